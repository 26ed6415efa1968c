"""MTP speculative decoding: expected tokens per iteration and the iteration breakdown."""

import pytest

from deepserve.adapters.hardware.batch import Parallel
from deepserve.adapters.hardware.models import model_profile
from deepserve.adapters.hardware.mtp import expected_tokens_per_iteration, mtp_decode_iteration
from deepserve.adapters.hardware.specs import npu_spec

DEEPSEEK = model_profile("deepseek-r1")
DIE = npu_spec("910c")
PAR = Parallel(tp=16)


def test_expected_tokens_per_iteration():
    assert expected_tokens_per_iteration(0.9) == pytest.approx(1.9)
    assert expected_tokens_per_iteration(0.0, 3) == 1.0
    assert expected_tokens_per_iteration(1.0, 3) == 4.0
    assert expected_tokens_per_iteration(0.8, 2) == pytest.approx(1 + 0.8 + 0.64)
    with pytest.raises(ValueError, match="^acceptance: "):
        expected_tokens_per_iteration(1.5)
    with pytest.raises(ValueError, match="^draft_tokens: "):
        expected_tokens_per_iteration(0.5, -1)


def test_iteration_is_mtp_forward_sampling_main_forward_sampling():
    it = mtp_decode_iteration(DEEPSEEK, DIE, batch_size=8, context_tokens=2048, par=PAR,
                              acceptance=0.8, gap_s=1e-3)  # fmt: skip
    parts = it.mtp_forward_s + it.mtp_sampling_s + it.main_forward_s + it.main_sampling_s
    assert it.iteration_s == pytest.approx(parts)
    assert it.tpot_s == pytest.approx((it.iteration_s + 1e-3) / 1.8)
    assert it.tokens_per_s == pytest.approx(8 / it.tpot_s)


def test_higher_acceptance_lowers_tpot():
    tpots = [
        mtp_decode_iteration(DEEPSEEK, DIE, batch_size=8, context_tokens=2048, par=PAR,
                             acceptance=a).tpot_s
        for a in (0.5, 0.7, 0.9)
    ]  # fmt: skip
    assert tpots == sorted(tpots, reverse=True)


def test_mtp_needs_an_mtp_model_and_sane_input():
    with pytest.raises(ValueError, match="^model: kimi-k2 has no MTP module"):
        mtp_decode_iteration(model_profile("kimi-k2"), DIE, batch_size=1, context_tokens=1,
                             par=Parallel(tp=16), acceptance=0.9)  # fmt: skip
    with pytest.raises(ValueError, match="^gap_s: "):
        mtp_decode_iteration(DEEPSEEK, DIE, batch_size=1, context_tokens=1, par=PAR,
                             acceptance=0.9, gap_s=-1)  # fmt: skip
