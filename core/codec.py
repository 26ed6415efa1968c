"""msgpack codec for messages, events and states, decoding by registered type name."""

from __future__ import annotations

from typing import Any, Final

import msgspec

from .messages import Raw, registered

# Deterministic order: sets and frozensets are sorted and dict keys too, so a record
# does not depend on the process's hash seed or on how a dict was built. Every
# record payload (message, event, state) goes through this encoder.
_encoder = msgspec.msgpack.Encoder(order="deterministic")
# msgspec sorts str keys only and refuses other dict keys in that mode. A state with int-keyed
# dicts (the RTC's block pool: keyed by block id or chain hash, insertion order = LRU order) is
# encoded in insertion order instead: deterministic for a deterministic actor (int hashes are not
# salted per process), and it keeps the order the state depends on.
_insertion_encoder = msgspec.msgpack.Encoder()
_raw_decoder = msgspec.msgpack.Decoder()
_decoders: dict[type, msgspec.msgpack.Decoder] = {}


# Bound once: `encode` runs for every logged message and event (the compiled build,
# compiled.py, then calls the encoder's C method without looking it up each time).
_encode: Final = _encoder.encode
_encode_insertion: Final = _insertion_encoder.encode


def encode(obj: Any) -> bytes:
    try:
        return _encode(obj)
    except TypeError:
        return _encode_insertion(obj)


class DecodeError(ValueError):
    """A payload that is not valid msgpack for its declared type."""


def _decoder_for(cls: type) -> msgspec.msgpack.Decoder:
    dec = _decoders.get(cls)
    if dec is None:
        dec = _decoders[cls] = msgspec.msgpack.Decoder(cls)
    return dec


def decode(name: str, payload: bytes) -> Any:
    """Decode a logged payload by type name; an unknown name gives a `Raw` record."""
    cls = registered(name)
    try:
        if cls is None:
            return Raw(type=name, data=_raw_decoder.decode(payload))
        return _decoder_for(cls).decode(payload)
    except msgspec.DecodeError as exc:
        raise DecodeError(f"payload of type {name!r} does not decode: {exc}") from None


def to_builtins(obj: Any) -> Any:
    """Plain dicts/lists for printing and JSON output."""
    if isinstance(obj, Raw):
        return {"type": obj.type, **(obj.data if isinstance(obj.data, dict) else {"data": obj.data})}
    return msgspec.to_builtins(obj)
