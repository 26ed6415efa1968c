"""`deepserve sim` on the whole platform (issue 31 §1): the daemon's config simulated on a trace,
a mixed cluster of colocated and P/D groups serving two models behind several JEs, a scenario of
only a cluster and a fault plan now with the control plane, every request entering through the
gateway, and the same seed giving the same log."""

from __future__ import annotations

import json
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from cliproc import in_process

from deepserve.actors.gateway.messages import GatewayRouted
from deepserve.actors.workload.messages import RequestDone
from deepserve.cluster.config import load
from deepserve.cluster.layout import plan
from deepserve.cluster.sim import run
from deepserve.core.codec import decode
from deepserve.persistence.memory import MemorySink

CONFIGS = Path(str(resources.files("deepserve") / "configs"))
AZURE = CONFIGS / "traces" / "azure_conv_500.csv"
NEW_KEYS = ("failed", "e2e_ms_p99_all", "faults_injected", "recoveries", "tes_ready_at_end", "tes_target")
OLD_KEYS = ("scenario", "seed", "trace", "requests", "completed", "cancelled", "ttft_ms_p99", "tpot_ms_p50",
            "e2e_ms_p99", "failed_e2e_ms_p99", "prefix_hit_rate", "throughput_rps", "failure_reasons",
            "virtual_time_s", "deliveries", "wall_s", "sim_requests_per_wall_s", "workers", "log")  # fmt: skip

MIXED = """name = "mixed"
[cluster]
model = "llama3-8b"
tes = 2
kv_block_tokens = 16
[pd]
prefill_tes = 1
decode_tes = 1
[[groups]]
model = "llama2-7b"
tes = 1
kv_block_tokens = 16
[scheduling]
jes = 3
[workload]
requests = 60
rps_scale = 4.0
models = ["llama3-8b", "llama2-7b"]
"""


def test_sim_runs_the_daemon_config_on_the_azure_trace(tmp_path: Path) -> None:
    """Acceptance: `deepserve sim configs/daemon/default.toml --trace <Azure conv> --requests 300
    --json` — the daemon's cluster (3 colocated TEs and a 1P1D pool, heartbeats on) in virtual time."""
    res = in_process("sim", str(CONFIGS / "daemon" / "default.toml"), "--trace", str(AZURE), "--requests", "300",
                     "--json", "--log", "none", cwd=tmp_path)  # fmt: skip
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert all(k in out for k in OLD_KEYS + NEW_KEYS), sorted(set(OLD_KEYS + NEW_KEYS) - set(out))
    assert out["requests"] == 300 and out["completed"] + out["failed"] == 300 and out["failed"] == 0
    assert (out["tes_ready_at_end"], out["tes_target"], out["recoveries"], out["faults_injected"]) == (5, 5, 0, 0)
    assert out["e2e_ms_p99_all"] == pytest.approx(out["e2e_ms_p99"])  # nothing failed: the same requests


def test_a_mixed_cluster_serves_two_models_over_three_jes(tmp_path: Path) -> None:
    (tmp_path / "mixed.toml").write_text(MIXED)
    cfg = load(str(tmp_path / "mixed.toml"))
    layout = plan(cfg)
    group_of = {s.te: s.group for s in layout.slots}
    assert sorted(Counter(group_of.values()).items()) == [
        ("llama2-7b/colocated", 1), ("llama3-8b/colocated", 3), ("llama3-8b/decode", 1), ("llama3-8b/prefill", 1)]  # one spare
    done: list[RequestDone] = []
    sink = MemorySink()
    states: dict[str, Any] = {}

    def at_end(d: Any) -> None:
        states.update({f"je/{k}": d.actor(f"je/{k}").state for k in range(3)})

    result = run(cfg, sink=sink, on_done=done.append, on_end=at_end)
    assert result.summary["completed"] == 60 and result.summary["tes_ready_at_end"] == 5
    per = result.summary["by_model"]
    assert {m: (s["requests"], s["completed"]) for m, s in per.items()} == {"llama3-8b": (30, 30), "llama2-7b": (30, 30)}
    served = Counter((r.request_id, group_of[r.te]) for r in done)
    by_model: dict[str, set[str]] = {}
    for (rid, group), _ in served.items():
        model = "llama3-8b" if int(rid[1:]) % 2 == 0 else "llama2-7b"  # workload.models in turn
        assert group.startswith(model + "/"), (rid, group)
        by_model.setdefault(model, set()).add(group.split("/")[1])
    assert by_model == {"llama3-8b": {"colocated", "decode"}, "llama2-7b": {"colocated"}}  # PD ends on decode
    # the gateway spread the jobs over the three JEs; each saw every group and fed its own trees
    routed = Counter(e.je for e in _events(sink, "gateway", GatewayRouted))
    assert set(routed) == {"je/0", "je/1", "je/2"} and sum(routed.values()) == 60
    for je, st in states.items():
        assert st.completed == routed[je]
        assert st.groups == {"llama3-8b": {"colocated": ["te/0", "te/1"], "prefill": ["te/3"], "decode": ["te/4"]},
                             "llama2-7b": {"colocated": ["te/5"]}}, je  # fmt: skip
        assert set(st.trees) >= {"llama3-8b", "llama2-7b"}, je


def test_a_scenario_of_a_cluster_and_faults_runs_with_the_control_plane(tmp_path: Path) -> None:
    toml = ('name = "only"\n[cluster]\nmode = "pd"\n'
            '[[faults]]\nat_s = 5.0\nkind = "link-down"\ntarget = "s0/npu0/roce"\n'
            '[[faults]]\nat_s = 8.0\nkind = "link-up"\ntarget = "s0/npu0/roce"\n')  # fmt: skip
    (tmp_path / "only.toml").write_text(toml)
    res = in_process("sim", "only.toml", "--requests", "40", "--json", "--log", "only.db", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["completed"] + out["failed"] == 40 and out["faults_injected"] == 2
    assert (out["tes_ready_at_end"], out["tes_target"]) == (2, 2)
    log = in_process("replay", "log", "only.db", "--actor", "cluster", "--until", "0", cwd=tmp_path).stdout
    assert "TeReady" in log and "MembershipPushed" in log, log[:2000]  # the manager booted the TEs


def test_every_request_enters_as_the_gateways_api_request(tmp_path: Path) -> None:
    (tmp_path / "mixed.toml").write_text(MIXED)
    sink = MemorySink()
    run(load(str(tmp_path / "mixed.toml"), ("workload.requests=20",)), sink=sink)
    client = [s.input for s in sink.steps if s.input.src == "ext/client"]
    assert len(client) == 20 and {(i.type, i.actor) for i in client} == {("ApiRequest", "gateway")}
    assert len(_events(sink, "gateway", GatewayRouted)) == 20


def test_the_same_seed_gives_the_same_log(tmp_path: Path) -> None:
    (tmp_path / "mixed.toml").write_text(MIXED)
    for name in ("a", "b"):
        res = in_process("sim", "mixed.toml", "--seed", "7", "--log", f"{name}.db", "--json", cwd=tmp_path)
        assert res.returncode == 0, res.stderr
    digests = [in_process("replay", "digest", f"{n}.db", cwd=tmp_path).stdout for n in ("a", "b")]
    assert digests[0] == digests[1] and digests[0].strip()
    verify = in_process("replay", "verify", "a.db", cwd=tmp_path)
    assert verify.returncode == 0 and verify.stdout.startswith("identical"), verify.stdout + verify.stderr


def _events(sink: MemorySink, actor: str, cls: type) -> list[Any]:
    return [decode(ev.type, ev.payload) for s in sink.steps if s.input.actor == actor
            for ev in s.events if ev.type == cls.__name__]  # fmt: skip


def test_a_daemon_files_admin_token_is_not_in_the_sim_log(tmp_path: Path) -> None:
    secret = "s3cret-token-0123456789abcdef"
    (tmp_path / "d.toml").write_text(f'[daemon]\nadmin_token = "{secret}"\n[cluster]\ntes = 1\n')
    res = in_process("sim", "d.toml", "--requests", "2", "--log", "d.db", "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert secret.encode() not in (tmp_path / "d.db").read_bytes() and secret not in res.stdout


def test_an_arrival_wakes_a_heartbeat_monitor_backed_off_while_idle() -> None:
    """As the daemon's frontend does (daemon/runtime.py `_wake_heartbeats`): the default config's
    monitor backs off while the cluster idles between sparse arrivals, and the next arrival brings
    its tick back to one interval."""
    sink = MemorySink()
    result = run(load(None, ("workload.requests=20", "workload.rps_scale=0.05")), sink=sink)
    assert result.summary["completed"] == 20
    events = Counter(e.type for s in sink.steps if s.input.actor == "cluster/heartbeat" for e in s.events)
    assert events["HbWoken"] > 0 and events["HbTicked"] > 0, events


def test_the_text_summary_shows_the_cluster_and_the_slo(tmp_path: Path) -> None:
    res = in_process("sim", "pd-1p1d", "--requests", "10", "--log", "none", "--set", "slo.ttft_ms=1500", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "cluster  2/2 TEs ready at the end, 0 recoveries, 0 faults injected" in res.stdout, res.stdout
    assert "(TTFT <= 1500 ms and TPOT <= 100 ms, of all requests)" in res.stdout, res.stdout


def test_a_run_with_heartbeats_logs_its_end_and_verifies_whole(tmp_path: Path) -> None:
    """The heartbeats' timers never let the heap empty: the run still ends with every actor's
    final state in the log, so verify compares them (it said "the log stops before the run's end")."""
    res = in_process("sim", str(CONFIGS / "daemon" / "default.toml"), "--requests", "10", "--log", "hb.db", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    verify = in_process("replay", "verify", "hb.db", cwd=tmp_path)
    assert verify.returncode == 0 and verify.stdout.startswith("identical: "), verify.stdout + verify.stderr
    assert "stops before" not in verify.stdout, verify.stdout
