"""The daemon through real clients: the official `openai` client, `curl -N`, raw HTTP for bad
input; a client that disconnects frees its KV blocks; the log replays identically."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import pytest

from deepserve.persistence import open_log
from deepserve.replay import verify

MODEL = "llama3-8b"
MESSAGES = [{"role": "user", "content": "Tell me about the river and the mountain."}]


def client(daemon: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon["url"] + "/v1", api_key="none", max_retries=0, timeout=60)


def status(daemon: dict[str, Any]) -> dict[str, Any]:
    return httpx.get(daemon["admin_url"] + "/admin/status", timeout=10).json()


def test_models_and_chat_non_streaming(daemon: dict[str, Any]) -> None:
    c = client(daemon)
    assert [m.id for m in c.models.list().data] == [MODEL]
    r = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, seed=7,
                                  extra_body={"ignore_eos": True})  # fmt: skip
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12 and len(r.choices[0].message.content.split()) == 12
    assert r.usage.prompt_tokens == len("user: " + MESSAGES[0]["content"] + "\nassistant: ") // 4 + 1
    again = c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, seed=7,
                                      extra_body={"ignore_eos": True})  # fmt: skip
    assert again.choices[0].message.content == r.choices[0].message.content  # same seed, same words


def test_chat_streaming_arrives_in_chunks(daemon: dict[str, Any]) -> None:
    stream = client(daemon).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=20, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    pieces, arrivals, usage, finish = [], [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.delta.content:
                pieces.append(ch.delta.content)
                arrivals.append(time.perf_counter())
            finish = ch.finish_reason or finish
    assert len(pieces) == 20 and finish == "length" and usage.completion_tokens == 20
    assert arrivals[-1] - arrivals[0] > 0.05  # tokens arrive over time, at the emulated pace


def test_completions_both_ways_and_stop(daemon: dict[str, Any]) -> None:
    c = client(daemon)
    kw: dict[str, Any] = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 6, "seed": 3,
                          "extra_body": {"ignore_eos": True}}  # fmt: skip
    r = c.completions.create(**kw)
    assert r.usage.completion_tokens == 6 and r.choices[0].finish_reason == "length"
    text = "".join(ch.choices[0].text for ch in c.completions.create(stream=True, **kw))
    assert text == r.choices[0].text  # same seed: the same words, streamed or not
    stop = " " + r.choices[0].text.split()[2] + " "
    stopped = c.completions.create(stop=[stop], **kw)
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == r.choices[0].text[: r.choices[0].text.find(stop)]


def test_unknown_model_is_a_404_error_object(daemon: dict[str, Any]) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        client(daemon).chat.completions.create(model="gpt-4", messages=MESSAGES)
    assert exc.value.body["param"] == "model"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b'{"model": "llama3-8b", "messages": "hi"}', "messages"),
        (b'{"model": "llama3-8b", "messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}', "max_tokens"),
        (b'{"model": "llama3-8b", "messages": [{"role": "user", "content": "x"}], "temperature": 7}', "temperature"),
        (b'{"model": "llama3-8b", "messages": []}', "messages"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"model": "llama3-8b", "messages": [{"content": "x"}]}', "messages[0].role"),
        # bytes that are not UTF-8 inside a JSON string: a 500 and a traceback before (a tour)
        (b'{"model": "llama3-8b", "messages": [{"role": "user", "content": "\xff\xfe"}]}', None),
    ],
)
def test_bad_bodies_are_400_naming_the_field(daemon: dict[str, Any], body: bytes, param: str | None) -> None:
    r = httpx.post(daemon["url"] + "/v1/chat/completions", content=body, timeout=10)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if param is not None:
        assert err["param"] == param


def test_text_content_parts_read_as_their_text(daemon: dict[str, Any]) -> None:
    """OpenAI's array form of content (text parts), and a history with a tool turn."""
    c = client(daemon)
    kw: dict[str, Any] = {"model": MODEL, "max_tokens": 4, "seed": 5, "extra_body": {"ignore_eos": True}}
    as_string = c.chat.completions.create(
        messages=[{"role": "user", "content": "Tell me about\nthe river."}], **kw)
    as_parts = c.chat.completions.create(messages=[{"role": "user", "content": [
        {"type": "text", "text": "Tell me about"}, {"type": "text", "text": "the river."}]}], **kw)
    assert as_parts.usage.prompt_tokens == as_string.usage.prompt_tokens  # parts join with "\n"
    assert as_parts.choices[0].message.content == as_string.choices[0].message.content
    history = c.chat.completions.create(messages=[
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
        {"role": "user", "content": "and then?"}], **kw)  # fmt: skip
    assert history.usage.completion_tokens == 4


@pytest.mark.parametrize(
    ("route", "extra", "param", "words"),
    [
        ("chat", {"logprobs": True}, "logprobs", "no token probabilities"),
        ("chat", {"top_logprobs": 2}, "top_logprobs", "no token probabilities"),
        ("chat", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "call functions"),
        ("chat", {"tool_choice": "required"}, "tool_choice", "call functions"),
        ("chat", {"response_format": {"type": "json_object"}}, "response_format", "plain text"),
        ("chat", {"logit_bias": {"17": 5}}, "logit_bias", "no token probabilities"),
        ("chat", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
         "messages[0].content[0].type", "image_url"),
        ("chat", {"max_token": 5}, "max_token", "unknown field"),  # a typo is not ignored
        # only an assistant turn that called tools may have no content (a user tour: accepted)
        ("chat", {"messages": [{"role": "user", "content": None}]}, "messages[0].content",
         "required for a user message"),
        # a typo inside a message or stream_options too (a user tour: both were ignored)
        ("chat", {"messages": [{"role": "user", "content": "hi", "nmae": "bob"}]}, "messages[0].nmae",
         "unknown field"),
        ("chat", {"stream": True, "stream_options": {"include_usgae": True}}, "stream_options.include_usgae",
         "unknown field"),
        ("chat", {"stream_options": {"include_usage": True}}, "stream_options", "only allowed when `stream`"),
        ("chat", {"presence_penalty": 0.5}, "presence_penalty", "do not depend"),
        ("chat", {"frequency_penalty": -2}, "frequency_penalty", "do not depend"),
        ("chat", {"presence_penalty": 50}, "presence_penalty", "<= 2"),
        ("chat", {"repetition_penalty": 1.2}, "repetition_penalty", "do not depend"),  # vLLM's extensions
        ("completions", {"top_k": -5}, "top_k", ">= -1"),
        ("completions", {"min_p": 1.5}, "min_p", "<= 1"),
        ("completions", {"logprobs": 1}, "logprobs", "no token probabilities"),
        ("completions", {"best_of": 3}, "best_of", "one completion"),
        ("completions", {"suffix": "end"}, "suffix", "fill-in-the-middle"),
    ],
)
def test_what_deepserve_cannot_honour_is_a_400_naming_the_field(
    daemon: dict[str, Any], route: str, extra: dict[str, Any], param: str, words: str
) -> None:
    """Never silently ignored: the output would not be what the request asked for."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 2}
    body |= {"messages": MESSAGES} if route == "chat" else {"prompt": "Once"}
    r = httpx.post(f"{daemon['url']}/v1/{'chat/' if route == 'chat' else ''}completions",
                   json=body | extra, timeout=10)  # fmt: skip
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["type"], err["param"]) == ("invalid_request_error", param)
    assert words in err["message"]


def test_neutral_values_of_unsupported_fields_are_accepted(daemon: dict[str, Any]) -> None:
    """What clients send by default (logprobs false, no tools, text format) changes nothing."""
    r = client(daemon).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=3, logprobs=False, tool_choice="none",
        response_format={"type": "text"}, metadata={"team": "sre"}, store=False,
        parallel_tool_calls=True, presence_penalty=0, frequency_penalty=0.0,
        # vLLM's sampling extensions, as vLLM clients send them (a tour: each was a 400)
        extra_body={"ignore_eos": True, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.0},
    )  # fmt: skip
    assert r.usage.completion_tokens == 3
    # an assistant turn sent back as the client got it (refusal, annotations): history, accepted
    turn = r.choices[0].message.model_dump()
    again = client(daemon).chat.completions.create(
        model=MODEL, messages=[*MESSAGES, turn, {"role": "user", "content": "more"}], max_tokens=2)
    assert again.usage.completion_tokens >= 1


def test_echo_returns_the_prompt_before_the_completion(daemon: dict[str, Any]) -> None:
    c = client(daemon)
    kw: dict[str, Any] = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4, "seed": 9,
                          "extra_body": {"ignore_eos": True}}  # fmt: skip
    plain = c.completions.create(**kw).choices[0].text
    echoed = c.completions.create(echo=True, **kw).choices[0].text
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(echo=True, stream=True, **kw))
    assert echoed == streamed == "Once upon a time" + plain


def test_a_prompt_of_token_ids_is_served_as_those_tokens(daemon: dict[str, Any]) -> None:
    """OpenAI's token-array prompt, flat or nested: the prompt's length is the ids' count, the
    same ids give the same request (test_routing_policy.py: they hit the prefix cache)."""
    c = client(daemon)
    ids = list(range(1000, 1040))  # 40 tokens: two full KV blocks of 16
    kw: dict[str, Any] = {"model": MODEL, "max_tokens": 3, "seed": 4, "extra_body": {"ignore_eos": True}}
    flat = c.completions.create(prompt=ids, **kw)
    nested = c.completions.create(prompt=[ids], **kw)
    assert flat.usage.prompt_tokens == nested.usage.prompt_tokens == 40
    assert flat.choices[0].text == nested.choices[0].text  # same seed, same words
    echoed = c.completions.create(prompt=ids[:2], echo=True, **kw).choices[0].text
    assert echoed.endswith(c.completions.create(prompt=ids[:2], **kw).choices[0].text)
    assert len(echoed.split()) == 2 + 3  # the ids' words, then the completion's


@pytest.mark.parametrize(
    ("prompt", "says"),
    [
        ([], "empty list"),
        ([[]], "empty list of token ids"),
        (["a", "b"], "exactly one prompt per request, got 2"),
        ([[1, 2], [3]], "exactly one prompt per request, got 2"),
        ([1, "a"], "mixes token ids"),
        ([-1, 2], "token id -1 is outside"),
    ],
)
def test_bad_prompts_are_400_naming_the_prompt(daemon: dict[str, Any], prompt: Any, says: str) -> None:
    r = httpx.post(daemon["url"] + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2},
                   timeout=10)  # fmt: skip
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "prompt" and says in err["message"], err


def test_a_model_is_retrieved_by_id_and_unknown_paths_are_error_objects(daemon: dict[str, Any]) -> None:
    c = client(daemon)
    assert c.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as exc:
        c.models.retrieve("org/other-model")
    assert exc.value.body["param"] == "model" and "org/other-model" in exc.value.body["message"]
    for method, path, code in (("GET", "/v1/nope", 404), ("GET", "/v1/chat/completions", 405)):
        r = httpx.request(method, daemon["url"] + path, timeout=10)
        # OpenAI's kind of code, not the status as a string (issue 30 §3)
        expected = {404: "not_found", 405: "method_not_allowed"}[code]
        assert r.status_code == code and r.json()["error"]["code"] == expected, r.text


def test_an_empty_prompt_is_a_400_at_once(daemon: dict[str, Any]) -> None:
    t0 = time.perf_counter()
    r = httpx.post(daemon["url"] + "/v1/completions", json={"model": MODEL, "prompt": "", "max_tokens": 2},
                   timeout=10)  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    assert time.perf_counter() - t0 < 2.0  # not after the TTFT deadline


def test_a_huge_body_is_413(daemon: dict[str, Any]) -> None:
    r = httpx.post(daemon["url"] + "/v1/completions", content=b"x" * (5 << 20), timeout=30)
    assert r.status_code == 413 and "error" in r.json()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_curl_streams_sse(daemon: dict[str, Any]) -> None:
    body = json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 5, "stream": True, "ignore_eos": True})
    out = subprocess.run(["curl", "-sN", daemon["url"] + "/v1/completions", "-H", "content-type: application/json",
                          "-d", body], capture_output=True, text=True, timeout=60).stdout  # fmt: skip
    events = [line[6:] for line in out.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]).count(" ") == 5


def test_disconnect_cancels_and_frees_blocks(daemon: dict[str, Any]) -> None:
    before = status(daemon)["requests"].get("cancelled", 0)
    body = {"model": MODEL, "prompt": "a long story " * 50, "max_tokens": 4000, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", daemon["url"] + "/v1/completions", json=body, timeout=30) as r:
        got = 0
        for line in r.iter_lines():
            got += line.startswith("data: ")
            if got >= 3:
                break  # leave with the stream open: the connection closes
    end = time.monotonic() + 60  # generous: a loaded machine
    while time.monotonic() < end:
        st = status(daemon)
        dps = [dp for te in st["tes"] for dp in te["dps"]]
        if st["requests"].get("cancelled", 0) > before and st["inflight"] == 0:
            break
        time.sleep(0.1)
    assert st["requests"]["cancelled"] == before + 1
    assert sum(dp["running"] for dp in dps) == 0 and sum(dp["kv_blocks_used"] for dp in dps) == 0


def test_200_concurrent_requests_all_complete(daemon: dict[str, Any]) -> None:
    async def main() -> list[Any]:
        c = openai.AsyncOpenAI(base_url=daemon["url"] + "/v1", api_key="none", max_retries=0, timeout=120)

        async def one(i: int) -> Any:
            await asyncio.sleep(i * 0.025)  # 200 arrivals over 5 s
            return await c.completions.create(model=MODEL, prompt=f"request {i} " * 8, max_tokens=8,
                                              extra_body={"ignore_eos": True})  # fmt: skip

        return await asyncio.gather(*(one(i) for i in range(200)))

    results = asyncio.run(main())
    assert all(r.usage.completion_tokens == 8 for r in results)


def test_admin_reads_a_request_from_the_live_log(daemon: dict[str, Any]) -> None:
    r = httpx.post(daemon["url"] + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 3}, timeout=30)
    rid = r.headers["x-request-id"]
    end = time.monotonic() + 60
    while time.monotonic() < end:  # the log commits a few milliseconds behind
        got = httpx.get(f"{daemon['admin_url']}/admin/requests/{rid}", timeout=10)
        if got.status_code == 200 and any("JobFinished" in s["events"] for s in got.json()["steps"]):
            break
        time.sleep(0.05)
    steps = got.json()["steps"]
    assert steps[0]["input"] == "ApiRequest" and steps[0]["from"] == "ext/http" and steps[0]["external"]
    assert sum(s["events"].count("JobFinished") for s in steps) == 1
    assert got.json()["truncated"] is False
    # A long request has more steps than a page shows: it says so (it stopped at 1,000 silently)
    first = httpx.get(f"{daemon['admin_url']}/admin/requests/{rid}?limit=2", timeout=10).json()
    assert first["steps"] == steps[:2] and first["truncated"] is True
    bad = httpx.get(f"{daemon['admin_url']}/admin/requests/{rid}?limit=0", timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"
    assert httpx.get(f"{daemon['admin_url']}/admin/requests/nope", timeout=10).status_code == 404


def test_health_metrics_and_openapi(daemon: dict[str, Any]) -> None:
    assert httpx.get(daemon["url"] + "/health", timeout=10).json() == {"status": "ok"}
    # one finished request of its own: the per-request series exist once one was observed
    # (run alone, or on an xdist worker that ran no other test of this module, there was none)
    client(daemon).completions.create(model=MODEL, prompt="Once", max_tokens=2)
    metrics = httpx.get(daemon["url"] + "/metrics", timeout=10).text
    for name in ("vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count",
                 "vllm:e2e_request_latency_seconds_count", "vllm:num_requests_running",
                 "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits",
                 'deepserve_requests_total{status="completed"}'):  # fmt: skip
        assert name in metrics, name
    doc = httpx.get(daemon["url"] + "/openapi.json", timeout=10).json()
    assert "messages" in doc["components"]["schemas"]["ChatRequest"]["properties"]


def test_zz_shutdown_is_clean_and_the_log_replays(daemon: dict[str, Any]) -> None:
    out = daemon["stop"]()
    assert daemon["proc"].returncode == 0, out
    assert "stopped" in out
    assert not Path(f"runs/daemons/{daemon['pid']}.json").exists()  # `deepserve status` forgets it
    log = open_log(daemon["log"])
    try:
        assert verify(log).identical
    finally:
        log.close()
