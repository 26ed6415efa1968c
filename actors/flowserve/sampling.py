"""The emulated model's sampling: which token it emits at each output position, and where it stops.

The emulated model has, at every output position j, a next-token distribution over its
vocabulary (EOS aside) ranked by probability: p(rank r) ∝ (r + 1)^-ZIPF_EXPONENT, a Zipf law (the
shape of real next-token distributions' heads). Which token holds which rank depends on the
prompt and the position only (`prompt_key`, j): the model's preferred continuation of a prompt.

Sampling then works as a user of a real model expects:

- temperature T scales the logits: p_T(r) ∝ (r + 1)^-(ZIPF_EXPONENT / T) — a higher T draws from a
  wider distribution; T < GREEDY_TEMPERATURE (as vLLM's) or top_k = 1 is greedy: rank 0 always,
  so the output depends on the prompt only, whatever the seed;
- top_k keeps the k first ranks, min_p the ranks with p ≥ min_p · p(rank 0), top_p the smallest
  head with mass ≥ top_p (nucleus) — each a truncation of the ranks, renormalised;
- the seed picks the uniform draw at each position: a seed makes sampling reproducible.

The rank is drawn by inverting the continuous Zipf CDF on [1, R + 1) (closed form, no table over
the vocabulary: the simulation draws millions), which is the discrete law up to rounding.

The output length (where EOS comes) is drawn once per request before it runs (the scheduler knows
it in advance, tokens.output_length): from the per-token `eos_rate` (geometric, the simulator's
old model), or from a lognormal fitted to a real trace's output lengths (`eos_lognormal`, see
README "Sampling and output lengths"). A greedy request draws it from its prompt, a sampled one
from its seed; `min_tokens` defers EOS.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections.abc import Sequence
from statistics import NormalDist
from typing import Final

from deepserve.actors.flowserve.messages import Sampling
from deepserve.actors.flowserve.tokens import _MASK, combine, eos_index, mix64

ZIPF_EXPONENT = 2.0  # at T = 1 the top token has about half the mass, as an instruct model's
GREEDY_TEMPERATURE = 1e-5  # vLLM's _SAMPLING_EPS: a lower temperature is greedy
_UNIT = 1.0 / 9007199254740992.0  # 2^-53
_NORMAL = NormalDist()


def greedy(s: Sampling) -> bool:
    return s.temperature < GREEDY_TEMPERATURE or s.top_k == 1


def prompt_key_of(token_ids: Sequence[int]) -> int:
    """The 64-bit digest of a prompt's token ids (what a greedy output depends on)."""
    raw = array("q", token_ids).tobytes()
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8, person=b"ds-prompt").digest(), "little")


def _uniform(key: int, index: int) -> float:
    """A uniform in (0, 1) from (key, index)."""
    return ((combine(key & _MASK, index) >> 11) + 0.5) * _UNIT


def ranks_allowed(s: Sampling, vocab: int) -> int:
    """How many ranks top_k and min_p leave (at least 1)."""
    ranks = vocab - 1  # EOS is never sampled: its place is the output length
    if s.top_k > 0:
        ranks = min(ranks, s.top_k)
    if s.min_p > 0.0:
        a = ZIPF_EXPONENT / s.temperature
        # p(r) / p(0) = (r + 1)^-a >= min_p  <=>  r + 1 <= min_p^(-1/a)
        try:
            bound = min(math.pow(s.min_p, -1.0 / a), 1e18)
        except OverflowError:  # a tiny min_p (1e-300) at a high temperature: no rank is cut
            bound = 1e18
        ranks = min(ranks, max(1, int(bound)))
    return max(1, ranks)


def sampled_rank(u: float, temperature: float, top_p: float, ranks: int) -> int:
    """The rank (0 = the most likely token) a uniform `u` picks under temperature and nucleus."""
    a = ZIPF_EXPONENT / temperature
    v = u * top_p  # the nucleus: the head of mass top_p of the (continuous) law
    top = ranks + 1.0
    if abs(1.0 - a) < 1e-9:
        x = math.pow(top, v)
    else:
        b = 1.0 - a
        x = math.pow(1.0 + v * (math.pow(top, b) - 1.0), 1.0 / b)
    return min(max(int(x) - 1, 0), ranks - 1)


def sampled_tokens(s: Sampling, start: int, count: int, vocab: int) -> tuple[int, ...]:
    """Output tokens `start .. start+count` of a request: token j holds rank r_j of position j's
    ranking, r_j = 0 when greedy, else drawn from the seed. Never EOS (vocab - 1)."""
    if _HALVES and vocab <= _HALVES_MAX_VOCAB and 0 <= start and start + count < _M32:
        return tokens_on_halves(s, start, count, vocab)
    return sampled_tokens_reference(s, start, count, vocab)


def sampled_tokens_reference(s: Sampling, start: int, count: int, vocab: int) -> tuple[int, ...]:
    """`sampled_tokens` in Python's big ints (tokens.combine, tokens.mix64): the readable path,
    and the pure build's."""
    v, key = vocab - 1, s.prompt_key & _MASK
    bases = [mix64(combine(key, j)) % v for j in range(start, start + count)]
    if greedy(s):
        return tuple(bases)
    ranks = ranks_allowed(s, vocab)
    seed, t, p = s.seed, s.temperature, s.top_p
    return tuple((b + sampled_rank(_uniform(seed, start + i), t, p, ranks)) % v for i, b in enumerate(bases))


def lognormal_length(key: int, mu: float, sigma: float) -> int:
    """An output length (>= 1) drawn from lognormal(mu, sigma) by the uniform of `key`."""
    z = _NORMAL.inv_cdf(_uniform(key, 0x1E57))
    return max(1, round(math.exp(min(mu + sigma * z, 40.0))))


def eos_position(s: Sampling, eos_rate: float, eos_lognormal: tuple[float, float] | None) -> int | None:
    """The 0-based index of the emulated EOS token, or None (never); min_tokens defers it."""
    key = s.prompt_key if greedy(s) else s.seed
    if eos_lognormal is not None:
        eos: int | None = lognormal_length(key, *eos_lognormal) - 1
    else:
        eos = eos_index(key, eos_rate)
    if eos is not None and eos + 1 < s.min_tokens:
        eos = s.min_tokens - 1
    return eos


def output_length_of(s: Sampling, eos_rate: float, eos_lognormal: tuple[float, float] | None) -> tuple[int, str]:
    """(output tokens, stop reason) of a request: tokens.output_length's rules with this module's
    EOS draw ("stop": the emulated EOS, counted; "length": max_tokens; "target": a trace's)."""
    if s.max_tokens <= 0:
        raise ValueError(f"max_tokens: must be > 0, got {s.max_tokens}")
    if s.target_output_tokens is not None:
        if s.target_output_tokens <= 0:
            raise ValueError(f"target_output_tokens: must be > 0, got {s.target_output_tokens}")
        if s.target_output_tokens < s.max_tokens:
            return s.target_output_tokens, "target"
        return s.max_tokens, "length"
    eos = None if s.ignore_eos else eos_position(s, eos_rate, eos_lognormal)
    if eos is not None and eos + 1 <= s.max_tokens:
        return eos + 1, "stop"
    return s.max_tokens, "length"


# ---- the compiled build's path: the same 64-bit mixing on 32-bit halves ------------------------
# In mypyc an int below 2**62 is unboxed, a 64-bit one a heap object: the big-int path allocates
# ~35 of them a token (~1.6 us of the ~2.1 a token costs, and more in the daemon, where a pass's
# allocations meet a cold cache). On halves, every intermediate stays below 2**62: none. Pure
# Python is slower on halves (more operations), so the pure build keeps the big ints.
_M32: Final = 0xFFFFFFFF  # Final: mypyc inlines the constants as unboxed ints
_M16: Final = 0xFFFF
_HALVES_MAX_VOCAB: Final = 1 << 30  # (hi % v) * 2**32 + lo stays below 2**62
# A compiled function has no bytecode: the build this module runs in
_HALVES = not hasattr(greedy, "__code__")


def _mul64(hi: int, lo: int, c3: int, c2: int, c1: int, c0: int) -> tuple[int, int]:
    """(hi, lo) times the 64-bit constant of 16-bit limbs c3..c0, mod 2**64, as (high, low) halves:
    the products of 16-bit limbs that land below bit 64, carried limb by limb."""
    l1, l0, h1, h0 = lo >> 16, lo & _M16, hi >> 16, hi & _M16
    t0 = l0 * c0
    t1 = l1 * c0 + l0 * c1 + (t0 >> 16)
    t2 = l1 * c1 + l0 * c2 + (t1 >> 16)
    t3 = l1 * c2 + l0 * c3 + (t2 >> 16)
    t2 = (t2 & _M16) + h0 * c0  # the high half's products from limb 2 up
    t3 += h1 * c0 + h0 * c1 + (t2 >> 16)
    return ((t3 & _M16) << 16) | (t2 & _M16), ((t1 & _M16) << 16) | (t0 & _M16)


def mix_halves(hi: int, lo: int) -> tuple[int, int]:
    """`tokens.mix64` of the 64-bit value (hi << 32) | lo, as halves."""
    lo ^= ((lo >> 30) | (hi << 2)) & _M32
    hi ^= hi >> 30
    hi, lo = _mul64(hi, lo, 0xBF58, 0x476D, 0x1CE4, 0xE5B9)
    lo ^= ((lo >> 27) | (hi << 5)) & _M32
    hi ^= hi >> 27
    hi, lo = _mul64(hi, lo, 0x94D0, 0x49BB, 0x1331, 0x11EB)
    lo ^= ((lo >> 31) | (hi << 1)) & _M32
    hi ^= hi >> 31
    return hi, lo


def combine_halves(ph: int, pl: int, value: int) -> tuple[int, int]:
    """`tokens.combine` of the parent (ph << 32) | pl and 0 <= value < 2**32 - 1, as halves: the
    parent rotated left 23 bits, xor (value + 1) * GOLDEN, then mixed."""
    rh = ((ph << 23) | (pl >> 9)) & _M32
    rl = ((pl << 23) | (ph >> 9)) & _M32
    gh, gl = _mul64(0, value + 1, 0x9E37, 0x79B9, 0x7F4A, 0x7C15)
    return mix_halves(rh ^ gh, rl ^ gl)


def tokens_on_halves(s: Sampling, start: int, count: int, vocab: int) -> tuple[int, ...]:
    """`sampled_tokens_reference` on halves (vocab <= 2**30, start + count < 2**32 - 1): token j
    is mix64(combine(prompt key, j)) mod (vocab - 1), plus the rank _uniform(seed, j) draws."""
    v, key = vocab - 1, s.prompt_key & _MASK
    kh, kl = key >> 32, key & _M32
    out: list[int] = []
    if greedy(s):
        for j in range(start, start + count):
            hi, lo = combine_halves(kh, kl, j)
            hi, lo = mix_halves(hi, lo)
            out.append(((hi % v) * 4294967296 + lo) % v)
        return tuple(out)
    ranks = ranks_allowed(s, vocab)
    seed = s.seed & _MASK
    sh, sl, t, p = seed >> 32, seed & _M32, s.temperature, s.top_p
    for j in range(start, start + count):
        hi, lo = combine_halves(kh, kl, j)
        hi, lo = mix_halves(hi, lo)
        uh, ul = combine_halves(sh, sl, j)
        u = (((uh << 21) | (ul >> 11)) + 0.5) * _UNIT  # _uniform(seed, j): (z >> 11 + 0.5) / 2**53
        out.append((((hi % v) * 4294967296 + lo) % v + sampled_rank(u, t, p, ranks)) % v)
    return tuple(out)
