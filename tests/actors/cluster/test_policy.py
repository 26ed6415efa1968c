"""The cluster manager's and the heartbeat monitor's pure decisions, without actors."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from deepserve.actors.cluster import policy as P
from deepserve.actors.cluster.state import CmState, GroupRecord, TeRecord
from deepserve.actors.ports.pod import TeSlot

G = "m/colocated"


def slot(i: int, group: str = G) -> TeSlot:
    return TeSlot(te=f"te/{i}", group=group, model="m", role="colocated", server=0, host="hw/s0/host",
                  npus=(f"hw/s0/npu{i}",), tp=1, dp_groups=1, te_config={})  # fmt: skip


def cm(states: dict[str, str], target: int, group: str = G) -> CmState:
    s = CmState(groups={group: GroupRecord(model="m", role="colocated", target=target)})
    for te, state in states.items():
        s.tes[te] = TeRecord(te=te, group=group, generation=1, state=state, pod_id=f"{te}#g1", source="cold",  # type: ignore[arg-type]
                             launched_s=0.0, since_s=0.0)  # fmt: skip
    return s


def test_a_failed_ready_te_leaves_its_group_and_is_replaced() -> None:
    s = cm({"te/0": "ready", "te/1": "ready"}, target=2)
    out = P.on_te_failed(s, "te/1", 1, "3 heartbeats missed")
    assert out == [P.Fail("te/1", 1, "3 heartbeats missed"), P.Unwatch("te/1"), P.Push(G),
                   P.StopPodOnly("te/1", "generation 1 failed: 3 heartbeats missed"),
                   P.Launch("te/1", 2, "cold", replacing=True)]  # fmt: skip


def test_stale_or_repeated_failures_do_nothing() -> None:
    s = cm({"te/0": "ready"}, target=1)
    assert P.on_te_failed(s, "te/0", 7, "old generation") == []
    assert P.on_te_failed(s, "te/9", 1, "unknown") == []
    s.tes["te/0"].state = "failed"
    assert P.on_te_failed(s, "te/0", 1, "again") == []


def test_a_failed_te_the_group_no_longer_wants_is_stopped_not_replaced() -> None:
    s = cm({"te/0": "ready", "te/1": "ready"}, target=1)  # scaled down meanwhile
    out = P.on_te_failed(s, "te/1", 1, "dead")
    assert P.Stop("te/1", "generation 1 failed: dead") in out and not any(isinstance(a, P.Launch) for a in out)
    s = cm({"te/0": "draining"}, target=0)
    assert [type(a) for a in P.on_te_failed(s, "te/0", 1, "dead")] == [P.Fail, P.Unwatch, P.Push, P.Stop]


def test_a_te_failing_while_booting_is_not_pushed() -> None:
    s = cm({"te/0": "replacing"}, target=1)
    out = P.on_te_failed(s, "te/0", 1, "boot failed")
    assert P.Push(G) not in out and P.Launch("te/0", 2, "cold", replacing=True) in out


def test_a_failed_boot_backs_off_doubling_to_the_cap_and_never_gives_up() -> None:
    b = P.BootBackoff(base_s=1.0, max_s=30.0)
    assert [b.delay_s(n) for n in range(1, 10)] == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert b.delay_s(10_000) == 30.0  # bounded however long the slot keeps failing
    assert P.NO_BACKOFF.delay_s(5) == 0.0
    s = cm({"te/0": "replacing"}, target=1)
    s.tes["te/0"].boot_failures = 3  # this is the 4th failed boot in a row: wait 4 s
    out = P.on_te_failed(s, "te/0", 1, "boot failed: link s0/ssd is down", backoff=b)
    assert out[-1] == P.Backoff("te/0", 1, 4, 4.0) and not any(isinstance(a, P.Launch) for a in out)
    s = cm({"te/0": "ready"}, target=1)
    s.tes["te/0"].boot_failures = 3  # a serving TE that fails: replaced at once, no backoff
    assert P.on_te_failed(s, "te/0", 1, "crash", backoff=b)[-1] == P.Launch("te/0", 2, "cold", replacing=True)


def test_relaunch_after_a_backoff_only_while_the_group_wants_the_te() -> None:
    s = cm({"te/0": "failed", "te/1": "ready"}, target=2)
    assert P.on_relaunch(s, "te/0", 1) == [P.Launch("te/0", 2, "cold", replacing=True)]
    assert P.on_relaunch(s, "te/0", 0) == []  # a stale timer
    s.groups[G].target = 1  # scaled down during the wait
    assert P.on_relaunch(s, "te/0", 1) == [P.Stop("te/0", f"not relaunched: its group {G} is at its target")]
    s.tes["te/0"].state = "stopped"
    assert P.on_relaunch(s, "te/0", 1) == []


def test_registration_makes_a_booting_te_ready_pushed_and_watched() -> None:
    s = cm({"te/0": "starting"}, target=1)
    assert P.on_registered(s, "te/0") == [P.Ready("te/0", 1), P.Push(G), P.Watch("te/0", 1)]
    s.tes["te/0"].state = "ready"
    assert P.on_registered(s, "te/0") == []  # a second registration changes nothing


def test_scale_up_uses_free_slots_and_scale_down_drains_newest_ready_last() -> None:
    slots = tuple(slot(i) for i in range(4))
    s = cm({"te/0": "ready", "te/1": "ready"}, target=2)
    assert P.on_scale(s, slots, G, 4) == [P.Launch("te/2", 1, "cold"), P.Launch("te/3", 1, "cold")]
    s = cm({"te/0": "ready", "te/1": "ready", "te/2": "starting"}, target=3)
    out = P.on_scale(s, slots, G, 1)
    assert out == [P.Stop("te/2", f"scale {G} to 1: stopped while booting"), P.Drain("te/1", f"scale {G} to 1"), P.Push(G)]
    s = cm({"te/0": "ready", "te/1": "stopped"}, target=1)
    assert P.on_scale(s, slots, G, 2) == [P.Launch("te/1", 2, "cold")]  # a stopped slot is free again


def test_scale_refusals_name_the_field() -> None:
    slots = (slot(0), slot(1))
    s = cm({"te/0": "ready"}, target=1)
    [r] = P.on_scale(s, slots, G, 3)
    assert isinstance(r, P.Refuse) and r.reason.startswith("size: must be in [0, 2]")
    [r] = P.on_scale(s, slots, "x/decode", 1)
    assert isinstance(r, P.Refuse) and r.reason.startswith("group: no TE group 'x/decode'")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["starting", "replacing", "ready", "draining", "stopped", "failed"]), min_size=0,
                max_size=6), st.integers(0, 6))  # fmt: skip
def test_scale_reaches_the_target_count_exactly(states: list[str], size: int) -> None:
    slots = tuple(slot(i) for i in range(6))
    s = cm({f"te/{i}": x for i, x in enumerate(states)}, target=0)
    out = P.on_scale(s, slots, G, size)
    now = len(P.active(s, G))
    launched = sum(isinstance(a, P.Launch) for a in out)
    removed = sum(isinstance(a, P.Stop | P.Drain) for a in out)
    free = len(P.free_slots(s, slots, G))
    if size >= now:  # up: as many as the free slots allow
        assert removed == 0 and now + launched == min(size, now + free)
    else:  # down: exactly to the target, nothing launched
        assert launched == 0 and now - removed == size
    assert len({a.te for a in out if isinstance(a, P.Launch | P.Stop | P.Drain)}) == launched + removed


def test_heartbeat_tick_counts_consecutive_misses_and_declares_at_the_limit() -> None:
    w = {"te/0": P.Watched(generation=1, sent=4, acked=4), "te/1": P.Watched(generation=2, sent=4, acked=3, misses=1,
         reason="te/1/dp/0 did not answer the heartbeat: timeout after 0.5s"), "te/2": P.Watched(generation=1)}  # fmt: skip
    out = P.heartbeat_tick(w, misses_limit=3, interval_s=1.0)
    assert out.missed == (("te/1", 2, "te/1/dp/0 did not answer the heartbeat: timeout after 0.5s"),)
    assert out.failed == () and out.ping == ("te/0", "te/1", "te/2")
    w["te/1"].misses = 2
    out = P.heartbeat_tick(w, misses_limit=3, interval_s=1.0)
    assert out.failed == (("te/1", 2, "3 heartbeats missed in a row (last: te/1/dp/0 did not answer the heartbeat: "
                                     "timeout after 0.5s)"),) and out.ping == ("te/0", "te/2")  # fmt: skip
    silent = {"te/5": P.Watched(generation=1, sent=1)}
    assert P.heartbeat_tick(silent, 1, 0.25).failed == (("te/5", 1, "1 heartbeat missed (last: no answer "
                                                                    "within 0.25s)"),)  # fmt: skip


def test_drain_finishes_when_idle_or_at_the_timeout() -> None:
    assert P.drain_finished(0, 0, 0.1, 60) == "drained: no task left"
    assert P.drain_finished(1, 2, 10, 60) is None
    assert P.drain_finished(1, 2, 60, 60) == "drain timeout after 60s (1 waiting, 2 running)"
