"""`deepserve chaos`: the CI's fixed seed set passes with no violation, the same command gives
the same numbers, a failing seed is reported with its step and re-run alone, bad arguments are
one line naming the flag."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cliproc import assert_one_line_error, deepserve, in_process

from deepserve.actors.gateway.actor import Gateway

COLOCATED = ("mooncake-16te", "--set", "cluster.tes=3")


def _summary(res: Any) -> dict[str, Any]:
    assert res.stdout.strip(), res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_ci_seed_set_has_no_violation(tmp_path: Path) -> None:
    """The fixed seed set CI runs: 4 seeds x 60 requests of 3 colocated TEs, over 2 processes,
    and 2 seeds x 40 requests of a prefill/decode pair."""
    res = deepserve("chaos", *COLOCATED, "--seeds", "4", "--requests", "60", "--workers", "2", "--json",
                    "--log-dir", str(tmp_path), cwd=tmp_path)  # fmt: skip
    s = _summary(res)
    assert res.returncode == 0, s["violation_list"]
    assert (s["seeds"], s["requests"], s["violations"]) == (4, 240, 0) and s["faults_injected"] >= 4
    assert s["completed"] + s["failed"] == 240 and s["seeds_per_hour"] > 0 and s["backend"] == "2 local processes"
    pd = _summary(in_process("chaos", "pd-1p1d", "--seeds", "2", "--requests", "40", "--workers", "1", "--json",
                             "--log-dir", str(tmp_path), cwd=tmp_path))  # fmt: skip
    assert (pd["seeds"], pd["requests"], pd["violations"]) == (2, 80, 0), pd["violation_list"]
    assert list(tmp_path.glob("*.db")) == []  # passing seeds' logs are dropped


def test_the_same_command_gives_the_same_numbers(tmp_path: Path) -> None:
    args = ("chaos", *COLOCATED, "--seeds", "2", "--first-seed", "5", "--requests", "20", "--workers", "1",
            "--json", "--log-dir", str(tmp_path), "--keep-logs")  # fmt: skip
    a, b = (_summary(in_process(*args, cwd=tmp_path)) for _ in range(2))
    keys = ("seeds", "requests", "completed", "failed", "faults_injected", "violations", "steps")
    assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
    assert sorted(p.name for p in tmp_path.glob("*.db")) == ["chaos-mooncake-16te-5.db", "chaos-mooncake-16te-6.db"]
    verify = in_process("replay", "verify", str(tmp_path / "chaos-mooncake-16te-6.db"), cwd=tmp_path)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_a_failing_seed_is_printed_with_its_step_and_reruns_alone(tmp_path: Path, monkeypatch: Any) -> None:
    real = Gateway._done

    def twice(self: Gateway, ctx: Any, m: Any) -> None:  # a planted bug: r3 answered twice
        c = self.state.clients.get(m.request_id)
        real(self, ctx, m)
        if m.request_id == "r3" and c is not None:
            ctx.send(c.reply_to, m, corr=m.request_id)

    monkeypatch.setattr(Gateway, "_done", twice)
    base = ("chaos", *COLOCATED, "--requests", "8", "--workers", "1", "--log-dir", str(tmp_path))
    res = in_process(*base, "--seeds", "2", cwd=tmp_path)
    assert res.returncode == 1
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("seed ")]
    assert len(lines) == 2 and lines[1].startswith("seed 1: terminal violated at step ")
    assert "r3: a second terminal state" in lines[1] and "chaos mooncake-16te --set cluster.tes=3 --seeds 1 --first-seed 1 --requests 8" in lines[1]
    assert (tmp_path / "chaos-mooncake-16te-1.db").exists()
    again = in_process(*base, "--seeds", "1", "--first-seed", "1", cwd=tmp_path)
    assert again.returncode == 1
    assert [ln for ln in again.stdout.splitlines() if ln.startswith("seed ")][0].split(" [")[0] == lines[1].split(" [")[0]


@pytest.mark.parametrize(("args", "needle"), [
    (("--seeds", "0"), "--seeds"),
    (("--seeds", "x"), "--seeds"),
    (("--seeds", "2", "--requests", "0"), "--requests"),
    (("--seeds", "2", "--workers", "0"), "--workers"),
    (("--seeds", "2", "--first-seed", "-1"), "--first-seed"),
    (("--seeds", "2", "--workers", "2", "--cluster", "local"), "--workers"),
    (("--seeds", "2", "--cluster", " "), "--cluster"),
    (("--seeds", "2", "--set", "cluster.tes=0"), "cluster.tes"),
    ((), "--seeds"),
])  # fmt: skip
def test_bad_arguments_are_one_line_naming_the_flag(tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    assert_one_line_error(in_process("chaos", "pd-1p1d", *args, cwd=tmp_path), needle)


def test_an_unknown_scenario_is_one_line(tmp_path: Path) -> None:
    assert_one_line_error(in_process("chaos", "no-such", "--seeds", "1", cwd=tmp_path), "no-such")
    (tmp_path / "f").write_text("x")
    assert_one_line_error(in_process("chaos", "pd-1p1d", "--seeds", "1", "--log-dir", str(tmp_path / "f"),
                                     cwd=tmp_path), "--log-dir")  # fmt: skip


def test_cluster_without_ray_is_one_line_naming_the_extra(tmp_path: Path, monkeypatch: Any) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where it is not installed
    res = in_process("chaos", "pd-1p1d", "--seeds", "1", "--requests", "2", "--cluster", "local",
                     "--log-dir", str(tmp_path), cwd=tmp_path)  # fmt: skip
    assert_one_line_error(res, "--cluster needs the ray package", "deepserve[ray]")
