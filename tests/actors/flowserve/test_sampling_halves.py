"""The compiled build's token path (sampling.tokens_on_halves: 64-bit mixing on 32-bit halves)
against the readable big-int one (sampled_tokens_reference, tokens.combine / tokens.mix64)."""

from __future__ import annotations

import random

import deepserve
from deepserve.actors.flowserve import sampling
from deepserve.actors.flowserve.messages import Sampling
from deepserve.actors.flowserve.tokens import _MASK, combine, mix64

_EDGES = (0, 1, 2, (1 << 32) - 1, 1 << 32, (1 << 63) - 1, 1 << 63, _MASK - 1, _MASK, 0x9E3779B97F4A7C15)


def _whole(halves: tuple[int, int]) -> int:
    hi, lo = halves
    assert 0 <= hi < 1 << 32 and 0 <= lo < 1 << 32
    return (hi << 32) | lo


def test_mix_and_combine_on_halves_equal_the_big_int_ones() -> None:
    rng = random.Random(30)
    values = [*_EDGES, *(rng.getrandbits(64) for _ in range(20000))]
    for z in values:
        assert _whole(sampling.mix_halves(z >> 32, z & 0xFFFFFFFF)) == mix64(z)
    small = [0, 1, 2, 15, 16, 8191, (1 << 31), (1 << 32) - 3, (1 << 32) - 2]
    for i, z in enumerate(values):
        v = small[i % len(small)] if i % 3 else rng.randrange((1 << 32) - 1)
        assert _whole(sampling.combine_halves(z >> 32, z & 0xFFFFFFFF, v)) == combine(z, v)


def _samplings(rng: random.Random) -> list[Sampling]:
    out = [Sampling(max_tokens=16, seed=e, prompt_key=k) for e in _EDGES for k in (_EDGES[0], _EDGES[-1])]
    for _ in range(300):
        out.append(Sampling(
            max_tokens=64, seed=rng.getrandbits(64) - (1 << 63) * rng.randrange(2),
            prompt_key=rng.getrandbits(64), temperature=rng.choice((0.0, 1e-6, 0.5, 1.0, 1.7, 2.0)),
            top_p=rng.choice((1.0, 0.9, 0.3)), top_k=rng.choice((-1, 0, 1, 5, 50)),
            min_p=rng.choice((0.0, 0.05, 0.5)),
        ))  # fmt: skip
    return out


def test_tokens_on_halves_equal_the_reference() -> None:
    rng = random.Random(39)
    for s in _samplings(rng):
        for vocab in (2, 3, 32000, 151936, (1 << 30)):
            start = rng.choice((0, 1, 15, 4000, (1 << 32) - 40))
            count = rng.choice((1, 2, 7, 33))
            want = sampling.sampled_tokens_reference(s, start, count, vocab)
            assert sampling.tokens_on_halves(s, start, count, vocab) == want
            assert sampling.sampled_tokens(s, start, count, vocab) == want


def test_sampled_tokens_beyond_the_halves_range_takes_the_reference() -> None:
    s = Sampling(max_tokens=4, seed=7, prompt_key=11)
    for vocab, start in (((1 << 30) + 1, 0), (32000, (1 << 32) - 2), (1 << 40, 3)):
        assert sampling.sampled_tokens(s, start, 3, vocab) == sampling.sampled_tokens_reference(s, start, 3, vocab)


def test_the_halves_run_in_the_compiled_build_only() -> None:
    assert sampling._HALVES == (deepserve.BUILD == "compiled")
