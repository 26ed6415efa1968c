"""One request's output on the HTTP side: waiting for the first item under the TTFT deadline, then
SSE chunks or one JSON body, with stop sequences matched on the text (a match cancels the rest of
the generation, reason recorded) and a client that goes away cancelling its request to the TE."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from fastapi import Request

from deepserve.actors.flowserve.messages import TaskTokens
from deepserve.actors.je.stream import DROP, StreamMerge
from deepserve.actors.workload.messages import RequestDone
from deepserve.adapters.tokenizer import output_text

from .api import error_body, usage
from .plainsse import plain_sse
from .runtime import Runtime
from .stream import Stream

DISCONNECT_POLL_S = 0.25
# A text no piece holds, encoded where a chunk's piece goes (`Generation.piece_event`)
_MARK = "\x00deepserve:piece\x00"


class Disconnected(Exception):
    pass


class GenerationFailed(Exception):
    """A non-streamed request that failed after its first token (the frontend's 503)."""


async def first_item(request: Request, q: Stream, deadline_s: float) -> Any:
    end = time.monotonic() + deadline_s
    while True:
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError
        try:  # (`asyncio.timeout` and `get`, without the context: stream.py; not wait_for: no task)
            return await q.get_within(min(left, DISCONNECT_POLL_S))
        except TimeoutError:
            if await request.is_disconnected():
                raise Disconnected from None


class Head:
    """What every choice and chunk of one response shares: its id (unique across restarts), its
    creation time, the model and the system fingerprint."""

    def __init__(self, id_: str, kind: str, model: str, fingerprint: str) -> None:
        self.id, self.kind, self.model, self.fingerprint = id_, kind, model, fingerprint
        self.created = int(time.time())

    def chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint, "choices": choices}  # fmt: skip


class Generation:
    """One choice's output: text pieces with stop sequences and stop token ids matched, and its
    chunks and choice object (`index` among the response's n)."""

    def __init__(self, rt: Runtime, rid: str, kind: str, model: str, stops: list[str], req: Any,
                 q: Stream, first: Any, index: int = 0, head: Head | None = None) -> None:  # fmt: skip
        self.rt, self.rid, self.kind, self.model, self.stops, self.req, self.q = rt, rid, kind, model, stops, req, q
        self.index = index
        self.head = head if head is not None else Head(rid, kind, model, "")
        self.pending = first
        self._around: tuple[bytes, bytes] | None = None  # a piece event's bytes around the piece
        self.text = ""
        self.tokens = 0
        self.last_token_s: float | None = None  # the latest token's emulated time (TPOT ends there)
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None  # vLLM's: the stop string or token id that ended it
        self.task_id: str | None = None  # the task whose tokens are followed (`_new_part`)
        self.merge = StreamMerge()
        # the runtime's open streams and their positions (none for a runtime without them)
        self.open: dict[str, Any] = getattr(rt, "streams", {})
        self.positions: dict[str, int] = getattr(rt, "positions", {})
        self.done: RequestDone | None = None
        self.created = self.head.created
        self.prompt_tokens = 0  # known at submission (continuous usage stats)
        self.stop_ids = frozenset(getattr(req, "stop_token_ids", None) or ())
        self.min_tokens: int = getattr(req, "min_tokens", 0) or 0
        # where stop sequences may start: not inside the first min_tokens tokens (vLLM's rule)
        self.min_chars = 0 if self.min_tokens == 0 else -1
        # `echo`: completions send the prompt back before the completion, as OpenAI's does; a chat
        # (vLLM's) the last message's content when the assistant wrote it (a reply continued).
        self.echo: str = ""
        if getattr(req, "echo", False):
            if kind == "cmpl":
                self.echo = req.prompt
            elif req.messages[-1].role == "assistant":
                self.echo = req.messages[-1].text()

    async def _next(self) -> Any:
        if self.pending is not None:
            item, self.pending = self.pending, None
            return item
        return await self.q.get()

    def _end(self, item: RequestDone) -> None:
        self.done = item
        if self.finish_reason is None:
            self.finish_reason = "length" if item.reason in ("length", "target") else "stop"
            if item.status != "completed":
                self.finish_reason = "stop" if item.reason == "stop sequence" else "abort"

    async def _append(self, ids: tuple[int, ...], count: int) -> None:
        """Add a message's tokens; a stop token id (after min_tokens) ends the text before it."""
        cut = next((k for k, t in enumerate(ids) if t in self.stop_ids and self.tokens + k + 1 > self.min_tokens),
                   None) if self.stop_ids else None  # fmt: skip
        if self.min_chars < 0 and self.tokens + count >= self.min_tokens:
            self.min_chars = len(self.text) + len(output_text(ids[: self.min_tokens - self.tokens]))
        if cut is not None:
            self.tokens += cut + 1
            self.text += output_text(ids[:cut])
            self.finish_reason, self.stop_reason = "stop", ids[cut]
            await self.rt.cancel(self.rid, "stop token", completed=True)
            return
        self.tokens += count
        self.text += output_text(ids)

    async def pieces(self) -> AsyncIterator[str]:
        """Text pieces until the terminal message (or a stop sequence or token). With stop
        sequences, the last `len(longest stop) - 1` characters are held back until they cannot
        start a match."""
        hold = max((len(x) for x in self.stops), default=1) - 1
        sent = 0
        while self.done is None:
            item = await self._next()
            if isinstance(item, RequestDone):
                self._end(item)
                if len(self.text) > sent:
                    yield self.text[sent:]
                return
            if not isinstance(item, TaskTokens) or self.finish_reason is not None:
                continue
            ids, count = self._new_part(item)
            if not count:
                continue
            if item.times_s:
                self.last_token_s = item.times_s[-1]
            await self._append(ids, count)
            if self.finish_reason is None and self.stops and self.min_chars >= 0:
                await self._match_stops(max(0, sent - hold, self.min_chars))
            if self.finish_reason is not None:
                continue
            upto = len(self.text) - hold
            if upto > sent:
                yield self.text[sent:upto]
                sent = upto

    def _new_part(self, item: TaskTokens) -> tuple[tuple[int, ...], int]:
        """The chunk's tokens the client does not have yet, and their count. The TEs stream to
        the frontend directly (no JE in between to drop an abandoned attempt's tokens), and
        several tasks may produce one request's output — a P/D decode after its prefill, a
        retry from scratch, a migrated stream resuming on another TE at a token the client
        may already have: merged by token index (actors/je/stream.py), nothing twice, nothing
        skipped."""
        count = len(item.token_ids) or len(item.times_s)
        skip = self.merge.take(item.task_id, item.first_index, count)
        if skip == DROP:
            return (), 0
        self.task_id = self.merge.task
        if self.rid in self.open:  # where a JE moving the request resumes it (runtime.positions)
            self.positions[self.rid] = self.merge.next
        return item.token_ids[skip:], count - skip

    async def _match_stops(self, start: int) -> None:
        hits = [(h, x) for h, x in ((self.text.find(x, start), x) for x in self.stops) if h >= 0]
        if hits:
            at, stop = min(hits)
            keep = len(stop) if getattr(self.req, "include_stop_str_in_output", False) else 0
            self.text = self.text[: at + keep]
            self.finish_reason, self.stop_reason = "stop", stop
            await self.rt.cancel(self.rid, "stop sequence", completed=True)

    def usage_parts(self) -> tuple[int, int, int]:
        """(prompt, completion, cached prompt) tokens of this choice."""
        d = self.done
        if d is None:
            return self.prompt_tokens, self.tokens, 0
        return d.prompt_tokens, self.tokens, d.cached_prompt_tokens

    def _emulated(self) -> dict[str, Any]:
        """The emulated timings of the request (the TE's token times on the daemon's clock)."""
        d = self.done
        if d is None or d.first_token_s is None:
            return {}
        # up to the last token, not the end: a stream cut by a failure ends when the failure was
        # noticed, seconds after its last token (a tour: a TPOT of 59 ms for 15 ms tokens)
        end = self.last_token_s if self.last_token_s is not None else d.finish_s
        tpot = (end - d.first_token_s) / (d.output_tokens - 1) if d.output_tokens > 1 else None
        return {"ttft_s": d.first_token_s - d.arrival_s, "tpot_s": tpot, "status": d.status}

    def chunk_choice(self, delta: str | None, finish: str | None) -> dict[str, Any]:
        if self.kind == "chat":
            choice: dict[str, Any] = {"index": self.index, "delta": {} if delta is None else {"content": delta}}
        else:
            choice = {"index": self.index, "text": delta or ""}
        choice |= {"logprobs": None, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = self.stop_reason
        return choice

    def plain(self) -> bool:
        """No stop sequence, stop token id or min_tokens: each piece is its tokens' text, sent
        as it comes (`pieces` holds nothing back; daemon/plainsse.py)."""
        return not self.stops and not self.stop_ids and self.min_tokens == 0

    def piece_event(self, piece: str) -> bytes:
        """The SSE event of a text piece: `b"data: " + encode(head.chunk([chunk_choice(piece,
        None)])) + b"\n\n"` (the readable version; tests/daemon/test_sse_chunks.py checks they
        agree), from the event's bytes around the piece, encoded once a choice: building and
        encoding the chunk's dicts each piece was ~3 % of the daemon's CPU under load."""
        pre, post = self.around()
        return pre + msgspec.json.encode(piece) + post

    def around(self) -> tuple[bytes, bytes]:
        """A piece event's bytes before and after the piece's JSON string (`piece_event`)."""
        around = self._around
        if around is None:
            enc = msgspec.json.encode
            whole = b"data: " + enc(self.head.chunk([self.chunk_choice(_MARK, None)])) + b"\n\n"
            pre, _, post = whole.partition(enc(_MARK))
            around = self._around = (pre, post)
        return around

    def failure(self) -> str | None:
        """Why the request failed after its first output, or None (completed, or cut short
        by a stop sequence)."""
        d = self.done
        if d is None or d.status == "completed" or self.finish_reason != "abort":
            return None
        n = self.tokens
        return f"the request {d.status} after {n} output token{'' if n == 1 else 's'}: {d.reason}"

    def choice(self) -> dict[str, Any]:
        """The choice object of a non-streamed response."""
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": self.echo + self.text, "refusal": None,
                       "annotations": None, "audio": None, "function_call": None, "tool_calls": []}  # fmt: skip
            return {"index": self.index, "message": message, "logprobs": None,
                    "finish_reason": self.finish_reason, "stop_reason": self.stop_reason}  # fmt: skip
        return {"index": self.index, "text": self.echo + self.text, "logprobs": None,
                "finish_reason": self.finish_reason, "stop_reason": self.stop_reason}  # fmt: skip

    async def drain(self) -> None:
        async for _ in self.pieces():
            pass


class Choices:
    """A response's n choices (one Generation each): merged SSE chunks, or one JSON body whose
    usage counts the prompt once and sums the completions (as OpenAI's and vLLM's)."""

    single_fast = True  # one choice: `plain_sse`, or `sse` without `_merged` (False: the readable version)

    def __init__(self, head: Head, gens: list[Generation], req: Any) -> None:
        self.head, self.gens, self.req = head, gens, req

    def usage(self) -> dict[str, Any]:
        prompt, _, cached = self.gens[0].usage_parts()
        return usage(prompt, sum(g.tokens for g in self.gens), cached)

    async def _merged(self) -> AsyncIterator[tuple[Generation, str | None]]:
        """(choice, piece) as pieces arrive, then (choice, None) once each choice ends."""
        if len(self.gens) == 1:  # the common case: no task, no queue
            g = self.gens[0]
            async for piece in g.pieces():
                yield g, piece
            yield g, None
            return
        merged: asyncio.Queue[tuple[Generation, str | None]] = asyncio.Queue()

        async def pump(g: Generation) -> None:
            try:
                async for piece in g.pieces():
                    await merged.put((g, piece))
            finally:
                await merged.put((g, None))

        tasks = [asyncio.ensure_future(pump(g)) for g in self.gens]
        try:
            for _ in range(len(tasks)):
                while True:
                    item = await merged.get()
                    yield item
                    if item[1] is None:
                        break
        finally:
            for t in tasks:
                t.cancel()

    def _event(self, g: Generation, piece: str | None, continuous: bool) -> bytes:
        """The SSE event of a choice's text piece, or of its end (`piece` None)."""
        if piece is not None and not continuous:
            return g.piece_event(piece)
        chunk = self.head.chunk([g.chunk_choice(piece, None if piece is not None else g.finish_reason)])
        if continuous:
            chunk["usage"] = self.usage()
        return b"data: " + msgspec.json.encode(chunk) + b"\n\n"

    def _heads(self) -> list[bytes]:
        """The events before any piece, each its own body message: each choice's role chunk (a
        chat's) and echo."""
        enc, head = msgspec.json.encode, self.head
        out = []
        for g in self.gens:
            if head.kind == "chat":
                first = g.chunk_choice(None, None)
                first["delta"] = {"role": "assistant", "content": "", "refusal": None}
                out.append(b"data: " + enc(head.chunk([first])) + b"\n\n")
            if g.echo:
                out.append(b"data: " + enc(head.chunk([g.chunk_choice(g.echo, None)])) + b"\n\n")
        return out

    def _tail(self, last: bytes) -> bytes:
        """The stream's last body message: the last choice's finish event `last`, the error and
        usage events and [DONE] follow each other with nothing awaited between them (one write
        to the socket, not up to four; the same bytes; 3 of the 20 a 16-token stream had)."""
        enc, opts = msgspec.json.encode, self.req.stream_options
        failure = next((f for f in (g.failure() for g in self.gens) if f is not None), None)
        if failure is not None:  # cut after output: said in-band, as vLLM does (the openai
            # client raises it as an `APIError`); the finish chunk says "abort"
            last += b"data: " + enc(error_body(failure, "service_unavailable", None, "service_unavailable")) + b"\n\n"
        if opts is not None and opts.include_usage:
            final = self.head.chunk([])
            final["usage"] = self.usage()
            final["deepserve"] = self.gens[0]._emulated()  # for `deepserve bench http` (overhead)
            last += b"data: " + enc(final) + b"\n\n"
        return last + b"data: [DONE]\n\n"

    async def _close(self) -> None:
        """The stream ended or was cut: a choice not ended yet (the client went away mid-stream)
        is cancelled to the TE."""
        for g in self.gens:
            if g.done is None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(g.rt.cancel(g.rid, "the client disconnected"))

    def stream(self) -> AsyncIterator[bytes]:
        """The SSE body: `plain_sse` for one plain choice (the common case), else `sse`."""
        opts = self.req.stream_options
        continuous = opts is not None and bool(opts.continuous_usage_stats)
        if len(self.gens) == 1 and not continuous and self.single_fast and self.gens[0].plain():
            return plain_sse(self)
        return self.sse()

    async def sse(self) -> AsyncIterator[bytes]:
        opts = self.req.stream_options
        continuous = opts is not None and bool(opts.continuous_usage_stats)
        try:
            for event in self._heads():
                yield event
            if len(self.gens) == 1 and not continuous and self.single_fast:
                # One choice (the common case): its pieces' events straight from its generator,
                # one async generator less a token than `_merged`'s (the readable version:
                # tests/daemon/test_sse_single.py compares the two byte for byte).
                g = self.gens[0]
                async for piece in g.pieces():
                    yield g.piece_event(piece)
                last = self._event(g, None, False)
            else:
                last, open_choices = b"", len(self.gens)
                async for g, piece in self._merged():
                    event = self._event(g, piece, continuous)
                    open_choices -= piece is None
                    if open_choices == 0:  # the last item of the merge
                        last = event
                        continue
                    yield event
            yield self._tail(last)
        finally:
            await self._close()

    async def collect(self, request: Request) -> dict[str, Any]:
        tasks = [asyncio.ensure_future(g.drain()) for g in self.gens]
        while not all(t.done() for t in tasks):
            await asyncio.wait(tasks, timeout=DISCONNECT_POLL_S, return_when=asyncio.ALL_COMPLETED)
            if not all(t.done() for t in tasks) and await request.is_disconnected():
                for t, g in zip(tasks, self.gens, strict=True):
                    if not t.done():
                        t.cancel()
                        await g.rt.cancel(g.rid, "the client disconnected")
                raise Disconnected
        for t in tasks:
            t.result()
        failure = next((f for f in (g.failure() for g in self.gens) if f is not None), None)
        if failure is not None:  # nothing was sent yet: an error, not a 200 with part of a text
            raise GenerationFailed(failure)
        h = self.head
        body = h.chunk([g.choice() for g in self.gens])
        body["object"] = "chat.completion" if h.kind == "chat" else "text_completion"
        body["usage"] = self.usage()
        return body
