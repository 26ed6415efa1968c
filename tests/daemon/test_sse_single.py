"""A one-choice stream's SSE bytes (Choices.sse without `_merged`, and daemon/plainsse.py's
plain_sse for a choice without stop token ids or min_tokens: the fast paths) are byte for byte
those of the readable version, the merge every n-choice stream goes through: completed or failed
after its output, with or without usage, chat or completions, a stop token id, min_tokens; a
stream cut mid-way cancels its request on either path."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from deepserve.actors.flowserve.messages import TaskTokens
from deepserve.actors.workload.messages import RequestDone
from deepserve.daemon.generation import Choices, Generation, Head
from deepserve.daemon.stream import Stream


class _Rt:
    streams: dict[str, Any] = {}
    positions: dict[str, int] = {}

    def __init__(self) -> None:
        self.cancelled: list[tuple[str, str]] = []

    async def cancel(self, request_id: str, reason: str, completed: bool = False) -> None:
        self.cancelled.append((request_id, reason))


def _items(status: str) -> list[Any]:
    out: list[Any] = [TaskTokens(task_id="r/chat.1", request_id="r", first_index=i, token_ids=(100 + i, 7 * i + 3),
                                 times_s=(1.0 + i, 1.01 + i)) for i in range(0, 12, 2)]  # fmt: skip
    out.append(RequestDone(request_id="r", status=status, reason="length" if status == "completed" else "te died",  # type: ignore[arg-type]
                           arrival_s=0.5, first_token_s=1.0, finish_s=12.0, prompt_tokens=9,
                           cached_prompt_tokens=0, output_tokens=12, te="te/0"))  # fmt: skip
    return out


async def _sse(kind: str, status: str, req: Any, fast: bool) -> tuple[list[bytes], str]:
    q = Stream()
    items = _items(status)
    for item in items[1:]:
        q.put_nowait(item)
    head = Head(f"{kind}-x-r", kind, "m", "fp_0")
    head.created = 1700000000
    g = Generation(_Rt(), "r", kind, "m", [], req, q, items[0], 0, head)  # type: ignore[arg-type]
    choices = Choices(head, [g], req)
    choices.single_fast = fast
    body = choices.stream()
    return [event async for event in body], body.ag_code.co_name  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["chat", "cmpl"])
@pytest.mark.parametrize("status", ["completed", "failed"])
@pytest.mark.parametrize("usage", [True, False])
@pytest.mark.parametrize("stop_ids", [None, [109]])
@pytest.mark.parametrize("min_tokens", [0, 3])
def test_one_choice_streams_the_merged_paths_bytes(kind: str, status: str, usage: bool, stop_ids: Any,
                                                   min_tokens: int) -> None:  # fmt: skip
    req = SimpleNamespace(stop_token_ids=stop_ids, min_tokens=min_tokens, echo=False, include_stop_str_in_output=False,
                          stream_options=SimpleNamespace(include_usage=usage, continuous_usage_stats=False))  # fmt: skip
    fast, path = asyncio.run(_sse(kind, status, req, True))
    readable, readable_path = asyncio.run(_sse(kind, status, req, False))
    assert fast == readable
    # a plain choice (no stop token ids, no min_tokens) through plain_sse, the others through sse
    assert (path, readable_path) == ("plain_sse" if stop_ids is None and min_tokens == 0 else "sse", "sse")
    assert len(fast) >= 3 and fast[-1].endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("fast", [True, False])
def test_a_stream_cut_mid_way_cancels_its_request(fast: bool) -> None:
    async def main() -> tuple[list[bytes], list[tuple[str, str]], str]:
        req = SimpleNamespace(stop_token_ids=None, min_tokens=0, echo=False, include_stop_str_in_output=False,
                              stream_options=None)  # fmt: skip
        items = _items("completed")
        q = Stream()
        q.put_nowait(items[1])  # then nothing: the client leaves after two pieces
        head = Head("cmpl-x-r", "cmpl", "m", "fp_0")
        rt = _Rt()
        choices = Choices(head, [Generation(rt, "r", "cmpl", "m", [], req, q, items[0], 0, head)], req)  # type: ignore[arg-type]
        choices.single_fast = fast
        body = choices.stream()
        got = [await body.__anext__(), await body.__anext__()]
        await body.aclose()  # what the response does to it when the client goes away
        return got, rt.cancelled, body.ag_code.co_name  # type: ignore[attr-defined]

    got, cancelled, path = asyncio.run(main())
    assert len(got) == 2 and path == ("plain_sse" if fast else "sse")
    assert cancelled == [("r", "the client disconnected")]
