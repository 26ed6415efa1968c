"""Mooncake JSONL (kvcache-ai/Mooncake, FAST'25 traces): one JSON object a line.

Fields: `timestamp` (arrival, milliseconds from the start), `input_length`, `output_length`,
`hash_ids` (one id per 512-token prompt block; the last block may be partial). Other fields are
ignored. Each line is decoded by msgspec against a typed row, so a bad field is named exactly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Annotated

import msgspec

from .common import (
    MOONCAKE_BLOCK_TOKENS,
    TraceError,
    TraceRequest,
    check_lengths,
    check_order,
)


class MooncakeRow(msgspec.Struct):
    timestamp: Annotated[float, msgspec.Meta(ge=0)]
    input_length: int
    output_length: int
    hash_ids: list[Annotated[int, msgspec.Meta(ge=0)]]


_DECODER = msgspec.json.Decoder(MooncakeRow)
_AT = re.compile(r"^(.*) - at `\$\.?(.*)`$")
_MISSING = re.compile(r"missing required field `([^`]+)`")


def _field_of(exc: msgspec.MsgspecError) -> tuple[str, str]:
    """(field, problem) out of a msgspec error message."""
    text = str(exc)
    m = _AT.match(text)
    if m is not None:
        return m.group(2) or "row", m.group(1)
    m = _MISSING.search(text)
    if m is not None:
        return m.group(1), "missing"
    if isinstance(exc, msgspec.DecodeError):
        return "row", f"not valid JSON ({text})"
    return "row", text


def parse_row(path: str, line: int, raw: bytes) -> MooncakeRow:
    try:
        row = _DECODER.decode(raw)
    except msgspec.MsgspecError as exc:
        field, problem = _field_of(exc)
        raise TraceError(path, line, field, problem) from None
    check_lengths(path, line, "input_length", row.input_length, "output_length", row.output_length)
    blocks = -(-row.input_length // MOONCAKE_BLOCK_TOKENS)
    if len(row.hash_ids) != blocks:
        raise TraceError(
            path, line, "hash_ids",
            f"{len(row.hash_ids)} ids for input_length {row.input_length} "
            f"({MOONCAKE_BLOCK_TOKENS}-token blocks need {blocks})",
        )  # fmt: skip
    return row


def read_mooncake(path: str, lines: Iterable[tuple[int, bytes]]) -> Iterator[TraceRequest]:
    """Requests from (line number, raw line) pairs; blank lines are skipped."""
    previous_s = 0.0
    index = 0
    for line, raw in lines:
        if not raw.strip():
            continue
        row = parse_row(path, line, raw)
        arrival_s = row.timestamp / 1000.0
        check_order(path, line, "timestamp", arrival_s, previous_s)
        previous_s = arrival_s
        yield TraceRequest(
            index, line, arrival_s, row.input_length, row.output_length, tuple(row.hash_ids)
        )
        index += 1
