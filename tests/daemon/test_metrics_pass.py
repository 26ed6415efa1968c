"""Metrics.pass_output (the runtime's hook, one call a forward pass) scrapes exactly as its
readable version: `batch(msg)` then `tokens(c)` for each chunk, on the same seeded passes with
the wall clock frozen while a pass is handled (its chunks reach the frontend together)."""

from __future__ import annotations

import random
import re

import pytest

import deepserve.daemon.metrics as metrics_mod
from deepserve.actors.flowserve.messages import TaskTokens, TokenBatch
from deepserve.actors.workload.messages import RequestDone
from deepserve.daemon.metrics import Metrics


def _passes(seed: int) -> list[tuple[float, TokenBatch | RequestDone | str]]:
    """(wall clock, what reached the frontend): arrivals, passes of chunks, terminal states."""
    rng = random.Random(seed)
    out: list[tuple[float, TokenBatch | RequestDone | str]] = []
    nxt: dict[str, int] = {}
    clock, t_emu = 10.0, 1.0
    for step in range(120):
        clock += rng.random() * 0.05
        if rng.random() < 0.3 or not nxt:
            rid = f"r{step}"
            nxt[rid] = 0
            out.append((clock, rid))
            continue
        t_emu += 0.02
        chunks = []
        for rid in rng.sample(sorted(nxt), min(len(nxt), rng.randrange(1, 5))):
            if rng.random() < 0.05:
                nxt[rid] = 0  # a retry from scratch
            n = rng.randrange(1, 4)
            times = tuple(t_emu + 0.001 * k for k in range(n))
            chunks.append(TaskTokens(task_id=f"{rid}/t", request_id=rid, first_index=nxt[rid], token_ids=(),
                                     times_s=times))  # fmt: skip
            nxt[rid] += n
        chunks.append(TaskTokens(task_id="x/t", request_id="unknown", first_index=0, token_ids=(), times_s=(t_emu,)))
        out.append((clock, TokenBatch(chunks=tuple(chunks))))
        if rng.random() < 0.2:
            rid = rng.choice(sorted(nxt))
            del nxt[rid]
            out.append((clock, RequestDone(request_id=rid, status="completed", reason="length", arrival_s=0.5,  # type: ignore[arg-type]
                                           first_token_s=1.0, finish_s=t_emu, prompt_tokens=9, cached_prompt_tokens=0, output_tokens=5, te="te/0")))  # fmt: skip
    return out


def _run(passes: list[tuple[float, object]], fast: bool, monkeypatch: pytest.MonkeyPatch) -> str:
    now = [0.0]
    monkeypatch.setattr(metrics_mod.time, "perf_counter", lambda: now[0])
    m = Metrics("llama3-8b")
    for clock, item in passes:
        now[0] = clock
        if isinstance(item, str):
            m.arrived(item, clock, 1, 16, 40)
        elif isinstance(item, RequestDone):
            m.done(item)
        elif fast:
            m.pass_output(item)  # type: ignore[arg-type]
        else:
            m.batch(item)  # type: ignore[arg-type]
            for c in item.chunks:  # type: ignore[attr-defined]
                m.tokens(c)
    text = m.render({"tes": []})[0].decode()
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", text)


def test_pass_output_scrapes_as_batch_then_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    for seed in range(8):
        passes = _passes(seed)
        readable = _run(passes, False, monkeypatch)
        assert _run(passes, True, monkeypatch) == readable, seed
    assert "vllm:generation_tokens_total" in readable and "vllm:inter_token_latency_seconds_count" in readable
