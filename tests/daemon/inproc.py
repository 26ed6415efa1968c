"""The daemon's runtime in this process, driven without HTTP: requests submitted to the
`Runtime` as the frontend submits them, their queues drained to the terminal message."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog

from deepserve.actors.flowserve.messages import Sampling
from deepserve.actors.workload.messages import RequestDone
from deepserve.adapters.tokenizer import prompt_of_ids
from deepserve.daemon.config import load_config
from deepserve.daemon.metrics import Metrics
from deepserve.daemon.runtime import Runtime

FAST = ("control.pod_start_s=0.05", "control.te_preload_s=0.05", "pd.prefill_tes=0", "pd.decode_tes=0",
        "cluster.tes=1", "control.spare_tes=0")  # fmt: skip


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The runtime logs a line per finished request: warnings only, while this runs."""
    before = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    try:
        yield
    finally:
        structlog.configure(**before)


async def started(run_dir: Path, *overrides: str) -> tuple[Runtime, Metrics]:
    """A running runtime whose TEs are ready, with the frontend's metrics hooks."""
    rt = Runtime(load_config(None, tuple(overrides)), run_dir)
    metrics = Metrics(rt.cfg.model_name())
    rt.on_done, rt.on_tokens, rt.on_rejected = metrics.done, metrics.tokens, metrics.rejected
    await rt.start()
    for _ in range(2000):
        tes = rt.status()["tes"]
        if tes and all(t["state"] == "ready" and all(d.get("alive") for d in t["dps"]) for t in tes):
            return rt, metrics
        await asyncio.sleep(0.01)
    raise RuntimeError("the TEs did not become ready")


async def one(rt: Runtime, i: int, tokens: int) -> tuple[int, RequestDone]:
    """One request to its end: (tokens received, its RequestDone)."""
    rid = rt.new_request_id("cmpl")
    # distinct token ids: no shared prefix blocks, every request is new work
    prompt = prompt_of_ids([(i * 131 + k) % 30_000 for k in range(24 + i % 8)], rt.cfg.cluster.kv_block_tokens)
    q = await rt.submit(rid, prompt, Sampling(max_tokens=tokens, ignore_eos=True, seed=i))
    got = 0
    while True:
        item: Any = await q.get()
        if isinstance(item, RequestDone):
            return got, item
        got += len(item.token_ids)


async def load(rt: Runtime, requests: int, concurrency: int, tokens: int) -> list[tuple[int, RequestDone]]:
    """`requests` requests, `concurrency` at a time (a closed loop)."""
    todo = list(range(requests))
    out: list[tuple[int, RequestDone]] = []

    async def worker() -> None:
        while todo:
            out.append(await one(rt, todo.pop(), tokens))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out
