"""The per-fault recovery lines and totals (actors/cluster/recovery_report.py): from a run's
recorded events on the 3-TE cluster with its control plane (recovery_harness.py), and from a
hand-written event list for the request accounting."""

from __future__ import annotations

from recovery_harness import build_run

from deepserve.actors.cluster.recovery_report import FaultLine, recovery_events, recovery_report
from deepserve.actors.cluster.state import GroupTarget, TeDeclaredFailed, TeReady
from deepserve.actors.je.messages import JeTaskEnded, JobFinished
from deepserve.actors.workload.messages import RequestDone
from deepserve.adapters.scenario.faults import FaultSpec

NPUS = {"te/0": ("hw/s0/npu0",), "te/1": ("hw/s0/npu1",), "te/2": ("hw/s0/npu2",)}
RUN = {"requests": 120, "gap_s": 0.5, "output_tokens": 100, "until_s": 100.0, "interval_s": 1.0}


def report(faults: list[dict[str, object]], **kw: object) -> object:
    d, _ = build_run(faults, **{**RUN, **kw})  # type: ignore[arg-type]
    return recovery_report([FaultSpec(**f) for f in faults], recovery_events(d.sink.steps), NPUS,  # type: ignore[arg-type]
                           until_s=d.now)  # fmt: skip


def test_a_hang_then_a_kill_of_the_replacement_each_get_their_line() -> None:
    r = report([{"at_s": 20.0, "kind": "hang-npu", "target": "hw/s0/npu1"},
                {"at_s": 50.0, "kind": "kill-te", "target": "te/1"}])  # fmt: skip
    assert [ln.text() for ln in r.lines] == [  # type: ignore[attr-defined]
        "fault at 20 s: hang-npu hw/s0/npu1 (te/1): detected after 3 s (hang), recovered after 9.57 s; "
        "requests: 2 failed, 0 retried",
        "fault at 50 s: kill-te te/1: detected after 3 s (silent), recovered after 6.89 s; requests: 1 failed, 4 retried",
    ]
    assert (r.faults_injected, r.recoveries, r.tes_ready_at_end, r.tes_target) == (2, 2, 3, 3)  # type: ignore[attr-defined]


def test_a_crash_its_repair_and_a_lost_je() -> None:
    r = report([{"at_s": 20.0, "kind": "npu-crash", "target": "hw/s0/npu1"},
                {"at_s": 40.0, "kind": "npu-reset", "target": "hw/s0/npu1"},
                {"at_s": 30.0, "kind": "kill-je", "target": "je/0"}], jes=2)  # fmt: skip
    crash, repair, je = r.lines  # type: ignore[attr-defined]
    assert (crash.te, crash.detected_after_s, crash.diagnosis, crash.failed) == ("te/1", 0.0, "device-lost", 2)
    assert crash.recovered_after_s is not None and 3.0 < crash.recovered_after_s < 10.0
    assert repair.text() == "fault at 40 s: npu-reset hw/s0/npu1 (te/1): a repair"
    assert (je.detected_after_s, je.diagnosis, je.retried + je.failed) == (0.0, "gateway", je.failed)
    assert je.failed > 0  # the harness's clients stream: their jobs fail naming the JE
    assert (r.faults_injected, r.recoveries, r.tes_ready_at_end, r.tes_target) == (3, 1, 3, 3)  # type: ignore[attr-defined]


def _done(rid: str, status: str) -> JobFinished:
    return JobFinished(done=RequestDone(request_id=rid, status=status, reason="", arrival_s=0.0,  # type: ignore[arg-type]
                                        first_token_s=None, finish_s=9.0, prompt_tokens=1, cached_prompt_tokens=0,
                                        output_tokens=0, te="te/0"))  # fmt: skip


def test_requests_count_as_retried_or_failed_up_to_the_detection() -> None:
    def ended(rid: str, te: str) -> JeTaskEnded:
        return JeTaskEnded(request_id=rid, task_id=f"{rid}/chat.1", te=te, status="failed", reason="x")

    evs = [(0.0, "cluster", GroupTarget(group="g", model="m", role="colocated", size=2)),
           (0.0, "cluster", TeReady(te="te/0", group="g", generation=1, at_s=0.0)),
           (0.0, "cluster", TeReady(te="te/1", group="g", generation=1, at_s=0.0)),
           (4.0, "je/0", ended("a", "te/0")), (5.0, "je/0", ended("b", "te/0")), (5.0, "je/0", ended("c", "te/1")),
           (5.0, "cluster", TeDeclaredFailed(te="te/0", generation=1, reason="r", at_s=5.0, diagnosis="hang")),
           (6.0, "je/0", ended("d", "te/0")), (9.0, "je/0", _done("a", "failed")), (9.0, "je/0", _done("b", "completed"))]
    r = recovery_report([FaultSpec(at_s=3.0, kind="hang-npu", target="hw/s0/npu0")], evs, NPUS)
    assert r.lines == (FaultLine(kind="hang-npu", target="hw/s0/npu0", at_s=3.0, te="te/0", detected_after_s=2.0,
                                 diagnosis="hang", failed=1, retried=1),)  # fmt: skip
    assert r.lines[0].text().endswith("detected after 2 s (hang), not recovered; requests: 1 failed, 1 retried")
    assert (r.faults_injected, r.recoveries, r.tes_ready_at_end, r.tes_target) == (1, 0, 1, 2)
