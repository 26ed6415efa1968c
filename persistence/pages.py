"""The paged layout (schema v4): a run's steps stored as pages, each the msgpack
`list[Step]` its driver encoded, one `pages` row per page (`schema.pages`).

Why: a row costs the SQLite writer ~3-8 µs to insert on a 2-core machine, and a step is
one row per record (an input, its events and outputs), so the writer process bounded a
logged simulation near 60-100k steps a second. A page of ~1,000 steps is one row: the
writer copies the bytes it was sent without decoding them, and a reader turns a page
back into `Step`s in one msgspec call.

Since schema v6 the writer process stores a page as a zstd frame (`sqlite/child.py`): a
Mooncake run's pages shrink ~4.5x, and writing 4.5x fewer bytes costs the writer less than
compressing them does (docs/decisions.md, "Pages are zstd frames"). A body is a zstd frame if it begins
with zstd's magic number, which no msgpack array (a page before v6) can begin with.

Each page carries a CRC-32 of its stored bytes, checked whenever it is read and by
`check_integrity`: SQLite does not check what a blob holds, so a row's damaged payload
goes unseen, a page's does not. What a page gives up is the per-record indexes: a filter
by actor or correlation id decodes the run's pages and tests each step
(`StepFilter.matches`); a time range skips the pages outside it (`t_first`/`t_last`).

Both sides live here: `page_head` (what the writer process stores beside a page's
bytes; the frame that carries it is `sqlite/child.py`'s PAGE), and the readers'
`page_steps`, `page_actors` and `page_snapshots`.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import msgspec
import zstandard

from deepserve.core.records import SnapshotRec, Step

from .api import StepFilter
from .errors import LogError

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # a zstd frame's first four bytes (RFC 8878)


class PageHead(NamedTuple):
    steps: int
    t_first: float
    t_last: float


def page_head(steps: list[Step]) -> PageHead:
    """The head of a page of `steps` (at least one)."""
    ts = [s.input.t for s in steps]
    return PageHead(len(steps), min(ts), max(ts))


class EncodedSteps:
    """Steps a driver encoded itself, back to back (`core.steps.StepPage`: each the msgpack of
    a `Step`), handed to the thread writer as one item (`GroupCommitSink.append_page`)."""

    __slots__ = ("body", "steps", "t_first", "t_last")

    def __init__(self, body: bytes, steps: int, t_first: float, t_last: float) -> None:
        self.body, self.steps, self.t_first, self.t_last = body, steps, t_first, t_last


def page_body(part: list[Any], encode: Callable[[Any], bytes]) -> tuple[bytes, PageHead]:
    """One page's msgpack `list[Step]` of `part`: `Step`s (encoded here with `encode`) and
    `EncodedSteps` (their bytes as they are), in order; and its head. The same bytes as
    `encode(list of every step)`: an array header, then each step's encoding."""
    if all(type(x) is not EncodedSteps for x in part):  # only Steps: msgspec's own list
        return encode(part), page_head(part)
    pieces: list[bytes] = []
    steps, t_first, t_last = 0, float("inf"), float("-inf")
    for x in part:
        if type(x) is EncodedSteps:
            pieces.append(x.body)
            steps += x.steps
            t_first, t_last = min(t_first, x.t_first), max(t_last, x.t_last)
        else:
            pieces.append(encode(x))
            steps += 1
            t_first, t_last = min(t_first, x.input.t), max(t_last, x.input.t)
    return array_header(steps) + b"".join(pieces), PageHead(steps, t_first, t_last)


def part_steps(part: list[Any]) -> int:
    """The steps in a writer's part (`Step`s and `EncodedSteps`)."""
    return sum(x.steps if type(x) is EncodedSteps else 1 for x in part)


def array_header(n: int) -> bytes:
    """msgpack's header of an `n`-element array (fixarray, array 16, array 32): what goes
    before `n` steps encoded one by one to make the page `msgspec` would encode from a list."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


class _InputHead(msgspec.Struct, array_like=True):
    # `InputRec`'s first fields, as far as `StepFilter.matches` reads: msgspec skips the rest
    # of the array (the payload), and the step's events, outputs and snapshot.
    actor: str
    seq: int  # -1: a dead letter or a drop, not a delivery to `actor`
    t: float
    hlc: int
    kind: int
    src: str
    msg_id: int
    corr: str | None


class _StepHead(msgspec.Struct, array_like=True):
    input: _InputHead


class _StepSnapshot(msgspec.Struct, array_like=True):
    # A step with only its snapshot built: the rest stays undecoded bytes (`Raw`).
    input: msgspec.Raw
    events: msgspec.Raw
    outputs: msgspec.Raw
    snapshot: SnapshotRec | None = None


_DECOMPRESS = zstandard.ZstdDecompressor().decompress  # frames carry their content size
_STEPS = msgspec.msgpack.Decoder(list[Step])
_HEADS = msgspec.msgpack.Decoder(list[_StepHead])
_SNAPSHOTS = msgspec.msgpack.Decoder(list[_StepSnapshot])

# A stored page as readers fetch it: (id, body, crc32).
Page = tuple[int, bytes, int]


def checked_body(label: str, run_id: str, page: Page) -> bytes:
    """The page's body (its msgpack) once its stored bytes match their checksum; else the
    log is damaged."""
    page_id, body, crc = page
    if zlib.crc32(body) != crc:
        raise LogError(
            f"{label}: damaged log: page {page_id} of run {run_id!r} fails its checksum "
            "(its steps cannot be trusted)"
        )
    if body[:4] != ZSTD_MAGIC:
        return body
    try:
        return _DECOMPRESS(body)
    except zstandard.ZstdError as exc:
        raise LogError(
            f"{label}: damaged log: page {page_id} of run {run_id!r} does not decompress ({exc})"
        ) from None


def _decode(decoder: msgspec.msgpack.Decoder[Any], label: str, run_id: str, page: Page) -> Any:
    """A page decoded; a page that fails its checksum or does not decode is a damaged
    log (`LogError`)."""
    body = checked_body(label, run_id, page)
    try:
        return decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise LogError(
            f"{label}: damaged log: page {page[0]} of run {run_id!r} does not decode ({exc})"
        ) from None


def check_page_head(label: str, run_id: str, page: Page, head: PageHead, first_step: int,
                    expected_first: int | None) -> int:
    """A page's stored head (its row's `steps`, `t_first`, `t_last`, `first_step`) against what
    its body holds: the checksum covers only the body, and readers select pages for a time range
    by `t_first`/`t_last` without decoding them, so damage there would silently hide a page.
    `expected_first`: where the run's previous page ended (None for its first page; another
    run's pages may come between, written to the same file at once). Returns where this page
    ends (`LogError` if anything disagrees)."""
    heads = _decode(_HEADS, label, run_id, page)  # checks the body's CRC first
    ts = [h.input.t for h in heads]
    actual = PageHead(len(ts), min(ts), max(ts)) if ts else None
    problems = []
    if actual != head:
        holds = (f"its body holds {actual.steps} at t={actual.t_first:g}..{actual.t_last:g}" if actual
                 else "its body holds none")  # fmt: skip
        problems.append(f"its row says {head.steps} steps at t={head.t_first:g}..{head.t_last:g}, {holds}")
    if expected_first is not None and first_step < expected_first:
        problems.append(f"its row says it starts at step {first_step}, inside the run's previous page "
                        f"(which ends at step {expected_first - 1})")  # fmt: skip
    if problems:
        raise LogError(
            f"{label}: damaged log: page {page[0]} of run {run_id!r} has a head that does not "
            f"match its steps ({'; '.join(problems)})"
        )
    return first_step + head.steps


def decode_page(label: str, run_id: str, page: Page) -> list[Step]:
    """A page's steps (`LogError` for a damaged page)."""
    return _decode(_STEPS, label, run_id, page)  # type: ignore[no-any-return]


def page_steps(
    label: str, run_id: str, pages: Iterable[Page], where: StepFilter
) -> Iterator[Step]:
    """The steps of `pages` (in log order) that `where` (a `StepFilter`) selects. Under a
    filter, a page's input heads are decoded first (~a third of a full decode) and the
    page is decoded in full only if one of them matches: a correlation id or a rare
    actor touches few of a run's pages."""
    if where.whole_run:
        for page in pages:
            yield from decode_page(label, run_id, page)
        return
    matches = where.matches
    for page in pages:
        heads = _decode(_HEADS, label, run_id, page)
        hits = [i for i, h in enumerate(heads) if matches(h.input)]
        if hits:
            steps = decode_page(label, run_id, page)
            yield from (steps[i] for i in hits)


def select_in_page(
    label: str, run_id: str, page: Page, keep: Callable[[Any], bool]
) -> list[tuple[int, Step]]:
    """The steps of one page whose input `keep` selects (it sees the input's head: actor, seq,
    t, hlc, kind, src, msg_id, corr), each with its index in the page (its step id is the page's
    `first_step` plus that): for readers that need step ids, such as the admin timeline."""
    heads = _decode(_HEADS, label, run_id, page)
    hits = [i for i, h in enumerate(heads) if keep(h.input)]
    if not hits:
        return []
    steps = decode_page(label, run_id, page)
    return [(i, steps[i]) for i in hits]


def page_actors(label: str, run_id: str, pages: Iterable[Page]) -> set[str]:
    """Actors that were delivered an input in these pages (decoding only the head of
    each input), as `SqlLog.actors` selects them from rows (`seq >= 0`)."""
    seen: set[str] = set()
    for page in pages:
        seen.update(h.input.actor for h in _decode(_HEADS, label, run_id, page) if h.input.seq >= 0)
    return seen


def page_snapshots(
    label: str, run_id: str, pages: Iterable[Page], actor: str | None
) -> Iterator[SnapshotRec]:
    """The snapshots in these pages, in log order (of `actor` only, if given). Only the
    snapshots are built (~a quarter of a full decode's time on a simulation's log)."""
    for page in pages:
        for step in _decode(_SNAPSHOTS, label, run_id, page):
            snap = step.snapshot
            if snap is not None and (actor is None or snap.actor == actor):
                yield snap
