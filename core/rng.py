"""The per-delivery random generator: `random.Random`'s API on SplitMix64.

`ctx.rng` is seeded afresh for every delivery from (run seed, address, actor-seq),
so replaying one input reproduces its draws alone. Seeding Mersenne Twister costs
about 4.5 µs (it fills 624 words); SplitMix64 seeds in one multiply, and its
statistical quality is ample for simulation draws. All of `random.Random`'s
methods (randint, choice, gauss, shuffle, ...) work: they are built on
`random()` and `getrandbits()`, which this class provides.
"""

from __future__ import annotations

import hashlib
import random
from math import cos, log, pi, sin, sqrt

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_UNIT = 1.0 / 9007199254740992.0  # 2^-53: `random()`'s scale
_TWOPI = 2.0 * pi  # random.py's TWOPI, the same float


def address_hash(addr: str) -> int:
    """A stable 64-bit hash of an address (Python's `hash` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(addr.encode(), digest_size=8).digest(), "little")


def mix64(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def delivery_seed(run_seed: int, addr_hash: int, seq: int) -> int:
    return mix64((run_seed * _GOLDEN) ^ addr_hash ^ mix64(seq + _GOLDEN)) & _MASK


class DeliveryRng(random.Random):
    """SplitMix64 behind the `random.Random` interface."""

    _state: int
    gauss_next: float | None  # random.Random's cached second normal draw (`gauss`)

    def seed(self, a: object = None, version: int = 2) -> None:  # noqa: ARG002
        if not isinstance(a, int):
            raise TypeError(f"DeliveryRng is seeded with an int, got {type(a).__name__}")
        self._state = a & _MASK
        self.gauss_next = None

    def _next64(self) -> int:
        self._state = s = (self._state + _GOLDEN) & _MASK
        return mix64(s)

    def random(self) -> float:
        return (self._next64() >> 11) * _UNIT

    def gauss(self, mu: float = 0.0, sigma: float = 1.0) -> float:
        """`random.Random.gauss`: the same floats and the same cached second draw, with its two
        `random()` calls (`_next64`, `mix64`) inlined — one frame instead of seven; the NPU
        draws one a forward pass. The base class's method, built on `random()`, is the
        readable reference (tests/core/test_rng_gauss.py checks they agree)."""
        z: float | None = self.gauss_next
        self.gauss_next = None
        if z is None:
            s1 = (self._state + _GOLDEN) & _MASK
            self._state = s2 = (s1 + _GOLDEN) & _MASK
            s1 = ((s1 ^ (s1 >> 30)) * 0xBF58476D1CE4E5B9) & _MASK  # mix64(s1)
            s1 = ((s1 ^ (s1 >> 27)) * 0x94D049BB133111EB) & _MASK
            s2 = ((s2 ^ (s2 >> 30)) * 0xBF58476D1CE4E5B9) & _MASK  # mix64(s2)
            s2 = ((s2 ^ (s2 >> 27)) * 0x94D049BB133111EB) & _MASK
            x2pi = ((s1 ^ (s1 >> 31)) >> 11) * _UNIT * _TWOPI
            g2rad = sqrt(-2.0 * log(1.0 - ((s2 ^ (s2 >> 31)) >> 11) * _UNIT))
            z = cos(x2pi) * g2rad
            self.gauss_next = sin(x2pi) * g2rad
        return mu + z * sigma

    def getrandbits(self, k: int) -> int:
        if k < 0:
            raise ValueError(f"number of bits must be non-negative, got {k}")
        if k <= 64:
            return self._next64() >> (64 - k)
        out, got = 0, 0
        while got < k:
            out |= self._next64() << got
            got += 64
        return out & ((1 << k) - 1)

    def getstate(self) -> tuple[int, float | None]:  # type: ignore[override]
        return (self._state, self.gauss_next)

    def setstate(self, state: tuple[int, float | None]) -> None:  # type: ignore[override]
        self._state, self.gauss_next = state  # type: ignore[assignment]
