"""The JE's global prompt tree mirrors the TEs' real KV cache events (issue 6 §2): the DP masters
publish `KVEventBatch`es to the JEs that subscribed, the JE folds them. Checked on whole simulated
runs of real FlowServe TEs: at the end the tree holds exactly the blocks (per TE, per DP rank, per
tier) the masters' RTCs hold — stored blocks appear, evicted ones are gone — and routing on it
finds at least the hits routing guesses (ROUTED) find."""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.actors.flowserve.master.kv_publish import (
    MAX_SUBSCRIBERS,
    KvPublisher,
    SubscribeKvEvents,
)
from deepserve.actors.flowserve.rtc.kv_events import index_view
from deepserve.actors.scheduling.locality import DRAM, HBM, ROUTED, PromptTree, rank_shift
from deepserve.adapters.scenario.loader import load_scenario
from deepserve.cluster.run import RunResult, run_scenario


class KvCounter:
    """A log sink counting the KV events the JEs folded, by kind."""

    def __init__(self) -> None:
        self.kinds: dict[str, int] = {}

    def begin_run(self, run: Any) -> None:
        pass

    def append(self, step: Any) -> int:
        for ev in step.events:
            if ev.type == "KvEventsFolded":
                for k in msgspec.msgpack.decode(ev.payload)["batch"]["events"]:
                    self.kinds[k["type"]] = self.kinds.get(k["type"], 0) + 1
        return 0

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def expected_tree(driver: Any) -> dict[tuple[str, str], int]:
    """(chain hash, TE) -> medium bits, from every DP master's RTC index."""
    exp: dict[tuple[str, str], int] = {}
    for addr, cell in driver.cells.items():
        parts = addr.split("/")
        if len(parts) != 4 or parts[2] != "dp" or cell.actor is None:
            continue
        te, rank = "/".join(parts[:2]), int(parts[3])
        for h, (_parent, hbm, dram) in index_view(cell.actor.state.rtc).items():
            bits = ((HBM if hbm else 0) | (DRAM if dram else 0)) << rank_shift(rank)
            if bits:
                exp[str(h), te] = exp.get((str(h), te), 0) | bits
    return exp


def run(requests: int, *overrides: str, sink: Any = None) -> tuple[RunResult, dict[str, Any]]:
    s = load_scenario("mooncake-16te", ["scheduling.policy=load_aware", *overrides])
    seen: dict[str, Any] = {}

    def end(driver: Any) -> None:
        je = driver.actor("je/0").state
        tree = je.trees[s.cluster.model]
        seen["have"] = {(h, te): b for h, holders in tree.nodes.items() for te, b in holders.items()}
        seen["expected"] = expected_tree(driver)
        seen["publishing"] = sorted(je.publishing)

    return run_scenario(s, requests=requests, on_end=end, sink=sink), seen


def test_the_tree_equals_the_tes_caches_stored_and_evicted_per_dp_rank_and_tier() -> None:
    counter = KvCounter()
    # 4 TEs x 2 DP groups, 300 HBM blocks a group and a DRAM tier: blocks are stored, evicted
    # from HBM, swapped to DRAM and dropped from it.
    r, seen = run(200, "cluster.tes=4", "cluster.dp_groups=2", "cluster.scheduler.kv_blocks=300", sink=counter)
    assert r.summary["completed"] == 200
    assert seen["publishing"] == [f"te/{k}" for k in range(4)]
    assert counter.kinds.get("BlockStored", 0) > 100 and counter.kinds.get("BlockRemoved", 0) > 100
    assert seen["have"] and seen["have"] == seen["expected"]  # no stale block, no missing one
    assert not any(b & ROUTED for b in seen["have"].values())  # the guesses gave way to events


def test_routing_on_real_events_keeps_the_hit_rate_of_routing_guesses_within_noise() -> None:
    base = ("cluster.tes=8", "cluster.kv_dram_gb=0")
    ev, seen = run(300, *base)
    routed, seen_routed = run(300, *base, "scheduling.kv_events=false")
    for label, x in (("events", ev), ("routed only", routed)):
        print(label, {k: round(x.summary[k], 4) for k in ("prefix_hit_rate", "ttft_ms_p50", "ttft_ms_p99")})
    assert ev.summary["completed"] == routed.summary["completed"] == 300
    assert seen["have"] == seen["expected"]
    assert seen_routed["publishing"] == [] and seen_routed["have"] != seen_routed["expected"]  # stale guesses
    # On 300 requests the two hit rates differ by the NPUs' variance draws more than by the
    # routing signal: events / routed = 0.91-1.12 over seeds 0-3 and variance off, on both the
    # previous and the current NPU variance stream (measured 2026-11-23, sim-npu); so this checks
    # that real events never cost much, not that they always win
    assert ev.summary["prefix_hit_rate"] >= 0.85 * routed.summary["prefix_hit_rate"]


def test_the_tree_keeps_dp_ranks_apart_and_forgets_a_te() -> None:
    from deepserve.actors.flowserve.rtc.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

    t = PromptTree()
    t.insert("te/0", (1, 2))  # a routing guess
    t.drop_routed("te/0")
    assert t.nodes == {}
    for rank in (0, 1):
        t.fold_kv_event("te/0", BlockStored(block_hashes=(1, 2), parent_block_hash=None, token_ids=(),
                                            block_size=128, medium="HBM"), rank)  # fmt: skip
    t.fold_kv_event("te/0", BlockRemoved(block_hashes=(2,), medium="HBM"), 0)
    assert t.match((1, 2), ["te/0"]) == {"te/0": 2}  # rank 1 still holds block 2
    t.fold_kv_event("te/0", AllBlocksCleared(), 1)
    assert t.match((1, 2), ["te/0"]) == {"te/0": 1} and t.nodes["1"] == {"te/0": HBM}
    t.insert("te/1", (1,))
    t.forget("te/0")
    assert t.nodes == {"1": {"te/1": ROUTED}}


def test_the_publisher_sends_nothing_without_subscribers_and_bounds_them() -> None:
    p = KvPublisher(block_tokens=128, dp=0)
    assert p.subscribers == ()

    class Ctx:  # a context that applies what the publisher records (the real one: the runs above)
        def __init__(self) -> None:
            self.events: list[Any] = []

        def record(self, e: Any) -> None:
            self.events.append(e)
            p.evolve(e)

    ctx = Ctx()
    for k in range(MAX_SUBSCRIBERS + 3):
        p.subscribe(ctx, SubscribeKvEvents(subscriber=f"je/{k}"))  # type: ignore[arg-type]
    p.subscribe(ctx, SubscribeKvEvents(subscriber="je/0"))  # type: ignore[arg-type]
    assert len(p.subscribers) == MAX_SUBSCRIBERS and p.refused == 3 and len(ctx.events) == MAX_SUBSCRIBERS
    p.subscribe(ctx, SubscribeKvEvents(subscriber="je/0", subscribe=False))  # type: ignore[arg-type]
    assert "je/0" not in p.subscribers
