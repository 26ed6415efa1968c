"""Link transfer costs, multi-hop paths, UB semantics, collectives, broadcast."""

import math

import pytest

from deepserve.adapters.hardware.specs import link_spec
from deepserve.adapters.hardware.transfer import (
    BROADCAST_CHUNK_BYTES,
    allreduce_time_s,
    blockwise_transfer_time_s,
    broadcast_time_s,
    effective_bw_bytes_per_s,
    path_bw_bytes_per_s,
    path_time_s,
    transfer_time_s,
    ub_best_send_time_s,
    ub_send_time_s,
)

MB = 1024 * 1024


def test_transfer_is_latency_plus_messages_plus_bytes_over_bandwidth():
    roce = link_spec("roce")
    got = transfer_time_s(100 * MB, roce, messages=3)
    want = roce.latency_s + 3 * roce.per_message_s + 100 * MB / (roce.bw_bytes_per_s * roce.eff)
    assert got == pytest.approx(want)


def test_block_by_block_costs_more_than_contiguous():
    roce = link_spec("roce")
    contiguous = transfer_time_s(64 * MB, roce)
    blocks = blockwise_transfer_time_s(64 * MB, 128 * 1024, roce)  # 512 blocks of 128 KiB
    assert blocks > contiguous
    assert blocks - contiguous == pytest.approx(511 * roce.per_message_s)


def test_multi_hop_path_runs_at_bottleneck_with_summed_latencies():
    path = [link_spec("ub"), link_spec("roce"), link_spec("pcie")]
    assert path_bw_bytes_per_s(path) == effective_bw_bytes_per_s(link_spec("roce"))
    got = path_time_s(10 * MB, path)
    fixed = sum(link.latency_s + link.per_message_s for link in path)
    assert got == pytest.approx(fixed + 10 * MB / path_bw_bytes_per_s(path))
    assert got > transfer_time_s(10 * MB, link_spec("roce"))


def test_allreduce():
    hccs, ub = link_spec("hccs"), link_spec("ub")
    assert allreduce_time_s(MB, 1, hccs) == 0.0
    # a switched port carries more of the data as ranks grow ...
    assert allreduce_time_s(64 * MB, 8, ub) > allreduce_time_s(64 * MB, 2, ub) > 0
    # ... while a full mesh drives one link per peer at once
    assert allreduce_time_s(64 * MB, 8, hccs) < allreduce_time_s(64 * MB, 2, hccs)
    assert allreduce_time_s(64 * MB, 8, hccs) > allreduce_time_s(MB, 8, hccs)


def test_broadcast_to_many_costs_little_more_than_to_one():
    hccs = link_spec("hccs")
    one = broadcast_time_s(16e9, hccs, 1)
    many = broadcast_time_s(16e9, hccs, 32)
    chunks = math.ceil(16e9 / BROADCAST_CHUNK_BYTES)
    assert one == pytest.approx(transfer_time_s(16e9, hccs, messages=chunks), rel=1e-6)
    assert one < many < 1.05 * one


def test_ub_memory_semantics_for_small_dma_for_bulk():
    ub = link_spec("ub")
    small, bulk = 64 * 1024, 512 * MB
    assert ub_send_time_s(small, 2, ub) < ub_send_time_s(small, 2, ub, semantic="dma")
    assert ub_send_time_s(bulk, 2, ub, semantic="dma") < ub_send_time_s(bulk, 2, ub)
    assert ub_best_send_time_s(bulk, 2, ub) == ub_send_time_s(bulk, 2, ub, semantic="dma")
    # more cores help memory semantics until the link saturates
    assert ub_send_time_s(9 * MB, 48, ub) < ub_send_time_s(9 * MB, 4, ub)
    assert ub_send_time_s(9 * MB, 48, ub) == ub_send_time_s(9 * MB, 96, ub)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: transfer_time_s(-1, link_spec("ub")), "nbytes"),
        (lambda: transfer_time_s(1, link_spec("ub"), messages=0), "messages"),
        (lambda: blockwise_transfer_time_s(1, 0, link_spec("ub")), "block_bytes"),
        (lambda: path_time_s(1, []), "path"),
        (lambda: allreduce_time_s(1, 0, link_spec("ub")), "ranks"),
        (lambda: broadcast_time_s(1, link_spec("ub"), 0), "targets"),
        (lambda: ub_send_time_s(1, 0, link_spec("ub")), "cores"),
        (lambda: ub_send_time_s(1, 1, link_spec("ub"), semantic="rdma"), "semantic"),
    ],
)
def test_bad_input_names_the_field(call, field):
    with pytest.raises(ValueError, match=f"^{field}: "):
        call()
