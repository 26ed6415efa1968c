"""A daemon meant to run for days is flat once warm: under a steady load (the runtime in this
process, a few thousand short requests) the memory it holds stops growing after warm-up. A user
saw RSS grow ~12 KB a request at 10 req/s and stay there when idle; the driver's copy of every
message sent outside (`external_out`, 100,000 envelopes: each request's token chunks and its
terminal message) was most of it.

Memory is counted in allocated blocks (`sys.getallocatedblocks`, after a full collection):
exact, and free of tracemalloc's cost. What the kernel keeps for restarts (each actor's events
since its last snapshot) is bounded but sawtooths with the snapshot cadence; the test shortens
the cadence so that warm-up covers whole cycles."""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from inproc import FAST, load, quiet, started

from deepserve.actors.flowserve.master.actor import DpMaster
from deepserve.adapters.hardware.devices.npu import Npu
from deepserve.core.actor import Actor

WARM_UP, PHASE, PHASES = 600, 600, 3
CONCURRENCY, TOKENS = 64, 4
MAX_BLOCKS_PER_REQUEST = 12  # measured: 1-6 a phase flat (one phase 15 once); 24-36 with the leak back


def _actor_classes(cls: type = Actor) -> Iterator[type]:
    yield cls
    for sub in cls.__subclasses__():
        yield from _actor_classes(sub)


@pytest.fixture
def short_snapshot_cadence(monkeypatch: pytest.MonkeyPatch) -> None:
    assert DpMaster and Npu  # imported: their classes are among the subclasses patched
    for cls in list(_actor_classes()):
        if "snapshot_every" in vars(cls):
            monkeypatch.setattr(cls, "snapshot_every", 64)


def _blocks() -> int:
    gc.collect()
    return sys.getallocatedblocks()


async def _run(run_dir: Path) -> dict[str, Any]:
    rt, metrics = await started(run_dir, *FAST)
    try:
        done = await load(rt, WARM_UP, CONCURRENCY, TOKENS)
        growth = []
        for _ in range(PHASES):
            before = _blocks()
            done += await load(rt, PHASE, CONCURRENCY, TOKENS)
            growth.append((_blocks() - before) / PHASE)
        d = rt.driver
        assert d is not None
        je, gw = d.actor("je/0").state, d.actor(rt.cfg.daemon.ingress).state
        masters = [c.actor.state for a, c in d.cells.items() if "/dp/" in a and c.actor is not None]
        return {"growth": growth, "done": done, "external_out": len(d.external_out), "streams": len(rt.streams),
                "last_token": len(metrics._last_token_s), "jobs": len(je.jobs), "clients": len(gw.clients),
                "reqs": sum(len(m.reqs) for m in masters), "masters": len(masters)}  # fmt: skip
    finally:
        await rt.stop(2.0)


def test_memory_stops_growing_after_warm_up(tmp_path: Path, short_snapshot_cadence: None) -> None:
    with quiet():
        r = asyncio.run(_run(tmp_path / "run"))
    done = r["done"]
    assert len(done) == WARM_UP + PHASE * PHASES
    assert all(got == TOKENS and d.status == "completed" for got, d in done)
    # the least-growing phase: a leak grows in every phase (24-36 blocks a request with the
    # external_out leak back), while the kernel's snapshot sawtooth and bounded structures still
    # filling may land in any one or two phases (measured [20.5, 13.2, -4.8] and
    # [17.9, 13.0, 0.3] once per-request events grew with the engine-phase times)
    assert min(r["growth"]) < MAX_BLOCKS_PER_REQUEST, r["growth"]
    # every per-request record is gone once its request ended
    assert r["masters"] >= 1
    assert (r["streams"], r["last_token"], r["jobs"], r["clients"], r["reqs"], r["external_out"]) == (0,) * 6
