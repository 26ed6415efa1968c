"""One plain choice's SSE body in one generator (issue 30 §1, CPU per request).

A streamed token went through four frames between the queue and the response: `Choices.sse`
iterating `Generation.pieces` (both async generators), `pieces` awaiting `_next` and `_append`
(coroutines), then `piece_event` — ~5 % of the daemon's event-loop CPU under `bench http`'s
load (py-spy), for what is, without stop sequences, stop token ids or min_tokens
(`Generation.plain`), a queue read, the tokens' text and its event. `plain_sse` is that loop,
with `Choices.sse`'s first events, last message and cancel-on-disconnect (its `_heads`, `_tail`,
`_close`). `Choices.sse` is the readable version: tests/daemon/test_sse_single.py checks the
two send the same bytes, message for message.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import msgspec

from deepserve.actors.flowserve.messages import TaskTokens
from deepserve.actors.workload.messages import RequestDone
from deepserve.adapters.tokenizer import output_text, token_text

if TYPE_CHECKING:
    from .generation import Choices


async def plain_sse(ch: Choices) -> AsyncIterator[bytes]:
    """`Choices.sse` for one choice that is `plain` (and no continuous usage stats)."""
    g = ch.gens[0]
    try:
        for event in ch._heads():
            yield event
        pre, post = g.around()
        enc, q, new_part = msgspec.json.encode, g.q, g._new_part
        item, g.pending = g.pending, None
        while True:  # `pieces` with nothing held back: each new text is sent as it comes
            if item is None:
                item = await q.get()
            if isinstance(item, RequestDone):
                g._end(item)
                break
            if isinstance(item, TaskTokens):
                ids, count = new_part(item)
                if count:
                    if item.times_s:
                        g.last_token_s = item.times_s[-1]
                    g.tokens += count
                    piece = token_text(ids[0]) if len(ids) == 1 else output_text(ids)  # (its join of one)
                    if piece:
                        g.text += piece
                        yield pre + enc(piece) + post
            item = None
        yield ch._tail(ch._event(g, None, False))
    finally:
        await ch._close()
