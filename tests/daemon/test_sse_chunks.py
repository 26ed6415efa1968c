"""A streamed text piece's SSE event from its pre-encoded surroundings (Generation.piece_event)
is byte for byte the readable build: the chunk's dicts encoded whole."""

from __future__ import annotations

from types import SimpleNamespace

import msgspec

from deepserve.daemon.generation import Generation, Head
from deepserve.daemon.stream import Stream

PIECES = ["", "word ", 'a "quoted" \\ piece', "naïve 日本語 🙂", "\x00\x1f\n\t", "deepserve:piece", "}]}"]


def _readable(g: Generation, piece: str) -> bytes:
    return b"data: " + msgspec.json.encode(g.head.chunk([g.chunk_choice(piece, None)])) + b"\n\n"


def test_piece_events_are_the_encoded_chunks() -> None:
    req = SimpleNamespace(stop_token_ids=None, min_tokens=0, echo=False)
    for kind in ("chat", "cmpl"):
        for index in (0, 3):
            head = Head(f"{kind}-x-1", kind, "llama3-8b", "fp_0123456789")
            g = Generation(SimpleNamespace(), f"{kind}-1", kind, "llama3-8b", [], req, Stream(), None,
                           index, head)  # fmt: skip
            for piece in PIECES:
                assert g.piece_event(piece) == _readable(g, piece), (kind, index, piece)
