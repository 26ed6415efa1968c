"""Azure LLM inference trace 2023 (Azure Public Dataset; Patel et al., Splitwise, ISCA 2024).

CSV with a header; the columns used are `TIMESTAMP` (`YYYY-MM-DD HH:MM:SS.fffffff`),
`ContextTokens` (prompt length) and `GeneratedTokens` (output length), in any order, other columns
ignored. Arrival times are seconds from the first row. Prompt text is not published: prompts share
nothing (every request's blocks are unique).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from datetime import datetime

from .common import TraceError, TraceRequest, check_lengths, check_order

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def header_columns(path: str, header: str) -> dict[str, int]:
    """Column name -> position; an error names the missing column."""
    names = [name.strip() for name in next(csv.reader([header]), [])]
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise TraceError(path, 1, missing[0], f"column missing from the header {names!r}")
    return {c: names.index(c) for c in COLUMNS}


def _int(path: str, line: int, field: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise TraceError(path, line, field, f"{text!r} is not an integer") from None


def _time(path: str, line: int, text: str) -> datetime:
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:
        raise TraceError(
            path, line, "TIMESTAMP", f"{text!r} is not a time like 2023-11-16 18:15:46.6805900"
        ) from None


def read_azure(path: str, header: str, lines: Iterable[tuple[int, str]]) -> Iterator[TraceRequest]:
    """Requests from the header and (line number, text) pairs of the rows after it."""
    cols = header_columns(path, header)
    width = max(cols.values()) + 1
    header_width = len(next(csv.reader([header])))
    t_col, p_col, o_col = (cols[c] for c in COLUMNS)
    first: datetime | None = None
    previous_s = 0.0
    index = 0
    for line, text in lines:
        if not text.strip():
            continue
        fields = next(csv.reader([text]))
        if len(fields) < width:
            raise TraceError(
                path, line, COLUMNS[_first_absent(cols, len(fields))],
                f"row has {len(fields)} fields, the header names {width}",
            )  # fmt: skip
        if len(fields) > header_width:  # a shifted or merged row: its values may be misread
            raise TraceError(path, line, "row", f"row has {len(fields)} fields, the header names {header_width}")
        stamp = _time(path, line, fields[t_col])
        prompt = _int(path, line, "ContextTokens", fields[p_col])
        output = _int(path, line, "GeneratedTokens", fields[o_col])
        check_lengths(path, line, "ContextTokens", prompt, "GeneratedTokens", output)
        if first is None:
            first = stamp
        try:
            arrival_s = (stamp - first).total_seconds()
        except TypeError:  # one row with a UTC offset, another without
            raise TraceError(path, line, "TIMESTAMP", "mixes times with and without a UTC offset") from None
        check_order(path, line, "TIMESTAMP", arrival_s, previous_s)
        previous_s = arrival_s
        yield TraceRequest(index, line, arrival_s, prompt, output, None)
        index += 1
    if index == 0:  # as an empty file is refused
        raise TraceError(path, 1, "format", "the file holds a header and no rows")


def _first_absent(cols: dict[str, int], present: int) -> int:
    """Index into COLUMNS of the first needed column the short row lacks."""
    return min((i for i, c in enumerate(COLUMNS) if cols[c] >= present), default=0)
