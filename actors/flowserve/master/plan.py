"""What `scheduler.schedule` returns: the batch it planned and how it runs. Structs of their own
module: the scheduler is compiled by mypyc, and msgspec Structs stay in pure modules
(tests/core/test_compiled.py)."""

from __future__ import annotations

import msgspec

from deepserve.actors.flowserve import rtc
from deepserve.actors.flowserve.master.state import BatchPlanned, Entry


class Plan(msgspec.Struct, kw_only=True):
    batch: BatchPlanned | None
    copies: list[rtc.RtcCopyStarted]  # swap-outs started by preemption (the caller moves bytes)


class Run(msgspec.Struct, frozen=True):
    """How a batch runs: `passes` (1: a single forward), the lead passes after pass 0 (their
    entries, in pass order) and, per entry, the pass of its first token (0 for all: ())."""

    passes: int
    lead: tuple[tuple[Entry, ...], ...] = ()
    emit_from: tuple[int, ...] = ()


SINGLE = Run(1)
