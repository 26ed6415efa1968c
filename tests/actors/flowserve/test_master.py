"""The DP-group master: continuous batching, chunked prefill, decode-first, preemption, output
short-circuit, emulated tokens — on emulated NPUs, with exact replay."""

from __future__ import annotations

from fsharness import assert_replays, driver, events_of, out_to
from fswire import REQ, hardware, master_config, task

from deepserve.actors.flowserve.master.actor import DpMaster
from deepserve.actors.flowserve.messages import TaskAccepted, TaskFinished, TaskRejected, TaskTokens

M = "te/0/dp/0"


def run(tasks, at=None, **cfg):
    d = driver()
    hardware(d)
    d.spawn(M, DpMaster, config=master_config(**cfg))
    for i, t in enumerate(tasks):
        d.inject(M, t, at=0.0 if at is None else at[i], src=REQ)
    d.run()
    return d


def finished(d) -> dict[str, TaskFinished]:
    return {m.task_id: m for _, m in out_to(d, REQ) if isinstance(m, TaskFinished)}


def tokens(d) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for _, m in out_to(d, REQ):
        if isinstance(m, TaskTokens):
            got = out.setdefault(m.task_id, [])
            assert m.first_index == len(got)
            got.extend(zip(m.token_ids, m.times_s, strict=True))
    return out


def test_every_task_completes_with_its_tokens_and_replays() -> None:
    ts = [task(i, 300 + 100 * i, 20 + i) for i in range(6)]
    d = run(ts)
    fin = finished(d)
    assert sorted(fin) == sorted(t.task_id for t in ts)
    toks = tokens(d)
    for t in ts:
        f = fin[t.task_id]
        assert f.status == "completed" and f.reason == "target"
        assert f.output_tokens == t.sampling.target_output_tokens == len(toks[t.task_id])
        times = [tm for _, tm in toks[t.task_id]]
        assert times == sorted(times) and f.first_token_s == times[0] and f.finish_s == times[-1]
    accepted = [m for _, m in out_to(d, REQ) if isinstance(m, TaskAccepted)]
    assert len(accepted) == 6 and all(a.master == M for a in accepted)
    st = d.actor(M).state
    assert not st.reqs and not st.rtc.seqs  # no block leaked: every table freed
    assert_replays(d)


def test_chunked_prefill_splits_a_long_prompt_under_the_token_budget() -> None:
    d = run([task(0, 5000, 3)], max_num_batched_tokens=2048)
    plans = events_of(d, M, "BatchPlanned")
    chunks = [p.entries[0].n for p in plans if p.entries[0].n > 1]
    assert chunks == [2048, 2048, 904]
    assert finished(d)["t0"].output_tokens == 3
    assert_replays(d)


def test_decode_first_and_the_gap_between_decode_passes() -> None:
    """A prompt arriving while another decodes: the decoding task is scheduled first in the
    mixed batch; between pure decode passes the NPU idles exactly the launch gap."""
    d = run([task(0, 200, 40), task(1, 3000, 5)], at=[0.0, 0.2], sched_gap_s=0.001)
    plans = events_of(d, M, "BatchPlanned")
    mixed = next(p for p in plans if len(p.entries) == 2)
    assert mixed.entries[0].task_id == "t0" and mixed.entries[0].n == 1
    ev = events_of(d, "hw/s0/npu0")
    starts = [e.at_s for e in ev if type(e).__name__ == "NpuForwardStarted"]
    ends = [e.at_s for e in ev if type(e).__name__ == "NpuForwardEnded"]
    gaps = [s - e for s, e in zip(starts[1:], ends, strict=False) if s - e < 0.1]
    assert len(gaps) > 30 and all(abs(g - 0.001) < 1e-9 for g in gaps)
    assert_replays(d)


def test_preemption_by_recompute_when_blocks_run_out_loses_nothing() -> None:
    # 6 tasks of 256 prompt + 300 output tokens need 5 blocks each at the end; 16 blocks
    # hold three at a time, so decoding tasks get preempted and recomputed.
    ts = [task(i, 256, 300) for i in range(6)]
    d = run(ts, hbm_blocks=16, max_num_seqs=6)
    fin = finished(d)
    assert all(f.status == "completed" and f.output_tokens == 300 for f in fin.values())
    assert len(fin) == 6
    preempted = [tid for p in events_of(d, M, "BatchPlanned") for tid in p.preempted]
    assert preempted and sum(f.preemptions for f in fin.values()) == len(preempted)
    toks = tokens(d)
    assert all(len(v) == 300 for v in toks.values())  # each token streamed once
    assert not d.actor(M).state.rtc.seqs
    assert_replays(d)


def test_swap_preemption_and_populate_bring_the_prefix_back_from_dram() -> None:
    shared = task(0, 1024, 4).prompt.block_hashes  # 8 blocks every task shares
    ts = [task(i, 1024, 200, hashes=shared) for i in range(5)]
    d = run(ts, hbm_blocks=20, dram_blocks=64, host="hw/s0/host", max_num_seqs=5,
            preemption="swap")  # fmt: skip
    fin = finished(d)
    assert len(fin) == 5 and all(f.status == "completed" for f in fin.values())
    assert sum(f.cached_prompt_tokens for f in fin.values()) > 0
    starts = events_of(d, M, "RtcCopyStarted")
    assert any(c.kind == "swap_out" for c in starts)
    assert not d.actor(M).state.rtc.seqs
    assert_replays(d)


def test_a_prompt_larger_than_the_pool_is_rejected_naming_the_field() -> None:

    d = run([task(0, 128 * 40, 3)], hbm_blocks=16)
    (rej,) = [m for _, m in out_to(d, REQ) if isinstance(m, TaskRejected)]
    assert rej.reason.startswith("prompt.num_tokens: 5120 tokens need more KV blocks")
    assert_replays(d)


def test_a_prompt_over_the_budget_without_chunked_prefill_is_rejected_and_blocks_nobody() -> None:
    """With chunked prefill off one pass must take a whole prompt: a longer one would wait at the
    queue's head forever and hold up every task behind it (a user tour: 398 of 400 failed)."""
    ts = [task(0, 600, 5), task(1, 100, 3), task(2, 100, 3)]
    d = run(ts, at=[0.0, 0.01, 0.02], chunked_prefill=False, max_num_batched_tokens=512)
    (rej,) = [m for _, m in out_to(d, REQ) if isinstance(m, TaskRejected)]
    assert rej.task_id == "t0" and rej.reason == (
        "prompt.num_tokens: 600 tokens exceed the token budget of one pass "
        "(max_num_batched_tokens=512) and chunked prefill is off")  # fmt: skip
    fin = finished(d)
    assert {k: f.status for k, f in fin.items()} == {"t1": "completed", "t2": "completed"}
    assert_replays(d)


def test_a_prefix_swapped_to_dram_is_populated_asynchronously_then_hit() -> None:
    a = task(0, 1024, 2)  # its 8 blocks get cached, then swapped out under pressure
    fillers = [task(i, 1500, 40) for i in (1, 2)]
    again = task(3, 1024, 2, hashes=a.prompt.block_hashes)
    d = run([a, *fillers, again], at=[0.0, 1.0, 1.0, 3.0], hbm_blocks=26, dram_blocks=64,
            host="hw/s0/host")  # fmt: skip
    copies = events_of(d, M, "RtcCopyStarted")
    assert "swap_out" in [c.kind for c in copies]
    (pop,) = [c for c in copies if c.kind == "populate"]
    assert pop.seq == "t3" and pop.hbm
    fin = finished(d)
    # what came back from DRAM (the swapped-out run of the prefix) counts as cached
    assert fin["t3"].cached_prompt_tokens == 128 * (len(pop.shared) + len(pop.hbm)) > 0
    assert fin["t0"].cached_prompt_tokens == 0
    assert not d.actor(M).state.rtc.seqs
    assert_replays(d)


def test_asynchronous_execution_hides_the_host_scheduling_time() -> None:
    """Between decode passes the NPU idles the launch gap with asynchronous execution, and the
    gap plus the host's scheduling time without it; the same tokens come out later."""

    def gaps_and_finish(async_on: bool) -> tuple[list[float], float]:
        d = run([task(0, 200, 60)], sched_gap_s=0.0005, sched_cpu_s=0.004, async_scheduling=async_on)
        ev = events_of(d, "hw/s0/npu0")
        starts = [e.at_s for e in ev if type(e).__name__ == "NpuForwardStarted"]
        ends = [e.at_s for e in ev if type(e).__name__ == "NpuForwardEnded"]
        assert_replays(d)
        return [s - e for s, e in zip(starts[1:], ends, strict=False)], finished(d)["t0"].finish_s

    on, t_on = gaps_and_finish(True)
    off, t_off = gaps_and_finish(False)
    assert len(on) == len(off) == 59
    assert all(abs(g - 0.0005) < 1e-9 for g in on)
    assert all(abs(g - 0.0045) < 1e-9 for g in off)
    assert t_off - t_on > 59 * 0.004 - 1e-9


def test_emulated_eos_and_max_tokens_end_tasks_and_a_cancel_ends_one_early() -> None:
    from deepserve.actors.flowserve.messages import CancelTask, Prompt, Sampling, SubmitTask
    from deepserve.actors.flowserve.tokens import eos_token_id, output_length, unique_chain_hashes

    def free_task(i: int, max_tokens: int) -> SubmitTask:
        return SubmitTask(task_id=f"t{i}", request_id=f"r{i}", kind="chat", model="llama3-8b",
                          prompt=Prompt(num_tokens=256, block_hashes=unique_chain_hashes(i, 256, 128)),
                          sampling=Sampling(max_tokens=max_tokens, seed=100 + i), reply_to=REQ)  # fmt: skip

    d = driver()
    hardware(d)
    d.spawn(M, DpMaster, config=master_config(eos_rate=0.02, aggregate=True))
    for i in range(8):
        d.inject(M, free_task(i, 80), at=0.0, src=REQ)
    d.inject(M, CancelTask(task_id="t7"), at=0.3, src=REQ)
    d.run()
    fin, toks = finished(d), tokens(d)
    for i in range(7):
        n, why = output_length(100 + i, 80, None, False, 0.02)
        f = fin[f"t{i}"]
        assert (f.status, f.reason, f.output_tokens, len(toks[f"t{i}"])) == ("completed", why, n, n)
        assert (toks[f"t{i}"][-1][0] == eos_token_id()) == (why == "stop")
    reasons = {fin[f"t{i}"].reason for i in range(7)}
    assert reasons == {"stop", "length"}  # both stops happen at this rate
    c = fin["t7"]
    assert c.status == "cancelled" and c.finish_s >= 0.3 and len(toks.get("t7", [])) == c.output_tokens < 80
    assert_replays(d)


def test_a_crashed_or_hung_npu_fails_every_task_once_with_the_reason() -> None:
    from deepserve.actors.ports.faults import NpuCrash, NpuHang

    for fault, words in ((NpuCrash(), "crashed"), (NpuHang(), "no answer")):
        d = driver()
        hardware(d)
        d.spawn(M, DpMaster, config=master_config(npu_timeout_s=2.0, aggregate=True))
        for i in range(4):
            d.inject(M, task(i, 400, 300), at=0.01 * i, src=REQ)
        d.inject("hw/s0/npu0", fault, at=0.5, src="ext/fault")
        d.inject(M, task(9, 400, 5), at=1.0, src=REQ)  # arrives after the fault
        d.run(until=30.0)
        ends = [m for _, m in out_to(d, REQ) if isinstance(m, TaskFinished)]
        refused = [m for _, m in out_to(d, REQ) if isinstance(m, TaskRejected)]
        # A crashed device is known lost (`DeviceLost`): a task arriving later is refused at
        # once, for its JE to place elsewhere. A hung one is not known lost: t9 waits and fails.
        late = refused if isinstance(fault, NpuCrash) else ends
        assert sorted(m.task_id for m in ends + refused) == ["t0", "t1", "t2", "t3", "t9"]  # once each
        assert [m.task_id for m in late if m.task_id == "t9"] == ["t9"]
        assert all(m.status == "failed" and words in m.reason for m in ends), ends
        assert all(m.reason.startswith("device lost: ") and words in m.reason for m in refused)
        assert not d.actor(M).state.reqs and not d.actor(M).state.rtc.seqs
        assert_replays(d)


def test_without_token_ids_the_stream_carries_times_only() -> None:
    d = run([task(0, 300, 25), task(1, 700, 9)], token_ids=False, aggregate=True)
    streams = [m for _, m in out_to(d, REQ) if isinstance(m, TaskTokens)]
    assert streams and all(m.token_ids == () for m in streams)
    fin = finished(d)
    for tid in ("t0", "t1"):
        assert sum(len(m.times_s) for m in streams if m.task_id == tid) == fin[tid].output_tokens
    assert_replays(d)


def test_tokens_false_keeps_the_accept_and_the_terminal_message_but_sends_no_chunk() -> None:
    # a JE's non-streaming job in a simulation: it needs the accept (its timeout) and the end
    # (and a frontend, `stream_to`, still gets every chunk)
    ts = [task(0, 300, 25, tokens=False), task(1, 700, 9), task(2, 400, 7, tokens=False, stream_to="ext/stream")]
    d = run(ts, token_ids=False, aggregate=True)
    fin = finished(d)
    assert fin["t0"].status == fin["t1"].status == fin["t2"].status == "completed"
    assert fin["t0"].output_tokens == 25 and fin["t0"].first_token_s is not None
    assert {m.task_id for _, m in out_to(d, REQ) if isinstance(m, TaskTokens)} == {"t1"}
    assert {m.task_id for _, m in out_to(d, REQ) if isinstance(m, TaskAccepted)} == {"t0", "t1", "t2"}
    front = [c for _, m in out_to(d, "ext/stream") for c in m.chunks]
    assert {c.task_id for c in front} == {"t2"} and sum(len(c.times_s) for c in front) == 7
    assert_replays(d)
