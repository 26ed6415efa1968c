"""The processes-mode supervisor against real TE host processes (no daemon around it): a spawn
becomes a ready process whose addresses the main transport routes; SIGKILL is reaped and reported
with its signal and the routes go; SIGTERM ends the process cleanly with a log that verifies; a
process that cannot come up is reported as a failed start; shutdown leaves nothing running."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from deepserve.actors.ports.pod import BootSpec, TeSlot
from deepserve.adapters.zmq import Directory
from deepserve.core.messages import Message
from deepserve.daemon.procs.messages import (
    ProcessExited,
    ProcessStartFailed,
    ProcessUp,
    SignalProcess,
    SpawnProcess,
)
from deepserve.daemon.procs.supervisor import Supervisor
from deepserve.persistence import open_log
from deepserve.replay import verify


def slot(te: str, npu: int) -> TeSlot:
    return TeSlot(te=te, group="m/colocated", model="llama3-8b", role="colocated", server=0, host="hw/s0/host",
                  npus=(f"hw/s0/npu{npu}",), tp=1, dp_groups=1, te_config={})  # fmt: skip


def spawn(te: str, npu: int) -> SpawnProcess:
    pid = f"{te}#g1"
    return SpawnProcess(pod_id=pid, spec=BootSpec(pod_id=pid, generation=1, slot=slot(te, npu), source="cold",
                                                  manager="cluster"))  # fmt: skip


async def until(got: list[Message], kind: type, n: int = 1, timeout_s: float = 30) -> list[Any]:
    end = time.monotonic() + timeout_s
    while len([m for m in got if isinstance(m, kind)]) < n:
        assert time.monotonic() < end, f"no {kind.__name__} in {got}"
        await asyncio.sleep(0.02)
    return [m for m in got if isinstance(m, kind)]


def supervisor(tmp_path: Path, parent_pid: int | None = None) -> tuple[Supervisor, Directory, list[Message]]:
    got: list[Message] = []

    async def inject(msg: Message) -> None:
        got.append(msg)

    sock = tmp_path / "s"
    sock.mkdir()
    directory = Directory({"cluster": f"ipc://{sock}/main"})
    base = {"run_id": "t", "seed": 0, "epoch": time.time(), "main_endpoint": f"ipc://{sock}/main",
            "main_prefixes": ("cluster", "hw", "je"), "npu_kind": "910b", "parent_pid": parent_pid or os.getpid()}  # fmt: skip
    return Supervisor(run_dir=tmp_path, sock_dir=sock, directory=directory, inject=inject, base=base, grace_s=5.0), \
        directory, got  # fmt: skip


def test_processes_come_up_are_routed_and_their_ends_are_reported(tmp_path: Path) -> None:
    async def main() -> None:
        sup, directory, got = supervisor(tmp_path)
        sup.submit(spawn("te/0", 0))
        sup.submit(spawn("te/1", 1))
        ups = {m.pod_id: m for m in await until(got, ProcessUp, 2)}
        assert directory.resolve("te/0/dp/0") == ups["te/0#g1"].endpoint == directory.resolve("hw/s0/npu0")
        assert directory.resolve("te/1") == ups["te/1#g1"].endpoint != ups["te/0#g1"].endpoint
        pids = {m.pid for m in ups.values()}
        sup.submit(SignalProcess(pod_id="te/0#g1", kill=True, reason="kill-te"))
        sup.submit(SignalProcess(pod_id="te/1#g1", kill=False, reason="stop"))
        ends = {m.pod_id: m for m in await until(got, ProcessExited, 2)}
        assert ends["te/0#g1"].returncode == -signal.SIGKILL and ends["te/1#g1"].returncode == 0
        assert directory.resolve("te/0") is None and directory.resolve("hw/s0/npu1") is None
        assert not sup.children and not [p for p in pids if os.path.exists(f"/proc/{p}")]
        log = open_log(ups["te/1#g1"].log)
        try:  # the cleanly stopped process flushed a log that verifies on its own
            result = verify(log)
            assert result.identical and result.actors == 2, result.summary()  # its NPU and pod agent
        finally:
            log.close()
        await sup.shutdown()

    asyncio.run(main())


def test_a_process_that_cannot_come_up_is_a_failed_start_and_shutdown_reaps_all(tmp_path: Path) -> None:
    async def main() -> None:
        sup, _, got = supervisor(tmp_path, parent_pid=1)  # not its parent: the TE host exits at once
        sup.submit(spawn("te/0", 0))
        (failed,) = await until(got, ProcessStartFailed)
        # The TE host exits 3, and that status is what is reported (Popen.send_signal used to
        # reap the child first, and asyncio's watcher then reported 255).
        assert failed.pod_id == "te/0#g1"
        assert failed.reason == "exited with status 3 before it was ready", failed.reason
        assert not [m for m in got if isinstance(m, ProcessUp | ProcessExited)]

        (tmp_path / "b").mkdir()
        sup2, _, got2 = supervisor(tmp_path / "b")
        sup2.submit(spawn("te/2", 2))
        (up,) = await until(got2, ProcessUp)
        await sup2.shutdown()
        assert [(m.pod_id, m.returncode) for m in got2 if isinstance(m, ProcessExited)] == [("te/2#g1", 0)]
        assert not os.path.exists(f"/proc/{up.pid}")
        sup2.submit(spawn("te/3", 3))  # after shutdown: refused, reported
        (late,) = await until(got2, ProcessStartFailed)
        assert "shutting down" in late.reason

    asyncio.run(main())
