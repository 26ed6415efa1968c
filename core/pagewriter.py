"""A delivery's log record written as msgpack straight into a page: field by field, the bytes
msgspec makes of the same record (a `Step`, or its row of tuples), built from the cell, the
envelope and the context without a record object in between.

Why: a logged delivery built its step as four tuples (~30 values, several boxed ints and a
float) for msgspec to walk, ~4.5k of the ~6k instructions logging added to a ping-pong step.
Here the compiled build (compiled.py) writes each value into a `librt.strings.BytesWriter`
(mypyc's own byte buffer: its appends and big-endian writes compile to a few C instructions),
unboxed. The encoding is msgpack as msgspec writes it: the smallest int form, floats as float64,
str/bin/array headers by length, None/False/True as 0xc0/0xc2/0xc3. Tests compare it with
msgspec value by value and step by step (tests/core/test_pagewriter.py), which also fail when a
field is added to a record (`core/records.py`) and not here. The pure build encodes rows with
msgspec instead (`steps.NATIVE`): interpreted, ~50 writes a step are ~50 calls.

What is encoded once and kept: an address or a type name, with its header, by the string (or
the type) it encodes (bounded caches, cleared when full).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec
from librt.strings import BytesWriter, write_f64_be, write_i16_be, write_i32_be, write_i64_be

from .cell import Cell
from .codec import encode
from .context import Out
from .envelope import Envelope
from .messages import Event

_encode: Final = encode
# The rare records written whole (a snapshot, a Step): plain msgpack, as a page is.
_plain_encode: Final = msgspec.msgpack.Encoder().encode

CACHE_LIMIT: Final = 4096  # encoded strings (or type names) kept; cleared when full
_STRS: Final[dict[str, bytes]] = {}
_TYPE_NAMES: Final[dict[type, bytes]] = {}
_INT_RANGE: Final = "can't serialize ints < -2**63 or > 2**64 - 1"  # msgspec's words

STEP_HEAD: Final = 0x94  # a step: [input, events, outputs, snapshot]
INPUT_HEAD: Final = 0x9E  # an input record: 14 fields
EVENT_HEAD: Final = 0x95  # an event record: 5 fields
OUTPUT_HEAD: Final = 0x9D  # an output record: 13 fields
NONE: Final = 0xC0
FALSE: Final = 0xC2
TRUE: Final = 0xC3
DELIVERED: Final = 0  # `InputKind.DELIVERED`, a positive fixint


def write_int(w: BytesWriter, x: int) -> None:
    """An int as msgspec writes it: the smallest form that holds it."""
    if x >= 0:
        if x < 0x80:
            w.append(x)
        elif x < 0x100:
            w.append(0xCC)
            w.append(x)
        elif x < 0x10000:
            w.append(0xCD)
            write_i16_be(w, x - 0x10000 if x >= 0x8000 else x)
        elif x < 0x100000000:
            w.append(0xCE)
            write_i32_be(w, x - 0x100000000 if x >= 0x80000000 else x)
        elif x <= 0x3FFFFFFFFFFFFFFF:  # compiled, a short int: compared without a big constant
            w.append(0xCF)
            write_i64_be(w, x)
        elif x < 0x10000000000000000:
            w.append(0xCF)
            write_i64_be(w, x - 0x10000000000000000 if x >= 0x8000000000000000 else x)
        else:
            raise OverflowError(_INT_RANGE)
    elif x >= -0x20:
        w.append(x + 0x100)
    elif x >= -0x80:
        w.append(0xD0)
        w.append(x + 0x100)
    elif x >= -0x8000:
        w.append(0xD1)
        write_i16_be(w, x)
    elif x >= -0x80000000:
        w.append(0xD2)
        write_i32_be(w, x)
    elif x >= -0x8000000000000000:
        w.append(0xD3)
        write_i64_be(w, x)
    else:
        raise OverflowError(_INT_RANGE)


def write_opt_int(w: BytesWriter, x: int | None) -> None:
    if x is None:
        w.append(NONE)
    else:
        write_int(w, x)


def write_float(w: BytesWriter, x: float) -> None:
    w.append(0xCB)
    write_f64_be(w, x)


def _len_head(w: BytesWriter, n: int, small: int, one: int, what: str) -> None:
    """A str (`small` = fixstr, `one` = str 8) or bin (`small` < 0: none, `one` = bin 8)
    header: the byte after `one` is the 16-bit form, the next the 32-bit form."""
    if n < 32 and small >= 0:
        w.append(small | n)
    elif n < 0x100:
        w.append(one)
        w.append(n)
    elif n < 0x10000:
        w.append(one + 1)
        write_i16_be(w, n - 0x10000 if n >= 0x8000 else n)
    elif n < 0x100000000:
        w.append(one + 2)
        write_i32_be(w, n - 0x100000000 if n >= 0x80000000 else n)
    else:
        raise msgspec.EncodeError(f"Can't encode {what} longer than 2**32 - 1")


def write_bin(w: BytesWriter, b: bytes) -> None:
    _len_head(w, len(b), -1, 0xC4, "bytes-like objects")
    w.write(b)


def write_str(w: BytesWriter, s: str) -> None:
    b = s.encode()
    _len_head(w, len(b), 0xA0, 0xD9, "strings")
    w.write(b)


class _Last:
    """The string and the type encoded last, with their bytes: a delivery's output often goes
    back to its input's source, and a reply is often of its request's type (a dict lookup
    saved each, ~100 instructions)."""

    def __init__(self) -> None:
        self.s = ""
        self.s_bytes = b"\xa0"
        self.cls: type = str
        self.cls_bytes = b"\xa3str"


_LAST: Final = _Last()


def str_bytes(s: str) -> bytes:
    """`s` as msgpack (header and UTF-8), from the cache."""
    last = _LAST
    if s == last.s:
        return last.s_bytes
    b = _STRS.get(s)
    if b is None:
        b = _cache_str(_STRS, s, s)
    last.s = s
    last.s_bytes = b
    return b


def _cache_str(cache: dict[Any, bytes], key: Any, text: str) -> bytes:
    """`text` as msgpack, kept in `cache` under `key` (a cache miss; bounded by CACHE_LIMIT)."""
    tmp = BytesWriter()
    write_str(tmp, text)
    b = tmp.getvalue()
    if len(cache) >= CACHE_LIMIT:
        cache.clear()
    cache[key] = b
    return b


def write_opt_str(w: BytesWriter, s: str | None) -> None:
    if s is None:
        w.append(NONE)
    else:
        w.write(str_bytes(s))


def type_name_bytes(obj: object) -> bytes:
    """`type(obj).__name__` as msgpack, from the cache."""
    cls = type(obj)
    last = _LAST
    if cls is last.cls:
        return last.cls_bytes
    b = _TYPE_NAMES.get(cls)
    if b is None:
        b = _cache_str(_TYPE_NAMES, cls, cls.__name__)
    last.cls = cls
    last.cls_bytes = b
    return b


def write_array_head(w: BytesWriter, n: int) -> None:
    if n < 16:
        w.append(0x90 | n)
    elif n < 0x10000:
        w.append(0xDC)
        write_i16_be(w, n - 0x10000 if n >= 0x8000 else n)
    else:
        w.append(0xDD)
        write_i32_be(w, n - 0x100000000 if n >= 0x80000000 else n)


def write_record(w: BytesWriter, record: Any) -> None:
    """Any record (a `Step`, a `SnapshotRec`), through msgspec: the rare ones."""
    w.write(_plain_encode(record))


def write_delivery(w: BytesWriter, cell: Cell, env: Envelope, now: float, snapshot: Any) -> None:
    """The step of the delivery `execute` just made (`steps.make_step`'s record, as bytes):
    its input, events, outputs and `snapshot` (a `SnapshotRec` or None). Leaves the
    message's encoding on `env` and each output's on its `Out`, as `make_step` does."""
    ctx = cell.ctx
    addr = cell.log_addr
    if addr is None:
        addr = cell.log_addr = str_bytes(cell.addr)
    seq = cell.seq
    msg = env.msg
    payload = env.payload
    if payload is None:
        payload = env.payload = _encode(msg)
    w.append(STEP_HEAD)
    w.append(INPUT_HEAD)
    w.write(addr)
    write_int(w, seq)
    write_float(w, now)
    write_int(w, cell.hlc)
    w.append(DELIVERED)
    w.write(str_bytes(env.src))
    write_int(w, env.msg_id)
    write_opt_str(w, env.corr)
    write_opt_int(w, env.reply_to)
    w.append(TRUE if env.external else FALSE)
    w.write(type_name_bytes(msg))
    write_bin(w, payload)
    w.append(TRUE if env.ask else FALSE)
    write_int(w, env.hlc)
    events = ctx.events
    if events:
        _write_events(w, addr, seq, events, _event_blobs(ctx.event_blobs, events))
    else:
        w.append(0x90)
    outputs = ctx.outputs
    write_array_head(w, len(outputs))
    i = 0
    for o in outputs:
        _write_output(w, addr, seq, i, o)
        i += 1
    if snapshot is None:
        w.append(NONE)
    else:
        write_record(w, snapshot)


def _event_blobs(blobs: list[bytes], events: list[Event]) -> list[bytes]:
    """The events' encodings: those `execute` made (`Context.event_blobs`), if it did."""
    if len(blobs) == len(events):
        return blobs
    return [_encode(e) for e in events]


def _write_events(w: BytesWriter, addr: bytes, seq: int, events: list[Event], blobs: list[bytes]) -> None:
    write_array_head(w, len(events))
    i = 0
    for e in events:
        w.append(EVENT_HEAD)
        w.write(addr)
        write_int(w, seq)
        write_int(w, i)
        w.write(type_name_bytes(e))
        write_bin(w, blobs[i])
        i += 1


def _write_output(w: BytesWriter, addr: bytes, seq: int, i: int, o: Out) -> None:
    """Output `i` of a delivery (`OutputRec`'s fields); its message's encoding stays on `o`
    for the receiver's input record (`Out.payload`)."""
    w.append(OUTPUT_HEAD)
    w.write(addr)
    write_int(w, seq)
    write_int(w, i)
    write_int(w, o.kind)
    w.write(str_bytes(o.dst))
    write_int(w, o.msg_id)
    write_float(w, o.delay)
    write_opt_str(w, o.key)
    write_opt_str(w, o.corr)
    write_opt_int(w, o.reply_to)
    w.append(TRUE if o.ask else FALSE)
    m = o.msg
    if m is None:
        w.append(0xA0)  # "": no message (a cancel, a stop)
        w.append(0xC4)
        w.append(0)  # b""
    else:
        w.write(type_name_bytes(m))
        blob = o.payload = _encode(m)
        write_bin(w, blob)
