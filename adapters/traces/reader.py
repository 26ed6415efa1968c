"""Open a trace file of either format, told apart by its content (never by its name).

A line starting with `{` is Mooncake JSONL; a CSV header naming `TIMESTAMP` is the Azure trace.
`open_trace` checks the file and its format at once (so a CLI can refuse it before it starts a
run); iterating the result streams the requests, raising `TraceError` at the first bad row.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import BinaryIO, Literal

from .azure import header_columns, read_azure
from .common import MAX_LINE_BYTES, TraceError, TraceRequest
from .mooncake import read_mooncake

TraceFormat = Literal["mooncake", "azure"]
_BOM = b"\xef\xbb\xbf"


def _lines(path: str, f: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw line) with a bound on a line's length."""
    line = 0
    while True:
        raw = f.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        line += 1
        if len(raw) > MAX_LINE_BYTES:
            raise TraceError(path, line, "row", f"line longer than {MAX_LINE_BYTES} bytes")
        if line == 1 and raw.startswith(_BOM):
            raw = raw[len(_BOM):]
        yield line, raw


def _text(path: str, lines: Iterator[tuple[int, bytes]]) -> Iterator[tuple[int, str]]:
    for line, raw in lines:
        try:
            yield line, raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError(path, line, "row", f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _first_row(path: str, f: BinaryIO) -> tuple[int, bytes]:
    for line, raw in _lines(path, f):
        if raw.strip():
            return line, raw
    raise TraceError(path, 0, "format", "the file is empty (no rows)")


def detect_format(path: str, first: bytes, line: int) -> TraceFormat:
    head = first.lstrip()
    if head.startswith(b"{"):
        return "mooncake"
    if b"TIMESTAMP" in head:
        return "azure"
    raise TraceError(
        path, line, "format",
        "neither Mooncake JSONL (a JSON object a line) nor the Azure CSV "
        "(a header with TIMESTAMP,ContextTokens,GeneratedTokens)",
    )  # fmt: skip


class Trace:
    """A trace file whose format is known; iterate it (again and again) for its requests."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        try:
            with open(self.path, "rb") as f:
                line, first = _first_row(self.path, f)
        except OSError as exc:
            raise TraceError(self.path, 0, "path", exc.strerror or str(exc)) from None
        self.format: TraceFormat = detect_format(self.path, first, line)
        if self.format == "azure":
            if line != 1:
                raise TraceError(self.path, line, "format", "the Azure CSV header must be line 1")
            header_columns(self.path, first.decode("utf-8", "replace"))

    def __iter__(self) -> Iterator[TraceRequest]:
        try:
            f = open(self.path, "rb")  # noqa: SIM115 — closed by the generator's finally
        except OSError as exc:
            raise TraceError(self.path, 0, "path", exc.strerror or str(exc)) from None
        with f:
            lines = _lines(self.path, f)
            if self.format == "mooncake":
                yield from read_mooncake(self.path, lines)
            else:
                text = _text(self.path, lines)
                _, header = next(text)
                yield from read_azure(self.path, header, text)

    def rows(self) -> int:
        """How many requests the trace holds, by a quick count of its non-empty lines (a bad row
        is the reader's to report, when the run reaches it)."""
        n = 0
        try:
            with open(self.path, "rb") as f:
                for line in f:
                    n += bool(line.strip())
        except OSError as exc:
            raise TraceError(self.path, 0, "path", exc.strerror or str(exc)) from None
        return n - (self.format == "azure")  # the header

    def head(self, n: int | None) -> Iterator[TraceRequest]:
        """The first `n` requests (all when `n` is None)."""
        return iter(self) if n is None else islice(self, n)


def open_trace(path: str | Path) -> Trace:
    """Check that `path` is a readable trace of a known format; raises `TraceError`."""
    return Trace(path)
