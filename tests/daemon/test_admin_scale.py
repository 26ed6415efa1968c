"""The admin API with a bearer token (`$DEEPSERVE_ADMIN_TOKEN`): 401 without it, works with it;
`deepserve scale GROUP N` launches a TE through the cold path and drains TEs on the way down;
bad arguments exit 2 with one line naming the field; every admin action is an external input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from daemonproc import start_daemon, stop_daemon
from daemonproc import wait_for as wait_for_status

from deepserve.persistence import open_log
from deepserve.replay import verify

TOKEN = "s3cret"
GROUP = "llama3-8b/colocated"
SETTINGS = ("cluster.tes=2", "control.spare_tes=1",
            "control.pod_start_s=0.2", "control.te_preload_s=0.3", "control.heartbeat_interval_s=0.5",
            "pd.prefill_tes=0", "pd.decode_tes=0")  # fmt: skip
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def wait_for(admin: str, pred: Any, timeout_s: float = 60.0) -> dict[str, Any]:
    return wait_for_status(admin, pred, timeout_s, headers=AUTH)


def cli(*args: str, token: str = TOKEN) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEEPSERVE_ADMIN_TOKEN": token}  # the clients read it there too
    return subprocess.run([sys.executable, "-m", "deepserve", *args], capture_output=True, text=True, timeout=60,
                          env=env)  # fmt: skip


def states(st: dict[str, Any]) -> dict[str, tuple[int, str]]:
    return {t["te"]: (t["generation"], t["state"]) for t in st["tes"]}


def test_token_scale_up_and_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPSERVE_ADMIN_TOKEN", TOKEN)  # the daemon's token (start_daemon passes os.environ)
    proc, info = start_daemon(tmp_path / "run", *[a for s in SETTINGS for a in ("--set", s)])
    admin = info["admin_url"]
    try:
        assert httpx.get(admin + "/admin/status", timeout=10).status_code == 401
        wrong = httpx.get(admin + "/admin/status", headers={"Authorization": "Bearer nope"}, timeout=10)
        assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
        assert httpx.post(admin + "/admin/scale", json={"group": GROUP, "size": 3}, timeout=10).status_code == 401
        ok = httpx.get(admin + "/admin/status", headers=AUTH, timeout=10)
        assert ok.status_code == 200 and states(ok.json()) == {"te/0": (1, "ready"), "te/1": (1, "ready")}
        denied = cli("status", "--admin-url", admin, token="")
        assert denied.returncode == 2 and denied.stderr.count("\n") == 1 and "401" in denied.stderr
        # a field that does not apply to the fault's kind is named, not ignored (a user tour)
        for body, field in (({"kind": "link-down", "target": "s0/npu0/roce", "bw_factor": 5}, "bw_factor"),
                            ({"kind": "hang-npu", "target": "hw/s0/npu0", "region": "kv"}, "region"),
                            # missing and unknown fields too (their param was null)
                            ({}, "kind"), ({"kind": "kill-te", "target": "te/0", "n": 1}, "n")):  # fmt: skip
            r = httpx.post(admin + "/admin/fault", json=body, headers=AUTH, timeout=10)
            assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text

        up = cli("scale", GROUP, "3", "--admin-url", admin)
        assert up.returncode == 0 and f"group {GROUP}: target 3 (was 2)" in up.stdout, up.stderr
        st = wait_for(admin, lambda s: states(s).get("te/2") == (1, "ready"))
        te2 = next(t for t in st["tes"] if t["te"] == "te/2")
        assert te2["state"] == "ready", te2
        steps = te2["boot_steps"]
        assert steps["pod_start"] >= 0.2 and steps["te_pre_load"] >= 0.3 and steps["ssd_to_dram"] > 1.0
        assert steps["registered"] >= steps["pod_start"] + steps["ssd_to_dram"] + steps["dram_to_npu"]
        assert st["groups"][GROUP] == {"target": 3, "ready": 3, "slots": 3}

        for args, field in ((("scale", GROUP, "9"), "size"), (("scale", "nope/colocated", "1"), "group"),
                            (("scale", GROUP, "-1"), "size"), (("fault", "kill-te", "te/9"), "target"),
                            (("fault", "link-down", "s0/npu0/rocee"), "target: no link"),
                            (("fault", "hbm-fault", "hw/s0/npu0", "--region", "r0"), "region")):  # fmt: skip
            bad = cli(*args, "--admin-url", admin)
            assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and field in bad.stderr, (args, bad.stderr)

        down = cli("scale", GROUP, "1", "--admin-url", admin)
        assert down.returncode == 0 and "target 1 (was 3)" in down.stdout
        st = wait_for(admin, lambda s: [t["state"] for t in s["tes"]] == ["ready", "stopped", "stopped"])
        assert states(st) == {"te/0": (1, "ready"), "te/1": (1, "stopped"), "te/2": (1, "stopped")}
        assert all("drained" in t["reason"] for t in st["tes"][1:])
        gone = cli("fault", "kill-te", "te/1", "--admin-url", admin)  # no pod to kill
        assert gone.returncode == 2 and "target: te/1 is stopped (scaled down); TEs: te/0" in gone.stderr
        r = httpx.post(info["url"] + "/v1/completions", json={"model": "llama3-8b", "prompt": "hi", "max_tokens": 3,
                                                              "ignore_eos": True}, timeout=30)  # fmt: skip
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        inputs = httpx.get(admin + "/admin/faults", headers=AUTH, timeout=10).json()["inputs"]
        scales = [i for i in inputs if i["input"] == "ScaleGroup"]
        assert len(scales) == 2 and all(i["from"] == "ext/admin" and i["to"] == "cluster" for i in scales)
        assert not [i for i in inputs if i["input"] == "Started"]  # the boot is not an admin action
        # Errors in the API's one shape (FastAPI's 405 and 422 bodies before: a user tour)
        bad = httpx.get(admin + "/admin/faults?limit=abc", headers=AUTH, timeout=10)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"
        assert httpx.get(admin + "/admin/faults?limit=-1", headers=AUTH, timeout=10).status_code == 400
        wrong = httpx.get(admin + "/admin/fault", headers=AUTH, timeout=10)
        assert wrong.status_code == 405 and wrong.json()["error"]["type"] == "invalid_request_error"
    finally:
        out = stop_daemon(proc)
    assert proc.returncode == 0, out
    log = open_log(info["log"])
    try:
        assert verify(log).identical
    finally:
        log.close()


def test_a_pd_pair_is_not_scaled_into_half_a_pair() -> None:
    """Scaling a decode group to 0 while its prefill group runs left prefills that failed after
    their first token (a user tour: 1 request in 4 failed). Refused, naming `size`."""
    from types import SimpleNamespace

    from deepserve.daemon.admin import Scale, _check_pd_partner

    groups = {"m/prefill": SimpleNamespace(target=1), "m/decode": SimpleNamespace(target=1),
              "m/colocated": SimpleNamespace(target=2)}  # fmt: skip
    with pytest.raises(ValueError, match=r"^size: 0 would leave m/prefill's 1 TE\(s\) without a decode"):
        _check_pd_partner(Scale(group="m/decode", size=0), groups)
    _check_pd_partner(Scale(group="m/colocated", size=0), groups)  # no partner to strand
    _check_pd_partner(Scale(group="m/decode", size=2), groups)
    groups["m/decode"].target = 0
    with pytest.raises(ValueError, match=r"^size: m/decode has no TE \(target 0\)"):
        _check_pd_partner(Scale(group="m/prefill", size=2), groups)
    _check_pd_partner(Scale(group="m/prefill", size=0), groups)  # both halves at 0: consistent
