"""`deepserve up --config configs/scenarios/pd-1p1d.toml` serves the scenario's cluster (issue 31
acceptance: one config for both commands), here over two JEs: the gateway spreads the requests
over them, and each JE gets the cluster manager's membership of both groups."""

from __future__ import annotations

from collections import Counter
from importlib import resources
from pathlib import Path

import httpx2 as httpx
import openai
from daemonproc import start_daemon, stop_daemon

from deepserve.actors.gateway.messages import GatewayRouted
from deepserve.actors.je.messages import TeGroupMembership
from deepserve.core.codec import decode
from deepserve.persistence import open_log

PD_1P1D = str(resources.files("deepserve") / "configs" / "scenarios" / "pd-1p1d.toml")
REQUESTS = 12


def test_up_serves_a_scenario_over_two_jes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc, info = start_daemon(run, "--config", PD_1P1D, "--set", "scheduling.jes=2")
    try:
        c = openai.OpenAI(base_url=info["url"] + "/v1", api_key="none", max_retries=0, timeout=60)
        for i in range(REQUESTS):
            out = c.completions.create(model="llama3-8b", prompt=f"request {i} says hello", max_tokens=3)
            assert out.usage is not None and out.usage.completion_tokens == 3
        st = httpx.get(info["admin_url"] + "/admin/status", timeout=10).json()
        assert {g: (row["ready"], row["target"]) for g, row in st["groups"].items()} == {
            "llama3-8b/prefill": (1, 1), "llama3-8b/decode": (1, 1)}  # fmt: skip
        assert st["requests"]["completed"] == REQUESTS
    finally:
        stop_daemon(proc)
    routed: Counter[str] = Counter()
    views: dict[str, set[str]] = {}
    log = open_log(str(run / "daemon.db"))
    try:
        for step in log.steps(None):
            if step.input.actor == "gateway":
                routed.update(decode(e.type, e.payload).je for e in step.events if e.type == GatewayRouted.__name__)
            elif step.input.type == TeGroupMembership.__name__:
                m = decode(step.input.type, step.input.payload)
                views.setdefault(step.input.actor, set()).add(f"{m.role}:{','.join(m.tes)}")
    finally:
        log.close()
    assert set(routed) == {"je/0", "je/1"} and sum(routed.values()) == REQUESTS
    assert views == {je: {"prefill:te/0", "decode:te/1"} for je in ("je/0", "je/1")}


def test_up_serves_a_second_models_group_over_http(tmp_path: Path) -> None:
    """`[[groups]]` with another model: listed by /v1/models and served by its own TE."""
    run = tmp_path / "run"
    extra = 'groups=[{model = "llama2-7b", tes = 1, kv_block_tokens = 128}]'
    proc, info = start_daemon(run, "--config", PD_1P1D, "--set", extra)
    try:
        c = openai.OpenAI(base_url=info["url"] + "/v1", api_key="none", max_retries=0, timeout=60)
        assert [m.id for m in c.models.list().data] == ["llama3-8b", "llama2-7b"]
        for model in ("llama2-7b", "llama3-8b"):
            out = c.completions.create(model=model, prompt="hello", max_tokens=2)
            assert out.model == model and out.usage is not None and out.usage.completion_tokens == 2
        try:
            c.completions.create(model="llama3-70b", prompt="hello", max_tokens=2)
            raise AssertionError("an unserved model was accepted")
        except openai.NotFoundError as exc:
            assert "served: 'llama3-8b', 'llama2-7b'" in str(exc)
        st = httpx.get(info["admin_url"] + "/admin/status", timeout=10).json()
        assert st["groups"]["llama2-7b/colocated"]["ready"] == 1
    finally:
        stop_daemon(proc)
    served: dict[str, str] = {}
    log = open_log(str(run / "daemon.db"))
    try:
        for step in log.steps(None, actor="gateway"):
            routed = [decode(e.type, e.payload) for e in step.events if e.type == GatewayRouted.__name__]
            served.update({ev.request_id: ev.model for ev in routed})
    finally:
        log.close()
    assert sorted(served.values()) == ["llama2-7b", "llama3-8b"], served
