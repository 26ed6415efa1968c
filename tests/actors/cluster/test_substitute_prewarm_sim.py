"""Substitution (recovery rung `substitute`) boots through the fast-scaling path when `[scaling]`
is on (issue 34 §4; DeepServe §6.1–6.2): the failed decode TE moves to the spare server and its
new generation takes a pre-warmed pod and a pre-warmed TE there (the spare server keeps a pool of
pre-warmed executors too) and forks its weights from a running TE of the model over RoCE (the
spare is beyond the source's HCCS domain) — instead of a cold start. Without `[scaling]` the rung
boots cold as before."""

from __future__ import annotations

from typing import Any

from deepserve.benchmarks.recovery import simulate
from deepserve.cluster.control import MANAGER_ADDR

FAST = ("scaling.enabled=true", "scaling.fork=true", "scaling.pod_pool=2", "scaling.master_pool=2",
        "scaling.executor_pool_per_server=2")  # fmt: skip


def replacement(extra: tuple[str, ...]) -> tuple[Any, tuple[str, ...]]:
    run = simulate("substitute", "npu-crash", 40, extra=extra)
    st = run.driver.actor(MANAGER_ADDR).state
    rec = st.tes["te/2"]
    assert rec.generation == 2 and rec.state == "ready", rec
    return rec, st.placed["te/2"][1]  # where the ladder moved it


def test_substitution_takes_the_spare_server_s_prewarmed_te_and_forks_its_weights() -> None:
    rec, npus = replacement(FAST)
    assert npus == ("hw/s2/npu0",)  # on the spare server
    assert rec.details["scaler_pre"] == "pre-warmed pod"
    assert rec.details["te_pre_load"].startswith("pre-warmed: 1 executor(s) + 1 master(s)"), rec.details
    assert rec.details["te_load"].startswith("npu-fork-roce from te/"), rec.details
    assert rec.steps["registered"] < 2.0, rec.steps  # seconds, not a cold boot


def test_without_scaling_substitution_boots_cold_as_before() -> None:
    rec, npus = replacement(())
    assert npus == ("hw/s2/npu0",)
    assert "te_load" not in rec.details and rec.details["ssd_to_dram"] == "ssd", rec.details
    assert rec.steps["registered"] > 6.0, rec.steps
