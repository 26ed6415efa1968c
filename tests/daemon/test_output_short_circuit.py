"""xDeepServe §4.2's output short-circuit in the daemon: a DP master sends each forward pass's
tokens straight to the frontend (`ext/stream`) as one `TokenBatch`, not through the JE, which
relayed and logged every chunk (a user measured 40-70 KB of log a request, most of it the relay).
The JE still hears of each task's first chunk (no retry once output went out) and its end; the
log still replays identically."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from inproc import FAST, load, quiet, started

from deepserve.core.codec import decode
from deepserve.persistence import open_log
from deepserve.replay import verify

REQUESTS, CONCURRENCY, TOKENS = 40, 8, 12


async def _run(run_dir: Path) -> tuple[list[Any], str]:
    rt, _ = await started(run_dir, *FAST)
    try:
        return await load(rt, REQUESTS, CONCURRENCY, TOKENS), str(rt.log_path)
    finally:
        await rt.stop(2.0)


def test_tokens_reach_the_frontend_past_the_je_one_record_a_pass(tmp_path: Path) -> None:
    with quiet():
        done, log_path = asyncio.run(_run(tmp_path / "run"))
    assert [(got, d.status, d.output_tokens) for got, d in done] == [(TOKENS, "completed", TOKENS)] * REQUESTS
    log = open_log(log_path)
    try:
        assert verify(log).identical
        to_je = batches = chunks = passes = 0
        for step in log.steps(None):
            rec = step.input
            if rec.actor == "je/0" and rec.type == "TaskTokens":
                to_je += 1
            passes += sum(1 for e in step.events if e.type == "BatchEnded")
            for o in step.outputs:
                if o.type == "TokenBatch":
                    assert o.dst == "ext/stream" and "/dp/" in o.actor
                    batches += 1
                    chunks += len(decode(o.type, o.payload).chunks)  # type: ignore[attr-defined]
                assert not (o.type == "TaskTokens" and o.dst.startswith("ext/"))  # nothing relayed
    finally:
        log.close()
    assert to_je == REQUESTS  # each task's first chunk, for the JE to know output went out
    assert chunks == REQUESTS * TOKENS  # a token a pass for each running task ...
    assert batches <= passes < chunks  # ... in one message (and one log record) a pass
