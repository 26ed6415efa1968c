"""Seeds `deepserve chaos` found failing, kept as regressions (each ran the whole platform with
its seed's faults and failed an invariant before the fix named beside it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deepserve.chaos.platform import load_config
from deepserve.chaos.runner import run_seed

DAEMON = str(Path(__file__).resolve().parents[2] / "configs" / "daemon" / "default.toml")
MOONCAKE = ("mooncake-16te", ("cluster.tes=3", "scheduling.jes=2"))
PD = ("pd-1p1d", ("cluster.prefill_tes=2", "cluster.decode_tes=2", "scheduling.jes=2"))

# A replacement's boots failed three times in 3-10 s while `s0/ssd`, `s0/host/pcie` or an NPU's
# PCIe link was down or flapping, and the slot was left stopped for good (`convergence`):
# now failed boots back off (1, 2, 4 … s, capped) and never give up while the group wants the TE.
BOOT_SEEDS = [(*MOONCAKE, 490), (*MOONCAKE, 829), (*PD, 0), (DAEMON, ("scheduling.jes=2",), 13)]


@pytest.mark.parametrize(("scenario", "overrides", "seed"), BOOT_SEEDS)
def test_a_slot_whose_boots_failed_during_a_link_fault_boots_again(tmp_path: Path, scenario: str,
                                                                  overrides: tuple[str, ...], seed: int) -> None:  # fmt: skip
    r = run_seed(load_config(scenario, overrides), seed, 30, str(tmp_path))
    assert (r.violations, r.first) == (0, None)
    assert any("link" in f for f in r.faults)  # the seed's schedule still has its link fault


def test_a_kill_je_notice_reaches_the_gateway_where_chaos_put_it(tmp_path: Path) -> None:
    # Seed 1757 kills je/1; its notice went to "gateway" (a dead letter: chaos puts the gateway at
    # the workload's address), so the 9 requests of je/1 never reached a terminal state.
    r = run_seed(load_config(MOONCAKE[0], MOONCAKE[1]), 1757, 30, str(tmp_path))
    assert any("kill-je je/1" in f for f in r.faults)
    assert (r.violations, r.first, r.completed + r.failed) == (0, None, 30)
    # and its tasks are cancelled on the TEs (the cluster manager's CancelOwner): before, they ran on
    # to their end and streamed 3,452 token chunks for requests the gateway had already failed
    assert r.late_chunks == 0


def test_a_pd_request_whose_prefill_was_retried_streams_its_decode(tmp_path: Path) -> None:
    # 2P2D with the ladder's `replace` rung, seed 15 of 40 requests: r2's prefill failed on a TE
    # before any output and ran again as prefill.2; its decode went out as decode.1, which the
    # stream merge orders below prefill.2 (stream.task_order), so all its tokens were dropped:
    # "r2: completed with 55 output tokens, 1 streamed" (`tokens`). Now the decode is decode.2.
    cfg = load_config(PD[0], ("cluster.prefill_tes=2", "cluster.decode_tes=2", "recovery.rung=replace"))
    r = run_seed(cfg, 15, 40, str(tmp_path))
    assert (r.violations, r.first) == (0, None)
    assert r.completed + r.failed == 40 and r.tokens_streamed > 0
