"""A content digest of one run, equal for two runs that did the same thing.

What legitimately differs between two runs of the same seed and inputs is left
out: the run id (a name), the host, the process name, the wall-clock start time,
handler tracebacks (file paths, line numbers) and memory addresses in error texts. Everything else — every input,
event, output and snapshot, byte for byte, and the run's seed, mode, config and
code version — goes in, in log order.
"""

from __future__ import annotations

import hashlib

from deepserve.core.codec import DecodeError, decode, encode
from deepserve.core.messages import HandlerFailed
from deepserve.core.records import EventRec, Step
from deepserve.persistence.api import LogReader

from .common import mask_addresses, pick_run

# Bumped when what goes into the digest changes, so old and new digests never collide.
DIGEST_VERSION = 2  # 2: memory addresses in HandlerFailed errors masked


def digest(reader: LogReader, run_id: str | None = None) -> str:
    """blake2b-256 hex of the run's comparable content (default run: the last)."""
    run = pick_run(reader, run_id)
    h = hashlib.blake2b(digest_size=32)
    h.update(encode([DIGEST_VERSION, run.mode, run.seed, run.config, run.code_version]))
    update = h.update
    for step in reader.steps(run.run_id):
        for ev in step.events:
            if ev.type == "HandlerFailed":
                step = _without_tracebacks(step)
                break
        update(encode(step))
    return h.hexdigest()


def _without_tracebacks(step: Step) -> Step:
    events = tuple([_strip(ev) if ev.type == "HandlerFailed" else ev for ev in step.events])
    return Step(step.input, events, step.outputs, step.snapshot)


def _strip(ev: EventRec) -> EventRec:
    try:
        failed = decode("HandlerFailed", ev.payload)
    except DecodeError:
        return ev  # keep the bytes: a broken record is content too
    assert isinstance(failed, HandlerFailed)
    payload = encode(HandlerFailed(error=mask_addresses(failed.error)))
    return EventRec(ev.actor, ev.seq, ev.idx, ev.type, payload)
