"""kill -9 a process mid-stream: with `outbox` durability, every message another
process received is in the sender's log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import zmq

from deepserve.adapters.zmq.frames import receive_and_ack
from deepserve.persistence import open_log

HERE = Path(__file__).parent


def _receive_then_kill(tmp_path: Path, durability: str, want: int) -> tuple[set, set]:
    ctx = zmq.Context()
    pull = ctx.socket(zmq.ROUTER)  # the ZeroMQ transport's inbox: data frames in, acks out
    port = pull.bind_to_random_port("tcp://127.0.0.1")

    log = tmp_path / f"sender-{durability}.db"
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    child = subprocess.Popen(
        [sys.executable, str(HERE / "crash_child.py"), str(log), f"tcp://127.0.0.1:{port}", durability],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    received: set[tuple[str, int]] = set()
    deadline = time.monotonic() + 30
    try:
        while len(received) < want and time.monotonic() < deadline:
            if pull.poll(100):
                received.update((w.src, w.msg_id) for w in receive_and_ack(pull))
        os.kill(child.pid, signal.SIGKILL)  # mid-stream, no warning
        child.wait(timeout=10)
        while pull.poll(200):  # whatever was already on the wire still arrives
            received.update((w.src, w.msg_id) for w in receive_and_ack(pull))
    finally:
        if child.poll() is None:
            child.kill()
        pull.close(linger=0)
        ctx.term()
    assert child.returncode == -signal.SIGKILL, child.stderr.read().decode()[-2000:]
    reader = open_log(str(log))
    logged = {(o.actor, o.msg_id) for s in reader.steps() for o in s.outputs if o.dst == "rx/0"}
    reader.close()
    return received, logged


def test_outbox_never_loses_a_message_another_process_saw(tmp_path: Path) -> None:
    received, logged = _receive_then_kill(tmp_path, "outbox", want=3000)
    assert len(received) >= 3000
    missing = received - logged
    assert not missing, f"{len(missing)} received messages are not in the sender's log"
