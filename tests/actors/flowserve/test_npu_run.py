"""NpuForwardRun: k passes in one request equal k NpuForwards sent `gap_s` after each answer."""

from __future__ import annotations

import pytest
from fsharness import TEST_SRC, assert_replays, driver, events_of, out_to

from deepserve.actors.ports.npu import (
    NpuError,
    NpuForward,
    NpuForwardDone,
    NpuForwardRun,
    NpuForwardRunDone,
    NpuForwardTruncate,
    SeqShape,
)
from deepserve.adapters.hardware.devices.npu import Npu
from deepserve.core import Actor, Context, Event, Message

NPU = "hw/s0/npu0"
SEQS = (SeqShape(1, 900), SeqShape(1, 3000), SeqShape(1, 40))


class StepperGo(Message, frozen=True):
    iterations: int
    gap_s: float


class StepperNext(Message, frozen=True):
    i: int


class StepperPassEnded(Event, frozen=True):
    i: int
    at_s: float


class Stepper(Actor[tuple]):
    """Sends the passes one by one, each `gap_s` after the previous answer."""

    def initial_state(self) -> tuple:
        return (0, 0.0, 0)

    def evolve(self, state: tuple, event: Event) -> tuple:
        assert isinstance(event, StepperPassEnded)
        return (state[0], state[1], event.i + 1)

    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, StepperGo):
            self.k, self.gap = msg.iterations, msg.gap_s
            self._send(ctx, 0)
        elif isinstance(msg, StepperNext):
            self._send(ctx, msg.i)
        elif isinstance(msg, NpuForwardDone):
            i = self.state[2]
            ctx.record(StepperPassEnded(i, ctx.now()))
            if i + 1 < self.k:
                ctx.after(self.gap, StepperNext(i + 1))

    def _send(self, ctx: Context, i: int) -> None:
        seqs = tuple(SeqShape(1, s.context_tokens + i) for s in SEQS)
        ctx.send(NPU, NpuForward(req_id=f"p{i}", model="llama3-8b", seqs=seqs))


def test_a_run_is_the_stepwise_timeline() -> None:
    d = driver()
    d.spawn(NPU, Npu, npu="910b", variance=False)
    d.spawn("t/step", Stepper)
    d.inject("t/step", StepperGo(iterations=40, gap_s=0.002), at=0.0)
    d.run()
    stepwise = [e.at_s for e in events_of(d, "t/step", "StepperPassEnded")]
    t0 = 1.0 + stepwise[-1]
    run = NpuForwardRun(req_id="r", model="llama3-8b", seqs=SEQS, iterations=40, gap_s=0.002)
    d.inject(NPU, run, at=t0, src=TEST_SRC)
    d.run()
    (t_done, done), = [(t, m) for t, m in out_to(d) if isinstance(m, NpuForwardRunDone)]
    assert len(done.ends_s) == 40 and not done.truncated
    assert [e - t0 for e in done.ends_s] == pytest.approx(stepwise, abs=1e-9)
    assert t_done == pytest.approx(done.ends_s[-1], abs=1e-12)
    assert [s - e for s, e in zip(done.starts_s[1:], done.ends_s, strict=False)] == pytest.approx(
        [0.002] * 39
    )
    assert_replays(d)


def test_truncation_stops_after_the_running_pass_and_a_bad_run_is_refused() -> None:
    d = driver()
    d.spawn(NPU, Npu, npu="910b", variance=True)
    run = NpuForwardRun(req_id="r", model="llama3-8b", seqs=SEQS, iterations=1000, gap_s=0.001)
    d.inject(NPU, run, at=0.0, src=TEST_SRC)
    d.inject(NPU, NpuForwardTruncate(req_id="r"), at=0.5, src=TEST_SRC)
    d.inject(NPU, NpuForwardRun(req_id="bad", model="llama3-8b", seqs=SEQS, iterations=0),
             at=0.6, src=TEST_SRC)  # fmt: skip
    d.run()
    done = next(m for _, m in out_to(d) if isinstance(m, NpuForwardRunDone))
    assert done.truncated and done.ends_s[-1] >= 0.5 > done.ends_s[-2]
    drawn = events_of(d, NPU, "NpuRunStarted")[0].ends_s + tuple(
        x for e in events_of(d, NPU, "NpuRunExtended") for x in e.ends_s
    )
    assert done.ends_s == drawn[: len(done.ends_s)]  # the drawn passes, kept as drawn
    assert len(drawn) < 1000  # drawn in chunks: the truncated rest was never computed
    assert len(set(round(e - s, 12) for s, e in zip(done.starts_s, done.ends_s, strict=True))) > 1
    bad = next(m for _, m in out_to(d) if isinstance(m, NpuError))
    assert bad.req_id == "bad" and "iterations" in bad.reason
    assert_replays(d)


@pytest.mark.parametrize("model", ["llama3-8b", "llama3-70b", "llama2-13b", "qwen2-72b", "deepseek-v3"])
@pytest.mark.parametrize("sample", [False, True])
def test_the_closed_form_pass_costs_are_the_model_pass_by_pass(model: str, sample: bool) -> None:
    """Bit for bit: the closed form does forward_time's float operations in its order on
    integer sums that are exact (dense GQA models); MoE models are computed pass by pass."""
    import msgspec

    from deepserve.adapters.hardware.devices.npu_run import forward_cost_s, pass_costs, pass_shapes

    for tp, pp, seqs in [
        (8 if model != "llama3-8b" else 1, 1, SEQS * 5),
        (2, 2, SEQS),
        (4, 1, (SeqShape(3, 100_000), SeqShape(1, 0))),  # MTP-verify shapes, huge context
        (1, 1, (SeqShape(512, 4096), SeqShape(1, 7))),  # a prefill chunk: single-op mode
    ]:
        run = NpuForwardRun(
            req_id="r", model=model, seqs=seqs, iterations=3000, tp=tp, pp=pp, sample=sample
        )
        lo, hi = 37, 3000
        fast = pass_costs("910b", run, lo, hi)
        for i in [*range(lo, lo + 40), *range(lo, hi, 97), hi - 1]:
            one = msgspec.structs.replace(run, seqs=pass_shapes(run, i))
            assert fast[i - lo] == forward_cost_s("910b", one)[0], (tp, pp, seqs, i)
        assert fast[-1] > fast[0]  # longer contexts cost more


def test_a_delayed_run_without_starts_is_the_same_run_shifted_by_its_delay() -> None:
    """`start_delay_s` moves pass 0's start (the master's launch gap, timed by the NPU);
    `starts=False` leaves the answer's starts out (the caller recomputes them: pass i+1
    starts gap_s after pass i ends); a truncation during the delay keeps the first pass."""
    d = driver()
    d.spawn(NPU, Npu, npu="910b", variance=False)
    plain = NpuForwardRun(req_id="a", model="llama3-8b", seqs=SEQS, iterations=40, gap_s=0.002)
    delayed = NpuForwardRun(req_id="b", model="llama3-8b", seqs=SEQS, iterations=40, gap_s=0.002,
                            start_delay_s=0.002, starts=False)  # fmt: skip
    d.inject(NPU, plain, at=1.0, src=TEST_SRC)
    d.run()
    d.inject(NPU, delayed, at=5.0 - 0.002, src=TEST_SRC)
    cut = NpuForwardRun(req_id="c", model="llama3-8b", seqs=SEQS, iterations=40, gap_s=0.002,
                        start_delay_s=0.002)  # fmt: skip
    d.run()
    d.inject(NPU, cut, at=9.0, src=TEST_SRC)
    d.inject(NPU, NpuForwardTruncate(req_id="c"), at=9.001, src=TEST_SRC)  # within the delay
    d.run()
    a, b, c = (next(m for _, m in out_to(d) if isinstance(m, NpuForwardRunDone) and m.req_id == r)
               for r in "abc")  # fmt: skip
    assert b.starts_s == () and len(a.starts_s) == 40
    assert [e - 5.0 for e in b.ends_s] == pytest.approx([e - 1.0 for e in a.ends_s], abs=1e-12)
    assert b.queued_s == 0.0
    assert c.truncated and len(c.ends_s) == 1 and c.ends_s[0] == pytest.approx(
        9.002 + (a.ends_s[0] - 1.0), abs=1e-12
    )
    assert_replays(d)


@pytest.mark.parametrize(
    ("seqs", "layout"),
    [(SEQS, {"tp": 3}), (SEQS, {"ep": 2}), ((SeqShape(0, 5),), {}), ((), {}),
     ((SeqShape(1, -1),), {"tp": 64}), (SEQS, {"tp": 64})],
)  # fmt: skip
def test_a_run_is_refused_exactly_as_a_forward_of_its_first_pass(seqs, layout) -> None:
    """The NPU checks a run without pricing it (`check_run_cost`): the same refusals, with the
    same reasons, as an NpuForward of the run's first pass."""
    d = driver()
    d.spawn(NPU, Npu, npu="910b", variance=False)
    d.inject(NPU, NpuForwardRun(req_id="r", model="llama3-8b", seqs=seqs, iterations=4, **layout),
             at=0.0, src=TEST_SRC)  # fmt: skip
    d.inject(NPU, NpuForward(req_id="f", model="llama3-8b", seqs=seqs, **layout), at=1.0, src=TEST_SRC)
    d.run()
    got = {m.req_id: m for _, m in out_to(d) if isinstance(m, NpuError)}
    assert got["r"].kind == got["f"].kind == "bad_request"
    assert got["r"].reason == got["f"].reason


def test_a_run_with_a_head_is_a_forward_of_the_head_then_the_run_and_a_bad_head_is_refused() -> None:
    head = (SeqShape(900, 0), SeqShape(1, 2999), SeqShape(40, 0))  # two prompts complete
    d = driver()
    d.spawn(NPU, Npu, npu="910b", variance=False)
    d.inject(NPU, NpuForward(req_id="f", model="llama3-8b", seqs=head), at=0.0, src=TEST_SRC)
    body = NpuForwardRun(req_id="b", model="llama3-8b", seqs=SEQS, iterations=12, gap_s=0.002)
    d.inject(NPU, body, at=1.0, src=TEST_SRC)
    run = NpuForwardRun(req_id="h", model="llama3-8b", seqs=SEQS, head=head, iterations=13, gap_s=0.002)
    d.inject(NPU, run, at=2.0, src=TEST_SRC)
    wrong = NpuForwardRun(req_id="w", model="llama3-8b", seqs=SEQS, head=head[:2], iterations=3)
    d.inject(NPU, wrong, at=3.0, src=TEST_SRC)
    d.run()
    out = {m.req_id: m for _, m in out_to(d) if hasattr(m, "req_id")}
    f, b, h = out["f"], out["b"], out["h"]
    assert len(h.ends_s) == 13 and h.starts_s[0] == 2.0
    assert h.first_pass_s == pytest.approx(f.duration_s, rel=1e-12)  # pass 0: the head's forward
    assert h.ends_s[0] - 2.0 == pytest.approx(f.duration_s, rel=1e-12)
    # pass i >= 1: pass i - 1 of the body (SEQS are the head's sequences after it)
    assert [e - s for s, e in zip(h.starts_s[1:], h.ends_s[1:], strict=True)] == pytest.approx(
        [e - s for s, e in zip(b.starts_s, b.ends_s, strict=True)], rel=1e-12)  # fmt: skip
    assert isinstance(out["w"], NpuError) and "head: one shape per sequence" in out["w"].reason
    assert_replays(d)


def test_a_run_with_a_lead_prices_each_lead_pass_as_a_forward_and_a_lead_needs_a_head() -> None:
    """Passes 1..len(lead) are forwards of the lead's shapes; the passes after them are the
    body's from its pass 0 (`seqs` are the sequences after the lead). A lead without a head,
    or with an empty pass, is refused naming `lead`."""
    import msgspec

    from deepserve.adapters.hardware.devices.npu_run import forward_cost_s, pass_costs, pass_shapes

    head = (SeqShape(1, 900), SeqShape(500, 0))
    lead = ((SeqShape(1, 901), SeqShape(500, 500)), (SeqShape(1, 902), SeqShape(120, 1000)))
    body = (SeqShape(1, 903), SeqShape(1, 1120))
    run = NpuForwardRun(req_id="l", model="llama3-8b", seqs=body, head=head, lead=lead, iterations=9, sample=True)
    costs = pass_costs("910b", run, 0, 9)

    def fwd(shapes: tuple[SeqShape, ...]) -> float:
        return forward_cost_s("910b", NpuForward(req_id="x", model="llama3-8b", seqs=shapes, sample=True))[0]

    assert list(costs[:3]) == [fwd(head), fwd(lead[0]), fwd(lead[1])]
    for i in range(3, 9):
        assert costs[i] == fwd(pass_shapes(msgspec.structs.replace(run, lead=(), head=()), i - 3)), i
    assert list(pass_costs("910b", run, 2, 5)) == list(costs[2:5])  # a chunk across the lead's end
    d = driver(seed=2)
    d.spawn(NPU, Npu, npu="910b", variance=False)
    d.run()
    d.inject(NPU, run, at=0.0, src=TEST_SRC)
    no_head = NpuForwardRun(req_id="n", model="llama3-8b", seqs=body, lead=lead, iterations=4)
    empty = NpuForwardRun(req_id="e", model="llama3-8b", seqs=body, head=head, lead=((),), iterations=4)
    d.inject(NPU, no_head, at=10.0, src=TEST_SRC)
    d.inject(NPU, empty, at=10.0, src=TEST_SRC)
    d.run()
    out = {m.req_id: m for _, m in out_to(d, TEST_SRC)}
    done = out["l"]
    assert isinstance(done, NpuForwardRunDone) and len(done.ends_s) == 9
    assert done.ends_s[2] - done.ends_s[1] == pytest.approx(costs[2], rel=1e-12)  # no gap asked
    assert isinstance(out["n"], NpuError) and out["n"].reason == "lead: needs a head (pass 0's shapes)"
    assert isinstance(out["e"], NpuError) and "lead: every pass needs at least one sequence" in out["e"].reason
    assert_replays(d)


@pytest.mark.parametrize("model", ["llama3-8b", "llama3-70b", "deepseek-v3"])
@pytest.mark.parametrize("variance", [False, True])
def test_a_chunk_loop_is_the_array_path_bit_for_bit(model: str, variance: bool) -> None:
    """`chunk_ends` (one loop, compiled by mypyc in the compiled build) gives every pass end
    the array path gives (`pass_costs` x factors, `run_ends`): dense models, heads and leads,
    chunks across the lead's end, single-op mode, and MoE (the array path itself)."""
    from deepserve.adapters.hardware.devices.npu_draws import factors_of, picks_raw, run_ends
    from deepserve.adapters.hardware.devices.npu_run import chunk_ends, pass_costs

    head = (SeqShape(1, 900), SeqShape(500, 0))
    lead = ((SeqShape(1, 901), SeqShape(500, 500)), (SeqShape(1, 902), SeqShape(120, 1000)))
    runs = [
        NpuForwardRun(req_id="a", model=model, seqs=SEQS * 5, iterations=700, tp=8, sample=True),
        NpuForwardRun(req_id="b", model=model, seqs=(SeqShape(1, 903), SeqShape(1, 1120)), head=head,
                      lead=lead, iterations=300, tp=8, sample=True, gap_s=0.0007),  # fmt: skip
        NpuForwardRun(req_id="c", model=model, seqs=(SeqShape(300, 4096), SeqShape(1, 7)),
                      iterations=200, tp=8, sample=False, gap_s=0.0005),  # fmt: skip
    ]
    for run in runs:
        for lo, hi in [(0, 1), (0, 128), (1, 3), (2, 5), (128, 200), (150, run.iterations)]:
            raw = picks_raw(lo * 7919 + hi, hi - lo) if variance else None
            want = run_ends(run.gap_s, 3.25, pass_costs("910b", run, lo, hi),
                            factors_of(raw) if raw is not None else None)  # fmt: skip
            assert chunk_ends("910b", run, lo, hi, 3.25, None, raw) == want, (run.req_id, lo, hi)


@pytest.mark.parametrize("model", ["llama3-8b", "llama3-70b", "llama2-13b", "qwen2-72b", "deepseek-v3"])
def test_a_head_pass_is_priced_as_a_forward_of_its_shapes_bit_for_bit(model: str) -> None:
    """`head_costs` prices a dense model's head and lead passes by the run's closed form at
    pass 0: the same floats as `forward_cost_s` of a forward of those shapes."""
    from deepserve.adapters.hardware.devices.npu_run import forward_cost_s, head_costs

    heads = [
        (SeqShape(1, 900), SeqShape(500, 0)),
        (SeqShape(8192, 0),),
        (SeqShape(1, 131_000), SeqShape(3000, 100_000), SeqShape(1, 7)),
        (SeqShape(17, 4096),) * 9,
    ]
    for tp, sample in [(8, True), (4, False)]:
        for head in heads:
            run = NpuForwardRun(req_id="h", model=model, seqs=tuple(SeqShape(1, 10) for _ in head),
                                head=head, iterations=4, tp=tp, sample=sample)  # fmt: skip
            want = forward_cost_s("910b", NpuForward(req_id="x", model=model, seqs=head, tp=tp, sample=sample))[0]
            assert head_costs("910b", run) == (want,), (tp, sample, head)


@pytest.mark.parametrize("model", ["llama3-8b", "llama3-70b", "qwen2-72b", "deepseek-v3", "no-such-model"])
def test_a_forward_is_priced_and_refused_by_the_closed_form_as_by_the_model(model: str) -> None:
    """`forward_cost_fast` (what the NPU prices a forward with) gives `forward_cost_s`'s value,
    or raises its error, for good and bad shapes and layouts."""
    from deepserve.adapters.hardware.devices.npu_run import forward_cost_fast, forward_cost_s

    shapes = [
        (SeqShape(1, 900), SeqShape(500, 0)), (SeqShape(8192, 0),), (SeqShape(1, 5),) * 40,
        (SeqShape(0, 5),), (SeqShape(3, -1),), (),
    ]  # fmt: skip
    for tp, pp, sample in [(8, 1, True), (4, 1, False), (3, 1, True), (1, 64, True)]:
        for seqs in shapes:
            fwd = NpuForward(req_id="x", model=model, seqs=seqs, tp=tp, pp=pp, sample=sample)
            try:
                want: object = forward_cost_s("910b", fwd)
            except (ValueError, KeyError) as exc:
                want = (type(exc), str(exc))
            try:
                got: object = forward_cost_fast("910b", fwd)
            except (ValueError, KeyError) as exc:
                got = (type(exc), str(exc))
            assert got == want, (tp, pp, seqs)
