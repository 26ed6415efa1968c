"""The recovery ladder's pure decisions (actors/cluster/ladder.py), without a driver: a 2P2D
cluster, prefills te/0, te/1 on server 0, decodes te/2, te/3 on server 1, server 2 spare."""

from __future__ import annotations

import msgspec
import pytest

from deepserve.actors.cluster import ladder as L
from deepserve.actors.cluster import policy as P
from deepserve.actors.cluster.state import GroupRecord, GroupTarget, TeRecord
from deepserve.actors.ports.pod import TeSlot

PG, DG = "m/prefill", "m/decode"
NO = P.NO_BACKOFF


def slot(i: int, role: str, server: int) -> TeSlot:
    npu = f"hw/s{server}/npu{i % 2}"
    master = {"npus": [npu], "host": f"hw/s{server}/host", "te": f"te/{i}"}
    return TeSlot(te=f"te/{i}", group=f"m/{role}", model="m", role=role, server=server,  # type: ignore[arg-type]
                  host=f"hw/s{server}/host", npus=(npu,), tp=1, dp_groups=1,
                  te_config={"te": f"te/{i}", "role": role, "dps": [master]})  # fmt: skip


SLOTS = {s.te: s for s in (slot(0, "prefill", 0), slot(1, "prefill", 0), slot(2, "decode", 1), slot(3, "decode", 1))}


def world(states: dict[str, str] | None = None) -> L.LadderState:
    st = L.LadderState(groups={PG: GroupRecord(model="m", role="prefill", target=2),
                               DG: GroupRecord(model="m", role="decode", target=2)})  # fmt: skip
    for te, s in SLOTS.items():
        st.tes[te] = TeRecord(te=te, group=s.group, generation=1, state=(states or {}).get(te, "ready"),  # type: ignore[arg-type]
                              pod_id=f"{te}#g1", source="resident", launched_s=0.0, since_s=0.0)  # fmt: skip
    return st


def decide(rung: str, te: str, diagnosis: str, st: L.LadderState | None = None) -> list[L.Action]:
    cfg = L.Recovery(rung=rung, spare_servers=1)  # type: ignore[arg-type]
    return L.on_failed(st or world(), SLOTS, cfg, (2,), te, 1, "why", diagnosis, "cold", NO)


def notes(out: list[L.Action], cls: type) -> list[object]:
    return [a.event for a in out if isinstance(a, L.Note) and isinstance(a.event, cls)]


def apply(st: L.LadderState, out: list[L.Action]) -> None:
    for a in out:
        if isinstance(a, L.Note):
            if isinstance(a.event, GroupTarget):
                st.groups[a.event.group].target = a.event.size
            else:
                L.evolve(st, a.event)


def test_replace_is_today_s_decision_exactly_and_records_nothing_new() -> None:
    for diagnosis in ("device-lost", "hang", "exited"):
        assert decide("replace", "te/2", diagnosis) == P.on_te_failed(world(), "te/2", 1, "why", "cold", diagnosis, NO)


def test_a_healthy_node_under_any_rung_but_restart_world_replaces_in_place() -> None:
    for rung in ("pd-separate", "substitute"):
        out = decide(rung, "te/2", "exited")  # a process exit: the node is fine
        assert notes(out, L.NodeTainted) == [] and notes(out, L.TeRelocated) == []
        assert out[-1] == P.Launch("te/2", 2, "cold", replacing=True)
        assert not any(isinstance(a, P.Stop) for a in out)  # nobody else touched
        (chose,) = notes(out, L.LadderChose)
        assert chose.rung == rung and "in place" in chose.action  # type: ignore[attr-defined]


def test_pd_separate_kills_a_prefill_to_preserve_a_decode_on_a_tainted_node() -> None:
    st = world()
    out = decide("pd-separate", "te/2", "device-lost", st)
    assert notes(out, L.NodeTainted) == [L.NodeTainted(server=1, reason="te/2 failed: device-lost (why)")]
    (moved,) = notes(out, L.TeRelocated)
    assert (moved.te, moved.server, moved.npus) == ("te/2", 0, ("hw/s0/npu1",))  # type: ignore[attr-defined]
    stops = [a.te for a in out if isinstance(a, P.Stop)]
    assert stops == ["te/1"]  # the last ready prefill; the other decode untouched
    assert notes(out, GroupTarget) == [GroupTarget(group=PG, model="m", role="prefill", size=1)]
    assert out[-1] == P.Launch("te/2", 2, "cold", replacing=True)
    apply(st, out)
    relocated = L.slot_of(st, SLOTS["te/2"])
    assert relocated.npus == ("hw/s0/npu1",) and relocated.host == "hw/s0/host" and relocated.server == 0
    assert relocated.te_config["dps"][0] == {"npus": ["hw/s0/npu1"], "host": "hw/s0/host", "te": "te/2"}


def test_pd_separate_a_prefill_on_a_tainted_node_stays_down_and_no_decode_is_touched() -> None:
    out = decide("pd-separate", "te/0", "hang")
    assert [a.te for a in out if isinstance(a, P.Stop)] == ["te/0"]
    assert not any(isinstance(a, P.Launch) for a in out)
    assert notes(out, GroupTarget) == [GroupTarget(group=PG, model="m", role="prefill", size=1)]


def test_pd_separate_with_no_prefill_left_the_decode_stays_down() -> None:
    out = decide("pd-separate", "te/2", "device-lost", world({"te/0": "stopped", "te/1": "failed"}))
    assert [a.te for a in out if isinstance(a, P.Stop)] == ["te/2"] and not any(isinstance(a, P.Launch) for a in out)
    assert "no prefill TE" in notes(out, L.LadderChose)[0].action  # type: ignore[attr-defined]


def test_substitute_moves_exactly_the_failed_te_to_the_spare_server() -> None:
    st = world()
    out = decide("substitute", "te/3", "device-lost", st)
    (moved,) = notes(out, L.TeRelocated)
    assert (moved.te, moved.server, moved.npus) == ("te/3", 2, ("hw/s2/npu1",))  # type: ignore[attr-defined]
    assert not any(isinstance(a, P.Stop) for a in out) and out[-1] == P.Launch("te/3", 2, "cold", replacing=True)
    apply(st, out)
    # the spare pool has one server: a second tainted failure finds it used
    st.tes["te/3"].state = "ready"
    again = decide("substitute", "te/2", "device-lost", st)
    assert "spare pool is empty" in notes(again, L.LadderChose)[0].action  # type: ignore[attr-defined]
    assert [a.te for a in again if isinstance(a, P.Stop)] == ["te/2"]


def test_restart_world_stops_everyone_and_launches_decodes_before_prefills() -> None:
    st = world()
    out = decide("restart-world", "te/0", "exited", st)
    assert [a.te for a in out if isinstance(a, P.Stop)] == ["te/1", "te/2", "te/3"]
    assert [a.te for a in out if isinstance(a, P.Launch)] == ["te/2", "te/3"]
    (restart,) = notes(out, L.WorldRestarted)
    assert restart.queued == ("te/0", "te/1")  # type: ignore[attr-defined]
    apply(st, out)
    for te in ("te/1", "te/2", "te/3"):
        st.tes[te].state = "stopped"
    st.tes["te/2"].state, st.tes["te/3"].state = "ready", "replacing"
    assert L.on_ready(st, SLOTS, "te/2") == []  # te/3 still boots
    st.tes["te/3"].state = "ready"
    resumed = L.on_ready(st, SLOTS, "te/3")
    assert resumed[0] == L.Note(L.WorldResumed(model="m", launched=("te/0", "te/1")))
    assert [a.te for a in resumed if isinstance(a, P.Launch)] == ["te/0", "te/1"]


def test_restart_world_a_decode_on_a_tainted_node_takes_a_prefill_s_npus() -> None:
    out = decide("restart-world", "te/2", "device-lost")
    (moved,) = notes(out, L.TeRelocated)
    assert (moved.te, moved.npus) == ("te/2", ("hw/s0/npu1",))  # type: ignore[attr-defined]
    assert notes(out, L.WorldRestarted)[0].queued == ("te/0",)  # type: ignore[attr-defined]
    assert [a.te for a in out if isinstance(a, P.Launch)] == ["te/2", "te/3"]


def test_boot_failures_and_stale_declarations_go_the_default_way() -> None:
    st = world({"te/2": "replacing"})
    assert decide("substitute", "te/2", "device-lost", st) == P.on_te_failed(st, "te/2", 1, "why", "cold",
                                                                              "device-lost", NO)  # fmt: skip
    assert decide("pd-separate", "te/2", "device-lost", world({"te/2": "failed"})) == []


@pytest.mark.parametrize(("doc", "says"), [
    ({"rung": "restart"}, "rung"),
    ({"spare_servers": -1}, "spare_servers"),
    ({"taint": ["crash"]}, "taint"),
    ({"rungs": "replace"}, "rungs"),
])  # fmt: skip
def test_a_bad_recovery_section_names_its_field(doc: dict[str, object], says: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=says):
        msgspec.convert(doc, L.Recovery)


def test_a_repaired_node_brings_back_what_the_ladder_took_down_on_free_npus() -> None:
    st = world()
    out = decide("pd-separate", "te/2", "device-lost", st)
    assert L.Repair(1, 60.0) in out  # the node's repair is due node_repair_s later
    apply(st, out)
    st.tes["te/1"].state, st.tes["te/2"].state = "stopped", "ready"
    assert st.down == {PG: ["te/1"]} and st.groups[PG].target == 1
    back = L.on_repaired(st, SLOTS, 1)
    assert back[0] == L.Note(L.NodeRepaired(server=1))
    # te/1's own NPU is te/2's now: it takes the one te/2 left on the repaired server
    (moved,) = notes(back, L.TeRelocated)
    assert (moved.te, moved.npus) == ("te/1", ("hw/s1/npu0",))  # type: ignore[attr-defined]
    assert notes(back, GroupTarget) == [GroupTarget(group=PG, model="m", role="prefill", size=2)]
    assert back[-1] == P.Launch("te/1", 2, "cold", replacing=True)
    apply(st, back)
    assert st.tainted == {} and st.down == {}
    assert L.on_repaired(st, SLOTS, 1) == []  # once


def test_no_repair_when_node_repair_s_is_zero() -> None:
    cfg = L.Recovery(rung="pd-separate", node_repair_s=0.0)
    out = L.on_failed(world(), SLOTS, cfg, (), "te/2", 1, "why", "device-lost", "cold", NO)
    assert not any(isinstance(a, L.Repair) for a in out) and notes(out, L.NodeTainted)


def test_pd_separate_scales_a_decode_of_several_dp_groups_in_vertically() -> None:
    two = {**SLOTS, "te/2": msgspec.structs.replace(SLOTS["te/2"], dp_groups=2)}
    cfg = L.Recovery(rung="pd-separate")
    st = world()
    why = "its heartbeat said: te/2/dp/1: device lost: hw/s1/npu1 crashed"
    out = L.on_failed(st, two, cfg, (), "te/2", 1, why, "device-lost", "cold", NO)
    # not failed: no Fail, no push, no stop nor launch — dp/1 dropped, the TE watched again
    assert [type(a) for a in out] == [L.Note, L.Note, L.DropDp, P.Watch]
    assert notes(out, L.TeScaledIn) == [L.TeScaledIn(te="te/2", generation=1, dp=1, dps_left=1)]
    assert out[2:] == [L.DropDp("te/2", 1), P.Watch("te/2", 1)]
    apply(st, out)
    # the last group left: nothing to scale in to, the TE fails over as the rung says
    again = L.on_failed(st, two, cfg, (), "te/2", 1, "te/2/dp/0: device lost", "device-lost", "cold", NO)
    assert isinstance(again[0], P.Fail) and notes(again, L.TeScaledIn) == []
    # a hang, a one-group decode or a prefill: the other paths
    for te, slots, diagnosis in (("te/2", two, "hang"), ("te/2", SLOTS, "device-lost")):
        assert notes(L.on_failed(world(), slots, cfg, (), te, 1, why, diagnosis, "cold", NO), L.TeScaledIn) == []


def test_a_scale_up_does_not_launch_on_npus_a_moved_te_holds_nor_on_a_tainted_node() -> None:
    st = world()
    apply(st, decide("pd-separate", "te/2", "device-lost", st))  # te/2 on te/1's NPU, s1 tainted
    st.tes["te/1"].state = "stopped"
    slots = tuple(SLOTS.values())
    assert L.blocked_slots(st, slots) == frozenset({"te/1"})
    assert P.on_scale(st, slots, PG, 2, blocked=L.blocked_slots(st, slots)) == []  # nothing launched on it
    assert P.on_scale(st, slots, PG, 2) == [P.Launch("te/1", 2, "cold")]  # what it did before
    st.tes["te/3"].state = "stopped"  # a slot on the tainted node
    assert L.blocked_slots(st, slots) == frozenset({"te/1", "te/3"})
    assert L.blocked_slots(world(), slots) == frozenset()
