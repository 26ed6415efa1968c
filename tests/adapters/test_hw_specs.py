"""Spec tables and model profiles: the published figures are what the tables say."""

import msgspec
import pytest

from deepserve.adapters.hardware import sizes
from deepserve.adapters.hardware.errors import UnknownNameError
from deepserve.adapters.hardware.models import PROFILES, known_models, model_profile
from deepserve.adapters.hardware.specs import (
    LINKS,
    cluster_chips,
    cluster_npus,
    cluster_spec,
    link_spec,
    npu_spec,
    server_spec,
)

GB = 10**9


def test_910b_matches_deepserve_section_2():
    npu = npu_spec("910b")
    assert npu.tflops_fp16 == 400e12
    assert npu.hbm_bytes == 64 * GB
    assert npu.tops_int8 == 2 * npu.tflops_fp16
    assert npu.scale_up_link == "hccs"


def test_910c_is_two_dies_of_400_tflops_and_64_gb():
    die = npu_spec("910c")
    assert die.dies_per_chip == 2
    assert die.tflops_fp16 == 400e12
    assert die.hbm_bytes == 64 * GB
    assert die.compute_cores == 48


def test_cloudmatrix384_has_384_chips_and_768_dies_in_one_ub_domain():
    cm = cluster_spec("cm384")
    assert cm.servers == 48
    assert cluster_chips(cm) == 384
    assert cluster_npus(cm) == 768
    assert cm.scale_up_servers == cm.servers
    assert cm.global_shared_memory
    server = server_spec(cm.server)
    assert server.intra_link == server.inter_link == server.host_link == "ub"


def test_ub_is_uniform_and_several_times_roce():
    ub, roce = link_spec("ub"), link_spec("roce")
    assert 150 * GB <= ub.bw_bytes_per_s <= 250 * GB  # ~200 GB/s (DeepServe §2)
    assert ub.bw_bytes_per_s >= 3 * roce.bw_bytes_per_s  # "several times RoCE" (§2.2)


def test_gen1_server():
    server = server_spec("gen1-910b")
    assert server.npu == "910b" and server.npus == 8
    assert server.dram_bytes == 1500 * GB
    assert server.host_link == "pcie" and server.intra_link == "hccs"
    assert server.inter_link == "roce" and server.external_link == "vpc"
    assert link_spec("roce").bw_bytes_per_s == 200e9 / 8  # 200 Gbps per NPU
    assert not cluster_spec("gen1").global_shared_memory


def test_every_link_has_positive_costs():
    for link in LINKS.values():
        assert link.bw_bytes_per_s > 0 and 0 < link.eff <= 1
        assert link.latency_s > 0 and link.per_message_s > 0


@pytest.mark.parametrize(
    ("lookup", "field"),
    [(npu_spec, "npu"), (link_spec, "link"), (server_spec, "server"), (cluster_spec, "cluster"),
     (model_profile, "model")],
)  # fmt: skip
def test_unknown_names_raise_a_precise_lookup_error(lookup, field):
    with pytest.raises(UnknownNameError) as info:
        lookup("nonesuch")
    err = info.value
    assert isinstance(err, KeyError) and isinstance(err, ValueError)
    assert str(err).startswith(f"{field}: unknown {field} 'nonesuch'; known: ")
    assert err.known and all(name in str(err) for name in err.known)


def test_short_names():
    for name in ("llama3-8b", "llama2-13b", "codellama-34b", "llama3-70b", "qwen2-72b",
                 "deepseek-v3", "deepseek-r1", "kimi-k2"):  # fmt: skip
        assert model_profile(name).name == name
    assert known_models() == tuple(sorted(PROFILES))


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_derived_parameter_counts_match_published(name):
    m = model_profile(name)
    assert sizes.total_params(m) == pytest.approx(m.params_total, rel=0.02)
    assert sizes.active_params(m) == pytest.approx(m.params_active, rel=0.03)


def test_deepseek_profile():
    m = model_profile("deepseek-r1")
    assert m.n_layers == 61 and sizes.dense_layers(m) == 3 and sizes.moe_layers(m) == 58
    assert m.moe.n_routed_experts == 256 and m.moe.n_shared_experts == 1 and m.moe.top_k == 8
    assert m.mtp_layers == 1 and m.weight_dtype == "int8"
    # MLA: kv_lora_rank 512 (INT8) + qk_rope_head_dim 64 (BF16) per layer (xDeepServe §4.7).
    assert sizes.kv_bytes_per_token_layer(m) == 512 + 64 * 2
    bf16 = msgspec.structs.replace(m, kv_dtype="bf16")
    assert sizes.kv_bytes_per_token_layer(bf16) == (512 + 64) * 2
    assert sizes.kv_bytes_per_token(m) == 61 * 640


def test_gqa_kv_bytes_per_token():
    m = model_profile("llama3-70b")
    assert sizes.kv_bytes_per_token(m) == 2 * 80 * 8 * 128 * 2


def test_int8_weights_keep_embeddings_in_bf16():
    m = model_profile("deepseek-r1")
    expected = (sizes.quantizable_params(m) + sizes.mtp_params(m)) + 2 * sizes.embedding_params(m)
    assert sizes.weight_bytes(m) == expected
    dense = model_profile("llama3-70b")
    assert sizes.weight_bytes(dense) == 2 * sizes.total_params(dense)


def test_unknown_dtype():
    with pytest.raises(UnknownNameError, match="dtype: unknown dtype 'fp4'"):
        sizes.dtype_bytes("fp4")
