"""The same TE actors under AsyncDriver (wall clock, real concurrency), unchanged: a colocated TE
serves a request, streams every token, ends it once; the log replays identically."""

from __future__ import annotations

import anyio
from fswire import REQ, master_config, task

from deepserve.actors.flowserve.messages import TaskFinished, TaskTokens
from deepserve.actors.flowserve.te_shell import TeShell
from deepserve.adapters.hardware.devices.topology import gen1_cluster, spawn_topology
from deepserve.core import MemorySink
from deepserve.core.asyncdriver import AsyncDriver
from deepserve.persistence.api import MemoryLog
from deepserve.replay import verify


async def test_a_te_runs_under_the_async_driver() -> None:
    sink = MemorySink()
    async with AsyncDriver(seed=5, sink=sink) as d:
        spawn_topology(d, gen1_cluster(1), variance=False)
        d.spawn("te/0", TeShell, config=dict(te="te/0", dps=[master_config(aggregate=False)]))
        await d.inject("te/0", task(0, 600, 12), src=REQ)
        with anyio.fail_after(20):
            while not any(isinstance(e.msg, TaskFinished) for _, e in d.external_out):
                await anyio.sleep(0.01)
        await d.idle()
    got = [e.msg for _, e in d.external_out if e.dst == REQ]
    (fin,) = [m for m in got if isinstance(m, TaskFinished)]
    toks = [m for m in got if isinstance(m, TaskTokens)]
    assert fin.status == "completed" and fin.output_tokens == 12
    assert sum(len(m.token_ids) for m in toks) == 12
    assert verify(MemoryLog(sink)).identical
