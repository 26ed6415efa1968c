"""The fast-scaling pipeline on the wall clock (AsyncDriver, as `deepserve up` runs it): a
scale-out of two pre-warmed TEs forked from the running one, every step recorded; the log
replays identically."""

from __future__ import annotations

import anyio

from deepserve.actors.cluster.messages import ScaleGroup
from deepserve.benchmarks.scaling import PREWARM, scale_config
from deepserve.cluster.assembly import assemble
from deepserve.cluster.control import MANAGER_ADDR
from deepserve.core import MemorySink
from deepserve.core.asyncdriver import AsyncDriver
from deepserve.persistence.api import MemoryLog
from deepserve.replay import verify


def ready(d: AsyncDriver) -> int:
    try:
        return sum(r.state == "ready" for r in d.actor(MANAGER_ADDR).state.tes.values())
    except KeyError:  # not started yet
        return 0


async def test_a_forked_scale_out_under_the_async_driver() -> None:
    sink = MemorySink()
    cfg = scale_config({**PREWARM, "fork": True}, new_tes=2)
    async with AsyncDriver(seed=3, sink=sink) as d:
        assemble(d, cfg)
        await d.inject(MANAGER_ADDR, ScaleGroup(group="llama3-8b/colocated", size=3), src="ext/test")
        with anyio.fail_after(60):
            while ready(d) < 3:
                await anyio.sleep(0.05)
        await d.idle()
        tes = d.actor(MANAGER_ADDR).state.tes
    for te in ("te/1", "te/2"):
        assert tes[te].details["te_load"].startswith("npu-fork-hccs from te/0")
        assert {"scaler_pre", "te_pre_load", "te_load", "te_post_load", "registered"} <= set(tes[te].steps)
    assert verify(MemoryLog(sink)).identical  # type: ignore[arg-type]
