"""The TE shell: DP groups spawned and balanced, registration and load reports, context caching."""

from __future__ import annotations

import msgspec
from fsharness import assert_replays, driver, out_to
from fswire import MODEL, REQ, hardware, master_config, task
from hypothesis import given
from hypothesis import strategies as st

from deepserve.actors.flowserve.balancer import Pending, assign, balance_quality
from deepserve.actors.flowserve.master.messages import DpStatus, DpStatusQuery
from deepserve.actors.flowserve.messages import (
    ContextInfo,
    CreateContext,
    DeleteContext,
    DpLoad,
    GetContext,
    RegisterTe,
    TaskAccepted,
    TaskFinished,
    TeLoadReport,
)
from deepserve.actors.flowserve.te_shell import TeShell

TE = "te/0"
CM = "ext/cm"


def shell_config(groups: int, balancer: str = "collaborative", cm: str | None = CM, **kw):
    dps = [master_config(npus=(f"hw/s0/npu{i}",), dp=i, te=TE, **kw) for i in range(groups)]
    return dict(te=TE, dps=dps, balancer=balancer, cluster_manager=cm, report_interval_s=0.5)


def _load(dp, used=0, reserved=0, running=0, waiting=0, prefill=0, total=100, seqs=8):
    return DpLoad(dp=dp, waiting=waiting, running=running, kv_blocks_used=used,
                  kv_blocks_total=total, kv_blocks_reserved=reserved, prompt_tokens=0,
                  cached_prompt_tokens=0, prefill_tokens_waiting=prefill, max_num_seqs=seqs)  # fmt: skip


def test_prefill_policy_follows_prefix_hits_and_queued_work() -> None:
    loads = [_load(0, prefill=1000), _load(1), _load(2)]
    # no hits: the idle groups first, then spreading
    assert assign(loads, [Pending(512, 10, (0, 0, 0))] * 3, 128, "collaborative") == [1, 2, 1]
    # group 0 holds 7 of the 8 blocks: 128 uncached tokens + 1000 queued beats 1024 uncached
    assert assign(loads, [Pending(1024, 10, (7, 0, 0))], 128, "collaborative") == [1]
    assert assign([_load(0), _load(1)], [Pending(1024, 10, (7, 0))], 128, "collaborative") == [0]


def test_decode_policy_excludes_full_groups_then_lowest_kv_with_reservations() -> None:
    loads = [_load(0, used=10, running=8), _load(1, used=30, reserved=40), _load(2, used=50)]
    picks = assign(loads, [Pending(256, 128, (0, 0, 0), decode=True)], 128, "collaborative")
    assert picks == [2]  # group 0 is at its batch limit; group 1's reservations make it fuller
    assert assign(loads, [Pending(1, 1, (0, 0, 0))] * 4, 128, "round_robin", rr_next=2) == [2, 0, 1, 2]


def test_a_group_whose_device_is_lost_gets_nothing_while_another_can_take_it() -> None:
    lost = msgspec.structs.replace(_load(0), device_lost="hw/s0/npu0: hbm_fault: HBM region 'kv' is faulted")
    # group 0 holds every prefix block and is idle, group 1 is busy: the live group still wins
    assert assign([lost, _load(1, prefill=5000)], [Pending(1024, 10, (8, 0))] * 3, 128, "collaborative") == [1, 1, 1]
    # decode: group 1 at its batch limit is still preferred to a lost group
    assert assign([lost, _load(1, running=8)], [Pending(256, 128, (0, 0), decode=True)], 128, "collaborative") == [1]
    # every group lost: one is picked all the same (its master refuses, naming the device)
    assert assign([lost, lost], [Pending(256, 128, (0, 0))], 128, "collaborative") == [0]


@given(st.lists(st.integers(1, 4000), min_size=1, max_size=40), st.integers(1, 5))
def test_every_request_gets_a_group_and_bursts_spread(sizes: list[int], groups: int) -> None:
    loads = [_load(g, total=10_000, seqs=1000) for g in range(groups)]
    picks = assign(loads, [Pending(n, 64, (0,) * groups) for n in sizes], 128, "collaborative")
    assert len(picks) == len(sizes) and all(0 <= p < groups for p in picks)
    if len(sizes) >= groups:
        assert len(set(picks)) == groups  # nobody idles while a burst is placed


def _balance_run(balancer: str) -> float:
    d = driver(seed=1)
    hardware(d)
    d.spawn(TE, TeShell, config=shell_config(4, balancer, cm=None, hbm_blocks=600))
    for i in range(48):  # a long prompt every 4th: round-robin piles them on one group
        n = 6000 if i % 4 == 0 else 300
        d.inject(TE, task(i, n, 200 if i % 4 == 0 else 60), at=0.02 * i, src=REQ)
    probes = [0.3 + 0.1 * k for k in range(20)]
    for k, t in enumerate(probes):
        for g in range(4):
            d.inject(f"{TE}/dp/{g}", DpStatusQuery(req_id=f"p{k}"), at=t, src="ext/probe")
    d.run()
    fin = [m for _, m in out_to(d, REQ) if isinstance(m, TaskFinished)]
    assert len(fin) == 48 and all(f.status == "completed" for f in fin)
    assert_replays(d)
    by_probe: dict[str, list[DpLoad]] = {}
    for _, m in out_to(d, "ext/probe"):
        assert isinstance(m, DpStatus)
        by_probe.setdefault(m.req_id, []).append(m.load)
    qualities = [balance_quality(v) for v in by_probe.values() if any(x.kv_blocks_used for x in v)]
    return sum(qualities) / len(qualities)


def test_the_balancer_spreads_kv_better_than_round_robin() -> None:
    rr, bal = _balance_run("round_robin"), _balance_run("collaborative")
    print(f"max/mean KV usage across 4 DP groups: round-robin {rr:.2f}, balancer {bal:.2f}")
    assert bal < rr


def test_registration_load_reports_and_context_caching() -> None:
    d = driver()
    hardware(d)
    d.spawn(TE, TeShell, config=shell_config(2))
    ctx_task = task(100, 1024, 1)
    create = CreateContext(req_id="c1", context_id="doc", model=MODEL, prompt=ctx_task.prompt)
    d.inject(TE, create, at=0.0, src=REQ)
    d.inject(TE, GetContext(req_id="g1", context_id="doc"), at=0.5, src=REQ)
    # a prompt that starts with the context: routed to its group, prefix served from the cache
    extended = ctx_task.prompt.block_hashes + task(101, 512, 1).prompt.block_hashes
    user = task(1, 1536, 8, hashes=extended, context_id="doc")
    d.inject(TE, user, at=0.6, src=REQ)
    d.inject(TE, DeleteContext(req_id="d1", context_id="doc"), at=2.0, src=REQ)
    d.inject(TE, GetContext(req_id="g2", context_id="doc"), at=2.1, src=REQ)
    d.run(until=3.0)
    infos = {m.req_id: m for _, m in out_to(d, REQ) if isinstance(m, ContextInfo)}
    assert infos["c1"].found and infos["c1"].num_tokens == 1024
    assert infos["g1"].found and infos["g1"].dp == infos["c1"].dp
    assert infos["d1"].found and not infos["g2"].found
    (fin,) = [m for _, m in out_to(d, REQ) if isinstance(m, TaskFinished)]
    assert fin.cached_prompt_tokens == 1024 and fin.dp == infos["c1"].dp
    cm = [m for _, m in out_to(d, CM)]
    assert isinstance(cm[0], RegisterTe) and cm[0].dp_groups == 2
    reports = [m for m in cm if isinstance(m, TeLoadReport)]
    assert len(reports) == 6 and all(r.healthy for r in reports)  # every 0.5 s up to 3.0 s
    assert reports[1].prefix_hit_rate == 1024 / (1024 + 1536)
    assert_replays(d)


def test_tasks_arriving_during_a_gather_round_wait_for_the_next_one() -> None:
    d = driver()
    hardware(d)
    d.spawn(TE, TeShell, config=shell_config(2, cm=None))
    for i in range(5):  # same instant: the first opens a round, the others queue behind it
        d.inject(TE, task(i, 300, 4), at=0.0, src=REQ)
    d.run()
    fin = [m for _, m in out_to(d, REQ) if isinstance(m, TaskFinished)]
    assert len(fin) == 5 and all(f.status == "completed" for f in fin)
    assert {f.dp for f in fin} == {0, 1}
    assert d.actor(TE).state.rounds == 2
    assert_replays(d)


def test_only_a_single_dp_tes_master_says_it_may_be_sent_tasks_directly() -> None:
    # its shell only forwards: TaskAccepted.solo lets the JE send the TE's next tasks past it
    for groups, solo in ((1, True), (2, False)):
        d = driver()
        hardware(d)
        d.spawn(TE, TeShell, config=shell_config(groups, cm=None))
        d.inject(TE, task(0, 300, 4), at=0.0, src=REQ)
        d.run()
        (acc,) = [m for _, m in out_to(d, REQ) if isinstance(m, TaskAccepted)]
        assert (acc.solo, acc.master) == (solo, f"{TE}/dp/{acc.dp}")
