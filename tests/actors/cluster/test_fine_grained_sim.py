"""Issue 33 §2's fine-grained rungs (xDeepServe §6.2 stage 3), on the recovery harness's 3-TE
cluster with 2 DP groups a TE (te/1: hw/s0/npu2 and npu3), heartbeats on, 36 streamed requests
of 400 tokens from t=1 s (decoding at 5 s), 36 more from 15 s:

- a transient link error on te/1's first NPU during decode, with `token_recompute`: both DP
  groups roll back the pass in flight and run it again; no request fails; the tokens generated
  again are recorded. Without the setting the same fault fails the pass's requests.
- an HBM fault in the first 0.5 % of te/1's first NPU's KV region, with `hbm_masking`: the
  region is masked (100 blocks leave the pool, held by the mask), exactly the requests whose
  blocks sat there fail, te/1 is never declared failed and serves the later requests. Without
  the setting the whole TE is failed over (its device lost).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from recovery_harness import build_run, events

from deepserve.actors.cluster.state import TeDeclaredFailed
from deepserve.actors.flowserve import rtc
from deepserve.actors.flowserve.master.recovery import (
    HbmFaultMasked,
    IterationRolledBack,
    regenerated_tokens,
)
from deepserve.actors.workload.messages import RequestDone
from deepserve.adapters.scenario.resilience import Resilience
from deepserve.chaos.invariants import block_problems
from deepserve.persistence.memory import MemoryLog
from deepserve.replay import verify

NPU = "hw/s0/npu2"  # te/1's DP group 0
LINK_ERROR = [{"at_s": 5.0, "kind": "link-error", "target": NPU}]
HBM_FAULT = [{"at_s": 5.0, "kind": "hbm-fault", "target": NPU, "span": (0.0, 0.005)}]


def kw(**resilience: bool) -> dict[str, Any]:
    return {"dp_groups": 2, "resilience": Resilience(**resilience)}


def done_of(out: list[Any]) -> list[RequestDone]:
    return [m for m in out if isinstance(m, RequestDone)]


def all_events(d: Any, cls: type) -> list[tuple[float, str, Any]]:
    return [(t, a, e) for a in ("te/1/dp/0", "te/1/dp/1") for t, e in events(d, a, cls)]


def test_a_transient_link_error_during_decode_fails_no_request_and_reports_regenerated_tokens() -> None:
    d, out = build_run(LINK_ERROR, cluster_kw=kw(token_recompute=True))
    done = done_of(out)
    assert len(done) == 36 and Counter(m.status for m in done) == Counter(completed=36)
    rolled = all_events(d, IterationRolledBack)
    # both DP groups of te/1 rolled back their pass at the error: dp 0 met it, dp 1 heard the broadcast
    assert [(t, a, e.origin) for t, a, e in rolled] == [(5.0, "te/1/dp/0", 0), (5.0, "te/1/dp/1", 0)]
    assert all(e.tasks == 4 and e.outputs == 4 for _, _, e in rolled)  # 4 decoding a group: one token each
    assert regenerated_tokens(rolled) == 8
    assert events(d, "cluster", TeDeclaredFailed) == []
    for a in ("te/1/dp/0", "te/1/dp/1"):
        assert block_problems(d.actor(a).state) == []
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]


def test_without_token_recompute_the_same_error_fails_the_pass_s_requests() -> None:
    _, out = build_run(LINK_ERROR, cluster_kw=kw())
    failed = [m for m in done_of(out) if m.status == "failed"]
    assert len(failed) == 4 and all("transient link error" in m.reason for m in failed)


@pytest.fixture(scope="module")
def masked() -> Any:
    return build_run(HBM_FAULT, cluster_kw=kw(hbm_masking=True), again_at_s=15.0)


def test_an_hbm_fault_in_the_kv_region_fails_only_the_requests_whose_blocks_were_there(masked: Any) -> None:
    d, out = masked
    [(t, ev)] = events(d, "te/1/dp/0", HbmFaultMasked)
    assert (t, ev.name, ev.blocks, ev.held) == (5.0, "kv@0-0.005", tuple(range(100)), 0)
    hit = {tid.split("/")[0] for tid in ev.failed}
    done = done_of(out)
    failed = {m.request_id for m in done if m.status == "failed"}
    assert failed == hit and len(hit) == 4  # dp 0's four running requests held blocks there
    assert all("sat in a faulty HBM part (hw/s0/npu2: kv@0-0.005), masked" in m.reason
               for m in done if m.status == "failed")  # fmt: skip
    assert Counter(m.status for m in done) == Counter(completed=68, failed=4)
    assert events(d, "cluster", TeDeclaredFailed) == []  # te/1 keeps serving ...
    later = [m for m in done if m.te == "te/1" and m.arrival_s >= 15.0]
    assert len(later) > 5 and all(m.status == "completed" for m in later)  # ... the requests after it too


def test_masked_blocks_stay_accounted_and_the_capacity_shrinks(masked: Any) -> None:
    d, _ = masked
    st = d.actor("te/1/dp/0").state
    pool = st.rtc
    assert block_problems(st) == []  # free + cached + referenced = capacity, the mask a holder
    assert sorted(pool.caches[rtc.MASK].blocks) == list(range(100))
    assert not pool.seqs and len(pool.free_hbm) + len(pool.lru_hbm) + len(pool.cold_hbm) == pool.config.hbm_blocks - 100
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]


def test_without_hbm_masking_the_same_fault_fails_the_whole_te_over() -> None:
    d, _ = build_run(HBM_FAULT, cluster_kw=kw())
    assert [(t, e.te, e.diagnosis) for t, e in events(d, "cluster", TeDeclaredFailed)] == [(5.0, "te/1", "device-lost")]


@pytest.mark.parametrize(
    ("override", "key", "problem"),
    [
        ("cluster.resilience.kv_link_probe_s=-1", "cluster.resilience.kv_link_probe_s", ">= 0"),
        ("cluster.resilience.hbm_masking=maybe", "cluster.resilience.hbm_masking", "bool"),
        ("cluster.resilience.colour=1", "cluster.resilience.colour", "unknown"),
    ],
)  # fmt: skip
def test_a_bad_resilience_setting_names_its_key(override: str, key: str, problem: str) -> None:
    from deepserve.adapters.scenario.loader import ScenarioError, load_scenario

    with pytest.raises(ScenarioError) as info:
        load_scenario("mooncake-16te", [override])
    assert info.value.key == key and problem in info.value.problem.lower()


def test_a_bad_hbm_fault_span_names_its_field() -> None:
    from deepserve.adapters.scenario.faults import FaultSpec, check_faults

    bad = (FaultSpec(at_s=1.0, kind="hbm-fault", target=NPU, span=(0.5, 0.2)),
           FaultSpec(at_s=1.0, kind="npu-crash", target=NPU, span=(0.0, 0.1)))  # fmt: skip
    assert check_faults(bad, "gen1", 1) == [
        ("faults.0.span", "must be [lo, hi] with 0 <= lo < hi <= 1, got [0.5, 0.2]"),
        ("faults.1.span", "only for hbm-fault, not npu-crash"),
    ]
