"""Every request that reached the frontend ends in exactly one recorded terminal state (issue 30
§2), under a flood: many concurrent requests through the official `openai` client against a small
`daemon.max_inflight`. A refused one (429) is the gateway's `GatewayRefused` in the log — before,
only a counter moved, and `replay why` could not name it — and an admitted one its `GatewayDone`;
the log's counts match what the clients saw, and `replay why` explains a refusal."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
from daemonproc import start_daemon, stop_daemon

from deepserve.actors.gateway.messages import GatewayDone, GatewayRefused
from deepserve.core.codec import decode
from deepserve.persistence import open_log

MODEL = "llama3-8b"
SETTINGS = ("daemon.max_inflight=3", "cluster.tes=1", "pd.prefill_tes=0", "pd.decode_tes=0")
FLOOD = 48


async def one(c: openai.AsyncOpenAI, i: int) -> tuple[str, int]:
    """(request id, HTTP status) as the client saw them; streamed and not, chat and completions."""
    try:
        if i % 2:
            raw = await c.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": f"flood {i}"}], max_tokens=6,
                stream=bool(i % 4 == 1))  # fmt: skip
        else:
            raw = await c.completions.with_raw_response.create(model=MODEL, prompt=f"flood {i}", max_tokens=6)
        body = raw.parse()
        if i % 4 == 1:
            async for _ in body:  # the stream to its end
                pass
        return raw.headers["x-request-id"], raw.status_code
    except openai.APIStatusError as exc:
        return exc.response.headers.get("x-request-id", ""), exc.status_code


async def flood(url: str) -> list[tuple[str, int]]:
    c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
    try:
        return list(await asyncio.gather(*(one(c, i) for i in range(FLOOD))))
    finally:
        await c.close()


def terminals(log_path: Path) -> tuple[Counter[str], dict[str, Any], list[str]]:
    """Per request id: how many terminal records; the records; every request id the log admitted
    or refused."""
    log = open_log(str(log_path))
    try:
        count: Counter[str] = Counter()
        last: dict[str, Any] = {}
        for step in log.steps(None, actor="gateway"):
            for e in step.events:
                if e.type in (GatewayDone.__name__, GatewayRefused.__name__):
                    ev = decode(e.type, e.payload)
                    count[ev.request_id] += 1
                    last[ev.request_id] = ev
    finally:
        log.close()
    return count, last, sorted(count)


def test_every_request_of_a_flood_has_exactly_one_recorded_terminal_state(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc, info = start_daemon(run, *[a for s in SETTINGS for a in ("--set", s)])
    try:
        seen = asyncio.run(flood(info["url"]))
        metrics = httpx.get(info["url"] + "/metrics", timeout=10).text
    finally:
        stop_daemon(proc)
    by_status = Counter(code for _, code in seen)
    assert set(by_status) == {200, 429} and by_status[200] >= 3, by_status  # the flood was refused in part
    ids = [rid for rid, _ in seen]
    assert all(ids) and len(set(ids)) == FLOOD, seen  # every answer, a 429 too, names its request

    count, last, logged = terminals(run / "daemon.db")
    assert logged == sorted(ids)  # no request the clients did not see, none missing
    assert all(n == 1 for n in count.values()), [r for r, n in count.items() if n != 1]
    for rid, code in seen:  # the recorded terminal state is what the client was told
        ev = last[rid]
        assert (code, type(ev)) in ((429, GatewayRefused), (200, GatewayDone)), (rid, code, ev)
        assert code == 429 or ev.status == "completed", ev
    assert f'deepserve_requests_total{{status="rejected_429"}} {float(by_status[429])}' in metrics

    refused = next(rid for rid, code in seen if code == 429)
    why = subprocess.run([sys.executable, "-m", "deepserve", "replay", "why", str(run / "daemon.db"), refused],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert why.returncode == 0, why.stderr
    assert why.stdout.startswith(f"request {refused}: refused (429) by the gateway"), why.stdout
