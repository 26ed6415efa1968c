"""Issue 32 §3 and §5: `replay state LOG --cluster --at T` (every TE and JE in one view, folded
from the log) and incident bundles (`replay bundle`, opened by every replay command as they are).

The log: the shipped incident (a prefill NPU crash at 30 s; the first 120 requests), whose
prefill TE te/3 is being replaced at t=31 s and serves again from 37.6 s."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from cliproc import assert_one_line_error, deepserve, in_process

from deepserve.persistence.factory import open_log
from deepserve.replay.bundle import MANIFEST, without_secrets
from deepserve.replay.cluster_state import cluster_state_at
from deepserve.replay.state import state_at

SCENARIO = str(Path(__file__).resolve().parents[2] / "configs" / "scenarios" / "incident-prefill-crash.toml")


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("cluster")
    path = tmp / "incident.db"
    res = in_process("sim", SCENARIO, "--requests", "120", "--log", str(path), cwd=tmp)
    assert res.returncode == 0, res.stderr
    return path


def cluster_json(log: Path, *more: str) -> dict:
    res = in_process("replay", "state", str(log), "--cluster", "--json", *more, cwd=log.parent)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_the_cluster_during_a_replacement(log: Path) -> None:
    view = cluster_json(log, "--at", "31")
    tes = {t["te"]: t for t in view["tes"]}
    assert sorted(tes) == ["te/0", "te/1", "te/3", "te/4", "te/5", "te/6"]
    assert sorted(t["role"] for t in tes.values()) == ["colocated"] * 2 + ["decode"] * 2 + ["prefill"] * 2
    crashed = tes["te/3"]
    assert (crashed["generation"], crashed["state"]) == (2, "replacing")
    (dp,) = crashed["dp"]
    assert not dp["alive"] and "crashed" in dp["device_lost"]  # the failed generation's master, stopped
    assert all(t["state"] == "ready" and t["generation"] == 1 for n, t in tes.items() if n != "te/3")
    assert [j["je"] for j in view["jes"]] == ["je/0"]


def test_rows_are_the_actors_own_state(log: Path) -> None:
    with open_log(str(log), upgrade=False) as reader:
        view = cluster_state_at(reader, 40.0)
        rows = {d.dp: d for te in view.tes for d in te.dp}
        for dp, row in rows.items():
            m = state_at(reader, dp, 40.0).state
            assert (row.waiting, row.running) == (len(m.waiting), len(m.running))
            assert row.kv_hbm_referenced == sum(1 for r in m.rtc.ref if r > 0)
            free = len(m.rtc.free_hbm)
            assert row.kv_hbm_referenced + row.kv_hbm_cached + free == row.kv_hbm_blocks  # every block counted once
        je = state_at(reader, "je/0", 40.0).state
        assert view.jes[0].open_jobs == len(je.jobs) and sum(view.jes[0].by_phase.values()) == len(je.jobs)
    assert any(r.running for r in rows.values())  # mid-run: work in flight, not an empty cluster


def test_the_end_of_the_log_and_the_table(log: Path) -> None:
    view = cluster_json(log)
    assert view["at"] is None
    assert {(t["te"], t["state"]) for t in view["tes"]} == {(f"te/{i}", "ready") for i in (0, 1, 3, 4, 5, 6)}
    assert view["jes"][0]["open_jobs"] == 0  # all 120 requests ended
    res = in_process("replay", "state", str(log), "--cluster", "--at", "31", cwd=log.parent)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == "cluster at t=31 s (run sim-0): 6 TEs, 1 JEs"
    assert any(line.startswith("te/3") and " replacing " in line and "device lost" in line for line in lines)
    assert any(line.startswith("je/0: ") and "open jobs" in line for line in lines)


def test_state_takes_an_actor_or_the_cluster(log: Path, tmp_path: Path) -> None:
    both = in_process("replay", "state", str(log), "--cluster", "--actor", "je/0", cwd=tmp_path)
    assert_one_line_error(both, "not allowed with argument")
    neither = in_process("replay", "state", str(log), cwd=tmp_path)
    assert_one_line_error(neither, "one of the arguments --actor --cluster is required")
    plain = tmp_path / "plain.db"
    assert in_process("sim", "example", "--requests", "20", "--log", str(plain), cwd=tmp_path).returncode == 0
    no_platform = in_process("replay", "state", str(plain), "--cluster", cwd=tmp_path)
    assert_one_line_error(no_platform, "has no cluster manager")


# ---- bundles ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bundle(log: Path) -> Path:
    out = log.parent / "incident.tar.gz"
    res = in_process("replay", "bundle", str(log), "-o", str(out), "--json", cwd=log.parent)
    assert res.returncode == 0, res.stderr
    manifest = json.loads(res.stdout)
    assert manifest["logs"] == ["logs/incident.db"] and manifest["runs"][0]["run_id"] == "sim-0"
    return out


def test_a_bundle_holds_the_log_config_version_and_readme(bundle: Path) -> None:
    with tarfile.open(bundle, "r:gz") as tar:
        assert sorted(tar.getnames()) == ["MANIFEST.json", "README.md", "config.json", "logs/incident.db"]
        config = json.load(tar.extractfile("config.json"))  # type: ignore[arg-type]
        readme = tar.extractfile("README.md").read().decode()  # type: ignore[union-attr]
    assert config["sim-0"]["name"] == "incident-prefill-crash"
    assert "deepserve replay verify THIS.tar.gz" in readme


def test_replay_commands_open_a_bundle_as_the_log(log: Path, bundle: Path) -> None:
    # a fresh process: the note about other code, and the unpacked copy removed at exit
    verify = deepserve("replay", "verify", str(bundle), cwd=log.parent)
    assert verify.returncode == 0 and verify.stdout.startswith("identical: "), verify.stderr
    digests = [in_process("replay", "digest", p, cwd=log.parent).stdout for p in (str(log), str(bundle))]
    assert digests[0] == digests[1] and len(digests[0].strip()) == 64
    why = in_process("replay", "why", str(bundle), "r5", cwd=log.parent)
    assert why.returncode == 0 and why.stdout.startswith("request r5: completed"), why.stderr
    assert cluster_json(bundle, "--at", "31") == cluster_json(log, "--at", "31")


def test_a_run_directory_bundles_every_log(tmp_path: Path) -> None:
    run_dir = tmp_path / "split"
    run_dir.mkdir()
    made = deepserve("sim", "mooncake-16te", "--requests", "30", "--workers", "2", "--log", str(run_dir), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    out = tmp_path / "split.tgz"
    assert in_process("replay", "bundle", str(run_dir), "-o", str(out), cwd=tmp_path).returncode == 0
    with tarfile.open(out, "r:gz") as tar:
        assert sorted(n for n in tar.getnames() if n.startswith("logs/")) == ["logs/w0.db", "logs/w1.db"]
    verify = in_process("replay", "verify", str(out), cwd=tmp_path)
    assert verify.returncode == 0 and "2 logs, each verified on its own" in verify.stdout, verify.stderr


def test_secrets_are_removed_from_the_config() -> None:
    config = {"daemon": {"admin_token": "s3cret-value", "admin_token_file": "", "tokenizer": "approx",
                         "max_tokens_limit": 8192},
              "store": {"password": "pw", "url": "x"}, "groups": [{"api_key": "k", "stream_token_ids": True}]}  # fmt: skip
    clean = without_secrets(config)
    assert clean["daemon"] == {"admin_token": "<redacted>", "admin_token_file": "", "tokenizer": "approx",
                               "max_tokens_limit": 8192}  # fmt: skip
    assert clean["store"] == {"password": "<redacted>", "url": "x"}
    assert clean["groups"] == [{"api_key": "<redacted>", "stream_token_ids": True}]


def _rewrite(bundle: Path, out: Path, *, manifest: dict | None = None, extra: tuple[str, bytes] | None = None,
             drop: str = "") -> Path:  # fmt: skip
    with tarfile.open(bundle, "r:gz") as src, tarfile.open(out, "w:gz") as dst:
        for member in src.getmembers():
            if member.name == drop:
                continue
            data = src.extractfile(member).read()  # type: ignore[union-attr]
            if member.name == MANIFEST and manifest is not None:
                data = json.dumps({**json.loads(data), **manifest}).encode()
            member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
        if extra:
            info = tarfile.TarInfo(extra[0])
            info.size = len(extra[1])
            dst.addfile(info, io.BytesIO(extra[1]))
    return out


def test_bundles_from_other_versions_get_a_precise_message(bundle: Path, tmp_path: Path) -> None:
    older_code = _rewrite(bundle, tmp_path / "a.tgz", manifest={"code_version": "0.1.0+src.000000000000"})
    res = in_process("replay", "digest", str(older_code), cwd=tmp_path)
    assert res.returncode == 0 and "bundle made by deepserve 0.1.0 (code 0.1.0+src.000000000000)" in res.stderr
    newer = _rewrite(bundle, tmp_path / "b.tgz", manifest={"log_schema_version": 99, "release": "9.0.0"})
    assert_one_line_error(in_process("replay", "verify", str(newer), cwd=tmp_path),
                          "its logs have schema 99 (deepserve 9.0.0")  # fmt: skip
    future = _rewrite(bundle, tmp_path / "c.tgz", manifest={"bundle_version": 7})
    assert_one_line_error(in_process("replay", "why", str(future), "r1", cwd=tmp_path), "bundle format version 7")


def test_a_changed_or_foreign_bundle_is_refused(bundle: Path, tmp_path: Path) -> None:
    no_manifest = _rewrite(bundle, tmp_path / "d.tgz", drop=MANIFEST)
    assert_one_line_error(in_process("replay", "verify", str(no_manifest), cwd=tmp_path),
                          "not a deepserve incident bundle")  # fmt: skip
    smuggled = _rewrite(bundle, tmp_path / "e.tgz", extra=("logs/extra.db", b"x"))
    assert_one_line_error(in_process("replay", "verify", str(smuggled), cwd=tmp_path),
                          "its logs differ from what its MANIFEST.json lists")  # fmt: skip
    escape = _rewrite(bundle, tmp_path / "f.tgz", manifest={"logs": ["logs/../../escape.db"]})
    assert_one_line_error(in_process("replay", "verify", str(escape), cwd=tmp_path), "logs must be logs/NAME.db")
    assert not (tmp_path.parent / "escape.db").exists()
    missing = in_process("replay", "bundle", str(tmp_path / "nope.db"), "-o", str(tmp_path / "x.tgz"), cwd=tmp_path)
    assert_one_line_error(missing, "no such log file or run directory")
