"""PD disaggregation (xDeepServe §5.1) over DistFlow: transfer registration, backpressure on the
decode side, contiguous vs block-by-block transfer, KV integrity, failures as completions."""

from __future__ import annotations

from fsharness import assert_replays, driver
from fswire import hardware, master_config, task

from deepserve.actors.flowserve.distflow.messages import CorruptKvBlock, KvRecvDone
from deepserve.actors.flowserve.messages import SubmitTask, TaskFinished, TaskTokens
from deepserve.actors.flowserve.te_shell import TeShell
from deepserve.actors.ports.faults import LinkDown
from deepserve.core import Actor, Context, Event, Message, decode

P, D = "te/p", "te/d"
CLIENT = "cl/0"


class PdClientSent(Event, frozen=True):
    task: SubmitTask


class PdClient(Actor[dict]):
    """A stand-in requester: sends the prefill task to P, then the decode task (with the KV
    handle P returned) to D; everything P and D stream comes back here."""

    def initial_state(self) -> dict:
        return {}

    def evolve(self, state: dict, event: Event) -> dict:
        assert isinstance(event, PdClientSent)
        return {**state, event.task.task_id: event.task}

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, SubmitTask):
            ctx.record(PdClientSent(msg))
            ctx.send(P, msg)
        elif isinstance(msg, TaskFinished) and msg.kv is not None:
            pre = self.state[msg.task_id]
            tid = msg.task_id.removesuffix(":p") + ":d"
            ctx.send(D, _with(pre, task_id=tid, kind="decode", kv_source=msg.kv))


def _te(name: str, role: str, npu: str, **kw):
    dp = master_config(npus=(npu,), te=name, role=role, **kw)
    return dict(te=name, role=role, dps=[dp])


def run_pd(n: int = 6, faults=(), corrupt: str | None = None, out: int = 40, step: int = 300,
           resume: int = 0, **dkw):  # fmt: skip
    d = driver()
    hardware(d, servers=2)
    d.spawn(P, TeShell, config=_te(P, "prefill", "hw/s0/npu0"))
    d.spawn(D, TeShell, config=_te(D, "decode", "hw/s1/npu0", **dkw))
    d.spawn(CLIENT, PdClient)
    for i in range(n):
        pre = task(i, 1000 + step * i, out, kind="prefill", reply_to=CLIENT)
        pre = _with(pre, task_id=f"t{i}:p", resume_from=resume)  # the decode task inherits it
        d.inject(CLIENT, pre, at=0.01 * i, src="ext/wl")
    if corrupt is not None:
        d.inject(f"{D}/dp/0", CorruptKvBlock(task_id=f"{corrupt}:d", block_index=2), at=0.001)
    for at, fault in faults:
        d.inject("hw/fabric", fault, at=at, src="ext/fault")
    d.run()
    return d


def _with(t: SubmitTask, **kw) -> SubmitTask:
    import msgspec

    return msgspec.structs.replace(t, **kw)


def _msgs(d, cls):
    return [
        decode(s.input.type, s.input.payload)
        for s in d.sink.steps
        if s.input.actor == CLIENT and s.input.type == cls.__name__
    ]


def test_1p1d_prefill_registers_decode_pulls_prefill_frees() -> None:
    d = run_pd()
    fins = {m.task_id: m for m in _msgs(d, TaskFinished)}
    assert len(fins) == 12
    for i in range(6):
        p, dd = fins[f"t{i}:p"], fins[f"t{i}:d"]
        assert p.status == dd.status == "completed" and p.reason == "prefilled"
        assert p.output_tokens == 1 and dd.output_tokens == 40 and dd.reason == "target"
        assert p.kv is not None and p.kv.src == f"{P}/dp/0"
        assert dd.finish_s > p.finish_s
    toks = [m for m in _msgs(d, TaskTokens) if m.task_id.endswith(":d")]
    assert min(m.first_index for m in toks) == 1  # the decode side continues after token 0
    pst, dst = d.actor(f"{P}/dp/0").state, d.actor(f"{D}/dp/0").state
    assert not pst.held and not pst.rtc.seqs  # P freed every block once D had them
    assert not dst.rtc.seqs
    assert_replays(d)


def _transfer_s(d) -> list[float]:
    return [
        decode(s.input.type, s.input.payload).duration_s
        for s in d.sink.steps if s.input.type == "KvRecvDone"
    ]  # fmt: skip


def test_contiguous_transfer_beats_block_by_block() -> None:
    cont, block = run_pd(kv_transfer="contiguous"), run_pd(kv_transfer="block")
    c, b = _transfer_s(cont), _transfer_s(block)
    assert len(c) == len(b) == 6
    ratio = sum(b) / sum(c)
    print(f"KV transfer, block-by-block / contiguous: {ratio:.2f}x")
    assert ratio > 1.0
    assert_replays(block)


def test_a_small_decode_pool_defers_receives_and_loses_nothing() -> None:
    # 20 blocks of 128 tokens: one or two requests' KV at a time on the decode side
    d = run_pd(n=6, hbm_blocks=20)
    fins = {m.task_id: m for m in _msgs(d, TaskFinished)}
    assert all(f.status == "completed" for f in fins.values()) and len(fins) == 12
    statuses = [
        decode(e.type, e.payload).status
        for s in d.sink.steps if s.input.actor == f"{D}/dp/0"
        for e in s.events if e.type == "TaskStatus"
    ]  # fmt: skip
    assert 1 <= statuses.count("deferred") < 6  # some had to wait for room, not all
    recv = [s for s in d.sink.steps if s.input.actor == f"{D}/dp/0" and s.input.type == "KvRecvDone"]
    assert len(recv) == 6
    assert_replays(d)


def test_a_corrupted_block_fails_exactly_that_request() -> None:
    d = run_pd(corrupt="t3")
    fins = {m.task_id: m for m in _msgs(d, TaskFinished)}
    bad = fins["t3:d"]
    assert bad.status == "failed" and "KV integrity: KV block 2 fingerprint mismatch" in bad.reason
    assert all(f.status == "completed" for k, f in fins.items() if k != "t3:d")
    assert not d.actor(f"{P}/dp/0").state.held  # P freed it anyway
    assert_replays(d)


def test_a_link_down_mid_transfer_is_a_failed_completion_not_a_hang() -> None:
    d = run_pd(n=3, faults=[(0.0, LinkDown(link="s1/npu0/roce"))])
    fins = {m.task_id: m for m in _msgs(d, TaskFinished)}
    assert len(fins) == 6
    for i in range(3):
        f = fins[f"t{i}:d"]
        assert f.status == "failed" and "KV transfer failed: link transfer failed" in f.reason
    done = [decode(s.input.type, s.input.payload) for s in d.sink.steps if s.input.type == "KvRecvDone"]
    assert len(done) == 3 and not any(x.ok for x in done) and all(isinstance(x, KvRecvDone) for x in done)
    assert not d.actor(f"{P}/dp/0").state.held and not d.actor(f"{D}/dp/0").state.rtc.seqs
    assert_replays(d)


def test_received_tasks_holding_blocks_never_deadlock_a_preempted_head() -> None:
    """Long outputs on a small decode pool: decoding tasks get preempted while received ones
    wait holding their KV; those may pass the preempted head, so everything completes."""
    d = run_pd(n=8, out=600, step=0, hbm_blocks=24)  # 13 blocks each at the end
    fins = {m.task_id: m for m in _msgs(d, TaskFinished)}
    assert len(fins) == 16 and all(f.status == "completed" for f in fins.values())
    assert sum(f.preemptions for f in fins.values()) > 0
    assert_replays(d)


def test_link_cluster_reports_live_and_dead_peers() -> None:
    from deepserve.actors.flowserve.distflow.channel import DistFlowChannel
    from deepserve.actors.flowserve.distflow.messages import LinkCluster, LinkClustered

    d = driver()
    hardware(d, servers=2)
    d.spawn(P, TeShell, config=_te(P, "prefill", "hw/s0/npu0"))
    d.spawn("df/test", DistFlowChannel, config=dict(src_master=f"{P}/dp/0", dst_master="ext/d"))
    d.inject("df/test", LinkCluster(req_id="c1", peers=(f"{P}/dp/0", "te/gone/dp/0")), at=0.1,
             src="ext/op")  # fmt: skip
    d.run()
    (ans,) = [e.msg for _, e in d.external_out if isinstance(e.msg, LinkClustered)]
    assert not ans.ok and ans.live == (f"{P}/dp/0",) and ans.dead == ("te/gone/dp/0",)
    assert_replays(d)


def test_by_layer_and_tp2_transfers() -> None:
    """By layer, a contiguous transfer sends one message per layer (slower than one per request,
    faster than block by block); with TP=2 each rank pair moves its own shard."""
    by_req, by_layer = run_pd(n=3), run_pd(n=3, kv_granularity="layer")
    r, L = _transfer_s(by_req), _transfer_s(by_layer)
    assert all(a < b for a, b in zip(r, L, strict=True))

    d = driver()
    hardware(d, servers=2)
    d.spawn(P, TeShell, config=_te(P, "prefill", "hw/s0/npu0", tp=2) | {
        "dps": [master_config(npus=("hw/s0/npu0", "hw/s0/npu1"), te=P, role="prefill", tp=2)]})
    d.spawn(D, TeShell, config=_te(D, "decode", "hw/s1/npu0") | {
        "dps": [master_config(npus=("hw/s1/npu0", "hw/s1/npu1"), te=D, role="decode", tp=2)]})
    d.spawn(CLIENT, PdClient)
    pre = _with(task(0, 1500, 20, kind="prefill", reply_to=CLIENT), task_id="t0:p")
    d.inject(CLIENT, pre, at=0.0, src="ext/wl")
    d.run()
    (done,) = [decode(s.input.type, s.input.payload) for s in d.sink.steps if s.input.type == "KvRecvDone"]
    assert done.ok and done.transfers == 2 and done.nbytes == 2 * 12 * 128 * 128 * 1024
    fins = {m.task_id: m for m in _msgs(d, TaskFinished)}
    assert fins["t0:d"].status == "completed" and fins["t0:d"].output_tokens == 20
    assert_replays(d)


def test_cancelling_a_deferred_decode_task_releases_the_prefill_blocks() -> None:
    from deepserve.actors.flowserve.messages import CancelTask

    d = driver()
    hardware(d, servers=2)
    d.spawn(P, TeShell, config=_te(P, "prefill", "hw/s0/npu0"))
    d.spawn(D, TeShell, config=_te(D, "decode", "hw/s1/npu0", hbm_blocks=16))
    d.spawn(CLIENT, PdClient)
    for i in range(2):  # 1301 tokens = 11 blocks of 16: the second waits for the first
        pre = _with(task(i, 1300, 400, kind="prefill", reply_to=CLIENT), task_id=f"t{i}:p")
        d.inject(CLIENT, pre, at=0.0, src="ext/wl")
    d.inject(D, CancelTask(task_id="t1:d"), at=1.0, src="ext/wl")
    d.run()
    fins = {m.task_id: m for m in _msgs(d, TaskFinished)}
    assert fins["t1:d"].status == "cancelled" and fins["t0:d"].status == "completed"
    assert fins["t1:d"].finish_s < 1.01  # ended at once, not after the 300 s hold timeout
    assert not d.actor(f"{P}/dp/0").state.held and not d.actor(f"{P}/dp/0").state.rtc.seqs
    assert_replays(d)
