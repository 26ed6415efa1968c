"""The request's terminal state carries the DP master's QUEUED and first SCHEDULED times (the
daemon's `vllm:request_queue_time_seconds`, `..._prefill_time_seconds`, `..._inference_time_seconds`):
the JE copies the finishing task's from its `TaskFinished`; in PD mode the prefill task's (the
request's first scheduling, the one its first token followed), kept in `JePrefilled` while the
decode runs. The fake TEs queue and schedule a task when it comes."""

from __future__ import annotations

from test_je import done_of, events, job, run


def test_a_colocated_request_carries_its_finishing_tasks_times() -> None:
    tes = {"te/0": {"behaviour": "fail_early"}, "te/1": {}}  # the first attempt fails: retried on te/1
    d, out = run(tes, {"colocated": list(tes)}, [job(0)])
    r = done_of(out)["r0"]
    at = d.actor("te/1").received["r0/chat.2"]
    assert r.status == "completed" and r.queued_s == r.scheduled_s == at
    assert at > d.actor("te/0").received["r0/chat.1"]  # the retry's, not the failed attempt's


def test_a_pd_request_carries_its_prefills_times_not_its_decodes() -> None:
    d, out = run({"p/0": {}, "d/0": {}}, {"prefill": ["p/0"], "decode": ["d/0"]}, [job(0)])
    r = done_of(out)["r0"]
    prefill, decode = d.actor("p/0").received["r0/prefill.1"], d.actor("d/0").received["r0/decode.1"]
    assert r.status == "completed" and r.te == "d/0"
    assert r.queued_s == r.scheduled_s == prefill < decode
    assert r.scheduled_s < r.first_token_s  # the prefill's first token, after its scheduling
    (ev,) = events(d, "JePrefilled")
    assert (ev.queued_s, ev.scheduled_s) == (prefill, prefill)
