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

from .common import ReplayError
from .verifier import Divergence, VerifyResult, verify


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


def verify_logs(directory: str, run_id: str | None = None) -> DirVerdict:
    """Verify every `*.db` file of `directory` on its own (its last run, or `run_id` in the
    files that hold it). A diverged log does not stop the others from being checked."""
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
    if not verdicts:
        raise ReplayError(f"{directory}: no log holds run {run_id!r}")
    first_bad = next((v.result.divergence for v in verdicts if v.result.divergence is not None), None)
    return DirVerdict(verdicts[0].result.run_id, all(v.result.identical for v in verdicts),
                      sum(v.result.actors for v in verdicts), sum(v.result.inputs for v in verdicts),
                      first_bad, verdicts)  # fmt: skip
