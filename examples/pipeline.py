"""The `example` scenario: a dispatcher spreading jobs over flaky workers.

No LLM logic — just the kernel's features in one small, non-trivial network:

- `Dispatcher` spawns workers on start, assigns each job (one correlation id per
  job) to the least-loaded worker, and guards it with a timeout timer that
  re-dispatches the job if no `JobDone` arrives; a `JobDone` cancels the timer.
- `Worker` draws its service time from `ctx.rng` and finishes with a timer to
  itself; it sometimes crashes on a job (the supervisor restarts it, the job is
  lost and later re-dispatched by the timeout).
- Half-way through, the dispatcher retires `worker/0` (`ctx.stop`) and spawns a
  replacement: the retired worker's pending timers become dead letters.
"""

from __future__ import annotations

import random
from typing import Any

import msgspec

from deepserve.core import Actor, Context, Event, Message, SimDriver
from deepserve.core.records import LogSink, RunRec, Step

# ---- messages ------------------------------------------------------------------


class SubmitJob(Message, frozen=True):
    job: str
    size: float  # mean service time, seconds


class RunJob(Message, frozen=True):
    job: str
    size: float
    attempt: int


class ServiceElapsed(Message, frozen=True):
    job: str


class JobDone(Message, frozen=True):
    job: str
    worker: str
    service_s: float


class JobTimeout(Message, frozen=True):
    job: str
    attempt: int


# ---- events --------------------------------------------------------------------


class WorkerAdded(Event, frozen=True):
    worker: str


class WorkerRetired(Event, frozen=True):
    worker: str


class JobQueued(Event, frozen=True):
    job: str
    size: float


class JobAssigned(Event, frozen=True):
    job: str
    worker: str
    attempt: int


class JobCompleted(Event, frozen=True):
    job: str
    worker: str


class WorkAccepted(Event, frozen=True):
    job: str
    service_s: float


class WorkFinished(Event, frozen=True):
    job: str


# ---- the dispatcher ------------------------------------------------------------


class InFlight(msgspec.Struct):
    size: float
    worker: str = ""
    attempt: int = 0


class DispatchState(msgspec.Struct):
    workers: list[str] = []
    load: dict[str, int] = {}
    jobs: dict[str, InFlight] = {}
    done: int = 0
    retries: int = 0
    spawned: int = 0


class Dispatcher(Actor[DispatchState]):
    def __init__(self, workers: int, timeout_s: float, retire_after: int, fail_rate: float) -> None:
        self.n_workers = workers
        self.timeout_s = timeout_s
        self.retire_after = retire_after
        self.fail_rate = fail_rate

    def initial_state(self) -> DispatchState:
        return DispatchState()

    def on_start(self, ctx: Context) -> None:
        for _ in range(self.n_workers):
            self._add_worker(ctx)

    def evolve(self, s: DispatchState, e: Event) -> DispatchState:
        # Mutating in place is fine: the kernel snapshots by encoding, and a
        # failed handler's state is rebuilt from the snapshot, not from this object.
        if isinstance(e, WorkerAdded):
            s.workers.append(e.worker)
            s.load[e.worker] = 0
            s.spawned += 1
        elif isinstance(e, WorkerRetired):
            s.workers.remove(e.worker)
        elif isinstance(e, JobQueued):
            s.jobs[e.job] = InFlight(size=e.size)
        elif isinstance(e, JobAssigned):
            job = s.jobs[e.job]
            if job.worker in s.load:
                s.load[job.worker] -= 1
            job.worker, job.attempt = e.worker, e.attempt
            s.load[e.worker] += 1
            s.retries += e.attempt > 1
        elif isinstance(e, JobCompleted):
            job = s.jobs.pop(e.job)
            if job.worker in s.load:
                s.load[job.worker] -= 1
            s.done += 1
        return s

    def handle(self, ctx: Context, msg: Message) -> None:
        s = self.state
        if isinstance(msg, SubmitJob):
            ctx.record(JobQueued(job=msg.job, size=msg.size))
            self._assign(ctx, msg.job)
        elif isinstance(msg, JobDone):
            if msg.job not in s.jobs:
                return  # a late duplicate: the job was re-dispatched and finished elsewhere
            ctx.record(JobCompleted(job=msg.job, worker=msg.worker))
            ctx.cancel(f"job:{msg.job}")
            if s.done == self.retire_after and "worker/0" in s.workers:
                ctx.record(WorkerRetired(worker="worker/0"))
                ctx.stop("worker/0")
                self._add_worker(ctx)
        elif isinstance(msg, JobTimeout):
            job = s.jobs.get(msg.job)
            if job is not None and job.attempt == msg.attempt:
                self._assign(ctx, msg.job)

    def _add_worker(self, ctx: Context) -> None:
        addr = f"worker/{self.state.spawned}"
        ctx.spawn(addr, Worker, dispatcher=ctx.self, fail_rate=self.fail_rate)
        ctx.record(WorkerAdded(worker=addr))

    def _assign(self, ctx: Context, job_id: str) -> None:
        s = self.state
        job = s.jobs[job_id]
        # Least loaded, ties to the earliest-added worker: a total order, no set iteration.
        worker = min(s.workers, key=lambda w: s.load[w])
        attempt = job.attempt + 1
        ctx.record(JobAssigned(job=job_id, worker=worker, attempt=attempt))
        ctx.send(worker, RunJob(job=job_id, size=job.size, attempt=attempt))
        ctx.after(self.timeout_s, JobTimeout(job=job_id, attempt=attempt), key=f"job:{job_id}")


# ---- the worker ----------------------------------------------------------------


class WorkerState(msgspec.Struct):
    busy: dict[str, float] = {}
    finished: int = 0


class Worker(Actor[WorkerState]):
    def __init__(self, dispatcher: str, fail_rate: float) -> None:
        self.dispatcher = dispatcher
        self.fail_rate = fail_rate

    def initial_state(self) -> WorkerState:
        return WorkerState()

    def evolve(self, s: WorkerState, e: Event) -> WorkerState:
        if isinstance(e, WorkAccepted):
            s.busy[e.job] = e.service_s
        elif isinstance(e, WorkFinished):
            s.busy.pop(e.job, None)
            s.finished += 1
        return s

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, RunJob):
            service = ctx.rng.expovariate(1.0 / msg.size)
            ctx.record(WorkAccepted(job=msg.job, service_s=service))
            if ctx.rng.random() < self.fail_rate:
                # After recording on purpose: the kernel must discard this event.
                raise RuntimeError(f"{ctx.self} crashed on {msg.job}")
            ctx.after(service, ServiceElapsed(job=msg.job))
        elif isinstance(msg, ServiceElapsed):
            service = self.state.busy.get(msg.job, 0.0)
            ctx.record(WorkFinished(job=msg.job))
            ctx.send(self.dispatcher, JobDone(job=msg.job, worker=ctx.self, service_s=service))


# ---- running it ----------------------------------------------------------------


class _CountingSink:
    """Passes steps on to the real sink, counting what the summary reports."""

    def __init__(self, inner: LogSink | None) -> None:
        self.inner = inner
        self.failures = 0
        self.spawns = 0

    def begin_run(self, run: RunRec) -> None:
        if self.inner is not None:
            self.inner.begin_run(run)

    def append(self, step: Step) -> int:
        if step.input.type == "Started" and step.input.seq >= 0:
            self.spawns += 1
        for ev in step.events:
            if ev.type == "HandlerFailed":
                self.failures += 1
        return self.inner.append(step) if self.inner is not None else 0

    def flush(self) -> None:
        if self.inner is not None:
            self.inner.flush()

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()


def run_scenario(seed: int, sink: LogSink | None = None, requests: int | None = None) -> dict[str, Any]:
    """Run the scenario to completion; returns its summary. `sink` is not closed."""
    jobs = requests or 200
    counting = _CountingSink(sink)
    config = {"scenario": "example", "jobs": jobs, "workers": 4, "fail_rate": 0.05}
    driver = SimDriver(seed, sink=counting, config=config)
    driver.spawn(
        "dispatch", Dispatcher, workers=4, timeout_s=8.0, retire_after=jobs // 2, fail_rate=0.05
    )
    # The workload is an external input schedule, drawn outside the actors.
    arrivals = random.Random(f"example/{seed}")
    t = 0.0
    for i in range(jobs):
        t += arrivals.expovariate(2.0)
        job = f"job-{i}"
        size = arrivals.uniform(0.2, 2.0)
        driver.inject("dispatch", SubmitJob(job=job, size=size), at=t, corr=job, src="ext/client")
    driver.run()
    state = driver.actor("dispatch").state
    return {
        "scenario": "example",
        "seed": seed,
        "deliveries": driver.deliveries,
        "virtual_time_s": round(driver.now, 6),
        "actors": counting.spawns,
        "jobs": jobs,
        "jobs_done": state.done,
        "retries": state.retries,
        "failures": counting.failures,
        "dead_letters": driver.dead_letters,
    }
