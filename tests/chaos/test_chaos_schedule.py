"""A seed's fault schedule: drawn from the seed alone, every fault kind, valid targets, and every
fault stopped (links back up) before the window ends, so convergence can be asked for."""

from __future__ import annotations

from deepserve.adapters.scenario.faults import check_faults
from deepserve.adapters.scenario.loader import load_scenario
from deepserve.adapters.scenario.placement import place
from deepserve.chaos.schedule import TARGETS, WINDOW_S, draw, fault_kinds, injections, targets_of


def _targets(name: str = "pd-1p1d"):
    sc = load_scenario(name)
    placement = place(sc.cluster)
    return sc, placement, targets_of(sc.cluster.topology, placement, ("je/0", "je/1"))


def test_every_fault_kind_is_drawn_on_targets_the_cluster_has() -> None:
    sc, placement, t = _targets()
    assert set(fault_kinds()) == set(TARGETS), "a fault kind of the schema has no target rule here"
    seen: set[str] = set()
    for seed in range(200):
        faults = draw(seed, t)
        tes = [te.addr for te in placement.tes]
        assert check_faults(faults, sc.cluster.topology, placement.servers, tes, ["je/0", "je/1"]) == []
        assert "je/0" not in {f.target for f in faults}  # the first JE stays
        seen |= {f.kind for f in faults}
    assert seen == set(fault_kinds())
    assert set(t.npus) == {n for te in placement.tes for n in te.npus}


def test_same_seed_same_schedule_other_seed_other_schedule() -> None:
    _, _, t = _targets()
    assert draw(7, t) == draw(7, t)
    assert len({draw(s, t) for s in range(20)}) == 20


def test_faults_stop_inside_the_window_with_every_link_back_up() -> None:
    _, _, t = _targets()
    overlapping = 0
    for seed in range(300):
        faults = draw(seed, t)
        assert [f.at_s for f in faults] == sorted(f.at_s for f in faults)
        down: set[str] = set()
        for f in faults:
            end = f.at_s + (f.count or 0) * ((f.down_s or 0) + (f.up_s or 0))
            assert 0 <= f.at_s and end < WINDOW_S + 4.0  # a flap's last cycle may end a little after
            if f.kind in ("link-down", "link-degrade"):
                down.add(f.target)
            elif f.kind == "link-up":
                down.discard(f.target)
        assert not down, (seed, faults)
        targets = [f.target for f in faults if f.kind not in ("npu-reset", "link-up")]
        overlapping += len(targets) != len(set(targets))
    assert overlapping > 20  # several faults on one target at once, now and then


def test_injections_are_offset_to_the_clusters_start() -> None:
    _, _, t = _targets()
    faults = draw(3, t)
    got = injections(faults, 12.5)
    assert [at for at, _, _ in got] == [12.5 + f.at_s for f in faults]
