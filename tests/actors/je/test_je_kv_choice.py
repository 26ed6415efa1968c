"""KV migration's price (actors/je/migration.py `choose_kv`) and the surviving run it is offered
(actors/flowserve/rtc/export.py `dram_run`): moving the blocks the failed TE's host DRAM still
holds, plus prefilling the tail, against prefilling everything the target does not cache."""

from __future__ import annotations

import pytest

from deepserve.actors.flowserve import rtc
from deepserve.actors.flowserve.distflow.migrate import KvExportOffer, relay_path
from deepserve.actors.flowserve.rtc.export import dram_run, unsaved
from deepserve.actors.je.migration import MigrationParams, choose_kv
from deepserve.adapters.hardware.devices.topology import gen1_cluster

P = MigrationParams(enabled=True, kv=True, kv_bytes_per_token=131072.0, link_bytes_per_s=25e9,
                    host_bytes_per_s=25e9, prefill_tokens_per_s=2e4, setup_s=0.001)  # fmt: skip


def offer(blocks: int) -> KvExportOffer:
    return KvExportOffer(request_id="r1", master="te/2/dp/0/keep/1", host="hw/s0/host", blocks=blocks,
                         block_bytes=16 << 20, tp=1)  # fmt: skip


def test_surviving_blocks_move_and_only_the_tail_is_recomputed() -> None:
    c = choose_kv(P, 4000, 50, 0, "te/2", offer(31), 128)  # 31 full blocks of a 4,000-token prompt
    assert c.mode == "migrate" and c.survived_blocks == 31 and c.master == "te/2/dp/0/keep/1"
    assert c.moved_bytes == 31 * 128 * 131072 and c.recompute_tokens == 4050 - 31 * 128
    assert c.migrate_s == pytest.approx(0.001 + c.moved_bytes / 25e9 + c.recompute_tokens / 2e4)
    assert c.recompute_s == pytest.approx(4050 / 2e4) and c.migrate_s < c.recompute_s


def test_what_the_target_caches_is_neither_moved_nor_recomputed() -> None:
    c = choose_kv(P, 4000, 50, 31 * 128, "te/2", offer(31), 128)  # another TE caches it all
    assert c.mode == "recompute" and c.moved_bytes == 0 and c.recompute_tokens == 4050 - 31 * 128
    c = choose_kv(P, 4000, 50, 10 * 128, "te/2", offer(31), 128)  # only part: the rest moves
    assert c.mode == "migrate" and c.moved_bytes == 21 * 128 * 131072


def test_a_slow_path_or_no_offer_recomputes() -> None:
    slow = MigrationParams(enabled=True, kv=True, link_bytes_per_s=1e8, prefill_tokens_per_s=2e4)
    c = choose_kv(slow, 4000, 50, 0, "te/2", offer(31), 128)
    assert c.mode == "recompute" and c.migrate_s is not None and c.migrate_s >= c.recompute_s
    c = choose_kv(P, 4000, 50, 0, "te/2", None, 128)
    assert c.mode == "recompute" and c.migrate_s is None and "te/2's host offered no KV" in c.reason


def test_the_host_keeps_a_prefix_of_the_chain_only() -> None:
    r = rtc.new_rtc(rtc.RtcConfig(hbm_blocks=8, dram_blocks=8, block_tokens=4))
    r = rtc.apply(r, rtc.allocate(r, "s", 3))
    r = rtc.apply(r, rtc.cache_blocks(r, "s", (11, 12, 13)))
    assert unsaved(r, (11, 12, 13)) == [11, 12, 13] and dram_run(r, (11, 12, 13)) == ()
    copy = rtc.copy_to_dram(r, [11, 12])  # the write-through of the first two
    r = rtc.apply(r, copy)
    assert dram_run(r, (11, 12, 13)) == ()  # in flight: not readable yet
    r = rtc.apply(r, rtc.finish_copy(r, copy.copy_id, True))
    assert dram_run(r, (11, 12, 13)) == copy.dram and unsaved(r, (11, 12, 13)) == [13]
    assert dram_run(r, (12, 13)) == (copy.dram[1],)  # a chain read from its own start


def test_across_gen1_servers_the_bytes_leave_through_a_neighbour_nic() -> None:
    path = relay_path("hw/s1/host", "hw/s0/npu3")
    assert path == ("s1/npu4/roce:tx", "s0/npu3/roce:rx", "s1/host/pcie:h2d", "s1/npu4/pcie:h2d")
    links = {f"{link.name}:{d}" for link in gen1_cluster(2).links for d in link.directions}
    assert set(path) <= links  # link directions the fabric knows (an explicit `LinkTransfer.path`)
    assert relay_path("ext/x", "hw/s0/npu3") is None


def test_a_bad_survey_window_names_the_field() -> None:
    with pytest.raises(ValueError, match="survey_s"):
        MigrationParams(kv=True, survey_s=0)
