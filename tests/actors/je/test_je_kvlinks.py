"""The JE's view of the KV paths (actors/je/kvlinks.py) and what routing (routing.py) makes of it,
without a driver: a verdict in, the recorded `KvRouteChanged` and the candidates out."""

from __future__ import annotations

from deepserve.actors.flowserve.messages import Prompt, Sampling
from deepserve.actors.je.effects import After, Plan
from deepserve.actors.je.kvlinks import KvLinkVerdict, KvRouteChanged, on_verdict
from deepserve.actors.je.messages import JeState, Job
from deepserve.actors.je.routing import candidates, pool

GROUPS = {"m": {"prefill": ["te/0", "te/1"], "decode": ["te/2", "te/3"]}}


def state() -> JeState:
    return JeState(groups={k: {r: list(v) for r, v in g.items()} for k, g in GROUPS.items()})


def job(prefill_te: str = "") -> Job:
    return Job(model="m", prompt=Prompt(num_tokens=3),
               sampling=Sampling(max_tokens=4), reply_to="c", arrival_s=0.0, prefill_te=prefill_te)  # fmt: skip


def decodes(s: JeState, prefill_te: str) -> tuple[list[str], list[str]]:
    ok, out = candidates(s, job(prefill_te), ("decode",))
    return [c.te for c in ok], [x.reason for x in out]


def test_a_link_fault_on_a_pair_cuts_that_pair_only_until_a_healthy_probe() -> None:
    fx = Plan(state())
    on_verdict(fx.state, 1.0, fx, KvLinkVerdict(verdict="link-fault", src_te="te/0", dst_te="te/2", detected_s=1.0), 5.0)
    assert [(e.key, e.down) for e in fx.events()] == [("te/0>te/2", True)]  # type: ignore[attr-defined]
    assert decodes(fx.state, "te/0")[0] == ["te/3"] and "KV path blocked" in decodes(fx.state, "te/0")[1][0]
    assert decodes(fx.state, "te/1")[0] == ["te/2", "te/3"]
    on_verdict(fx.state, 2.0, fx, KvLinkVerdict(verdict="link-fault", src_te="te/0", dst_te="te/2"), 5.0)
    assert len(fx.events()) == 1  # already down: no second change
    on_verdict(fx.state, 9.0, fx, KvLinkVerdict(verdict="healthy", src_te="te/0", dst_te="te/2"), 5.0)
    assert fx.state.kv_down == {} and decodes(fx.state, "te/0")[0] == ["te/2", "te/3"]


def test_a_dead_nic_cuts_every_pair_of_its_te_and_a_prefill_that_reaches_no_decode_gets_no_task() -> None:
    fx = Plan(state())
    on_verdict(fx.state, 1.0, fx, KvLinkVerdict(verdict="link-fault", src_te="te/1", dst_te="te/2", nic_te="te/0",
                                                link="s0/npu0/roce"), 5.0)  # fmt: skip
    assert decodes(fx.state, "te/0")[0] == []
    p, gone = pool(fx.state, job(), ("colocated", "prefill"), 1.0)
    assert [g.tes for g in gone] == [("te/0",)] and "reaches no decode" in gone[0].reason
    assert p.all()[0].te == "te/1" and len(p.all()) == 1
    # a new instance at te/0 (its replacement registered): its paths are forgotten
    on_verdict(fx.state, 3.0, fx, KvLinkVerdict(verdict="reset", nic_te="te/0"), 5.0)
    assert fx.state.kv_down == {} and decodes(fx.state, "te/0")[0] == ["te/2", "te/3"]


def test_saturation_backs_the_decode_off_by_load_for_a_while_and_marks_no_path_down() -> None:
    fx = Plan(state())
    on_verdict(fx.state, 1.0, fx, KvLinkVerdict(verdict="saturation", src_te="te/0", dst_te="te/2"), 5.0)
    assert fx.state.kv_down == {} and fx.state.kv_busy == {"te/2": 6.0}
    (timer,) = [e for e in fx.steps if isinstance(e, After)]
    assert (timer.delay_s, timer.key) == (5.0, "kvbusy/te/2")
    assert decodes(fx.state, "te/0")[0] == ["te/3"] and decodes(fx.state, "te/1")[0] == ["te/3"]
    fx.state.groups["m"]["decode"] = ["te/2"]  # the only decode: backed off, still a candidate
    assert decodes(fx.state, "te/0")[0] == ["te/2"]
    on_verdict(fx.state, 6.0, fx, timer.msg, 5.0)  # type: ignore[arg-type]
    assert fx.state.kv_busy == {}
    assert [type(e) for e in fx.events()] == [KvRouteChanged, KvRouteChanged]


def test_a_transient_verdict_changes_no_routing() -> None:
    fx = Plan(state())
    on_verdict(fx.state, 1.0, fx, KvLinkVerdict(verdict="transient", src_te="te/0", dst_te="te/2"), 5.0)
    assert fx.steps == [] and decodes(fx.state, "te/0")[0] == ["te/2", "te/3"]
