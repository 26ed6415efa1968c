"""On-demand forwarding that gives up on the right things (issue 29 §4): a refusal that is not
"busy" (device lost) sets the prefill aside instead of being swept again; with no prefill able
to take a task it goes to the colocated subgroup before the TTFT deadline; a decision queued
behind older prefill tasks is recorded (and round robin moves on); the decisions say who
refused and what the fed TE holds."""

from __future__ import annotations

from test_je import MODEL, decisions, done_of, job, run, steps_of

from deepserve.actors.je.messages import TeGroupMembership
from deepserve.persistence.api import MemoryLog
from deepserve.replay import verify

PD = {"prefill": ["p/0", "p/1"], "decode": ["d/0"]}


def test_a_lost_device_is_set_aside_not_offered_again_as_if_busy() -> None:
    tes = {"p/0": {"behaviour": "lost"}, "p/1": {}, "d/0": {}}
    cfg = {"policy": "least_load", "forwarding": {"ttft_deadline_s": 5.0}}
    d, out = run(tes, PD, [job(i) for i in range(4)], cfg, gap_s=0.5)
    assert all(r.status == "completed" for r in done_of(out).values()) and len(done_of(out)) == 4
    to_p0 = [e.request_id for e in decisions(d) if e.decision.chosen == "p/0"]
    assert to_p0 == ["r0"]  # before: offered again by every request (least loaded: it holds nothing)
    refused = [e for _, e in steps_of(d, "je/0", "OfferRefused")]
    assert [(e.te, e.permanent) for e in refused] == [("p/0", True)]
    aside = [(t, e.te, e.until_s) for t, e in steps_of(d, "je/0", "PrefillSetAside")]
    assert aside == [(0.01, "p/0", 5.01)]  # kv_fail_cooldown_s: a probe per 5 s at most
    later = [e.decision for e in decisions(d) if e.request_id == "r1" and e.phase == "prefill"][0]
    assert [(x.tes, x.reason[:10]) for x in later.excluded] == [(("p/0",), "set aside ")]
    assert verify(MemoryLog(d.sink)).identical  # the new events fold back to the same state


def test_with_no_prefill_left_a_waiting_task_goes_colocated_before_its_deadline() -> None:
    """r1 waits for the only prefill (busy); at t=1 that prefill leaves the group. Before: the
    next sweep failed r1 ("no prefill TE in the group"); now it runs on the colocated TE."""
    tes = {"c/0": {}, "p/0": {"behaviour": "reject"}, "d/0": {}}
    roles = {"colocated": ["c/0"], "prefill": ["p/0"], "decode": ["d/0"]}
    gone = TeGroupMembership(model=MODEL, role="prefill", tes=())
    d, out = run(tes, roles, [job(0), job(1)], {"forwarding": {"ttft_deadline_s": 10.0}},
                 gap_s=0.01, extra=[(1.0, "je/0", gone)])
    r1 = done_of(out)["r1"]
    assert (r1.status, r1.te) == ("completed", "c/0") and r1.finish_s < 2.0
    last = [e for e in decisions(d) if e.request_id == "r1"][-1]
    assert last.phase == "chat"
    assert "no prefill TE can take it (none in the group): colocated subgroup" in last.decision.reason


def test_a_sweep_names_the_refusals_of_the_sweep_before() -> None:
    """The reason read "refused by :" (the refusals are reset when the task waits)."""
    tes = {"p/0": {"behaviour": "reject_first", "n": 1}, "d/0": {}}
    cfg = {"policy": "least_load", "forwarding": {"retry_backoff_s": 0.01}}
    d, out = run(tes, {"prefill": ["p/0"], "decode": ["d/0"]}, [job(0)], cfg)
    assert done_of(out)["r0"].status == "completed"
    sweep = [e.decision for e in decisions(d) if e.decision.policy == "on_demand"]
    assert [x.reason for x in sweep] == ["a new sweep (the last one refused by p/0): fewest open streams"]


def test_a_decision_queued_behind_waiting_tasks_is_recorded_and_round_robin_moves_on() -> None:
    """Before: the queued decision was not recorded, so round robin's turn stayed on the busy
    prefill and every later request queued behind it too (the herd behind a dead prefill)."""
    tes = {"c/0": {}, "p/0": {"behaviour": "reject"}, "d/0": {}}
    roles = {"colocated": ["c/0"], "prefill": ["p/0"], "decode": ["d/0"]}
    d, out = run(tes, roles, [job(i) for i in range(6)], {"policy": "round_robin", "forwarding": {"ttft_deadline_s": 1.0}},
                 gap_s=0.01)
    done = done_of(out)
    assert {rid for rid, r in done.items() if r.status == "completed"} == {"r0", "r2", "r4"}
    queued = [(e.request_id, e.decision.chosen, e.decision.policy) for _, e in steps_of(d, "je/0", "RouteQueued")]
    assert queued == [("r3", "p/0", "round_robin"), ("r5", "p/0", "round_robin")]
    assert verify(MemoryLog(d.sink)).identical


def test_batch_forwarding_shows_the_prefix_the_fed_prefill_holds() -> None:
    """The batch-forwarding decision said "prefix 0" for a TE holding the whole prompt."""
    tes = {"p/0": {"behaviour": "slots", "n": 1}, "d/0": {}}
    cfg = {"policy": "least_load", "kv_events": False}
    jobs = [job(i, prompt=384, blocks=(11, 12, 13)) for i in range(2)]
    d, out = run(tes, {"prefill": ["p/0"], "decode": ["d/0"]}, jobs, cfg, gap_s=0.001)
    assert all(r.status == "completed" for r in done_of(out).values())
    fed = [e.decision for e in decisions(d) if e.decision.policy == "batch_forwarding"]
    assert fed and [(r.te, r.prefix_blocks) for r in fed[0].ranked] == [("p/0", 3)]
