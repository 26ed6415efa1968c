"""The gateway: admission control (429 + Retry-After beyond the bound), a JE drawn at random
(seeded), and the prefill retry loop end to end (gateway -> JE -> rejecting / dying prefills)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent.parent / "je"))
from je_fakes import ScriptedTe  # noqa: E402

from deepserve.actors.flowserve.messages import Prompt, Sampling  # noqa: E402
from deepserve.actors.gateway.actor import Gateway  # noqa: E402
from deepserve.actors.gateway.messages import ApiRequest, Refused  # noqa: E402
from deepserve.actors.je.actor import JobExecutor  # noqa: E402
from deepserve.actors.je.messages import TeGroupMembership  # noqa: E402
from deepserve.actors.workload.messages import Arrive, RequestDone  # noqa: E402
from deepserve.core import MemorySink, SimDriver, decode  # noqa: E402
from deepserve.persistence.api import MemoryLog  # noqa: E402
from deepserve.replay import verify  # noqa: E402


def req(i: int, out: int = 4) -> ApiRequest:
    return ApiRequest(request_id=f"r{i}", model="m", prompt=Prompt(num_tokens=200),
                      sampling=Sampling(max_tokens=out, target_output_tokens=out), reply_to="ext/client")


def cluster(seed: int, tes: dict[str, dict[str, Any]], roles: dict[str, list[str]], jes: int = 1,
            gw: dict[str, Any] | None = None, je_cfg: dict[str, Any] | None = None) -> SimDriver:
    d = SimDriver(seed, sink=MemorySink())
    d.out: list[Any] = []  # type: ignore[attr-defined]
    d.on_external = lambda _t, env: d.out.append(env.msg)  # type: ignore[attr-defined]
    for addr, kw in tes.items():
        d.spawn(addr, ScriptedTe, **kw)
    names = [f"je/{k}" for k in range(jes)]
    for je in names:
        d.spawn(je, JobExecutor, config=je_cfg or {})
        for role, members in roles.items():
            d.inject(je, TeGroupMembership(model="m", role=role, tes=tuple(members)), at=0.0)  # type: ignore[arg-type]
    d.spawn("gw", Gateway, config={"jes": names, **(gw or {})})
    return d


def test_admission_bounds_inflight_and_refuses_with_retry_after() -> None:
    d = cluster(1, {"te/0": {"tpot_s": 0.1}}, {"colocated": ["te/0"]},
                gw={"max_inflight_per_model": 2, "retry_after_s": 2.5})
    for i in range(5):
        d.inject("gw", req(i, out=10), at=0.01, corr=f"r{i}")
    d.inject("gw", req(9), at=5.0, corr="r9")  # after the first two finished: admitted
    d.run(until=60.0)
    refused = [m for m in d.out if isinstance(m, Refused)]  # type: ignore[attr-defined]
    done = [m for m in d.out if isinstance(m, RequestDone)]  # type: ignore[attr-defined]
    assert sorted(m.request_id for m in refused) == ["r2", "r3", "r4"]
    assert all(m.status == 429 and m.retry_after_s == 2.5 and "limit 2" in m.reason for m in refused)
    assert sorted(m.request_id for m in done) == ["r0", "r1", "r9"]
    s = d.actor("gw").state
    assert (s.arrived, s.completed, s.refused, s.inflight) == (3, 3, 3, {"m": 0})


def test_je_drawn_at_random_from_the_seeded_rng() -> None:
    def draws(seed: int) -> list[str]:
        d = cluster(seed, {"te/0": {}}, {"colocated": ["te/0"]}, jes=3)
        for i in range(30):
            d.inject("gw", req(i), at=0.01 * i, corr=f"r{i}")
        d.run(until=60.0)
        assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]
        return [decode(e.type, e.payload).je for s in d.sink.steps for e in s.events  # type: ignore[union-attr]
                if e.type == "GatewayRouted"]

    a = draws(7)
    assert a == draws(7) and len(set(a)) == 3 and a != draws(8)


def test_retry_loop_with_rejecting_and_dying_prefills_end_to_end() -> None:
    tes = {"p/0": {"behaviour": "dead"}, "p/1": {"behaviour": "reject_first", "n": 2},
           "p/2": {"behaviour": "reject"}, "d/0": {}}
    cfg = {"policy": "least_load", "forwarding": {"ttft_deadline_s": 2.0, "accept_timeout_s": 0.1,
                                                  "retry_backoff_s": 0.01}}
    d = cluster(2, tes, {"prefill": ["p/0", "p/1", "p/2"], "decode": ["d/0"]}, je_cfg=cfg)
    for i in range(3):
        d.inject("gw", req(i), at=0.01 + 0.5 * i, corr=f"r{i}")
    d.run(until=60.0)
    done = {m.request_id: m for m in d.out if isinstance(m, RequestDone)}  # type: ignore[attr-defined]
    assert sorted(done) == ["r0", "r1", "r2"] and all(m.status == "completed" for m in done.values())
    assert verify(MemoryLog(d.sink)).identical  # type: ignore[arg-type]


def test_all_prefills_refusing_is_a_clear_timeout_through_the_gateway() -> None:
    tes = {"p/0": {"behaviour": "reject"}, "p/1": {"behaviour": "dead"}, "d/0": {}}
    cfg = {"forwarding": {"ttft_deadline_s": 0.3, "accept_timeout_s": 0.05}}
    d = cluster(2, tes, {"prefill": ["p/0", "p/1"], "decode": ["d/0"]}, je_cfg=cfg)
    d.inject("gw", req(0), at=0.01, corr="r0")
    d.run(until=60.0)
    (m,) = [m for m in d.out if isinstance(m, RequestDone)]  # type: ignore[attr-defined]
    assert m.status == "failed" and "TTFT deadline 0.3s" in m.reason


def test_simulator_arrivals_answer_the_metrics_collector_even_when_refused() -> None:
    d = cluster(1, {"te/0": {"tpot_s": 0.1}}, {"colocated": ["te/0"]}, gw={"max_inflight_per_model": 1})
    for i in range(2):
        r = req(i, out=10)
        d.inject("gw", Arrive(request_id=r.request_id, model="m", prompt=r.prompt, sampling=r.sampling), at=0.01)
    d.run(until=60.0)
    done = sorted((m.request_id, m.status, m.reason[:3]) for m in d.out if isinstance(m, RequestDone))  # type: ignore[attr-defined]
    assert done == [("r0", "completed", "tar"), ("r1", "failed", "429")]


def test_a_lost_je_is_reported_to_the_cluster_manager_so_its_tasks_are_cancelled() -> None:
    from deepserve.actors.flowserve.messages import CancelOwner
    from deepserve.actors.gateway.messages import JeLost

    for manager in ("ext/cluster", ""):
        d = cluster(1, {"te/0": {"tpot_s": 0.1}}, {"colocated": ["te/0"]}, jes=2, gw={"manager": manager})
        d.inject("gw", JeLost(je="je/1", reason="crashed"), at=1.0)
        d.inject("gw", JeLost(je="je/1", reason="crashed again"), at=2.0)  # known already: nothing new
        d.run(until=5.0)
        told = [m for m in d.out if isinstance(m, CancelOwner)]  # type: ignore[attr-defined]
        assert told == ([CancelOwner(owner="je/1", reason="its JE je/1 was lost (crashed)")] if manager else [])
