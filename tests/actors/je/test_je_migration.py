"""Request migration vs recomputation (actors/je/migration.py): a streamed request whose TE fails
after output moves to another TE, resuming at the token the JE knows its client has; the choice
and its costs are recorded; zombie protection cancels the old task and frees a decode's P-side
KV; off (the default) the request fails as before. The cost model on its own."""

from __future__ import annotations

import msgspec
from je_harness import Harness
from je_harness import request as request4

from deepserve.actors.flowserve.master.pd import KvRelease
from deepserve.actors.flowserve.messages import CancelTask, SubmitTask, TaskTokens
from deepserve.actors.je.effects import Send
from deepserve.actors.je.messages import JobFinished, RouteDecided
from deepserve.actors.je.migration import MigrationParams, TaskMigrated, choose
from deepserve.actors.je.stream import StreamMerge, task_order

COLO = {"colocated": ["te/0", "te/1"]}
PD = {"prefill": ["te/p0"], "decode": ["te/d0", "te/d1"]}


def request(i: int) -> object:
    r = request4(i)
    return msgspec.structs.replace(r, sampling=msgspec.structs.replace(r.sampling, max_tokens=50, target_output_tokens=50))


ON = {"kv_events": False, "policy": "round_robin", "migration": {"enabled": True}}


def streamed(h: Harness, tid: str, upto: int) -> None:
    t = h.sent[tid]
    first = 1 if t.kind == "decode" else 0
    h.deliver(TaskTokens(task_id=tid, request_id=t.request_id, first_index=first, token_ids=(7,) * (upto - first),
                         times_s=(h.now,) * (upto - first)))  # fmt: skip


def test_a_streamed_request_on_a_failed_te_resumes_on_another_at_its_token() -> None:
    h = Harness(ON, COLO)
    h.deliver(request(1))
    h.accept("r1/chat.1")
    streamed(h, "r1/chat.1", 5)
    steps = h.finish("r1/chat.1", ok=False)
    moved = next(e for e in steps if isinstance(e, TaskMigrated))
    assert (moved.task_id, moved.from_te, moved.resume_from, moved.choice.mode) == ("r1/chat.1", "te/0", 5, "recompute")
    assert moved.choice.migrate_s is None and "lost with it" in moved.choice.reason
    routed = next(e for e in steps if isinstance(e, RouteDecided))
    assert (routed.task_id, routed.decision.chosen) == ("r1/chat.2", "te/1")
    sub = next(e.msg for e in steps if isinstance(e, Send) and isinstance(e.msg, SubmitTask))
    assert (sub.task_id, sub.kind, sub.resume_from) == ("r1/chat.2", "chat", 5)
    assert any(isinstance(e, Send) and e.dst == "te/0" and isinstance(e.msg, CancelTask) for e in steps)
    j = h.state.jobs["r1"]
    assert (j.migrations, j.output_tokens, j.streamed) == (1, 5, True) and j.first_token_s is not None
    assert not [e for e in steps if isinstance(e, JobFinished)]


def test_migration_is_off_by_default_and_the_request_fails_as_before() -> None:
    h = Harness({"kv_events": False, "policy": "round_robin"}, COLO)
    h.deliver(request(1))
    streamed(h, "r1/chat.1", 5)
    steps = h.finish("r1/chat.1", ok=False)
    assert not [e for e in steps if isinstance(e, TaskMigrated)]
    done = next(e for e in steps if isinstance(e, JobFinished))
    assert done.done.status == "failed" and "after output streamed" in done.done.reason


def test_a_request_moves_at_most_max_migrations_times_then_fails_with_the_reason() -> None:
    h = Harness({**ON, "migration": {"enabled": True, "max_migrations": 1}}, COLO)
    h.deliver(request(1))
    streamed(h, "r1/chat.1", 3)
    h.finish("r1/chat.1", ok=False)
    steps = h.finish("r1/chat.2", ok=False)
    done = next(e for e in steps if isinstance(e, JobFinished))
    assert done.done.status == "failed" and "after output streamed" in done.done.reason


def test_a_failed_decode_resumes_on_pd_at_its_token_and_its_prefill_side_frees_the_kv() -> None:
    """With no colocated TE a moved P/D request gets a new prefill of the prompt and the tokens
    its client has (`resume_from`), then a decode continuing from there, named after that
    prefill's attempt so the frontend's merge follows it (stream.task_order)."""
    h = Harness({**ON, "policy": "least_load"}, PD)
    h.deliver(request(1))
    tid = next(iter(h.sent))
    h.finish(tid)  # the prefill: its KV handle, then the decode
    dec = next(t for t in h.sent if "/decode." in t)
    streamed(h, dec, 9)
    steps = h.finish(dec, ok=False)
    moved = next(e for e in steps if isinstance(e, TaskMigrated))
    assert moved.resume_from == 9
    release = [e for e in steps if isinstance(e, Send) and isinstance(e.msg, KvRelease)]
    assert release and release[0].msg.transfer_id == tid  # zombie protection: P frees it now
    sub = next(e.msg for e in steps if isinstance(e, Send) and isinstance(e.msg, SubmitTask))
    assert (sub.kind, sub.resume_from, sub.task_id) == ("prefill", 9, "r1/prefill.2")
    assert h.state.jobs["r1"].output_tokens == 9  # what the client has: kept for the next move
    steps = h.finish("r1/prefill.2")
    sub = next(e.msg for e in steps if isinstance(e, Send) and isinstance(e.msg, SubmitTask))
    assert (sub.kind, sub.resume_from, sub.task_id) == ("decode", 9, "r1/decode.2") and sub.kv_source is not None
    assert task_order(sub.task_id) > task_order("r1/prefill.2") > task_order(dec)


def test_a_moved_decode_after_a_retried_prefill_is_ordered_after_its_new_prefill() -> None:
    h = Harness({**ON, "policy": "least_load"}, {"prefill": ["te/p0", "te/p1"], "decode": ["te/d0", "te/d1"]})
    h.deliver(request(1))
    h.finish("r1/prefill.1", ok=False)  # nothing streamed: an ordinary retry
    h.finish("r1/prefill.2")
    first = [t for t in h.sent if t.startswith("r1/decode.")][-1]
    assert task_order(first) > task_order("r1/prefill.2")
    streamed(h, first, 4)
    h.finish(first, ok=False)
    h.finish("r1/prefill.3")
    dec = [t for t in h.sent if t.startswith("r1/decode.")][-1]
    assert h.sent[dec].resume_from == 4 and task_order(dec) > task_order("r1/prefill.3")


def test_the_cost_model_migrates_when_the_link_beats_the_prefill() -> None:
    p = MigrationParams(enabled=True, kv_bytes_per_token=131072.0, link_bytes_per_s=21.25e9,
                        prefill_tokens_per_s=18910.0)  # fmt: skip
    gone = choose(p, 1000, 200, 0, "")
    assert gone.mode == "recompute" and gone.migrate_s is None and gone.kv_bytes == 1200 * 131072
    live = choose(p, 1000, 200, 0, "te/0")
    # 157 MB over 21 GB/s: ~8.4 ms; 1,200 tokens of prefill: ~63 ms
    assert live.mode == "migrate" and live.migrate_s is not None and live.migrate_s < live.recompute_s
    slow = choose(MigrationParams(link_bytes_per_s=1e9, prefill_tokens_per_s=1e6), 1000, 200, 0, "te/0")
    assert slow.mode == "recompute" and "<= migrate" in slow.reason
    cached = choose(p, 1000, 200, 992, "")
    assert abs(cached.recompute_s - 208 / 18910.0) < 1e-12  # the new TE's prefix cache is not recomputed


def test_the_config_section_is_off_by_default_and_a_bad_value_names_its_key() -> None:
    import pytest

    from deepserve.cluster.assembly import je_config
    from deepserve.cluster.config import load

    cfg = load("mooncake-16te", (), "sim")
    assert cfg.scheduling.migration.enabled is False and "migration" not in je_config(cfg.scheduling)
    on = load("mooncake-16te", ("scheduling.migration.enabled=true",), "sim")
    assert on.scheduling.migration.enabled and on.scheduling.migration.max_migrations == 3
    with pytest.raises(Exception, match=r"scheduling\.migration\.max_migrations"):
        load("mooncake-16te", ("scheduling.migration.max_migrations=0",), "sim")


def test_with_a_live_frontend_the_je_asks_how_far_the_stream_got_and_resumes_there() -> None:
    from deepserve.actors.je.effects import After
    from deepserve.actors.je.migration import (
        AskTimeout,
        MigrationAsked,
        StreamPosition,
        StreamPositionAsk,
    )

    cfg = {**ON, "stream_to": "ext/stream", "migration": {"enabled": True, "ask_stream_s": 0.5}}
    h = Harness(cfg, COLO)
    h.deliver(request(1))
    streamed(h, "r1/chat.1", 1)  # the JE hears of the first chunk only (output short-circuit)
    steps = h.finish("r1/chat.1", ok=False)
    assert [e for e in steps if isinstance(e, MigrationAsked)] and not [e for e in steps if isinstance(e, RouteDecided)]
    ask = next(e for e in steps if isinstance(e, Send) and isinstance(e.msg, StreamPositionAsk))
    assert ask.dst == "ext/stream" and ask.msg.reply_to == "je/0"
    assert After(0.5, AskTimeout(request_id="r1", task_id="r1/chat.1"), "ask/r1") in steps
    steps = h.deliver(StreamPosition(request_id="r1", next_index=23))
    moved = next(e for e in steps if isinstance(e, TaskMigrated))
    assert (moved.resume_from, moved.basis) == (23, "the frontend's position")
    sub = next(e.msg for e in steps if isinstance(e, Send) and isinstance(e.msg, SubmitTask))
    assert sub.resume_from == 23 and h.state.jobs["r1"].asked is None
    assert h.deliver(AskTimeout(request_id="r1", task_id="r1/chat.1")) == []  # answered: the timer is moot


def test_without_an_answer_the_je_resumes_at_what_it_saw() -> None:
    from deepserve.actors.je.migration import AskTimeout

    h = Harness({**ON, "stream_to": "ext/stream", "migration": {"enabled": True, "ask_stream_s": 0.5}}, COLO)
    h.deliver(request(1))
    streamed(h, "r1/chat.1", 2)
    h.finish("r1/chat.1", ok=False)
    steps = h.deliver(AskTimeout(request_id="r1", task_id="r1/chat.1"))
    moved = next(e for e in steps if isinstance(e, TaskMigrated))
    assert moved.resume_from == 2 and moved.basis.startswith("no answer from the frontend")


def test_a_decode_after_a_refused_prefill_is_ordered_after_the_prefill_the_client_follows() -> None:
    """On-demand forwarding (the default): a busy prefill refuses, the next one takes the task as
    `prefill.2` and streams token 0 to the client; its decode must be newer than it for the
    frontend's merge, or every decode token would be dropped."""
    h = Harness({"kv_events": False, "policy": "least_load"}, {"prefill": ["te/p0", "te/p1"], "decode": ["te/d0"]})
    h.deliver(request(1))
    h.reject("r1/prefill.1")  # busy: offered to the next prefill
    h.finish("r1/prefill.2")
    dec = [t for t in h.sent if t.startswith("r1/decode.")][-1]
    m = StreamMerge()
    assert m.take("r1/prefill.2", 0, 1) == 0
    assert m.take(dec, 1, 4) == 0 and m.next == 5, dec


def test_a_failed_decode_s_prefill_side_frees_its_kv_with_migration_off() -> None:
    """Zombie protection (P/D-Serve §3.4) whatever the migration setting: the decode died, so the
    prefill's held blocks are freed now, not when its 300 s hold expires."""
    # (an old JE config, without the setting, replays as recorded: no release)
    for cfg, freed in (({"policy": "least_load", "release_lost_decode_kv": True}, 1), ({"policy": "least_load"}, 0)):
        h = Harness(cfg, PD)
        h.deliver(request(1))
        tid = next(iter(h.sent))
        h.finish(tid)
        dec = next(t for t in h.sent if "/decode." in t)
        steps = h.finish(dec, ok=False)
        release = [e for e in steps if isinstance(e, Send) and isinstance(e.msg, KvRelease)]
        assert len(release) == freed, cfg
        if freed:
            assert (release[0].dst, release[0].msg.transfer_id) == ("te/p0", tid)  # the prefill holding it
