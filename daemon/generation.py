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
from deepserve.actors.workload.messages import RequestDone
from deepserve.adapters.tokenizer import output_text

from .api import error_body, usage
from .runtime import Runtime

DISCONNECT_POLL_S = 0.25


class Disconnected(Exception):
    pass


class GenerationFailed(Exception):
    """A non-streamed request that failed after its first token (the frontend's 503)."""


async def first_item(request: Request, q: asyncio.Queue[Any], deadline_s: float) -> Any:
    end = time.monotonic() + deadline_s
    while True:
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError
        try:
            return await asyncio.wait_for(q.get(), min(left, DISCONNECT_POLL_S))
        except TimeoutError:
            if await request.is_disconnected():
                raise Disconnected from None


class Generation:
    """One request's output: SSE chunks or one JSON body; stop sequences matched on the text."""

    def __init__(self, rt: Runtime, rid: str, kind: str, model: str, stops: list[str], req: Any,
                 q: asyncio.Queue[Any], first: Any) -> None:  # fmt: skip
        self.rt, self.rid, self.kind, self.model, self.stops, self.req, self.q = rt, rid, kind, model, stops, req, q
        self.pending = first
        self.text = ""
        self.tokens = 0
        self.last_token_s: float | None = None  # the latest token's emulated time (TPOT ends there)
        self.finish_reason: str | None = None
        self.done: RequestDone | None = None
        self.created = int(time.time())
        # `echo` (completions): the prompt comes back before the completion, as OpenAI's does.
        self.echo: str = req.prompt if kind == "cmpl" and getattr(req, "echo", False) else ""

    async def _next(self) -> Any:
        if self.pending is not None:
            item, self.pending = self.pending, None
            return item
        return await self.q.get()

    async def pieces(self) -> AsyncIterator[str]:
        """Text pieces until the terminal message (or a stop sequence). With stop sequences, the
        last `len(longest stop) - 1` characters are held back until they cannot start a match."""
        hold = max((len(x) for x in self.stops), default=1) - 1
        sent = 0
        while self.done is None:
            item = await self._next()
            if isinstance(item, RequestDone):
                self.done = item
                if self.finish_reason is None:
                    self.finish_reason = "length" if item.reason in ("length", "target") else "stop"
                    if item.status != "completed":
                        self.finish_reason = "stop" if item.reason == "stop sequence" else "abort"
                if len(self.text) > sent:
                    yield self.text[sent:]
                return
            if not isinstance(item, TaskTokens) or self.finish_reason is not None:
                continue
            if item.first_index == 0 and self.tokens:
                # A retry from scratch: the JE retries a non-streamed request whose task failed
                # after output (nothing was sent: `collect` answers at the end). The failed
                # attempt's text is dropped, not joined to the retry's. A streamed request is
                # never retried once output went out, so `sent` is 0 here.
                self.text, self.tokens, sent = "", 0, 0
            self.tokens += len(item.token_ids) or len(item.times_s)
            if item.times_s:
                self.last_token_s = item.times_s[-1]
            self.text += output_text(item.token_ids)
            hits = [h for h in (self.text.find(x, max(0, sent - hold)) for x in self.stops) if h >= 0]
            if hits:
                self.text = self.text[: min(hits)]
                self.finish_reason = "stop"
                await self.rt.cancel(self.rid, "stop sequence", completed=True)
                continue
            upto = len(self.text) - hold
            if upto > sent:
                yield self.text[sent:upto]
                sent = upto

    def _usage(self) -> dict[str, Any]:
        d = self.done
        prompt = d.prompt_tokens if d is not None else 0
        return usage(prompt, self.tokens, d.cached_prompt_tokens if d is not None else 0)

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

    def _chunk(self, delta: str | None, finish: str | None) -> dict[str, Any]:
        if self.kind == "chat":
            choice = {"index": 0, "delta": {} if delta is None else {"content": delta}, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": delta or "", "finish_reason": finish}
            obj = "text_completion"
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model, "choices": [choice]}

    async def sse(self) -> AsyncIterator[bytes]:
        enc = msgspec.json.encode
        try:
            if self.kind == "chat":
                first = self._chunk(None, None)
                first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
                yield b"data: " + enc(first) + b"\n\n"
            elif self.echo:
                yield b"data: " + enc(self._chunk(self.echo, None)) + b"\n\n"
            async for piece in self.pieces():
                yield b"data: " + enc(self._chunk(piece, None)) + b"\n\n"
            yield b"data: " + enc(self._chunk(None, self.finish_reason)) + b"\n\n"
            failure = self.failure()
            if failure is not None:  # cut after output: said in-band, as vLLM does (the openai
                # client raises it as an `APIError`); the finish chunk above says "abort"
                yield b"data: " + enc(error_body(failure, "service_unavailable", None, "503")) + b"\n\n"
            opts = self.req.stream_options
            if opts is not None and opts.include_usage:
                final = self._chunk(None, None)
                final["choices"], final["usage"] = [], self._usage()
                final["deepserve"] = self._emulated()  # for `deepserve bench http` (platform overhead)
                yield b"data: " + enc(final) + b"\n\n"
            yield b"data: [DONE]\n\n"
        finally:
            if self.done is None:  # the client went away mid-stream: cancel to the TE
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.rt.cancel(self.rid, "the client disconnected"))

    def failure(self) -> str | None:
        """Why the request failed after its first output, or None (completed, or cut short
        by a stop sequence)."""
        d = self.done
        if d is None or d.status == "completed" or self.finish_reason != "abort":
            return None
        n = self.tokens
        return f"the request {d.status} after {n} output token{'' if n == 1 else 's'}: {d.reason}"

    async def collect(self, request: Request) -> dict[str, Any]:
        task = asyncio.ensure_future(self._drain())
        while not task.done():
            await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if not task.done() and await request.is_disconnected():
                task.cancel()
                await self.rt.cancel(self.rid, "the client disconnected")
                raise Disconnected
        task.result()
        failure = self.failure()
        if failure is not None:  # nothing was sent yet: an error, not a 200 with part of a text
            raise GenerationFailed(failure)
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": self.text},
                      "finish_reason": self.finish_reason}  # fmt: skip
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": self.echo + self.text, "finish_reason": self.finish_reason,
                      "logprobs": None}  # fmt: skip
            obj = "text_completion"
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model,
                "choices": [choice], "usage": self._usage()}  # fmt: skip

    async def _drain(self) -> None:
        async for _ in self.pieces():
            pass
