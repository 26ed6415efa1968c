"""Compatibility with today's clients (issue 30 §3), through the official `openai` client against a
live daemon: sampling fields mean what users expect, `n > 1`, every current OpenAI/vLLM request
field is honoured, a documented no-op or a 400 saying why, response shapes as OpenAI's, vLLM's
utility endpoints, and `daemon.unknown_fields = "warn"`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx2 as httpx
import openai
import pytest
from daemonproc import start_daemon, stop_daemon

from deepserve.actors.flowserve.messages import Sampling
from deepserve.actors.flowserve.sampling import output_length_of, prompt_key_of, sampled_tokens
from deepserve.adapters.tokenizer import output_text
from deepserve.daemon.api import HONOURED, NO_OP, REFUSED, ChatRequest, CompletionRequest
from deepserve.daemon.config import load_config

MODEL = "llama3-8b"
MESSAGES = [{"role": "user", "content": "Tell me about the river and the mountain."}]
README = Path(__file__).resolve().parents[2] / "README.md"


def client(daemon: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon["url"] + "/v1", api_key="none", max_retries=0, timeout=60)


def chat(daemon: dict[str, Any], **kw: Any) -> Any:
    return client(daemon).chat.completions.create(model=MODEL, **{"messages": MESSAGES, "max_tokens": 16, **kw})


def text(r: Any) -> str:
    return str(r.choices[0].message.content)


IGNORE_EOS = {"extra_body": {"ignore_eos": True}}


# ---- sampling --------------------------------------------------------------------------------


def test_temperature_0_and_top_k_1_are_greedy_whatever_the_seed(daemon: dict[str, Any]) -> None:
    greedy = {text(chat(daemon, temperature=0, seed=s, **IGNORE_EOS)) for s in (1, 2, None, None)}
    assert len(greedy) == 1  # with seeds, and without (two unseeded requests agree)
    top1 = chat(daemon, temperature=1.5, seed=3, extra_body={"ignore_eos": True, "top_k": 1})
    assert text(top1) == greedy.pop()


def test_a_seed_reproduces_sampling_and_temperature_changes_it(daemon: dict[str, Any]) -> None:
    a, b = (text(chat(daemon, temperature=1.0, seed=11, **IGNORE_EOS)) for _ in range(2))
    assert a == b
    assert text(chat(daemon, temperature=1.0, seed=12, **IGNORE_EOS)) != a
    # one seed, temperatures 0 and 2: two texts (they were the same before issue 30)
    assert text(chat(daemon, temperature=0, seed=11, **IGNORE_EOS)) != text(
        chat(daemon, temperature=2, seed=11, **IGNORE_EOS))
    # unseeded sampled requests differ from each other
    assert len({text(chat(daemon, temperature=1.0, **IGNORE_EOS)) for _ in range(3)}) > 1


def test_min_tokens_defers_the_emulated_eos(daemon: dict[str, Any]) -> None:
    sched = load_config().cluster.scheduler
    law = (sched.eos_lognormal_mu, sched.eos_lognormal_sigma)
    # a seed whose sampled length is short (EOS drawn from the seed, not the prompt, at T = 1)
    seed = next(s for s in range(10_000)
                if output_length_of(Sampling(max_tokens=60, seed=s), 0.0, law)[0] < 12)  # fmt: skip
    short = chat(daemon, seed=seed, max_tokens=60)
    assert short.usage.completion_tokens < 12 and short.choices[0].finish_reason == "stop"
    held = chat(daemon, seed=seed, max_tokens=60, extra_body={"min_tokens": 12})
    assert held.usage.completion_tokens >= 12
    r = httpx.post(daemon["url"] + "/v1/completions", timeout=10,
                   json={"model": MODEL, "prompt": "x", "max_tokens": 4, "min_tokens": 5})  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"


def test_stop_strings_and_stop_token_ids(daemon: dict[str, Any]) -> None:
    full = text(chat(daemon, temperature=0, max_tokens=12, **IGNORE_EOS))
    word = full.split()[3] + " "
    cut = chat(daemon, temperature=0, max_tokens=12, stop=[word], extra_body={"ignore_eos": True})
    kept = chat(daemon, temperature=0, max_tokens=12, stop=[word],
                extra_body={"ignore_eos": True, "include_stop_str_in_output": True})  # fmt: skip
    at = full.index(word)
    assert text(cut) == full[:at] and text(kept) == full[: at + len(word)]
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].model_extra["stop_reason"] == word
    # stop_token_ids: the greedy output's ids are the emulated model's, from the prompt's tokens
    ids = httpx.post(daemon["url"] + "/tokenize", json={"messages": MESSAGES}, timeout=10).json()["tokens"]
    out = sampled_tokens(Sampling(max_tokens=12, temperature=0.0, prompt_key=prompt_key_of(ids)), 0, 12, 32_000)
    assert output_text(out) == full
    stopped = chat(daemon, temperature=0, max_tokens=12, extra_body={"ignore_eos": True, "stop_token_ids": [out[5]]})
    assert text(stopped) == output_text(out[:5]) and stopped.choices[0].model_extra["stop_reason"] == out[5]
    assert stopped.usage.completion_tokens == 6  # the stop token was generated (as vLLM counts it)


def test_truncate_prompt_tokens_cache_salt_and_chat_echo(daemon: dict[str, Any]) -> None:
    c = client(daemon)
    r = c.completions.create(model=MODEL, prompt="word " * 100, max_tokens=1, extra_body={"truncate_prompt_tokens": 7})
    assert r.usage.prompt_tokens == 7
    # cache_salt: the same prompt under one salt hits the prefix cache on a TE it ran on before
    # (round robin over the TEs: six requests revisit one); under fresh salts it never does
    prompt = "A long shared preamble about rivers and mountains. " * 8

    def cached(salt: str) -> int:
        u = c.completions.create(model=MODEL, prompt=prompt, max_tokens=1, extra_body={"cache_salt": salt}).usage
        return int(u.prompt_tokens_details.cached_tokens)

    assert max(cached("team-a") for _ in range(6)) > 0
    assert [cached(f"fresh-{i}") for i in range(6)] == [0] * 6
    # vLLM's chat echo: an assistant turn last is continued, its content first in the reply
    turn = [*MESSAGES, {"role": "assistant", "content": "Well, the river"}]
    echoed = c.chat.completions.create(model=MODEL, messages=turn, max_tokens=3, extra_body={"echo": True})
    assert str(echoed.choices[0].message.content).startswith("Well, the river")


def test_continuous_usage_stats_put_usage_in_every_chunk(daemon: dict[str, Any]) -> None:
    chunks = list(client(daemon).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, stream=True, extra_body={"ignore_eos": True},
        stream_options={"include_usage": True, "continuous_usage_stats": True}))  # fmt: skip
    counts = [ch.usage.completion_tokens for ch in chunks if ch.choices and ch.choices[0].delta.content]
    assert counts and counts == sorted(counts) and chunks[-1].usage.completion_tokens == 4


# ---- n > 1 -----------------------------------------------------------------------------------


def test_n_choices_non_streamed_and_streamed(daemon: dict[str, Any]) -> None:
    c = client(daemon)
    r = c.chat.completions.create(model=MODEL, messages=MESSAGES, n=3, max_tokens=5, seed=4, **IGNORE_EOS)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    assert len({ch.message.content for ch in r.choices}) == 3  # each choice its own draw
    assert r.usage.completion_tokens == 15 and r.usage.prompt_tokens == chat(daemon, max_tokens=1).usage.prompt_tokens
    stream = c.completions.create(model=MODEL, prompt="Once upon a time", n=2, max_tokens=4, seed=4, stream=True,
                                  stream_options={"include_usage": True}, **IGNORE_EOS)  # fmt: skip
    texts, finishes, usage = ["", ""], {}, None
    for chunk in stream:
        for ch in chunk.choices:
            texts[ch.index] += ch.text
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
        usage = chunk.usage or usage
    assert finishes == {0: "length", 1: "length"} and all(texts) and texts[0] != texts[1]
    assert usage is not None and usage.completion_tokens == 8
    same = c.completions.create(model=MODEL, prompt="Once upon a time", n=2, max_tokens=4, seed=4, **IGNORE_EOS)
    assert [ch.text for ch in same.choices] == texts  # streamed or not, the same draws
    greedy = c.completions.create(model=MODEL, prompt="Once", n=2, max_tokens=4, temperature=0, **IGNORE_EOS)
    assert greedy.choices[0].text == greedy.choices[1].text  # greedy: n copies, as vLLM's


# ---- request fields --------------------------------------------------------------------------


def test_every_declared_field_is_classified_and_in_the_readme_table() -> None:
    declared = set(ChatRequest.__struct_fields__) | set(CompletionRequest.__struct_fields__)
    kinds = [set(HONOURED), set(NO_OP), set(REFUSED)]
    assert declared == set().union(*kinds)
    assert not (kinds[0] & kinds[1] or kinds[0] & kinds[2] or kinds[1] & kinds[2])
    table = README.read_text().split("### Request fields", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `([a-z_.]+)` \| (honoured|no-op|refused)", table, re.M))
    for field in declared | {"stream_options.include_obfuscation", "stream_options.continuous_usage_stats"}:
        assert field in rows, f"{field} is not in the README's table"
    for field, kind in rows.items():
        if field in declared:
            expected = "honoured" if field in HONOURED else "no-op" if field in NO_OP else "refused"
            assert kind == expected, field


def test_documented_no_ops_are_accepted(daemon: dict[str, Any]) -> None:
    r = chat(daemon, max_tokens=3, seed=2, prompt_cache_key="k", safety_identifier="u-1", user="u", store=False,
             metadata={"a": "b"}, service_tier="auto", reasoning_effort="low", stream=False,
             prompt_cache_options={"mode": "implicit", "ttl": "30m"},
             extra_body={"priority": 5, "skip_special_tokens": False, "spaces_between_special_tokens": True,
                         "request_id": "mine", "ignore_eos": True, "chat_template_kwargs": {"x": 1}})  # fmt: skip
    assert r.usage.completion_tokens == 3
    part = {"type": "text", "text": "hi", "prompt_cache_breakpoint": {"type": "ephemeral"}}
    assert chat(daemon, max_tokens=1, messages=[{"role": "user", "content": [part]}]).usage.completion_tokens == 1
    stream = client(daemon).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=2, stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False}, **IGNORE_EOS)  # fmt: skip
    assert [c.usage.completion_tokens for c in stream if c.usage] == [2]


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "call functions"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "schema"),
        ({"guided_json": {"type": "object"}}, "guided_json", "grammar"),
        ({"use_beam_search": True}, "use_beam_search", "beam"),
        ({"web_search_options": {}}, "web_search_options", None),  # {} is neutral
    ],
)
def test_refused_fields_are_a_400_saying_why(daemon: dict[str, Any], extra: dict[str, Any], param: str,
                                             words: str | None) -> None:  # fmt: skip
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2, **extra}
    r = httpx.post(daemon["url"] + "/v1/chat/completions", json=body, timeout=30)
    if words is None:
        assert r.status_code == 200, r.text
        return
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"]) == (param, "unsupported_parameter") and words in err["message"]


def test_an_unknown_field_is_a_400_by_default(daemon: dict[str, Any]) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        chat(daemon, extra_body={"max_token": 5})
    assert exc.value.body["param"] == "max_token" and exc.value.body["code"] == "unknown_parameter"


def test_warn_mode_ignores_unknown_fields_with_one_warning_per_name(tmp_path: Path, daemon: dict[str, Any]) -> None:
    proc, info = start_daemon(tmp_path / "run", "--set", 'daemon.unknown_fields="warn"')
    try:
        c = openai.OpenAI(base_url=info["url"] + "/v1", api_key="none", max_retries=0, timeout=60)
        for _ in range(3):
            r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi", "nmae": "x"}],
                                          max_tokens=2, extra_body={"max_token": 5, "ignore_eos": True})  # fmt: skip
            assert r.usage.completion_tokens == 2
        other_start = r.id
    finally:
        out = stop_daemon(proc)
    assert out.count("ignored an unknown request field") == 2, out  # max_token, messages[].nmae
    # ids are unique across starts: `chatcmpl-<a random token of the start>-<the log's request id>`,
    # so two starts' n-th requests (both `chat-<n>` in their logs) differ
    here = chat(daemon, max_tokens=1).id
    pattern = r"chatcmpl-([0-9a-f]{12})-chat-\d+"
    assert re.fullmatch(pattern, other_start) and re.fullmatch(pattern, here)
    assert other_start.split("-")[1] != here.split("-")[1]


# ---- response shapes -------------------------------------------------------------------------


def test_response_shapes_as_openai_has_them(daemon: dict[str, Any]) -> None:
    raw = httpx.post(daemon["url"] + "/v1/chat/completions", timeout=30,
                     json={"model": MODEL, "messages": MESSAGES, "max_tokens": 2}).json()  # fmt: skip
    assert raw["id"].startswith("chatcmpl-") and raw["system_fingerprint"].startswith("fp_")
    choice = raw["choices"][0]
    assert choice["logprobs"] is None and choice["message"]["refusal"] is None
    cmpl = httpx.post(daemon["url"] + "/v1/completions", timeout=30,
                      json={"model": MODEL, "prompt": "x", "max_tokens": 2}).json()  # fmt: skip
    assert cmpl["id"].startswith("cmpl-") and cmpl["choices"][0]["logprobs"] is None and cmpl["system_fingerprint"]
    chunks = list(client(daemon).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=3, stream=True, stream_options={"include_usage": True}))
    assert all(c.system_fingerprint == raw["system_fingerprint"] for c in chunks)
    assert all(ch.logprobs is None for c in chunks for ch in c.choices)
    assert chunks[0].choices[0].delta.refusal is None and chunks[0].choices[0].delta.role == "assistant"
    # the usage extension: emulated timings under `deepserve` in the usage chunk
    assert set(chunks[-1].model_extra["deepserve"]) == {"ttft_s", "tpot_s", "status"}
    with pytest.raises(openai.NotFoundError) as exc:
        client(daemon).chat.completions.create(model="gpt-4", messages=MESSAGES)
    assert exc.value.body["code"] == "model_not_found"
    bad = httpx.post(daemon["url"] + "/v1/chat/completions", content=b"{not json", timeout=10).json()
    assert bad["error"]["code"] == "invalid_json"
    missing = httpx.get(daemon["url"] + "/v1/nothing", timeout=10).json()
    assert missing["error"]["code"] == "not_found"


# ---- vLLM's utility endpoints ----------------------------------------------------------------


def test_version_ping_tokenize_detokenize(daemon: dict[str, Any]) -> None:
    url = daemon["url"]
    assert re.fullmatch(r"\d+\.\d+.*", httpx.get(url + "/version", timeout=10).json()["version"])
    assert httpx.get(url + "/ping", timeout=10).status_code == 200
    assert httpx.post(url + "/ping", timeout=10).status_code == 200
    tok = httpx.post(url + "/tokenize", json={"model": MODEL, "prompt": "Once upon a time",
                                              "return_token_strs": True}, timeout=10).json()  # fmt: skip
    assert tok["count"] == len(tok["tokens"]) > 0 and "".join(tok["token_strs"]) == "Once upon a time"
    assert tok["max_model_len"] > 0
    used = client(daemon).completions.create(model=MODEL, prompt="Once upon a time", max_tokens=1)
    assert used.usage.prompt_tokens == tok["count"]
    chat_tok = httpx.post(url + "/tokenize", json={"messages": MESSAGES}, timeout=10).json()
    assert chat_tok["count"] == chat(daemon, max_tokens=1).usage.prompt_tokens and chat_tok["token_strs"] is None
    back = httpx.post(url + "/detokenize", json={"model": MODEL, "tokens": tok["tokens"]}, timeout=10).json()
    assert back == {"prompt": "Once upon a time"}
    wrong = httpx.post(url + "/detokenize", json={"model": "gpt-4", "tokens": [1]}, timeout=10)
    assert wrong.status_code == 404 and wrong.json()["error"]["code"] == "model_not_found"
    bad = httpx.post(url + "/tokenize", json={"prompt": 5}, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"


def test_the_openapi_document_declares_every_response(daemon: dict[str, Any]) -> None:
    doc = httpx.get(daemon["url"] + "/openapi.json", timeout=10).json()
    paths = doc["paths"]
    assert "text/plain" in paths["/metrics"]["get"]["responses"]["200"]["content"]
    assert "404" in paths["/v1/models/{model_id}"]["get"]["responses"]
    for route in ("/v1/chat/completions", "/v1/completions"):
        responses = paths[route]["post"]["responses"]
        assert {"200", "400", "404", "413", "429", "500", "503", "504"} <= set(responses)
        assert "text/event-stream" in responses["200"]["content"]
        assert responses["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorResponse"}
    for route in ("/version", "/ping", "/tokenize", "/detokenize"):
        assert route in paths


def test_min_tokens_defers_stop_strings_and_stop_token_ids() -> None:
    """vLLM's rule: no stop string or stop token ends the output before min_tokens tokens."""
    import asyncio

    import msgspec

    from deepserve.actors.flowserve.messages import TaskTokens
    from deepserve.actors.workload.messages import RequestDone
    from deepserve.adapters.tokenizer import token_text
    from deepserve.daemon.generation import Generation

    class Rt:
        async def cancel(self, *_a: Any, **_k: Any) -> None:
            return None

    ids = tuple(range(100, 110))
    words = [token_text(t) for t in ids]
    stop = words[1]  # the second token's word (it may recur later)

    def run(body: dict[str, Any]) -> str:
        req = msgspec.convert({"model": MODEL, "prompt": "x", **body}, type=CompletionRequest)

        async def go() -> str:
            q: asyncio.Queue[Any] = asyncio.Queue()
            q.put_nowait(RequestDone(request_id="c", status="completed", reason="length", arrival_s=0.0,  # type: ignore[arg-type]
                                     first_token_s=0.1, finish_s=0.2, prompt_tokens=1, cached_prompt_tokens=0,
                                     output_tokens=10, te="te/0"))  # fmt: skip
            first = TaskTokens(task_id="c/1", request_id="c", first_index=0, token_ids=ids, times_s=(0.1,) * 10)
            gen = Generation(Rt(), "c", "cmpl", MODEL, req.stops(), req, q, first)  # type: ignore[arg-type]
            await gen.drain()
            return gen.text

        return asyncio.run(go())

    full = "".join(words)
    assert run({"stop": [stop]}) == full[: full.index(stop)]
    later = full.find(stop, len("".join(words[:4])))  # a match may only start after token 4
    assert run({"stop": [stop], "min_tokens": 4}) == (full if later < 0 else full[:later])
    assert run({"stop_token_ids": [ids[1], ids[6]]}) == "".join(words[:1])
    assert run({"stop_token_ids": [ids[1], ids[6]], "min_tokens": 4}) == "".join(words[:6])
