"""Each routing policy alone on hand-built cases (DeepServe Algorithm 1's parts)."""

from __future__ import annotations

import pytest

from deepserve.actors.scheduling import Candidate, PdHeatmap, Policy, PromptTree, RouteRequest
from deepserve.actors.scheduling.forwarding import ForwardingParams, next_offer
from deepserve.actors.scheduling.locality import DRAM, HBM

REQ = RouteRequest(request_id="r1", prompt_tokens=1024, prompt_blocks=8)


def cands(*spec: tuple[str, int, int], sub: str = "colocated") -> tuple[Candidate, ...]:
    return tuple(Candidate(te=te, subgroup=sub, load=load, prefix_blocks=pre) for te, load, pre in spec)  # type: ignore[arg-type]


def test_round_robin_turns_through_candidates() -> None:
    cs = cands(("a", 9, 0), ("b", 0, 0), ("c", 0, 8))
    chosen = [Policy("round_robin").select(REQ, cs, t).chosen for t in range(4)]
    assert chosen == ["a", "b", "c", "a"]
    d = Policy("round_robin").select(REQ, cs, 1)
    assert [r.te for r in d.ranked] == ["b", "c", "a"]


def test_least_load_picks_fewest_open_tasks_ties_by_name() -> None:
    d = Policy("least_load").select(REQ, cands(("b", 1, 0), ("a", 1, 0), ("c", 3, 0)), 0)
    assert [r.te for r in d.ranked] == ["a", "b", "c"]
    assert d.chosen == "a"


def test_locality_picks_longest_prefix_then_load() -> None:
    d = Policy("locality", {"load_bound": 5}).select(REQ, cands(("a", 0, 2), ("b", 5, 6), ("c", 1, 6)), 0)
    assert d.chosen == "c"  # 6 blocks on b and c; c is less loaded
    assert [(r.te, r.prefix_blocks) for r in d.ranked] == [("c", 6), ("b", 6), ("a", 2)]
    assert "6 of 8" in d.reason and d.order_by == ("-prefix_blocks", "load")


def test_locality_does_not_herd_past_its_load_bound() -> None:
    """Every request sharing a first block went to the one TE holding it, however loaded."""
    hot = cands(("a", 9, 8), ("b", 4, 3), ("c", 0, 0))
    d = Policy("locality").select(REQ, hot, 0)  # default load_bound 4: a (9 > 0 + 4) is out
    assert d.chosen == "b" and d.params == {"load_bound": 4.0}
    assert [e.tes for e in d.excluded] == [("a",)] and "load_bound 4" in d.excluded[0].reason
    assert Policy("locality", {"load_bound": 9}).select(REQ, hot, 0).chosen == "a"
    with pytest.raises(ValueError, match="load_bound"):
        Policy("locality", {"load_bound": -1})


def test_pd_aware_and_combined_bound_the_load_on_the_heatmaps_subgroup() -> None:
    """The heatmap says PD; the one pair is busy decoding (decode_load): colocated takes it."""
    busy_pair = (cands(("co/0", 1, 0), ("co/1", 2, 0))
                 + (Candidate(te="p/0", subgroup="pd", load=0, decode_load=9),))
    long_short = RouteRequest(request_id="r", prompt_tokens=4096, predicted_bucket=0)
    for name in ("pd_aware", "combined"):
        d = Policy(name, heatmap=HEAT).select(long_short, busy_pair, 0)
        assert (d.subgroup, d.chosen) == ("colocated", "co/0"), name
        assert "subgroup_load_bound 4" in d.reason
        assert [(e.tes, e.reason) for e in d.excluded] == [(("p/0",), "not in the chosen subgroup (colocated)")]
        relaxed = Policy(name, {"subgroup_load_bound": 8}, heatmap=HEAT).select(long_short, busy_pair, 0)
        assert relaxed.chosen == "p/0"


def test_load_aware_keeps_locality_when_balanced_else_least_loaded() -> None:
    balanced = cands(("a", 3, 0), ("b", 5, 7))
    d = Policy("load_aware", {"threshold": 2}).select(REQ, balanced, 0)
    assert (d.chosen, d.imbalance) == ("b", 2)
    unbalanced = cands(("a", 3, 0), ("b", 6, 7))
    d = Policy("load_aware", {"threshold": 2}).select(REQ, unbalanced, 0)
    assert (d.chosen, d.imbalance) == ("a", 3)
    assert d.params == {"threshold": 2.0}
    assert "imbalance 3 > threshold 2" in d.reason


HEAT = PdHeatmap(prefill_edges=(0, 2048), ratio_edges=(0.0, 0.5),
                 values=((-0.2, -0.4), (0.6, -0.1)))


def test_pd_aware_uses_the_heatmap_cell_of_the_predicted_bucket() -> None:
    group = cands(("co/0", 0, 0), ("co/1", 2, 0)) + cands(("p/0", 4, 0), sub="pd")
    long_short = RouteRequest(request_id="r", prompt_tokens=4096, predicted_bucket=0)  # 64/4096
    d = Policy("pd_aware", heatmap=HEAT).select(long_short, group, 0)
    assert (d.subgroup, d.chosen) == ("pd", "p/0")
    assert d.heatmap_cell is not None and d.heatmap_cell.value == 0.6
    assert d.predicted_bucket == 0 and d.decode_ratio == pytest.approx(64 / 4096)
    long_long = RouteRequest(request_id="r", prompt_tokens=4096, predicted_bucket=20)  # 2624/4096
    d = Policy("pd_aware", heatmap=HEAT).select(long_long, group, 0)
    assert (d.subgroup, d.chosen) == ("colocated", "co/0")
    assert d.heatmap_cell is not None and d.heatmap_cell.ratio_lo == 0.5


def test_pd_aware_without_heatmap_on_a_mixed_group_is_an_error() -> None:
    group = cands(("co/0", 0, 0)) + cands(("p/0", 0, 0), sub="pd")
    with pytest.raises(ValueError, match="heatmap"):
        Policy("pd_aware").select(REQ, group, 0)
    d = Policy("pd_aware").select(REQ, cands(("co/0", 0, 0)), 0)  # one subgroup: no choice
    assert d.heatmap_cell is None and d.subgroup == "colocated"


def test_combined_runs_the_three_in_order() -> None:
    group = cands(("co/0", 0, 0), ("co/1", 0, 0)) + cands(("p/0", 9, 0), ("p/1", 1, 5), sub="pd")
    req = RouteRequest(request_id="r", prompt_tokens=4096, prompt_blocks=32, predicted_bucket=0)
    pol = Policy("combined", {"threshold": 10}, heatmap=HEAT)
    d = pol.select(req, group, 0)
    assert (d.subgroup, d.chosen, d.imbalance) == ("pd", "p/1", 8)  # balanced: prefix wins
    d = Policy("combined", {"threshold": 3}, heatmap=HEAT).select(req, group, 0)
    assert d.chosen == "p/1" and d.imbalance == 8 and "least loaded" in d.reason
    assert d.heatmap_cell is not None and [r.te for r in d.ranked] == ["p/1", "p/0"]


def test_bad_policy_names_and_params_name_the_field() -> None:
    with pytest.raises(ValueError, match="scheduling.policy: unknown policy 'fastest'"):
        Policy("fastest")
    with pytest.raises(ValueError, match="scheduling.params.treshold"):
        Policy("load_aware", {"treshold": 1})
    with pytest.raises(ValueError, match="threshold"):
        Policy("load_aware", {"threshold": -1})
    with pytest.raises(ValueError, match="no candidate"):
        Policy("least_load").select(REQ, (), 0)


def test_prompt_tree_longest_prefix_per_te_from_kv_events() -> None:
    from deepserve.actors.flowserve.rtc.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

    t = PromptTree()
    t.fold_kv_event("a", BlockStored(block_hashes=(1, 2, 3), parent_block_hash=None, token_ids=(),
                                     block_size=128, medium="HBM"))
    t.fold_kv_event("b", BlockStored(block_hashes=(1, 2), parent_block_hash=None, token_ids=(),
                                     block_size=128, medium="DRAM"))
    assert t.match((1, 2, 3, 4), ["a", "b", "c"]) == {"a": 3, "b": 2, "c": 0}
    t.fold_kv_event("a", BlockRemoved(block_hashes=(2,), medium="HBM"))
    assert t.match((1, 2, 3), ["a", "b"]) == {"a": 1, "b": 2}
    t.fold_kv_event("b", AllBlocksCleared())
    assert t.match((1, 2, 3), ["a", "b"]) == {"a": 1, "b": 0}
    assert t.nodes["1"] == {"a": HBM}
    t.insert("b", (1,), DRAM)
    assert t.nodes["1"] == {"a": HBM, "b": DRAM}


def test_prompt_tree_is_bounded() -> None:
    t = PromptTree(max_blocks=3)
    t.insert("a", (1, 2, 3, 4, 5))
    assert list(t.nodes) == ["3", "4", "5"]


def test_on_demand_offers_fewest_open_streams_first_until_deadline() -> None:
    p = ForwardingParams(ttft_deadline_s=1.0, retry_backoff_s=0.01)
    cs = cands(("p/0", 3, 0), ("p/1", 1, 0), ("p/2", 2, 0), sub="pd")
    assert next_offer(cs, (), 0.0, 0.0, p).te == "p/1"
    assert next_offer(cs, ("p/1",), 0.0, 0.0, p).te == "p/2"
    sweep = next_offer(cs, ("p/0", "p/1", "p/2"), 0.5, 0.0, p)
    assert sweep.te is None and sweep.wait_s == 0.01 and not sweep.stop
    late = next_offer(cs, ("p/1",), 1.0, 0.0, p)
    assert late.te is None and "TTFT deadline 1s" in late.stop
