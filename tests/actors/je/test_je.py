"""The JE's task bookkeeping: decomposition, routing decisions recorded, retries on task failure
only while nothing streamed, on-demand forwarding, membership pushes, batch jobs — and every
request terminal exactly once, whatever the TEs do."""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from je_fakes import ScriptedTe

from deepserve.actors.flowserve.messages import Prompt, Sampling
from deepserve.actors.je.actor import JobExecutor
from deepserve.actors.je.cluster import ClusterManager, RemoveTe
from deepserve.actors.je.messages import (
    BatchDone,
    BatchItem,
    JobRequest,
    SubmitBatch,
    TeGroupMembership,
)
from deepserve.actors.workload.messages import RequestDone
from deepserve.core import Actor, Context, MemorySink, Message, SimDriver, decode
from deepserve.persistence.api import MemoryLog
from deepserve.replay import verify

MODEL = "m"


def job(i: int, prompt: int = 256, out: int = 4, blocks: tuple[int, ...] = ()) -> JobRequest:
    return JobRequest(request_id=f"r{i}", model=MODEL, prompt=Prompt(num_tokens=prompt, block_hashes=blocks),
                     sampling=Sampling(max_tokens=out, target_output_tokens=out, seed=i), reply_to="ext/client")


def run(tes: dict[str, dict[str, Any]], roles: dict[str, list[str]], jobs: list[JobRequest],
        config: dict[str, Any] | None = None, gap_s: float = 0.1, sink: Any = None,
        extra: list[tuple[float, str, Any]] = ()) -> tuple[SimDriver, list[Any]]:  # type: ignore[assignment]
    d = SimDriver(3, sink=sink if sink is not None else MemorySink())
    out: list[Any] = []
    d.on_external = lambda _t, env: out.append(env.msg)
    for addr, kw in tes.items():
        d.spawn(addr, ScriptedTe, **kw)
    d.spawn("je/0", JobExecutor, config=config or {})
    for role, members in roles.items():
        d.inject("je/0", TeGroupMembership(model=MODEL, role=role, tes=tuple(members)), at=0.0)  # type: ignore[arg-type]
    for i, j in enumerate(jobs):
        d.inject("je/0", j, at=0.01 + gap_s * i, corr=j.request_id, src="ext/client")
    for at, dst, msg in extra:
        d.inject(dst, msg, at=at, src="ext/operator")
    d.run(until=600.0)
    return d, out


def done_of(out: list[Any]) -> dict[str, RequestDone]:
    dones = [m for m in out if isinstance(m, RequestDone)]
    counts = Counter(m.request_id for m in dones)
    assert all(c == 1 for c in counts.values()), counts  # exactly one terminal each
    return {m.request_id: m for m in dones}


def events(d: SimDriver, type_name: str, actor: str = "je/0") -> list[Any]:
    return [decode(e.type, e.payload) for s in d.sink.steps if s.input.actor == actor  # type: ignore[union-attr]
            for e in s.events if e.type == type_name]


def decisions(d: SimDriver) -> list[Any]:
    assert events(d, "HandlerFailed") == []
    return events(d, "RouteDecided")


def test_colocated_round_robin_one_task_each() -> None:
    tes = {f"te/{k}": {} for k in range(3)}
    d, out = run(tes, {"colocated": list(tes)}, [job(i) for i in range(6)], {"policy": "round_robin"})
    done = done_of(out)
    assert len(done) == 6 and all(x.status == "completed" for x in done.values())
    assert [x.te for x in sorted(done.values(), key=lambda x: x.request_id)] == ["te/0", "te/1", "te/2"] * 2
    s = d.actor("je/0").state
    assert (s.completed, s.failed, len(s.jobs), sum(s.open.values())) == (6, 0, 0, 0)
    assert [e.decision.policy for e in decisions(d)] == ["round_robin"] * 6


def test_pd_pair_gets_prefill_then_decode_with_both_decisions_recorded() -> None:
    tes = {"p/0": {}, "d/0": {}}
    d, out = run(tes, {"prefill": ["p/0"], "decode": ["d/0"]}, [job(0)])
    assert done_of(out)["r0"].status == "completed" and done_of(out)["r0"].te == "d/0"
    assert [(e.phase, e.decision.chosen) for e in decisions(d)] == [("prefill", "p/0"), ("decode", "d/0")]


def test_failure_before_streaming_retries_elsewhere() -> None:
    tes = {"te/0": {"behaviour": "fail_early"}, "te/1": {}}
    d, out = run(tes, {"colocated": list(tes)}, [job(0)])
    r = done_of(out)["r0"]
    assert (r.status, r.te) == ("completed", "te/1")
    assert [e.task_id for e in decisions(d)] == ["r0/chat.1", "r0/chat.2"]


def test_failure_after_streaming_fails_the_request_with_the_reason() -> None:
    tes = {"te/0": {"behaviour": "fail_late"}, "te/1": {}}
    _, out = run(tes, {"colocated": list(tes)}, [job(0)])
    r = done_of(out)["r0"]
    assert r.status == "failed" and "after output streamed" in r.reason and "NPU crashed" in r.reason
    # what failed, in words a completions client reads too (it said "chat task failed")
    assert r.reason.startswith("its generation (prefill and decode) task failed after output streamed: "), r.reason


def test_the_terminal_state_carries_the_finishing_tasks_preemptions() -> None:
    """For the daemon's `vllm:num_preemptions` (the TE reports them in `TaskFinished`)."""
    tes = {"te/0": {"behaviour": "preempted", "n": 2}}
    _, out = run(tes, {"colocated": list(tes)}, [job(0)])
    r = done_of(out)["r0"]
    assert (r.status, r.preemptions) == ("completed", 2)


def test_failure_after_output_of_a_non_streamed_job_retries_it_from_scratch() -> None:
    """A client that does not stream has seen nothing when the task fails, however many tokens
    it produced: the job is retried on another TE (a tour: `kill-te` failed such requests with
    "failed after output streamed"), and what it reports is the retry's alone. The log replays."""
    tes = {"te/0": {"behaviour": "fail_late"}, "te/1": {}}
    quiet = msgspec.structs.replace(job(0), stream=False)
    d, out = run(tes, {"colocated": list(tes)}, [quiet, job(1)], gap_s=0.001)
    done = done_of(out)
    r = done["r0"]
    assert (r.status, r.te, r.output_tokens) == ("completed", "te/1", 4)
    tid = {e.request_id: e.task_id for e in decisions(d)}
    assert [e.task_id for e in decisions(d) if e.request_id == "r0"] == ["r0/chat.1", "r0/chat.2"]
    retry = [e for e in events(d, "RouteDecided") if e.task_id == "r0/chat.2"][0]
    first = [e.first_token_s for e in events(d, "TaskStreamed") if e.task_id == "r0/chat.1"]
    assert first and r.first_token_s is not None and r.first_token_s > first[0]  # the retry's first token
    assert retry.decision.chosen == "te/1" and tid["r1"] == "r1/chat.1"
    assert done["r1"].status == "completed"  # r1 (streamed) went to te/1 round robin
    assert verify(MemoryLog(d.sink)).identical


def test_a_streamed_job_still_fails_after_output_and_retries_keep_their_limit() -> None:
    tes = {"te/0": {"behaviour": "fail_late"}, "te/1": {}}
    _, out = run(tes, {"colocated": ["te/0", "te/1"]}, [job(0)])
    assert "after output streamed" in done_of(out)["r0"].reason  # stream=True: the client saw a token
    tes = {f"te/{k}": {"behaviour": "fail_late"} for k in range(5)}
    quiet = msgspec.structs.replace(job(0), stream=False)
    d, out = run(tes, {"colocated": list(tes)}, [quiet], {"max_attempts": 3})
    r = done_of(out)["r0"]
    assert r.status == "failed" and r.reason.startswith("gave up after 3 attempts"), r.reason
    assert r.output_tokens == 1  # the last attempt's token, not the three attempts' sum
    assert verify(MemoryLog(d.sink)).identical


def test_a_non_streamed_pd_job_whose_decode_fails_starts_over_from_a_new_prefill() -> None:
    """A decode that fails has lost the prefill's KV: a non-streamed job restarts from a prefill,
    with task ids never reused (a late answer of the failed decode must stay late)."""
    tes = {"p/0": {}, "d/0": {"behaviour": "fail_late"}, "d/1": {}}
    quiet = msgspec.structs.replace(job(0), stream=False)
    d, out = run(tes, {"prefill": ["p/0"], "decode": ["d/0", "d/1"]}, [quiet])
    r = done_of(out)["r0"]
    assert (r.status, r.te) == ("completed", "d/1"), r
    assert [(e.task_id, e.decision.chosen) for e in decisions(d)] == [
        ("r0/prefill.1", "p/0"), ("r0/decode.1", "d/0"), ("r0/prefill.2", "p/0"), ("r0/decode.2", "d/1")]
    assert verify(MemoryLog(d.sink)).identical


def test_a_decode_whose_kv_never_arrived_is_retried_off_its_prefill_te_too() -> None:
    """The KV path between a P/D pair may be what failed (a link down: no heartbeat sees it), so
    the retry avoids the prefill TE as well and goes to a colocated TE (a tour: it went back to
    the same prefill and then failed, saying the TE group was empty)."""
    tes = {"c/0": {}, "p/0": {}, "d/0": {"behaviour": "kv_lost"}}
    first, quiet = job(0), msgspec.structs.replace(job(1), stream=False)
    roles = {"colocated": ["c/0"], "prefill": ["p/0"], "decode": ["d/0"]}
    d, out = run(tes, roles, [first, quiet], {"policy": "round_robin"})  # r1 gets the P/D pair
    r = done_of(out)["r1"]
    assert (r.status, r.te) == ("completed", "c/0"), r
    assert [(e.task_id, e.decision.chosen) for e in decisions(d) if e.request_id == "r1"] == [
        ("r1/prefill.1", "p/0"), ("r1/decode.1", "d/0"), ("r1/chat.2", "c/0")]
    assert verify(MemoryLog(d.sink)).identical
    # with no other path left, the failure names the TEs that failed the job
    d, out = run(tes, {"prefill": ["p/0"], "decode": ["d/0"]}, [quiet])
    r = done_of(out)["r1"]
    assert r.status == "failed" and r.reason.startswith(
        "no chat TE of model 'm' left for it: d/0, p/0 failed this job; last: failed on d/0: KV transfer failed"), r


def test_a_prefill_whose_kv_failed_gets_no_new_task_for_the_cooldown() -> None:
    """Outlier ejection: a down link is invisible to heartbeats, so without it every P/D request
    sent that way found it down once (a streamed one then failed: it had shown its first token).
    The prefill TE is set aside for `kv_fail_cooldown_s` while another TE can take the work."""
    tes = {"c/0": {}, "p/0": {}, "d/0": {"behaviour": "kv_lost"}}
    roles = {"colocated": ["c/0"], "prefill": ["p/0"], "decode": ["d/0"]}
    quiet = [msgspec.structs.replace(job(i), stream=False) for i in range(5)]
    late = msgspec.structs.replace(job(9), stream=False)
    d, out = run(tes, roles, quiet, {"kv_fail_cooldown_s": 2.0, "policy": "round_robin"}, gap_s=0.5, extra=[(8.0, "je/0", late)])
    done = done_of(out)
    assert all(r.status == "completed" for r in done.values()), done
    (aside,) = events(d, "PrefillSetAside")
    assert aside.te == "p/0" and "KV transfer failed" in aside.reason
    first = {e.request_id: e.decision for e in decisions(d) if e.attempt == 1 and e.phase != "decode"}
    assert first["r1"].chosen == "p/0"  # round robin's second turn: the P/D pair, whose KV fails
    for rid in ("r2", "r3", "r4"):  # within the cooldown: p/0 is not a candidate
        assert [c.te for c in first[rid].ranked] == ["c/0"], (rid, first[rid])
    assert {c.te for c in first["r9"].ranked} == {"c/0", "p/0"}  # after it: offered again
    assert verify(MemoryLog(d.sink)).identical


def test_dead_te_times_out_and_the_task_moves_on() -> None:
    tes = {"te/0": {"behaviour": "dead"}, "te/1": {}}
    d, out = run(tes, {"colocated": list(tes)}, [job(0)], {"forwarding": {"accept_timeout_s": 0.5}})
    r = done_of(out)["r0"]
    assert (r.status, r.te) == ("completed", "te/1") and r.finish_s > 0.5


def test_every_te_failing_gives_up_after_max_attempts() -> None:
    tes = {f"te/{k}": {"behaviour": "fail_early"} for k in range(5)}
    _, out = run(tes, {"colocated": list(tes)}, [job(0)], {"max_attempts": 3})
    r = done_of(out)["r0"]
    assert r.status == "failed" and r.reason.startswith("gave up after 3 attempts")


def test_no_te_in_the_group_is_a_clear_failure() -> None:
    _, out = run({}, {"colocated": []}, [job(0)])
    assert "no TE for model 'm' (its TE group is empty)" in done_of(out)["r0"].reason
    _, out = run({}, {}, [job(0)], {"forwarding": {"ttft_deadline_s": 2.0}})  # never pushed
    r = done_of(out)["r0"]
    assert "no TE group for model 'm' was pushed in time" in r.reason and r.finish_s == 2.01


def test_a_job_before_the_first_membership_push_waits_for_it() -> None:
    _, out = run({"te/0": {}}, {}, [job(0)], extra=[(0.5, "je/0", TeGroupMembership(
        model=MODEL, role="colocated", tes=("te/0",)))])
    r = done_of(out)["r0"]
    assert r.status == "completed" and r.first_token_s > 0.5


def test_on_demand_offers_next_prefill_until_one_accepts() -> None:
    tes = {"p/0": {"behaviour": "reject"}, "p/1": {"behaviour": "reject_first", "n": 3}, "d/0": {}}
    cfg = {"policy": "least_load", "forwarding": {"ttft_deadline_s": 1.0, "retry_backoff_s": 0.01}}
    d, out = run(tes, {"prefill": ["p/0", "p/1"], "decode": ["d/0"]}, [job(0)], cfg)
    r = done_of(out)["r0"]
    assert r.status == "completed"
    offers = [(e.decision.policy, e.decision.chosen) for e in decisions(d) if e.phase == "prefill"]
    assert offers[:3] == [("least_load", "p/0"), ("on_demand", "p/1"), ("on_demand", "p/0")]  # sweeps: fewest streams
    assert offers[-1][1] == "p/1" and len(offers) == 8  # p/1 refused 3 times, accepted the 4th


def test_on_demand_times_out_at_the_ttft_deadline() -> None:
    tes = {"p/0": {"behaviour": "reject"}, "p/1": {"behaviour": "reject"}, "d/0": {}}
    cfg = {"forwarding": {"ttft_deadline_s": 0.2, "retry_backoff_s": 0.02}}
    _, out = run(tes, {"prefill": ["p/0", "p/1"], "decode": ["d/0"]}, [job(0)], cfg)
    r = done_of(out)["r0"]
    assert r.status == "failed" and r.reason.startswith("timeout: TTFT deadline 0.2s")
    assert 0.2 <= r.finish_s - r.arrival_s < 0.3


def test_on_demand_skips_a_dying_prefill() -> None:
    tes = {"p/0": {"behaviour": "dead"}, "p/1": {}, "d/0": {}}
    cfg = {"forwarding": {"accept_timeout_s": 0.05}}
    _, out = run(tes, {"prefill": ["p/0", "p/1"], "decode": ["d/0"]}, [job(0)], cfg)
    assert done_of(out)["r0"].status == "completed"


def test_local_queue_mode_treats_a_refusal_as_a_task_failure() -> None:
    tes = {"p/0": {"behaviour": "reject"}, "p/1": {"behaviour": "reject"}, "d/0": {}}
    cfg = {"forwarding": {"mode": "local_queue"}}
    _, out = run(tes, {"prefill": ["p/0", "p/1"], "decode": ["d/0"]}, [job(0)], cfg)
    r = done_of(out)["r0"]
    assert r.status == "failed" and "rejected by p/1: queue full: no free slot" in r.reason


def test_membership_push_removing_a_te_moves_its_tasks() -> None:
    d = SimDriver(5, sink=MemorySink())
    out: list[Any] = []
    d.on_external = lambda _t, env: out.append(env.msg)
    d.spawn("te/0", ScriptedTe, tpot_s=1.0)
    d.spawn("te/1", ScriptedTe)
    d.spawn("je/0", JobExecutor, config={})
    d.spawn("cm", ClusterManager, jes=["je/0"])
    from deepserve.actors.flowserve.messages import RegisterTe

    for te in ("te/0", "te/1"):
        d.inject("cm", RegisterTe(te=te, model=MODEL, role="colocated", dp_groups=1, npus=()), at=0.0)
    d.inject("je/0", job(0, out=10), at=0.01)
    d.inject("cm", RemoveTe(te="te/0", reason="health check failed"), at=0.5)
    d.run(until=60.0)
    r = done_of(out)["r0"]
    assert (r.status, r.te) == ("completed", "te/1")
    assert d.actor("je/0").state.groups[MODEL]["colocated"] == ["te/1"]


def test_batch_job_waits_behind_online_traffic_and_honours_its_deadline() -> None:
    items = tuple(BatchItem(request_id=f"b{i}", prompt=Prompt(num_tokens=100),
                            sampling=Sampling(max_tokens=2, target_output_tokens=2)) for i in range(4))
    batch = SubmitBatch(batch_id="B", model=MODEL, items=items, deadline_s=5.0, reply_to="ext/client")
    late = SubmitBatch(batch_id="L", model=MODEL, items=(BatchItem(request_id="l0", prompt=Prompt(num_tokens=1),
                       sampling=items[0].sampling),), deadline_s=0.05, reply_to="ext/client")
    cfg = {"batch_online_limit": 1, "batch_inflight": 2}
    online = [job(i, out=50) for i in range(3)]  # 0.5 s each, back to back
    d, out = run({"te/0": {}}, {"colocated": ["te/0"]}, online, cfg, gap_s=0.3,
                 extra=[(0.02, "je/0", batch), (0.02, "je/0", late)])
    done = done_of(out)
    online_end = max(done[f"r{i}"].finish_s for i in range(3))
    batch_starts = [e for e in decisions(d) if e.request_id.startswith("b")]
    assert len(batch_starts) == 4
    assert all(done[f"b{i}"].status == "completed" for i in range(4))
    assert min(done[f"b{i}"].finish_s for i in range(4)) > online_end - 0.5  # behind online
    assert "batch deadline 0.05s passed" in done["l0"].reason and [m for m in out if isinstance(m, BatchDone)] == [
        BatchDone(batch_id="L", completed=0, failed=1), BatchDone(batch_id="B", completed=4, failed=0)]


BEHAVIOURS = st.sampled_from(["ok", "reject", "dead", "fail_early", "fail_late"])


@settings(max_examples=25, deadline=None)
@given(st.lists(BEHAVIOURS, min_size=1, max_size=4), st.lists(BEHAVIOURS, min_size=1, max_size=2),
       st.sampled_from(["on_demand", "local_queue"]), st.integers(1, 12))
def test_any_te_behaviour_ends_every_request_exactly_once(colo: list[str], pd: list[str], mode: str,
                                                          n: int) -> None:
    tes = {f"c/{k}": {"behaviour": b} for k, b in enumerate(colo)}
    tes |= {f"p/{k}": {"behaviour": b} for k, b in enumerate(pd)}
    tes["d/0"] = {"behaviour": pd[0]}
    roles = {"colocated": [t for t in tes if t.startswith("c")], "prefill": [t for t in tes if t.startswith("p")],
             "decode": ["d/0"]}
    cfg = {"policy": "least_load", "forwarding": {"mode": mode, "ttft_deadline_s": 0.5, "accept_timeout_s": 0.1}}
    d, out = run(tes, roles, [job(i) for i in range(n)], cfg, gap_s=0.01)
    assert sorted(done_of(out)) == sorted(f"r{i}" for i in range(n))
    s = d.actor("je/0").state
    assert not s.jobs and sum(s.open.values()) == 0 and s.completed + s.failed == n


def test_same_seed_same_log_and_replay_is_identical() -> None:
    tes = {"c/0": {}, "c/1": {"behaviour": "fail_early"}, "p/0": {"behaviour": "reject_first", "n": 2},
           "d/0": {}}
    roles = {"colocated": ["c/0", "c/1"], "prefill": ["p/0"], "decode": ["d/0"]}
    heat = {"prefill_edges": [0, 512], "ratio_edges": [0.0], "values": [[-1.0], [1.0]]}
    cfg = {"policy": "combined", "heatmap": heat, "params": {"threshold": 1}}
    jobs = [job(i, prompt=300 * (1 + i % 3), blocks=(7, 8, i)) for i in range(12)]
    logs = []
    for _ in range(2):
        d, _out = run(tes, roles, jobs, cfg, gap_s=0.02)
        result = verify(MemoryLog(d.sink))
        assert result.identical, result.divergence
        logs.append([(s.input.actor, s.input.type, [e.payload for e in s.events]) for s in d.sink.steps])
    assert logs[0] == logs[1]
    import msgspec

    # The kernel on main encodes state with sorted keys (str keys only): the JE's state must encode.
    msgspec.msgpack.Encoder(order="deterministic").encode(d.actor("je/0").state)
    assert {e.decision.subgroup for e in decisions(d)} == {"colocated", "pd"}


def test_locality_follows_the_kv_events_a_te_publishes() -> None:
    from deepserve.actors.flowserve.rtc.kv_events import BlockRemoved, BlockStored, KVEventBatch

    stored = KVEventBatch(ts=0.0, events=(BlockStored(block_hashes=(11, 12, 13), parent_block_hash=None,
                                                      token_ids=(), block_size=128, medium="HBM"),))
    removed = KVEventBatch(ts=0.0, events=(BlockRemoved(block_hashes=(12, 13), medium="HBM"),))
    d = SimDriver(3, sink=MemorySink())
    out: list[Any] = []
    d.on_external = lambda _t, env: out.append(env.msg)
    d.spawn("je/0", JobExecutor, config={"policy": "locality"})
    for te in ("te/0", "te/1"):
        d.spawn(te, ScriptedTe)
    d.spawn("te/1/dp/0", Relay, dst="je/0")  # te/1's DP master publishing its RTC's events
    d.inject("je/0", TeGroupMembership(model=MODEL, role="colocated", tes=("te/0", "te/1")), at=0.0)
    d.inject("te/1/dp/0", stored, at=0.001)
    d.inject("je/0", job(0, blocks=(11, 12, 13, 14)), at=0.01)
    d.inject("te/1/dp/0", removed, at=1.0)
    d.inject("je/0", job(1, blocks=(11, 12, 99)), at=1.01)
    d.run(until=5.0)
    first, second = decisions(d)
    assert first.decision.chosen == "te/1" and first.decision.ranked[0].prefix_blocks == 3
    # te/1 dropped blocks 12, 13; te/0 holds nothing: te/1 still matches 1 block
    assert second.decision.chosen == "te/1" and second.decision.ranked[0].prefix_blocks == 1
    assert all(m.status == "completed" for m in done_of(out).values())


class Relay(Actor[None]):
    """Forwards whatever it is given to `dst` (a stand-in publisher under a TE's address)."""

    def __init__(self, dst: str) -> None:
        self.dst = dst

    def handle(self, ctx: Context, msg: Message) -> None:
        ctx.send(self.dst, msg)


def steps_of(d: SimDriver, actor: str, type_name: str) -> list[tuple[float, Any]]:
    """(virtual time, decoded event) of an actor's events of one type, in log order."""
    return [(s.input.t, decode(e.type, e.payload)) for s in d.sink.steps if s.input.actor == actor  # type: ignore[union-attr]
            for e in s.events if e.type == type_name]


def test_batch_forwarding_fills_an_idle_prefill_back_to_back_at_once() -> None:
    """P/D-Serve §3.5: 6 prefill tasks wait (the only prefill refuses everything); at t=1 a prefill
    with 3 free slots joins: it gets the 3 oldest back to back at t=1, the 4th offer is refused
    at t=1 too, and no sweep ran (the sweep backoff is 30 s). When its first task ends, the
    freed slot is offered the next waiting task at that same instant."""
    tes = {"p/busy": {"behaviour": "reject"}, "p/0": {"behaviour": "slots", "n": 3}, "d/0": {}}
    cfg = {"policy": "least_load", "forwarding": {"ttft_deadline_s": 60.0, "retry_backoff_s": 30.0,
                                                  "max_backoff_s": 30.0}}
    joined = TeGroupMembership(model=MODEL, role="prefill", tes=("p/busy", "p/0"))
    d, out = run(tes, {"prefill": ["p/busy"], "decode": ["d/0"]}, [job(i, prompt=1000) for i in range(6)],
                 cfg, gap_s=0.001, extra=[(1.0, "je/0", joined)])
    assert all(r.status == "completed" for r in done_of(out).values()) and len(done_of(out)) == 6
    fed = [(t, e.request_id) for t, e in steps_of(d, "je/0", "RouteDecided") if e.decision.policy == "batch_forwarding"]
    assert fed[:4] == [(1.0, "r0"), (1.0, "r1"), (1.0, "r2"), (1.0, "r3")]  # oldest first, one instant
    refused = [(t, e.request_id, e.te) for t, e in steps_of(d, "je/0", "OfferRefused") if t >= 1.0]
    assert refused[0] == (1.0, "r3", "p/0")  # the 4th offer met a full prefill: feeding stopped
    waits = [(t, e.request_id, e.front) for t, e in steps_of(d, "je/0", "PrefillWaiting")]
    assert (1.0, "r3", True) in waits  # r3 is the oldest waiting again
    first_end = min(t for t, e in steps_of(d, "je/0", "JePrefilled"))
    assert fed[4] == (first_end, "r3")  # the freed slot is filled at the instant it frees
    assert not [t for t, _ in steps_of(d, "je/0", "SweepMissed")]  # no fallback sweep was needed


def test_fallback_sweeps_back_off_under_overload() -> None:
    """50 tasks wait 5 s for a prefill that refuses everything. Before: every waiting task swept
    every prefill every `retry_backoff_s` (50 x 500 offers here). Now one sweep (the oldest task)
    per backoff, doubling from 10 ms to the 0.5 s cap, and new arrivals join the wait without
    offers: a few dozen offers in all; each task times out once, at its deadline."""
    tes = {"p/0": {"behaviour": "reject"}, "d/0": {}}
    cfg = {"forwarding": {"ttft_deadline_s": 5.0, "retry_backoff_s": 0.01, "max_backoff_s": 0.5}}
    d, out = run(tes, {"prefill": ["p/0"], "decode": ["d/0"]}, [job(i) for i in range(50)], cfg, gap_s=0.01)
    done = done_of(out)
    assert len(done) == 50 and all(r.reason.startswith("timeout: TTFT deadline 5s") for r in done.values())
    assert all(abs(r.finish_s - r.arrival_s - 5.0) < 1e-9 for r in done.values())
    offers = len(decisions(d))
    ticks = [t for t, _ in steps_of(d, "je/0", "SweepMissed")]
    gaps = [round(b - a, 6) for a, b in zip(ticks, ticks[1:], strict=False)]
    assert offers <= 30 and gaps[:5] == [0.02, 0.04, 0.08, 0.16, 0.32] and max(gaps) == 0.5


def test_cluster_manager_removing_tes_with_open_tasks_retries_or_fails_each_request_once() -> None:
    """Issue 6 §1 with the cluster manager's push (the stand-in's `RemoveTe`; the real manager
    pushes the same `TeGroupMembership`): at t=0.5 two colocated TEs and a prefill TE leave while
    holding tasks. A task that streamed nothing is retried on a TE still in the group; one that
    streamed fails its request with the reason; the removed TEs' late answers change nothing."""
    from deepserve.actors.flowserve.messages import RegisterTe

    d = SimDriver(5, sink=MemorySink())
    out: list[Any] = []
    d.on_external = lambda _t, env: out.append(env.msg)
    roles = {"c/slow": ("colocated", {"tpot_s": 1.0}), "c/ok": ("colocated", {}),
             "c/stream": ("colocated", {"behaviour": "stream", "tpot_s": 1.0}),
             "p/slow": ("prefill", {"tpot_s": 1.0}), "p/ok": ("prefill", {}), "d/0": ("decode", {})}
    for te, (_role, kw) in roles.items():
        d.spawn(te, ScriptedTe, **kw)
    d.spawn("je/0", JobExecutor, config={"policy": "round_robin"})
    d.spawn("cm", ClusterManager, jes=["je/0"])
    for te, (role, _kw) in roles.items():
        d.inject("cm", RegisterTe(te=te, model=MODEL, role=role, dp_groups=1, npus=()), at=0.0)
    # round robin over colocated + prefill in name order: c/ok, c/slow, c/stream, p/ok, p/slow
    for i in range(5):
        d.inject("je/0", job(i, out=10), at=0.01 + 0.001 * i, src="ext/client")
    for te in ("c/slow", "c/stream", "p/slow"):
        d.inject("cm", RemoveTe(te=te, reason="declared failed"), at=0.5)
    d.run(until=60.0)
    done = done_of(out)  # exactly one terminal state each
    first = {e.request_id: e.decision.chosen for e in reversed(decisions(d))}
    by_first = {first[r]: done[r] for r in done}
    assert len(done) == 5
    assert by_first["c/ok"].status == "completed" and by_first["p/ok"].status == "completed"
    assert (by_first["c/slow"].status, by_first["c/slow"].te) == ("completed", "c/ok")  # retried
    assert (by_first["p/slow"].status, by_first["p/slow"].te) == ("completed", "d/0")  # prefill retried
    streamed = by_first["c/stream"]
    assert streamed.status == "failed" and "after output streamed" in streamed.reason
    assert "c/stream left the colocated group" in streamed.reason
    # Ended by the JE, it records what the client was sent (a tour found output_tokens=0,
    # prompt_tokens=0 and no first token after "failed after 151 output tokens")
    assert streamed.output_tokens == 1 and streamed.first_token_s is not None
    assert streamed.prompt_tokens > 0
    assert d.actor("je/0").state.late >= 2  # the removed TEs' answers arrived later, ignored
    s = d.actor("je/0").state
    assert (s.completed, s.failed, sum(s.open.values()), s.jobs) == (4, 1, 0, {})
