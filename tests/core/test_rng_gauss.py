"""DeliveryRng.gauss, the inlined fast path, against `random.Random.gauss` (the readable
reference, built on DeliveryRng.random): same floats, same state, same cached second draw."""

from __future__ import annotations

import random

from deepserve.core.rng import DeliveryRng, delivery_seed


def _pair(seed: int) -> tuple[DeliveryRng, DeliveryRng]:
    return DeliveryRng(seed), DeliveryRng(seed)


def test_gauss_equals_the_base_class_draw_for_draw() -> None:
    assert DeliveryRng.gauss is not random.Random.gauss  # the fast path is what is tested
    for i in range(2000):
        seed = delivery_seed(i * 7919, i * 104729, i)
        fast, ref = _pair(seed)
        for mu, sigma in ((0.0, 1.0), (3.5, 0.25), (-1.0, 2.0)):
            assert fast.gauss(mu, sigma) == random.Random.gauss(ref, mu, sigma)
            assert fast.getstate() == ref.getstate()


def test_gauss_interleaved_with_other_draws_keeps_the_same_stream() -> None:
    fast, ref = _pair(0xDEADBEEF)
    for k in range(3000):
        if k % 3 == 0:
            assert fast.random() == ref.random()
        elif k % 5 == 0:
            assert fast.getrandbits(64) == ref.getrandbits(64)
        else:
            assert fast.gauss() == random.Random.gauss(ref)
        assert fast.getstate() == ref.getstate()


def test_gauss_edge_seeds() -> None:
    for seed in (0, 1, (1 << 64) - 1, 0x9E3779B97F4A7C15, (1 << 63)):
        fast, ref = _pair(seed)
        assert [fast.gauss() for _ in range(4)] == [random.Random.gauss(ref) for _ in range(4)]
