"""`deepserve replay export LOG --format perfetto|csv|parquet|sql`: a run's facts for other tools.

- `perfetto`: Chrome trace-event JSON (the "JSON Object Format": `{"traceEvents": [...]}`), which
  Perfetto's UI and chrome://tracing open: a process per TE (a thread of batches, one of boots, a
  KV-blocks counter), a process of requests (one async slice each, arrival to finish), the JEs'
  routing decisions and every fault as instant events. Times in microseconds of the run's clock.
- `csv` / `parquet`: a directory holding `requests`, `decisions` and `faults`, one row per request,
  per routing decision and per fault (`COLUMNS` below, the same for both formats).
- `sql`: the same three tables written into the log itself with views over them
  (persistence/views.py); docs/replay-report.md lists them.
"""

from __future__ import annotations

import csv
import os
from typing import Any

from .report_facts import Facts

# Column name -> type ("str", "int", "float", "bool"); one list per table, in output order.
COLUMNS: dict[str, dict[str, str]] = {
    "requests": {
        "request_id": "str", "status": "str", "reason": "str", "je": "str", "te": "str", "arrival_s": "float",
        "first_token_s": "float", "finish_s": "float", "ttft_ms": "float", "tpot_ms": "float", "e2e_ms": "float",
        "prompt_tokens": "int", "cached_prompt_tokens": "int", "output_tokens": "int", "preemptions": "int",
        "slo_met": "bool",
    },
    "decisions": {
        # the routed task's id is the decision's (`replay why` shows it, `replay whatif --at-decision` takes it)
        "decision_id": "str", "t": "float", "je": "str", "request_id": "str", "phase": "str",
        "attempt": "int", "policy": "str", "chosen": "str", "subgroup": "str", "candidates": "int",
        "runner_up": "str", "excluded": "int", "reason": "str",
    },
    "faults": {
        "t": "float", "category": "str", "kind": "str", "target": "str", "te": "str", "source": "str", "detail": "str",
    },
}  # fmt: skip
FORMATS = ("perfetto", "csv", "parquet", "sql")


def tables(facts: Facts) -> dict[str, list[dict[str, Any]]]:
    """The three tables' rows (requests by arrival, decisions and faults by time)."""
    reqs = sorted(facts.requests.values(), key=lambda r: (r["arrival_s"], r["request_id"]))
    faults = sorted(facts.faults, key=lambda f: f["t"])
    return {name: [{c: row.get(c) for c in COLUMNS[name]} for row in rows]
            for name, rows in (("requests", reqs), ("decisions", facts.decisions), ("faults", faults))}  # fmt: skip


def write_csv(facts: Facts, directory: str) -> list[str]:
    written = []
    for name, rows in tables(facts).items():
        path = os.path.join(directory, f"{name}.csv")
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=list(COLUMNS[name]))
            w.writeheader()
            w.writerows(rows)
        written.append(path)
    return written


def write_parquet(facts: Facts, directory: str) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    kinds = {"str": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_()}
    written = []
    for name, rows in tables(facts).items():
        schema = pa.schema([(c, kinds[k]) for c, k in COLUMNS[name].items()])
        table = pa.Table.from_pylist(rows, schema=schema)
        path = os.path.join(directory, f"{name}.parquet")
        pq.write_table(table, path)
        written.append(path)
    return written


def perfetto(facts: Facts) -> dict[str, Any]:
    """The run as Chrome trace events (pid 1: requests, 2: routing and faults, 3+: a TE each)."""
    us = 1e6
    ev: list[dict[str, Any]] = []

    def meta(pid: int, name: str, tid: int | None = None, thread: str = "") -> None:
        if tid is None:
            ev.append({"ph": "M", "pid": pid, "tid": 0, "name": "process_name", "args": {"name": name}})
        else:
            ev.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": thread}})

    meta(1, "requests")
    meta(2, "control: routing and faults")
    meta(2, "", 1, "routing decisions")
    meta(2, "", 2, "faults")
    for n, r in enumerate(sorted(facts.requests.values(), key=lambda r: r["arrival_s"])):
        args = {k: r[k] for k in ("status", "te", "ttft_ms", "e2e_ms", "output_tokens", "reason")}
        common = {"cat": "request", "name": r["request_id"], "pid": 1, "tid": 1, "id": n}
        ev.append({**common, "ph": "b", "ts": r["arrival_s"] * us, "args": args})
        ev.append({**common, "ph": "e", "ts": r["finish_s"] * us})
    for d in facts.decisions:
        ev.append({"ph": "i", "s": "t", "pid": 2, "tid": 1, "ts": d["t"] * us, "cat": "routing",
                   "name": f"{d['request_id']} -> {d['chosen']}", "args": {k: d[k] for k in ("decision_id", "policy", "phase", "attempt", "reason")}})  # fmt: skip
    for f in facts.faults:
        ev.append({"ph": "i", "s": "g" if f["category"] == "injected" else "p", "pid": 2, "tid": 2, "ts": f["t"] * us,
                   "cat": f["category"], "name": f"{f['kind']} {f['target']}", "args": {"detail": f["detail"]}})  # fmt: skip
    # imported here: report_charts imports plotly, which every CLI command paid for at start-up
    from .report_charts import lane_order

    for k, te in enumerate(lane_order(facts)):
        pid, lane = 3 + k, facts.lanes[te]
        meta(pid, te)
        meta(pid, "", 1, "batches")
        meta(pid, "", 2, "boots")
        for s, e, n in zip(lane.batch_start, lane.batch_end, lane.batch_tasks, strict=True):
            ev.append({"ph": "X", "pid": pid, "tid": 1, "ts": s * us, "dur": max(e - s, 0.0) * us, "cat": "batch",
                       "name": "batch", "args": {"tasks": n}})  # fmt: skip
        for t, used in zip(lane.kv_t, lane.kv_used, strict=True):
            ev.append({"ph": "C", "pid": pid, "tid": 0, "ts": t * us, "name": "KV blocks in use", "args": {"blocks": used}})
        for b in facts.boots:
            if b["te"] == te and b["ready_s"] is not None and b["ready_s"] > b["start_s"]:
                ev.append({"ph": "X", "pid": pid, "tid": 2, "ts": b["start_s"] * us, "dur": (b["ready_s"] - b["start_s"]) * us,
                           "cat": "boot", "name": f"boot generation {b['generation']}"})  # fmt: skip
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "metadata": {"run_id": facts.run_id, "mode": facts.mode, "scenario": facts.scenario, "log": facts.label}}  # fmt: skip
