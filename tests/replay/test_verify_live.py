"""Logs written by real runs, replayed through `deepserve replay verify`.

SimDriver logs are verified everywhere else; these are the logs an operator will
actually hold: an `AsyncDriver` on the wall clock (timers, asks, a failure and a
restart) in both durability modes, two drivers talking over ZeroMQ with their logs
merged from a run directory, and logs left by `kill -9` (SQLite and PostgreSQL).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
import zmq
from cliproc import deepserve
from kernel_actors import Add, AskIt, Boom, CancelTimer, Counter, DictState, Forward, SetTimer

from deepserve.adapters.zmq.frames import receive_and_ack
from deepserve.adapters.zmq_transport import ZmqTransport
from deepserve.core.asyncdriver import AsyncDriver
from deepserve.core.classpath import trust_directory
from deepserve.persistence import open_log, open_sink
from deepserve.replay import verify

CORE_TESTS = Path(__file__).resolve().parent.parent / "core"
trust_directory(str(CORE_TESTS))  # crash_child.py's actors, replayed in this process (a log is data)


async def _wait_for(condition, timeout_s: float = 5.0) -> None:
    with anyio.fail_after(timeout_s):
        while not condition():
            await anyio.sleep(0.005)


def _verify_cli(log: str, cwd: Path, *, killed: bool = False) -> str:
    res = deepserve("replay", "verify", log, cwd=cwd)
    if killed:  # identical as far as it goes, which is not the whole run: exit 3, and one note
        assert res.returncode == 3, res.stdout + res.stderr
        assert res.stdout.startswith("identical as far as the log goes: "), res.stdout
        assert res.stderr.count("\n") == 1 and "the run has no closing record" in res.stderr, res.stderr
        return res.stdout
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("identical"), res.stdout
    assert res.stderr == ""
    return res.stdout


async def _wall_clock_run(log: str, durability: str) -> None:
    """Timers that fire and one cancelled, an actor's ask answered and one timed out,
    an outside ask, a failure and its restart, on the wall clock."""
    sink = open_sink(log, durability)
    async with AsyncDriver(seed=11, sink=sink, outbox=durability == "outbox") as d:
        d.spawn("c/0", Counter)
        d.spawn("c/1", Counter)
        d.spawn("mute/0", DictState)  # records Add, never replies: asks to it time out
        await d.inject("c/0", Add(1))
        await d.inject("c/0", SetTimer("fire", 0.02, 7))
        await d.inject("c/0", SetTimer("never", 0.5, 1000))
        await d.inject("c/0", CancelTimer("never"))
        await d.inject("c/0", AskIt("c/1", 2.0))  # answered: c/0 records c/1's reply
        await d.inject("c/0", AskIt("mute/0", 0.03))  # times out: AskFailed via a timer
        await d.inject("c/1", Boom())  # fails after recording; restarted from its events
        await d.inject("c/1", Add(5))
        reply = await d.ask("c/1", Add(2), timeout_s=2.0)  # c/1's total: racing c/0's ask
        assert isinstance(reply, Add) and reply.n >= 7
        await d.inject("c/0", Forward("c/1", 3))
        # 1, the timer's 7 and c/1's reply (>= 1); the cancelled timer's 1000 never comes
        await _wait_for(lambda: d.actor("c/0").state.notes and d.actor("c/0").state.total >= 9)
        await _wait_for(lambda: d.actor("c/1").state.total == 11)
        await d.idle()
    sink.close()


def _kinds_of_steps(log: str) -> set[str]:
    reader = open_log(log)
    seen: set[str] = set()
    for step in reader.steps():
        rec = step.input
        seen.add(rec.type)
        if rec.src == rec.actor:
            seen.add("own timer")
        if rec.src == "ext/ask":
            seen.add("outside ask")
        seen.update(ev.type for ev in step.events)
    reader.close()
    return seen


@pytest.mark.parametrize("durability", ["async", "outbox"])
async def test_async_driver_log_verifies(tmp_path: Path, durability: str) -> None:
    log = str(tmp_path / f"live-{durability}.db")
    await _wall_clock_run(log, durability)
    kinds = _kinds_of_steps(log)
    # The run did exercise what it claims to: otherwise "identical" would mean little.
    assert {"own timer", "outside ask", "AskFailed", "HandlerFailed", "Restarted"} <= kinds, kinds
    reader = open_log(log)
    result = verify(reader)
    reader.close()
    assert result.identical and result.ended, result.divergence  # closed: its final snapshots are there
    assert result.inputs >= 15
    _verify_cli(log, tmp_path)


async def _two_drivers(run_dir: Path) -> None:
    t_a = ZmqTransport(bind="tcp://127.0.0.1:*", routes={})
    t_b = ZmqTransport(bind="tcp://127.0.0.1:*", routes={"a/": t_a.endpoint})
    t_a.routes["b/"] = t_b.endpoint
    sink_a = open_sink(str(run_dir), "outbox", process="a")
    sink_b = open_sink(str(run_dir), "outbox", process="b")
    epoch = time.time()  # one run: shared clock origin, seed and run id
    common = dict(seed=4, run_id="net-1", epoch=epoch, outbox=True)
    async with AsyncDriver(sink=sink_a, transport=t_a, **common) as a, AsyncDriver(
        sink=sink_b, transport=t_b, **common
    ) as b:
        a.spawn("a/0", Counter)
        b.spawn("b/0", Counter)
        await a.idle()
        await b.idle()
        for n in (1, 2, 3):
            await a.inject("a/0", Forward("b/0", n))
        await a.inject("a/0", AskIt("b/0", 2.0))  # the reply crosses back
        await b.inject("b/0", SetTimer("t", 0.01, 4))
        await _wait_for(lambda: b.actor("b/0").state.total == 11 and a.actor("a/0").state.total)
        await a.idle()
        await b.idle()
    sink_a.close()
    sink_b.close()


@pytest.mark.timeout(60)
async def test_two_drivers_over_zeromq_verify_from_their_merged_logs(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    await _two_drivers(run_dir)
    assert sorted(p.name for p in run_dir.glob("*.db")) == ["a.db", "b.db"]
    out = _verify_cli(str(run_dir), tmp_path)
    assert "2 actors" in out and "(run 'net-1')" in out
    # Each side saw the other's messages: the merge interleaves two real streams.
    srcs = {s.input.src for s in open_log(str(run_dir)).steps()}
    assert {"a/0", "b/0"} <= srcs


def _kill_mid_stream(log: str, tmp_path: Path, want: int = 2000) -> set[tuple[str, int]]:
    """Run tests/core/crash_child.py (outbox, sending over ZeroMQ to us), kill -9 it
    once `want` messages arrived; returns what the outside saw."""
    ctx = zmq.Context()
    pull = ctx.socket(zmq.ROUTER)  # the ZeroMQ transport's inbox: data frames in, acks out
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    child = subprocess.Popen(
        [sys.executable, str(CORE_TESTS / "crash_child.py"), log, f"tcp://127.0.0.1:{port}", "outbox"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    received: set[tuple[str, int]] = set()
    deadline = time.monotonic() + 30
    try:
        while len(received) < want and time.monotonic() < deadline:
            if pull.poll(100):
                received.update((w.src, w.msg_id) for w in receive_and_ack(pull))
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
        while pull.poll(200):
            received.update((w.src, w.msg_id) for w in receive_and_ack(pull))
    finally:
        if child.poll() is None:
            child.kill()
        pull.close(linger=0)
        ctx.term()
    assert child.returncode == -signal.SIGKILL, child.stderr.read().decode()[-2000:]
    assert len(received) >= want
    return received


def _check_killed_log(log: str, received: set[tuple[str, int]]) -> None:
    reader = open_log(log)
    logged = {(o.actor, o.msg_id) for s in reader.steps() for o in s.outputs if o.dst == "rx/0"}
    result = verify(reader)
    reader.close()
    assert not received - logged, f"{len(received - logged)} messages seen outside are not logged"
    assert result.identical, result.divergence
    assert result.inputs >= want_inputs(received)
    # what is there verifies, and the line says it is not the whole run (a user tour: a log
    # without its -wal verified "identical" with 42 fewer inputs and nothing said): the writer
    # never closed it, so it has no closing record (schema v7)
    assert not result.ended and result.closed is False and result.summary().startswith(
        "identical as far as the log goes: ")
    assert result.summary().endswith(
        "; the log has no closing record (its process died, or still runs): the rest of the run is unknown")


def want_inputs(received: set[tuple[str, int]]) -> int:
    # 20 sends a `Go`: at least this many deliveries produced what the outside saw
    return len(received) // 20


@pytest.mark.timeout(90)
def test_log_left_by_kill_9_verifies_sqlite(tmp_path: Path) -> None:
    log = str(tmp_path / "killed.db")
    received = _kill_mid_stream(log, tmp_path)
    _check_killed_log(log, received)
    _verify_cli(log, tmp_path, killed=True)


@pytest.mark.timeout(120)
def test_log_left_by_kill_9_verifies_postgres(tmp_path: Path, postgres_url: str) -> None:
    received = _kill_mid_stream(postgres_url, tmp_path)
    _check_killed_log(postgres_url, received)
    _verify_cli(postgres_url, tmp_path, killed=True)
