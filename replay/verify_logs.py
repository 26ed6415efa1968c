"""Verifying a run directory that holds one log per process (`deepserve up --processes`).

Each process's log is re-executed on its own: what reached a process from the others is
recorded there as inputs, so no log needs another to replay, and the actors re-executed and
inputs checked add up to what a merged reading would check. Merging the files by HLC (what
`replay log` does) would mix the incarnations of an address that lived in two processes one
after the other (a TE and its replacement, both numbered from 1), so verify never merges them.
The result's first fields are a `VerifyResult`'s (run, identical, actors, inputs, the first
divergence); `logs` adds each file's own."""

from __future__ import annotations

import os

import msgspec

from deepserve.persistence.factory import log_files, open_log
from deepserve.persistence.run_dir import log_name

from .common import ReplayError
from .verifier import Divergence, VerifyResult, verify

PODS = "pods"  # the daemon's pod launcher (deepserve/cluster/control.PODS_ADDR)


class LogVerdict(msgspec.Struct):
    log: str  # the file's name in the directory
    result: VerifyResult


class DirVerdict(msgspec.Struct):
    run_id: str
    identical: bool  # every log re-executed identically
    actors: int  # summed over the logs
    inputs: int
    divergence: Divergence | None  # the first diverged log's
    logs: list[LogVerdict]

    def summary(self) -> str:
        n = len(self.logs)
        if self.identical:
            return (f"identical: {self.actors} actors, {self.inputs} inputs (run {self.run_id!r}); "
                    f"{n} logs, each verified on its own")  # fmt: skip
        bad = sum(not v.result.identical for v in self.logs)
        return f"diverged: {bad} of {n} logs (run {self.run_id!r})"


def one_run_per_process(path: str) -> bool:
    """A directory whose `*.db` files (more than one) all hold the same single run: one log per
    process of a daemon run. Files of different runs keep the merged reading (and its refusal
    to guess which run is meant)."""
    if not os.path.isdir(path):
        return False
    files = log_files(path)
    if len(files) < 2:
        return False
    run_ids: set[str] = set()
    for f in files:
        reader = open_log(f, upgrade=False)
        try:
            run_ids |= {r.run_id for r in reader.runs()}
        finally:
            reader.close()
        if len(run_ids) > 1:
            return False
    return len(run_ids) == 1


def missing_logs(directory: str, files: list[str]) -> list[str]:
    """The logs the run says it wrote and the directory lacks: a split simulation's workers
    (each log's run config names its partition, `index` of `of`), and a daemon's TE processes
    (the `pods` actor's `SpawnProcess` outputs in `daemon.db`). A run directory missing one
    used to verify `identical` on what was left, and `replay log` dropped its lines."""
    # the split simulation's naming rule (imported here: only a run directory needs it)
    from deepserve.adapters.scenario.partition import worker_log_name

    names = {os.path.basename(f) for f in files}
    expected: set[str] = set()
    for path in files:
        reader = open_log(path, upgrade=False)
        try:
            runs = reader.runs()
            if not runs:  # e.g. copied before its process began its run: not a whole run either
                raise ReplayError(f"{path}: holds no run, so {directory} is not a whole run directory")
            for run in runs:
                part = msgspec.json.decode(run.config).get("partition") if run.config else None
                if isinstance(part, dict) and isinstance(part.get("of"), int):
                    expected |= {worker_log_name(i) for i in range(part["of"])}
            if os.path.basename(path) == "daemon.db":
                for step in reader.steps(actor=PODS):
                    for out in step.outputs:
                        if out.type == "SpawnProcess":
                            pod = msgspec.msgpack.decode(out.payload).get("pod_id", "")
                            expected.add(log_name(pod) + ".db")
        finally:
            reader.close()
    return sorted(expected - names)


def exited_logs(directory: str) -> set[str]:
    """The logs of processes whose exit the daemon recorded (the `pods` actor's `ProcessExited`
    inputs in `daemon.db`: a TE process killed, or replaced). Such a log has no closing record when
    its process was killed, and that is the run's own story, not a log cut short: the daemon's log
    says where and how it ended."""

    path = os.path.join(directory, "daemon.db")
    if not os.path.isfile(path):
        return set()
    names: set[str] = set()
    reader = open_log(path, upgrade=False)
    try:
        for step in reader.steps(actor=PODS):
            if step.input.type == "ProcessExited":
                pod = msgspec.msgpack.decode(step.input.payload).get("pod_id", "")
                names.add(log_name(pod) + ".db")
    finally:
        reader.close()
    return names


def verify_logs(directory: str, run_id: str | None = None) -> DirVerdict:
    """Verify every `*.db` file of `directory` on its own (its last run, or `run_id` in the
    files that hold it). A diverged log does not stop the others from being checked; a log
    the run wrote and the directory lacks is refused before any is checked."""
    gone = missing_logs(directory, log_files(directory))
    if gone:
        raise ReplayError(f"{directory}: the run wrote {', '.join(gone)}, which the directory lacks: "
                          "an incomplete run directory cannot be verified")  # fmt: skip
    verdicts: list[LogVerdict] = []
    for path in log_files(directory):
        reader = open_log(path, upgrade=False)
        try:
            reader.check_integrity()
            if run_id is not None and run_id not in {r.run_id for r in reader.runs()}:
                continue
            verdicts.append(LogVerdict(os.path.basename(path), verify(reader, run_id)))
        finally:
            reader.close()
    exited = exited_logs(directory)
    for v in verdicts:
        if v.result.closed is False and v.log in exited:
            v.result.closed = None  # its process's end is in daemon.db: not a log cut short
    if not verdicts:
        raise ReplayError(f"{directory}: no log holds run {run_id!r}")
    first_bad = next((v.result.divergence for v in verdicts if v.result.divergence is not None), None)
    return DirVerdict(verdicts[0].result.run_id, all(v.result.identical for v in verdicts),
                      sum(v.result.actors for v in verdicts), sum(v.result.inputs for v in verdicts),
                      first_bad, verdicts)  # fmt: skip
