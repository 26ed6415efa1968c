"""The host's state (LRU page cache of model files, loads in flight), events and `evolve_host`."""

from __future__ import annotations

import msgspec

from deepserve.adapters.hardware.devices.common import ReplyTo
from deepserve.core import Event

PRELOAD = "preload"  # a job's path when it fills the page cache instead of loading NPUs
FORK = "npu-fork"


class Cached(msgspec.Struct, frozen=True, array_like=True):
    model: str
    nbytes: int


class Job(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    req_id: str
    model: str
    to: ReplyTo
    path: str  # "dram-hit", "ssd", "npu-fork[-kind]", PRELOAD
    targets: tuple[str, ...]
    bytes_per_npu: int
    accepted_at_s: float
    waiting: tuple[str, ...]  # transfer req_ids not yet completed
    initialising: bool = False
    asks: tuple[tuple[int, str], ...] = ()  # (ask id, transfer req_id): who failed, on AskFailed


class HostState(msgspec.Struct, frozen=True):
    cache: tuple[Cached, ...] = ()  # least recently used first
    jobs: dict[str, Job] = {}
    hits: int = 0
    misses: int = 0
    loads_done: int = 0
    loads_failed: int = 0

    def cached(self, model: str) -> Cached | None:
        return next((c for c in self.cache if c.model == model), None)

    def dram_bytes_used(self) -> int:
        return sum(c.nbytes for c in self.cache)


class HostJobStarted(Event, frozen=True):
    job: Job
    hit: bool | None  # page-cache hit or miss for local loads; None for forks and preloads


class HostPartDone(Event, frozen=True):
    key: str
    part: str
    link_kind: str


class HostJobInit(Event, frozen=True):
    key: str


class HostJobEnded(Event, frozen=True):
    key: str
    ok: bool


class HostCacheTouched(Event, frozen=True):
    model: str


class HostCacheFilled(Event, frozen=True):
    model: str
    nbytes: int
    evicted: tuple[str, ...]  # chosen by the handler, least recently used first


class HostCacheEvicted(Event, frozen=True):
    model: str


def _touch(cache: tuple[Cached, ...], model: str) -> tuple[Cached, ...]:
    hit = [c for c in cache if c.model == model]
    return (*[c for c in cache if c.model != model], *hit)


def evolve_host(st: HostState, e: Event) -> HostState:
    replace = msgspec.structs.replace
    if isinstance(e, HostJobStarted):
        hits, misses = st.hits + (e.hit is True), st.misses + (e.hit is False)
        return replace(st, jobs={**st.jobs, e.job.key: e.job}, hits=hits, misses=misses)
    if isinstance(e, HostPartDone):
        job = st.jobs[e.key]
        path = f"{FORK}-{e.link_kind}" if job.path == FORK else job.path
        waiting = tuple(p for p in job.waiting if p != e.part)
        return replace(st, jobs={**st.jobs, e.key: replace(job, waiting=waiting, path=path)})
    if isinstance(e, HostJobInit):
        return replace(st, jobs={**st.jobs, e.key: replace(st.jobs[e.key], initialising=True)})
    if isinstance(e, HostJobEnded):
        jobs = {k: j for k, j in st.jobs.items() if k != e.key}
        if e.ok:
            return replace(st, jobs=jobs, loads_done=st.loads_done + 1)
        return replace(st, jobs=jobs, loads_failed=st.loads_failed + 1)
    if isinstance(e, HostCacheTouched):
        return replace(st, cache=_touch(st.cache, e.model))
    if isinstance(e, HostCacheFilled):
        kept = tuple(c for c in st.cache if c.model not in e.evicted and c.model != e.model)
        return replace(st, cache=(*kept, Cached(e.model, e.nbytes)))
    if isinstance(e, HostCacheEvicted):
        return replace(st, cache=tuple(c for c in st.cache if c.model != e.model))
    raise AssertionError(f"host: unknown event {type(e).__name__}")
