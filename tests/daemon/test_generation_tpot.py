"""The emulated TPOT a response reports ends at the last token: a stream cut by a failure ends
when the failure was noticed, seconds after its last token (a tour: 59 ms for 15 ms tokens)."""

from __future__ import annotations

import asyncio

from deepserve.actors.flowserve.messages import TaskTokens
from deepserve.actors.workload.messages import RequestDone
from deepserve.daemon.generation import Generation


def _emulated(finish_s: float, status: str) -> dict:
    async def go() -> dict:
        q: asyncio.Queue = asyncio.Queue()
        times = tuple(1.0 + 0.015 * i for i in range(5))  # 5 tokens, 15 ms apart
        q.put_nowait(RequestDone(request_id="c", status=status, reason="x", arrival_s=0.5, first_token_s=1.0,  # type: ignore[arg-type]
                                 finish_s=finish_s, prompt_tokens=4, cached_prompt_tokens=0, output_tokens=5, te="te/0"))  # fmt: skip
        first = TaskTokens(task_id="c/chat.1", request_id="c", first_index=0, token_ids=(), times_s=times)
        gen = Generation(None, "c", "cmpl", "m", [], None, q, first)  # type: ignore[arg-type]
        async for _ in gen.pieces():
            pass
        return gen._emulated()

    return asyncio.run(go())


def test_tpot_ends_at_the_last_token_not_when_a_failure_was_noticed() -> None:
    cut = _emulated(finish_s=5.06, status="failed")  # noticed 4 s after the last token
    assert abs(cut["tpot_s"] - 0.015) < 1e-12, cut
    done = _emulated(finish_s=1.06, status="completed")  # a whole run: the same either way
    assert abs(done["tpot_s"] - 0.015) < 1e-12 and abs(done["ttft_s"] - 0.5) < 1e-12, done
