"""A request cut after its first output token says so: a non-streamed one is a 503 naming how far
it got and why (not a 200 with part of a text), a streamed one ends with an in-band error event
(which the `openai` client raises). Driven by a real fault: the prefill TE's RoCE link goes down,
so a P/D request's first token comes from prefill and its KV never reaches decode. Once the link
is repaired (`link-up`), every request finishes again."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx2 as httpx
import openai
from daemonproc import start_daemon, stop_daemon, stream_story

from deepserve.persistence import open_log
from deepserve.replay import verify

MODEL = "llama3-8b"
REQUESTS = 24


ERROR_IDS: list[str | None] = []  # X-Request-Id of each error response (`_load`)


async def _load(url: str, requests: int = REQUESTS) -> list[tuple[str, str]]:
    c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)

    async def plain(i: int) -> tuple[str, str]:
        try:
            r = await c.completions.create(model=MODEL, prompt=f"tell me {i} " * 20, max_tokens=6,
                                           extra_body={"ignore_eos": True})  # fmt: skip
            return ("finished", f"{r.choices[0].finish_reason} {r.usage.completion_tokens}")
        except openai.APIStatusError as exc:
            ERROR_IDS.append(exc.response.headers.get("x-request-id"))
            return ("error", f"{exc.status_code}: {exc.body['message']}")  # type: ignore[index]

    try:
        plains = await asyncio.gather(*(plain(i) for i in range(requests)))
        streams = await asyncio.gather(*(stream_story(c, MODEL, i, 6) for i in range(requests)))
    finally:
        await c.close()
    return [*plains, *streams]


def _break_prefill_link(info: dict) -> str:
    st = httpx.get(info["admin_url"] + "/admin/status", timeout=10).json()
    (prefill,) = [t for t in st["tes"] if t["role"] == "prefill"]
    link = prefill["npus"][0].removeprefix("hw/") + "/roce"
    r = httpx.post(info["admin_url"] + "/admin/fault", json={"kind": "link-down", "target": link}, timeout=10)
    assert r.status_code == 200, r.text
    return link


def test_a_request_cut_after_output_is_an_error_not_a_partial_success(tmp_path: Path) -> None:
    # one attempt: a non-streamed request cut after its first token is not retried either
    ERROR_IDS.clear()
    # and the prefill TE never set aside (kv_fail_cooldown_s=0): requests keep meeting the down link
    # migration off: a streamed request cut after output is the case here (on, as in the daemon's
    # default config, it continues on another TE: tests/daemon/test_stream_migration.py)
    proc, info = start_daemon(tmp_path / "run", "--set", "cluster.tes=1", "--set", "scheduling.max_attempts=1",
                              "--set", "scheduling.kv_fail_cooldown_s=0",
                              "--set", "scheduling.migration.enabled=false")  # fmt: skip
    try:
        link = _break_prefill_link(info)
        results = asyncio.run(_load(info["url"]))
        # the link repaired from the admin API, every request finishes again
        r = httpx.post(info["admin_url"] + "/admin/fault", json={"kind": "link-up", "target": link}, timeout=10)
        assert r.status_code == 200, r.text
        repaired = asyncio.run(_load(info["url"], 8))
    finally:
        out = stop_daemon(proc)
    assert proc.returncode == 0, out
    plain, streamed = results[:REQUESTS], results[REQUESTS:]
    cut = [why for kind, why in plain if kind == "error"]
    aborted = [why for kind, why in streamed if kind == "aborted"]
    assert cut and aborted, results  # the fault hit P/D requests both ways
    for why in cut:
        assert why.startswith("503: the request failed after 1 output token: gave up after 1 attempt: "), why
    # an accepted request's error names it, for `replay why` (a tour: only a 200 did)
    assert len(ERROR_IDS) == len(cut) and all(i and i.startswith("cmpl-") for i in ERROR_IDS), ERROR_IDS
    for why in aborted:
        assert why.startswith("the request failed after 1 output token: "), why
    for kind, why in results:  # everything else ran to its end
        assert kind in ("error", "aborted") or why in ("length 6", "length"), (kind, why)
    assert all(why in ("length 6", "length") for _, why in repaired), repaired
    with open_log(info["log"]) as log:
        assert verify(log).identical


def test_a_non_streamed_request_whose_kv_was_lost_is_retried_off_the_broken_pair(tmp_path: Path) -> None:
    """A tour: with the prefill TE's link down, a non-streamed request's retry went back to the
    same prefill TE and then failed, saying the model's TE group was empty. Now the retry avoids
    the pair (the JE excludes the prefill TE too) and a colocated TE answers it; and the prefill
    TE is set aside for `kv_fail_cooldown_s`, so the streamed requests sent after that failure
    do not meet the down link at all (they used to fail after their first token)."""
    proc, info = start_daemon(tmp_path / "run", "--set", "cluster.tes=1")
    try:
        _break_prefill_link(info)
        results = asyncio.run(_load(info["url"]))
    finally:
        out = stop_daemon(proc)
    assert proc.returncode == 0, out
    plain, streamed = results[:REQUESTS], results[REQUESTS:]
    assert all(why == "length 6" for _, why in plain), plain
    assert all(kind == "finished" for kind, _ in streamed), streamed
    with open_log(info["log"]) as log:
        assert verify(log).identical
