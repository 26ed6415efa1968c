"""Running many seeds: seeds are independent, so they fan out over an existing engine — local
processes (`concurrent.futures`) by default, Ray with a cluster address — one seed a task, each
with its own log. No scheduler of our own: the engines hand tasks to free workers.

A task gets the config as msgpack bytes and returns its `SeedResult` as msgpack bytes: the
same on both engines, and nothing of the worker's state crosses back.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

import msgspec

from deepserve.cluster.schema import PlatformConfig

from .runner import SeedResult, run_seed

_ENCODE = msgspec.msgpack.Encoder()
_SEED = msgspec.msgpack.Decoder(SeedResult)
_CONFIG = msgspec.msgpack.Decoder(PlatformConfig)


class RayMissing(RuntimeError):
    """`--cluster` without the `ray` package."""


def seed_task(config: bytes, seed: int, requests: int | None, log_dir: str, keep_log: bool) -> bytes:
    """One seed in a worker (a pool process or a Ray task)."""
    os.makedirs(log_dir, exist_ok=True)
    return _ENCODE.encode(run_seed(_CONFIG.decode(config), seed, requests, log_dir, keep_log))


def run_seeds(config: PlatformConfig, seeds: Sequence[int], requests: int | None, log_dir: str, *, workers: int = 1,
              keep_logs: bool = False, cluster: str | None = None,
              progress: Callable[[SeedResult], None] | None = None) -> tuple[list[SeedResult], float]:  # fmt: skip
    """Every seed's result in seed order, and the wall time. `cluster`: a Ray address ("local"
    starts a Ray instance on this machine); else `workers` local processes (1: this process)."""
    blob = _ENCODE.encode(config)
    args = [(blob, s, requests, log_dir, keep_logs) for s in seeds]
    t0 = time.perf_counter()
    if cluster is not None:
        results = _on_ray(cluster, args, progress)
    elif workers == 1:
        results = []
        for a in args:
            results.append(_SEED.decode(seed_task(*a)))
            if progress is not None:
                progress(results[-1])
    else:
        results = _on_processes(workers, args, progress)
    return sorted(results, key=lambda r: r.seed), time.perf_counter() - t0


def _on_processes(workers: int, args: list[tuple[Any, ...]], progress: Callable[[SeedResult], None] | None) -> list[SeedResult]:
    out = []
    with ProcessPoolExecutor(max_workers=min(workers, len(args))) as pool:
        for fut in as_completed([pool.submit(seed_task, *a) for a in args]):
            out.append(_SEED.decode(fut.result()))
            if progress is not None:
                progress(out[-1])
    return out


def _on_ray(address: str, args: list[tuple[Any, ...]], progress: Callable[[SeedResult], None] | None) -> list[SeedResult]:
    try:
        import ray
    except ImportError:
        raise RayMissing("--cluster needs the ray package, not installed: pip install 'deepserve[ray]'") from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=None if address == "local" else address, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)  # fmt: skip
    try:
        task = ray.remote(seed_task)
        pending = [task.remote(*a) for a in args]
        out = []
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            out.append(_SEED.decode(ray.get(done[0])))
            if progress is not None:
                progress(out[-1])
        return out
    finally:
        if started:
            ray.shutdown()
