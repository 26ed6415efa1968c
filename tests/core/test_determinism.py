"""Same seed + same external inputs => byte-identical log, and `verify` agrees.

Random networks (5-50 scripted actors: fan-out, timers, asks, rng draws, spawns,
stops, failing handlers under three supervision directives, external re-spawns)
run twice in `SimDriver`; the runs' digests must match, exact re-execution must
report identical, folded state must equal live state, and a tampered log must be
caught at the tampered delivery.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from netactors import NetSeen, random_network, run_network

from deepserve.core.records import EventRec, MemorySink, Step
from deepserve.persistence.api import MemoryLog
from deepserve.replay import digest, state_at, verify

HERE = Path(__file__).resolve().parent


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rnd=st.randoms(use_true_random=False), n=st.integers(5, 50), seed=st.integers(0, 2**31))
def test_two_runs_are_identical_and_verify(rnd, n, seed) -> None:
    net = random_network(rnd, n)
    first, second = MemorySink(), MemorySink()
    driver = run_network(net, seed, first)
    run_network(net, seed, second)

    assert digest(MemoryLog(first)) == digest(MemoryLog(second))
    assert [msgspec.msgpack.encode(s) for s in first.steps] == [
        msgspec.msgpack.encode(s) for s in second.steps
    ]
    result = verify(MemoryLog(first))
    assert result.identical, result.divergence
    assert result.inputs == sum(1 for s in first.steps if s.input.seq >= 0)

    for addr, cell in driver.cells.items():
        if cell.alive and cell.actor is not None:
            assert state_at(MemoryLog(first), addr).state == cell.actor.state, addr


@settings(max_examples=15, deadline=None)
@given(rnd=st.randoms(use_true_random=False), pick=st.integers(0, 10_000))
def test_a_tampered_event_is_the_first_divergence(rnd, pick) -> None:
    sink = MemorySink()
    run_network(random_network(rnd, 10), 1, sink)
    seen = [(i, j) for i, s in enumerate(sink.steps) for j, e in enumerate(s.events) if e.type == "NetSeen"]
    assume(seen)  # every ping may have hit a failing handler, which discards its events
    i, j = seen[pick % len(seen)]
    step = sink.steps[i]
    ev = step.events[j]
    forged = msgspec.msgpack.encode(NetSeen(tag=-1, draw=2.0, src="forged"))
    events = list(step.events)
    events[j] = EventRec(ev.actor, ev.seq, ev.idx, ev.type, forged)
    sink.steps[i] = Step(step.input, events, step.outputs, step.snapshot)

    result = verify(MemoryLog(sink))
    assert not result.identical
    d = result.divergence
    assert (d.actor, d.seq, d.what) == (step.input.actor, step.input.seq, f"event {j}")
    assert d.expected["payload"]["src"] == "forged"


def test_different_seeds_give_different_logs() -> None:
    import random

    net = random_network(random.Random(3), 20)
    logs = []
    for seed in (1, 2):
        sink = MemorySink()
        run_network(net, seed, sink)
        logs.append(digest(MemoryLog(sink)))
    assert logs[0] != logs[1]


def _python(code: str, hashseed: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(HERE), "PYTHONHASHSEED": hashseed}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp, capture_output=True, text=True, timeout=60
    )


def test_runs_in_other_processes_verify_and_digest_equal(tmp_path: Path) -> None:
    """Across processes with different hash seeds: file log, CLI verify, CLI digest."""
    digests = []
    for i, hashseed in enumerate(("1", "2")):
        log = tmp_path / f"net{i}.db"
        made = _python(f"import netactors; netactors.write_log({str(log)!r}, 5, 11)", hashseed, tmp_path)
        assert made.returncode == 0, made.stderr
        cli = "from deepserve.cli import main; raise SystemExit(main({}))"
        checked = _python(cli.format(["replay", "verify", str(log)]), str(3 + i), tmp_path)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert checked.stdout.startswith("identical: ")
        dig = _python(cli.format(["replay", "digest", str(log)]), "4", tmp_path)
        assert dig.returncode == 0, dig.stderr
        digests.append(dig.stdout.strip())
    assert digests[0] == digests[1] and len(digests[0]) == 64


def test_set_and_dict_payloads_encode_the_same_under_any_hash_seed(tmp_path: Path) -> None:
    """Messages, events and states holding sets/frozensets and dicts of strings: the
    log's digest is the same whatever PYTHONHASHSEED the run had."""
    digests = set()
    for hashseed in ("0", "1", "2", "3"):
        out = _python("import setactors; setactors.print_digest()", hashseed, tmp_path)
        assert out.returncode == 0, out.stderr
        digests.add(out.stdout.strip())
    assert len(digests) == 1 and len(digests.pop()) == 64
