"""`deepserve bench transport --json`: every row measured beside its baseline, and
the transport's sender, exiting at once, lost and refused nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cliproc import deepserve, in_process

RATES = {"zmq_msgs_per_s", "zmq_msgs_per_s_vs_bare", "zmq_roundtrips_per_s",
         "zmq_roundtrip_us_p50", "zmq_roundtrips_per_s_vs_asyncio", "zmq_roundtrip_us_p50_vs_asyncio"}


@pytest.mark.timeout(120)
def test_bench_transport_json_rows(tmp_path: Path) -> None:
    res = deepserve("bench", "transport", "--json", "--scale", "0.005", "--rounds", "1", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in map(json.loads, res.stdout.splitlines())}
    assert RATES | {"zmq_lost_on_exit", "zmq_refused", "zmq_unacknowledged_at_exit"} == rows.keys()
    for name in RATES:
        assert rows[name]["value"] > 0 and rows[name]["baseline_value"] > 0, rows[name]
    assert rows["zmq_lost_on_exit"]["value"] == 0 and rows["zmq_lost_on_exit"]["baseline"]
    assert rows["zmq_refused"]["value"] == 0 and rows["zmq_unacknowledged_at_exit"]["value"] == 0


def test_bench_transport_bad_rounds_is_one_line(tmp_path: Path) -> None:
    res = in_process("bench", "transport", "--rounds", "0", cwd=tmp_path)
    assert res.returncode == 2 and len(res.stderr.splitlines()) == 1 and "--rounds" in res.stderr
