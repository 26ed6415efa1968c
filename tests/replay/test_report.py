"""`deepserve replay report` and `replay export` on the shipped incident (issue 32 §4): the page's
numbers are the run's own (`deepserve sim --json`), its incidents name the requests the faults
hit and carry their `replay why`, the Perfetto export is well-formed trace-event JSON, the
csv/parquet tables and the SQL views hold a row per request, decision and fault, and writing the
views leaves the run's record (digest, verify) untouched. The browser test is
test_report_browser.py."""

from __future__ import annotations

import csv
import functools
import json
import re
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from cliproc import in_process  # noqa: E402

from deepserve.persistence import open_log  # noqa: E402
from deepserve.replay.export import COLUMNS  # noqa: E402
from deepserve.replay.report import incidents, summary  # noqa: E402
from deepserve.replay.report_facts import collect  # noqa: E402
from deepserve.replay.why import request_hops, why_lines  # noqa: E402

SCENARIO = str(Path(__file__).resolve().parents[2] / "configs" / "scenarios" / "incident-prefill-crash.toml")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    tmp = tmp_path_factory.mktemp("report")
    log = tmp / "incident.db"
    res = in_process("sim", SCENARIO, "--requests", "250", "--json", "--set", f"log={log}", cwd=tmp)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1]), log


@pytest.fixture(scope="module")
def refused(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """A run whose gateway refuses (at most 4 requests in flight): refusals to group and link."""
    tmp = tmp_path_factory.mktemp("refused")
    log = tmp / "refused.db"
    res = in_process("sim", "pd-1p1d", "--requests", "60", "--json", "--set", "scheduling.max_inflight_per_model=4",
                     "--log", str(log), cwd=tmp)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1]), log


@functools.lru_cache(maxsize=4)  # one pass a log for the whole module (the tests only read the facts)
def _facts(log: Path):  # type: ignore[no-untyped-def]
    with open_log(str(log), upgrade=False) as reader:
        return collect(reader)


KEYS = ("requests", "completed", "failed", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99",
        "e2e_ms_p50", "e2e_ms_p99", "slo_attainment", "throughput_rps", "output_tokens_per_s", "faults_injected",
        "recoveries")  # fmt: skip


@pytest.mark.parametrize("which", ["run", "refused"])
def test_the_report_s_numbers_are_the_run_s_own(which: str, request: pytest.FixtureRequest) -> None:
    sim, log = request.getfixturevalue(which)
    nums = summary(_facts(log))
    for k in KEYS:
        if isinstance(sim.get(k), (int, float)):
            assert nums[k] == pytest.approx(sim[k], rel=1e-6, abs=1e-6), k


def test_incidents_name_the_requests_the_faults_hit_with_their_why(run: tuple[dict, Path]) -> None:
    sim, log = run
    facts = _facts(log)
    incs = incidents(facts)
    assert [(i["head"]["kind"], [g["category"] for g in i["follow"]]) for i in incs] == [
        ("NpuCrash", ["declared_failed", "recovered"]), ("KillPod", ["declared_failed", "recovered"])]
    # the per-fault accounting of `deepserve sim` counts the same requests as retried
    assert [len(i["requests"]) for i in incs] == [f["retried"] for f in sim["faults"]]
    assert "r143" in incs[1]["requests"]  # the request test_incident_scenario follows
    with open_log(str(log), upgrade=False) as reader:
        assert facts.why_text("r143") == list(why_lines(request_hops(reader, "r143")))


def test_the_page_is_self_contained_and_its_links_resolve(run: tuple[dict, Path], refused: tuple[dict, Path]) -> None:
    for _, log in (run, refused):
        out = log.with_suffix(".html")
        res = in_process("replay", "report", str(log), "-o", str(out), cwd=log.parent)
        assert res.returncode == 0, res.stderr
        page = out.read_text()
        assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page), "the page loads nothing from outside"
        assert "Plotly.newPlot" in page and len(page) > 3_000_000  # plotly.js inline
        targets = set(re.findall(r'href="#(why-[^"]+)"', page))
        assert targets and targets <= set(re.findall(r'id="(why-[^"]+)"', page))
    page = refused[1].with_suffix(".html").read_text()
    assert '<span class="pill refused">refused</span>' in page and "429 refused" in page


def test_perfetto_export_is_trace_event_json(run: tuple[dict, Path], tmp_path: Path) -> None:
    _, log = run
    out = tmp_path / "trace.json"
    res = in_process("replay", "export", str(log), "--format", "perfetto", "-o", str(out), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    trace = json.loads(out.read_text())
    events = trace["traceEvents"]
    open_async: dict[tuple[str, int], float] = {}
    phases = set()
    for e in events:
        assert e["ph"] in {"M", "X", "b", "e", "i", "C"} and isinstance(e["pid"], int) and isinstance(e.get("tid", 0), int)
        phases.add(e["ph"])
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name") and isinstance(e["args"]["name"], str)
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0 and isinstance(e["name"], str)
        if e["ph"] == "X":
            assert e["dur"] >= 0
        elif e["ph"] == "b":
            open_async[(e["cat"], e["id"])] = e["ts"]
        elif e["ph"] == "e":
            assert open_async.pop((e["cat"], e["id"])) <= e["ts"]
        elif e["ph"] == "i":
            assert e["s"] in ("g", "p", "t")
        elif e["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in e["args"].values())
    assert not open_async and phases == {"M", "X", "b", "e", "i", "C"}
    assert sum(e["ph"] == "b" for e in events) == 250


def test_csv_and_parquet_hold_a_row_per_request_decision_and_fault(run: tuple[dict, Path], tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    _, log = run
    facts = _facts(log)
    for fmt in ("csv", "parquet"):
        res = in_process("replay", "export", str(log), "--format", fmt, "-o", str(tmp_path / fmt), cwd=tmp_path)
        assert res.returncode == 0, res.stderr
    expect = {"requests": 250, "decisions": len(facts.decisions), "faults": 6}
    assert expect["decisions"] >= 250
    for name, n in expect.items():
        with open(tmp_path / "csv" / f"{name}.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        table = pq.read_table(tmp_path / "parquet" / f"{name}.parquet")
        assert len(rows) == table.num_rows == n and table.column_names == list(COLUMNS[name]) == list(rows[0])
        assert [r[table.column_names[0]] for r in rows] == [str(v) for v in table.column(0).to_pylist()]


def test_sql_views_in_the_log_leave_its_record_untouched(run: tuple[dict, Path], tmp_path: Path) -> None:
    _, original = run
    log = tmp_path / "views.db"
    shutil.copy(original, log)
    before = in_process("replay", "digest", str(log), cwd=tmp_path).stdout
    for _ in range(2):  # exporting again replaces the run's rows
        res = in_process("replay", "export", str(log), "--format", "sql", cwd=tmp_path)
        assert res.returncode == 0, res.stderr
    with sqlite3.connect(log) as conn:
        assert conn.execute("SELECT count(*), sum(status = 'completed'), sum(refused) FROM requests").fetchone() == (250, 250, 0)
        assert conn.execute("SELECT count(*) FROM decisions WHERE request_status IS NULL").fetchone() == (0,)
        assert conn.execute("SELECT category, count(*) FROM faults GROUP BY 1 ORDER BY 1").fetchall() == [
            ("declared_failed", 2), ("injected", 2), ("recovered", 2)]
    assert in_process("replay", "digest", str(log), cwd=tmp_path).stdout == before
    res = in_process("replay", "verify", str(log), cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.startswith("identical"), res.stdout + res.stderr


@pytest.mark.parametrize("args, says", [
    (("report", "{log}", "-o", "/nonexistent/dir/r.html"), "does not exist"),
    (("report", "{log}", "-o", "{dir}"), "is a directory"),
    (("export", "{log}", "--format", "perfetto"), "-o is required"),
    (("export", "{log}", "--format", "csv", "-o", "{log}"), "is a file"),
    (("export", "{log}", "--format", "sql", "-o", "x"), "drop -o"),
    (("export", "{dir}", "--format", "sql"), "one SQLite log file"),
    (("export", "{log}", "--format", "xml", "-o", "x"), "invalid choice"),
    (("report", "{dir}/missing.db", "-o", "r.html"), "missing.db"),
])  # fmt: skip
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], says: str, run: tuple[dict, Path], tmp_path: Path) -> None:
    _, log = run
    argv = [a.format(log=log, dir=tmp_path) for a in args]
    res = in_process("replay", *argv, cwd=tmp_path)
    assert res.returncode == 2 and says in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


@pytest.mark.parametrize("actor", ["te/4/dp/0", "te/6/dp/0", "te/0/dp/0"])
def test_the_kv_lane_is_the_rtc_s_own_count_of_blocks_in_use(actor: str, run: tuple[dict, Path]) -> None:
    """At any T, the lane's KV usage is what `replay state` folds for the DP master: its HBM
    blocks with a reference (Rtc.ref > 0), across the faults (te/6 decodes beside the killed te/5)."""
    import numpy as np

    from deepserve.replay.state import state_at

    _, log = run
    lane = _facts(log).lanes[actor.split("/dp/")[0]]
    t, used = np.frombuffer(lane.kv_t, float), np.frombuffer(lane.kv_used, np.int32)
    with open_log(str(log), upgrade=False) as reader:
        for at in (12.0, 30.5, 45.0, 61.2, 70.0):
            held = sum(1 for r in state_at(reader, actor, at).state.rtc.ref if r > 0)
            k = np.searchsorted(t, at, "right") - 1
            assert (int(used[k]) if k >= 0 else 0) == held, at
    assert used.max() > 100  # the comparison saw blocks in use


def test_busy_share_and_kv_bins_from_a_made_lane() -> None:
    """Two batches [1, 3] and [3.5, 4] s over bins of 2 s; KV 10 blocks at 0.5 s, 40 at 2.5 s,
    0 at 2.6 s, of a 100-block pool."""
    from array import array

    import numpy as np

    from deepserve.replay.report_charts import busy_fraction, kv_percent
    from deepserve.replay.report_facts import TeLane

    lane = TeLane(batch_start=array("d", [1.0, 3.5]), batch_end=array("d", [3.0, 4.0]), batch_tasks=array("i", [1, 2]),
                  kv_t=array("d", [0.5, 2.5, 2.6]), kv_used=array("i", [10, 40, 0]), kv_capacity=100)  # fmt: skip
    edges = np.array([0.0, 2.0, 4.0, 6.0])
    assert busy_fraction(lane, edges).tolist() == [0.5, 0.75, 0.0]
    assert kv_percent(lane, edges).tolist() == [10.0, 40.0, 0.0]


def test_a_bundle_is_reported_and_exported_but_never_written_into(run: tuple[dict, Path], tmp_path: Path) -> None:
    _, log = run
    bundle = tmp_path / "incident.tar.gz"
    assert in_process("replay", "bundle", str(log), "-o", str(bundle), cwd=tmp_path).returncode == 0
    res = in_process("replay", "report", str(bundle), "-o", str(tmp_path / "r.html"), "--json", cwd=tmp_path)
    assert res.returncode == 0 and json.loads(res.stdout)["requests"] == 250, res.stderr
    res = in_process("replay", "export", str(bundle), "--format", "sql", cwd=tmp_path)
    assert res.returncode == 2 and "incident bundle" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_a_damaged_log_is_refused_before_anything_is_written(run: tuple[dict, Path], tmp_path: Path) -> None:
    _, original = run
    log = tmp_path / "damaged.db"
    shutil.copy(original, log)
    with sqlite3.connect(log) as conn:  # a page whose checksum no longer matches its bytes
        conn.execute("UPDATE pages SET crc32 = crc32 + 1 WHERE id = (SELECT min(id) FROM pages)")
    for args in (("report", str(log), "-o", str(tmp_path / "r.html")), ("export", str(log), "--format", "sql")):
        res = in_process("replay", *args, cwd=tmp_path)
        assert res.returncode == 2 and "damaged log" in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "r.html").exists()
    with sqlite3.connect(log) as conn:
        assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name LIKE 'derived_%'").fetchone() == (0,)
