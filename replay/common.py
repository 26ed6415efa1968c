"""What the replay tools share: the error type, run selection, record rendering."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from deepserve.core.codec import DecodeError, decode, to_builtins
from deepserve.core.records import (
    INPUT_KIND_NAMES,
    OUTPUT_KIND_NAMES,
    EventRec,
    InputRec,
    OutputRec,
    RunRec,
    SnapshotRec,
)
from deepserve.persistence.api import LogReader


class ReplayError(Exception):
    """A log this code cannot re-execute or fold (unknown type, unloadable actor
    class, inconsistent numbering). The message is one precise line for the user."""


_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def mask_addresses(text: str) -> str:
    """An error text without memory addresses (`<object object at 0x7f…>`): they differ
    from process to process, and say nothing about behaviour."""
    return _ADDRESS.sub("0x…", text)


def some(names: list[str], limit: int = 8) -> str:
    """A short list for an error line: the first `limit` names, then how many more."""
    if not names:
        return "none"
    shown = ", ".join(names[:limit])
    return shown + (f", … {len(names) - limit} more" if len(names) > limit else "")


def first_few(names: list[str], limit: int = 8) -> str:
    """`some` for a list cut short by its reader: `names` holds at most `limit + 1` items,
    the last only telling that there are more (how many is not known)."""
    if len(names) <= limit:
        return some(names, limit)
    return ", ".join(names[:limit]) + ", … and more"


def load_hint(cls: str) -> str:
    """What to do about an actor class replay cannot import."""
    if cls.startswith("__main__:"):
        return (
            "it was defined in a script with no importable name (python -c, a REPL): "
            "define it in a module to replay it"
        )
    return "give its directory with --path DIR, or put it on PYTHONPATH"


def refused_spawn(rec: InputRec, exc: Exception) -> str:
    """The one line refusing a log's spawn entry whose class path replay will not call."""
    return f"{rec.actor}#{rec.seq}: the log spawns {rec.actor!r} as {exc} (a log is data, never code)"


def pick_run(reader: LogReader, run_id: str | None) -> RunRec:
    """The run named `run_id`, or the last run: the same default readers use."""
    runs = reader.runs()
    if not runs:
        raise ReplayError("the log holds no run")
    if run_id is None:
        return runs[-1]
    for run in runs:
        if run.run_id == run_id:
            return run
    known = ", ".join(repr(r.run_id) for r in runs)
    raise ReplayError(f"no run {run_id!r} in this log (runs: {known})")


def payload_view(type_name: str, payload: bytes) -> Any:
    """A logged payload as plain data, for printing; never raises, because a
    report about a broken record must still be printable."""
    if not type_name:
        return None
    try:
        data = to_builtins(decode(type_name, payload))
    except (DecodeError, TypeError, ValueError) as exc:
        return {"undecodable": payload.hex()[:64], "error": str(exc)}
    if isinstance(data, dict):
        data.pop("type", None)  # the type is printed beside the payload already
    return data


def compact(data: Any, width: int = 100) -> str:
    """One-line JSON, cut at `width` characters so listings stay one line per record."""
    text = msgspec.json.encode(data, enc_hook=repr).decode()
    return text if len(text) <= width else text[: width - 1] + "…"


def input_view(rec: InputRec) -> dict[str, Any]:
    return {
        "t": rec.t,
        "actor": rec.actor,
        "seq": rec.seq,
        "kind": INPUT_KIND_NAMES.get(rec.kind, str(rec.kind)),
        "src": rec.src,
        "msg_id": rec.msg_id,
        "corr": rec.corr,
        "reply_to": rec.reply_to,
        "external": rec.external,
        "type": rec.type,
        "payload": payload_view(rec.type, rec.payload),
    }


def event_view(rec: EventRec) -> dict[str, Any]:
    return {"idx": rec.idx, "type": rec.type, "payload": payload_view(rec.type, rec.payload)}


def output_view(rec: OutputRec) -> dict[str, Any]:
    view: dict[str, Any] = {
        "idx": rec.idx,
        "kind": OUTPUT_KIND_NAMES.get(rec.kind, str(rec.kind)),
        "dst": rec.dst,
        "msg_id": rec.msg_id,
    }
    # Only the fields that mean something for this kind of output: shorter reports.
    if rec.delay:
        view["delay"] = rec.delay
    if rec.key is not None:
        view["key"] = rec.key
    if rec.corr is not None:
        view["corr"] = rec.corr
    if rec.reply_to is not None:
        view["reply_to"] = rec.reply_to
    if rec.ask:
        view["ask"] = True
    if rec.type:
        view["type"] = rec.type
        view["payload"] = payload_view(rec.type, rec.payload)
    return view


def snapshot_view(rec: SnapshotRec | None) -> dict[str, Any] | None:
    if rec is None:
        return None
    try:
        state: Any = msgspec.msgpack.decode(rec.payload)
    except msgspec.DecodeError:
        state = {"undecodable": rec.payload.hex()[:64]}
    return {"seq": rec.seq, "type": rec.type, "state": state}
