"""Max-min fair sharing and completion times of concurrent flows."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from maxmin_reference import Q, max_min

from deepserve.adapters.hardware.fairshare import (
    Flow,
    MaxMinShare,
    completion_times_s,
    max_min_rates,
)


def test_single_link_is_split_evenly():
    assert max_min_rates({"a": 9.0}, {"x": ["a"], "y": ["a"], "z": ["a"]}) == pytest.approx(
        {"x": 3.0, "y": 3.0, "z": 3.0}
    )


def test_bottlenecked_flow_leaves_the_rest_to_others():
    rates = max_min_rates({"a": 10.0, "b": 2.0}, {"long": ["a", "b"], "short": ["a"]})
    assert rates == pytest.approx({"long": 2.0, "short": 8.0})


def test_classic_parking_lot():
    caps = {"l1": 10.0, "l2": 10.0}
    flows = {"through": ["l1", "l2"], "one": ["l1"], "two": ["l2"]}
    assert max_min_rates(caps, flows) == pytest.approx({"through": 5.0, "one": 5.0, "two": 5.0})


def test_no_flows():
    assert max_min_rates({"a": 1.0}, {}) == {}


def test_completion_times_reshare_when_a_flow_ends():
    flows = {"small": Flow(path=("a",), nbytes=10.0), "big": Flow(path=("a",), nbytes=30.0)}
    done = completion_times_s({"a": 10.0}, flows)
    # both at 5/s until small ends at t=2; big then has 20 left at 10/s
    assert done == pytest.approx({"small": 2.0, "big": 4.0})


def test_completion_times_with_late_start_and_empty_flow():
    flows = {
        "early": Flow(path=("a",), nbytes=20.0),
        "late": Flow(path=("a",), nbytes=10.0, start_s=1.0),
        "empty": Flow(path=("a",), nbytes=0.0, start_s=0.5),
    }
    done = completion_times_s({"a": 10.0}, flows)
    # early alone for 1 s (10 left), then both at 5/s: both finish at t=3
    assert done == pytest.approx({"early": 3.0, "late": 3.0, "empty": 0.5})


@pytest.mark.parametrize(
    ("caps", "flows", "message"),
    [
        ({"a": 0.0}, {"x": ["a"]}, "capacities: link 'a'"),
        ({"a": 1.0}, {"x": []}, "flows: flow 'x' has an empty path"),
        ({"a": 1.0}, {"x": ["b"]}, "flows: flow 'x' uses unknown link 'b'"),
        ({"a": 1.0}, {"x": ["a", "a"]}, "flows: flow 'x' crosses a link twice"),
    ],
)
def test_bad_input_names_the_field(caps, flows, message):
    with pytest.raises(ValueError, match=message):
        max_min_rates(caps, flows)


def test_negative_flow_size_rejected():
    with pytest.raises(ValueError, match="flows: flow 'x'"):
        completion_times_s({"a": 1.0}, {"x": Flow(path=("a",), nbytes=-1.0)})


# ---- the incremental allocator against the independent exact simulator ---------------------

_LINKS = [f"l{i}" for i in range(6)]
_op = st.one_of(
    st.tuples(st.just("add"), st.lists(st.sampled_from(_LINKS), min_size=1, max_size=3, unique=True)),
    st.tuples(st.just("remove"), st.integers(0, 40)),
    st.tuples(st.just("cap"), st.sampled_from(_LINKS), st.sampled_from([0.0, 0.5, 1.0, 3.0, 10.0])),
    st.tuples(st.just("burst"), st.lists(
        st.lists(st.sampled_from(_LINKS), min_size=1, max_size=3, unique=True), min_size=1, max_size=4,
    )),
)


@settings(max_examples=200, deadline=None)
@given(
    caps=st.lists(st.sampled_from([1.0, 2.0, 5.0, 7.5, 10.0]), min_size=6, max_size=6),
    ops=st.lists(_op, min_size=1, max_size=25),
)
def test_incremental_share_is_the_max_min_allocation_after_every_change(caps, ops):
    nominal = dict(zip(_LINKS, caps, strict=True))
    share = MaxMinShare()
    live: dict[str, tuple[str, ...]] = {}
    for n, op in enumerate(ops):
        before = dict(share.rates)
        if op[0] == "add":
            live[f"f{n}"] = tuple(op[1])
            changed = share.add(f"f{n}", op[1], lambda link: nominal[link])
        elif op[0] == "remove" and live:
            gone = sorted(live)[op[1] % len(live)]
            del live[gone]
            changed = share.remove(gone)
            before.pop(gone)
        elif op[0] == "burst":  # several flows start at the same instant: one repair
            batch = [(f"f{n}.{i}", tuple(p)) for i, p in enumerate(op[1])]
            live.update(batch)
            changed = share.add_many(batch, lambda link: nominal[link])
        elif op[0] == "cap":
            nominal[op[1]] = op[2]
            changed = share.set_capacity(op[1], op[2])
        else:
            continue
        exact = max_min({k: Q(v) for k, v in nominal.items()}, live)
        assert share.rates.keys() == live.keys()
        for f, rate in share.rates.items():
            assert rate == pytest.approx(float(exact[f]), rel=1e-9, abs=1e-12), (f, op)
        # `changed` names exactly the flows whose rate moved (the caller re-anchors those)
        moved = {f for f, r in share.rates.items() if before.get(f) != r}
        assert moved <= changed.keys() and all(share.rates[f] == r for f, r in changed.items())
        assert set(share.users) == {link for p in live.values() for link in p}
        _assert_remembered_bottlenecks(share)


def _assert_remembered_bottlenecks(share: MaxMinShare) -> None:
    """The repair skips a fixed flow whose remembered bottleneck did not move: so each flow's
    remembered link must be on its path, saturated, and carry no flow faster than it."""
    assert share.bneck.keys() == share.rates.keys()
    for f, link in share.bneck.items():
        assert link in share.paths[f], (f, link)
        on = [share.rates[g] for g in share.users[link]]
        assert sum(on) >= share.caps[link] * (1 - 1e-9), (f, link, "not saturated")
        assert share.rates[f] >= max(on) * (1 - 1e-9), (f, link, "a flow there gets more")


def test_a_change_touches_only_the_flows_that_share_links_with_it(monkeypatch):
    """Per-event work follows what changed: 2,000 flows on disjoint pairs of links, then one
    more on one pair: the repair water-fills only that pair's flows."""
    share = MaxMinShare()
    for i in range(2000):
        share.add(f"f{i}", (f"tx{i}", f"rx{i}"), lambda link: 10.0)
    filled: list[int] = []
    real_fill = MaxMinShare._fill

    def spy(self: MaxMinShare, region: dict, touched: dict, changed: dict) -> list[str]:
        filled.append(len(region))
        return real_fill(self, region, touched, changed)

    monkeypatch.setattr(MaxMinShare, "_fill", spy)
    changed = share.add("new", ("tx7", "rx7"), lambda link: 10.0)
    assert changed == {"f7": 5.0, "new": 5.0} and filled == [2]
    filled.clear()
    assert share.remove("f7") == {"new": 10.0} and filled == [1]
    filled.clear()
    assert share.set_capacity("tx9", 4.0) == {"f9": 4.0} and filled == [1]


def test_random_large_cases_agree_with_a_full_recompute():
    """Hundreds of flows on a UB-like fabric (each crosses a tx and an rx port): after a
    random history the incremental rates equal a from-scratch water-filling."""
    rng = random.Random(7)
    share = MaxMinShare()
    paths: dict[str, tuple[str, ...]] = {}
    for n in range(1500):
        if paths and rng.random() < 0.3:
            gone = rng.choice(sorted(paths))
            del paths[gone]
            share.remove(gone)
        else:
            s, t = rng.sample(range(192), 2)
            paths[f"f{n}"] = (f"{s}:tx", f"{t}:rx")
            share.add(f"f{n}", paths[f"f{n}"], lambda link: 50.0)
    caps = {link: 50.0 for p in paths.values() for link in p}
    full = max_min_rates(caps, paths)
    assert len(paths) > 300
    for f, rate in full.items():
        assert share.rates[f] == pytest.approx(rate, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    ports=st.integers(4, 40),
    steps=st.integers(30, 250),
    degrade=st.floats(0.1, 1.0),
)
def test_repairs_on_a_busy_port_fabric_keep_the_exact_allocation(seed, ports, steps, degrade):
    """UB-like fabric (every flow crosses a tx and an rx port, some ports degraded), flows
    starting and ending at random, bursts, a capacity change now and then: after every repair
    the rates are the exact max-min allocation and every remembered bottleneck holds — the
    multi-round repairs (a region that grows) are where a stale bottleneck would hide."""
    rng = random.Random(seed)
    nominal = {f"{i}:{d}": (degrade if i % 3 == 0 else 1.0) * 40.0 for i in range(ports) for d in ("tx", "rx")}
    share, live = MaxMinShare(), {}
    for n in range(steps):
        roll = rng.random()
        if live and roll < 0.4:
            gone = rng.choice(sorted(live))
            del live[gone]
            share.remove(gone)
        elif roll < 0.95:
            batch = []
            for i in range(1 if roll < 0.85 else rng.randint(2, 5)):
                s, t = rng.sample(range(ports), 2)
                batch.append((f"f{n}.{i}", (f"{s}:tx", f"{t}:rx")))
            live.update(batch)
            share.add_many(batch, lambda link: nominal[link])
        else:
            link = rng.choice(sorted(nominal))
            nominal[link] = rng.choice([0.5, 10.0, 40.0, 80.0])
            share.set_capacity(link, nominal[link])
        exact = max_min({k: Q(v) for k, v in nominal.items()}, live) if n % 25 == 0 or n == steps - 1 else None
        if exact is not None:
            for f, rate in share.rates.items():
                assert rate == pytest.approx(float(exact[f]), rel=1e-9, abs=1e-12), (f, n)
        _assert_remembered_bottlenecks(share)
