"""A request id names an accepted request, one in the log (issue 30 §2: every request that reached
the frontend ends in exactly one recorded terminal state). A 400 (the prompt too long, or empty;
`max_tokens` over the limit) is not an accepted request: it gets no id — before, the id was drawn
first, so the 400s left gaps in the ids and the next request was `cmpl-3`. A 503 while the daemon
shuts down is refused before acceptance too: no id, no `X-Request-Id`, nothing in the log (the
actor system is stopping; it could not record the refusal)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import openai
import pytest
from daemonproc import start_daemon, stop_daemon

from deepserve.actors.gateway.messages import ApiRequest, GatewayDone
from deepserve.core.codec import decode
from deepserve.persistence import open_log

MODEL = "llama3-8b"
SETTINGS = ("cluster.tes=1", "pd.prefill_tes=0", "pd.decode_tes=0")


def logged(log_path: Path) -> tuple[list[str], list[str]]:
    """The request ids the gateway received (`ApiRequest`) and ended (`GatewayDone`), in order."""
    log = open_log(str(log_path))
    arrived, ended = [], []
    try:
        for step in log.steps(None, actor="gateway"):
            if step.input.type == ApiRequest.__name__:
                arrived.append(decode(step.input.type, step.input.payload).request_id)
            ended += [decode(e.type, e.payload).request_id for e in step.events if e.type == GatewayDone.__name__]
    finally:
        log.close()
    return arrived, ended


def status_and_id(call: object) -> tuple[int, str | None]:
    try:
        raw = call()  # type: ignore[operator]
        return raw.status_code, raw.headers.get("x-request-id")
    except openai.APIStatusError as exc:
        return exc.status_code, exc.response.headers.get("x-request-id")


def test_a_400_and_a_503_at_shutdown_get_no_id_and_every_id_is_a_logged_request(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc, info = start_daemon(run, *[a for s in SETTINGS for a in ("--set", s)])
    c = openai.OpenAI(base_url=info["url"] + "/v1", api_key="none", max_retries=0, timeout=60)
    create = c.completions.with_raw_response.create
    try:
        bad = [status_and_id(lambda: create(model=MODEL, prompt="word " * 60_000, max_tokens=4)),
               status_and_id(lambda: create(model=MODEL, prompt="hello", max_tokens=10**9)),
               status_and_id(lambda: create(model=MODEL, prompt="", max_tokens=4))]  # fmt: skip
        assert bad == [(400, None)] * 3, bad
        code, first = status_and_id(lambda: create(model=MODEL, prompt="hello", max_tokens=2))
        assert (code, first) == (200, "cmpl-1")  # the 400s drew no id

        # A long stream holds the shutdown's drain open; the requests sent meanwhile get 503.
        long = c.completions.create(model=MODEL, prompt="a long one", max_tokens=4000, stream=True,
                                    extra_body={"ignore_eos": True})  # fmt: skip
        next(iter(long))
        proc.send_signal(signal.SIGTERM)
        seen, end = [], time.monotonic() + 30
        while not seen or seen[-1][0] != 503:  # until the frontend has stopped accepting
            assert time.monotonic() < end, seen
            seen.append(status_and_id(lambda: create(model=MODEL, prompt="late", max_tokens=1)))
            time.sleep(0.01)
        long.close()  # the client goes: the drain ends
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            stop_daemon(proc)
    assert seen[-1] == (503, None), seen
    arrived, ended = logged(run / "daemon.db")
    named = [first, *(rid for code, rid in seen if code != 503)]
    # every id a client was told is a request the log has, with its one terminal state; the
    # long stream is the one more (its id went nowhere: the client never read the header)
    assert set(named) <= set(arrived) and len(arrived) == len(named) + 1, (named, arrived)
    assert sorted(ended) == sorted(arrived), (arrived, ended)
    assert arrived == [f"cmpl-{i}" for i in range(1, len(arrived) + 1)]  # no id drawn for a refusal


if __name__ == "__main__":
    pytest.main([__file__, "-q", "-p", "no:xdist"])
