"""The JE's routing policy is the daemon's `[scheduling]` section: with `load_aware` an idle
daemon sends a repeated prompt, as text or as token ids, back to the TE that holds its prefix,
and the client sees the cached tokens in `usage` (with `round_robin` the same prompt rotates
over every TE; `load_aware` is the default now, set here all the same)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from daemonproc import start_daemon, stop_daemon

from deepserve.actors.je.messages import RouteDecided
from deepserve.core.codec import decode
from deepserve.persistence import open_log
from deepserve.replay import verify

MODEL = "llama3-8b"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    run_dir = tmp_path_factory.mktemp("routing") / "run"
    proc, info = start_daemon(run_dir, "--set", "scheduling.policy=load_aware")
    info["proc"] = proc
    yield info
    if proc.poll() is None:
        stop_daemon(proc)


def _cached(c: openai.OpenAI, prompt: Any) -> list[int]:
    out = []
    for _ in range(3):
        r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=2, extra_body={"ignore_eos": True})
        out.append(r.usage.prompt_tokens_details.cached_tokens)
    return out


def test_a_repeated_prompt_returns_to_the_te_that_caches_it(daemon: dict[str, Any]) -> None:
    c = openai.OpenAI(base_url=daemon["url"] + "/v1", api_key="none", max_retries=0, timeout=60)
    text = "The river runs past the mountain and the garden in the morning light. " * 4  # 70 tokens
    assert _cached(c, text) == [0, 64, 64]  # four full blocks of 16 tokens, from the 2nd on
    assert _cached(c, list(range(500, 540))) == [0, 32, 32]  # 40 token ids: two full blocks


def test_the_routing_decisions_are_in_the_log_and_it_replays(daemon: dict[str, Any]) -> None:
    stop_daemon(daemon["proc"])
    log = open_log(daemon["log"])
    try:
        decided = [decode(e.type, e.payload) for s in log.steps() for e in s.events
                   if e.type == "RouteDecided"]  # fmt: skip
        assert len(decided) >= 6 and all(isinstance(d, RouteDecided) for d in decided)
        policies = {d.decision.policy for d in decided}
        assert policies == {"load_aware"}
        assert verify(log).identical
    finally:
        log.close()
