"""Weight-loading paths beyond the calibration points."""

import pytest

from deepserve.adapters.hardware.loading import (
    TENSOR_INIT_S,
    dram_cached_models,
    local_load,
    npu_fork,
)
from deepserve.adapters.hardware.models import model_profile
from deepserve.adapters.hardware.sizes import weight_bytes
from deepserve.adapters.hardware.specs import link_spec, server_spec

GEN1 = server_spec("gen1-910b")
LLAMA70 = model_profile("llama3-70b")


def test_dram_miss_reads_the_ssd_and_is_slower():
    hit = local_load(LLAMA70, GEN1, 8, dram_hit=True)
    miss = local_load(LLAMA70, GEN1, 8, dram_hit=False)
    assert miss.seconds > 3 * hit.seconds
    # all ranks share the one SSD
    ssd_s = weight_bytes(LLAMA70) / GEN1.ssd_read_bw_bytes_per_s
    assert miss.transfer_s == pytest.approx(ssd_s, rel=0.01)


def test_every_path_pays_tensor_initialisation():
    for estimate in (
        local_load(LLAMA70, GEN1, 8, dram_hit=True),
        npu_fork(LLAMA70, link_spec("roce"), 8),
    ):
        assert estimate.seconds == pytest.approx(estimate.transfer_s + TENSOR_INIT_S)
        assert estimate.bytes_per_npu == weight_bytes(LLAMA70) // 8


def test_other_loaders_on_the_server_slow_a_load():
    alone = local_load(model_profile("llama3-8b"), GEN1, 1, dram_hit=True)
    crowded = local_load(model_profile("llama3-8b"), GEN1, 1, dram_hit=True, loaders=8)
    assert crowded.seconds > alone.seconds


def test_dram_capacity_counts_whole_models():
    assert dram_cached_models(LLAMA70, GEN1) == GEN1.dram_bytes // weight_bytes(LLAMA70)


def test_bad_tp():
    with pytest.raises(ValueError, match="^tp: "):
        local_load(LLAMA70, GEN1, 9, dram_hit=True)
    with pytest.raises(ValueError, match="^tp: "):
        npu_fork(LLAMA70, link_spec("hccs"), 0)
