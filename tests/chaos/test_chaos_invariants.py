"""The checkers alone, on hand-made states and messages (no driver): what each one calls a
violation, and that a sound state passes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from deepserve.actors.flowserve import rtc
from deepserve.actors.flowserve.master.state import MasterState
from deepserve.actors.flowserve.messages import TaskTokens, TokenBatch
from deepserve.actors.workload.messages import RequestDone
from deepserve.chaos.invariants import Checker, block_problems

CAP = 8


def _master(tasks: tuple[str, ...] = ("t1",)) -> MasterState:
    """A master whose RTC gave `t1` three blocks (t1 tracked as a task unless left out)."""
    st = MasterState(rtc=rtc.new_rtc(rtc.RtcConfig(hbm_blocks=CAP, block_tokens=16)))
    rtc.apply(st.rtc, rtc.allocate(st.rtc, "t1", 3))
    st.reqs = dict.fromkeys(tasks)  # type: ignore[arg-type]  (only the keys are read)
    return st


def test_a_sound_pool_passes_and_a_freed_one_too() -> None:
    st = _master()
    assert block_problems(st) == []
    rtc.apply(st.rtc, rtc.free(st.rtc, "t1"))
    st.reqs = {}
    assert block_problems(st) == []


def test_a_block_table_left_behind_is_a_leak() -> None:
    (p,) = block_problems(_master(tasks=()), full=False)
    assert p.startswith("block table of t1 left behind") and "3 blocks leaked" in p


def test_a_reference_count_below_its_holders_is_a_double_free() -> None:
    st = _master()
    b = st.rtc.seqs["t1"].blocks[0]
    st.rtc.ref[b] = 0  # a free that went through while the table still names the block
    st.rtc.free_hbm.append(b)
    # the sums still add up (6 free + 2 referenced): only the per-block count finds it
    assert block_problems(st, full=False) == []
    assert block_problems(st) == [f"block {b}: reference count 0, 1 holders (freed twice)"]


def test_a_count_that_adds_up_wrong_names_the_sums() -> None:
    st = _master()
    st.rtc.free_hbm.pop()  # a block lost from the free stack: in no list
    assert block_problems(st, full=False)[0] == f"free 4 + cached 0 + referenced 3 = 7, capacity {CAP}"


def _done(rid: str, status: str = "completed", reason: str = "length", out: int = 3) -> RequestDone:
    return RequestDone(request_id=rid, status=status, reason=reason, arrival_s=0.0,  # type: ignore[arg-type]
                       first_token_s=None, finish_s=1.0, prompt_tokens=4, cached_prompt_tokens=0, output_tokens=out,
                       te="te/0")  # fmt: skip


def _feed(c: Checker, *msgs: Any) -> list[tuple[str, str]]:
    driver = SimpleNamespace(now=1.0, step_cell=SimpleNamespace(addr="te/0/dp/0", actor=None, ctx=None))
    for m in msgs:
        c.on_external(1.0, SimpleNamespace(msg=m, src="workload"))
        c(driver)
    return [(v.invariant, v.detail) for v in c.violations]


def _tokens(rid: str, first: int, n: int) -> TokenBatch:
    return TokenBatch(chunks=(TaskTokens(task_id=f"{rid}/chat.1", request_id=rid, first_index=first, token_ids=(),
                                         times_s=(0.5,) * n),))  # fmt: skip


def test_terminal_states_exactly_once_with_a_reason() -> None:
    c = Checker()
    c.accepted = {"r0", "r1", "r2"}
    got = _feed(c, _done("r0"), _done("r0", "failed", "again"), _done("r9"), _done("r1", "failed", " "))
    assert [inv for inv, _ in got] == ["terminal"] * 3
    assert got[0][1].startswith("r0: a second terminal state (failed: again) after completed")
    assert got[1][1] == "r9: a terminal state for a request never sent"
    assert got[2][1] == "r1: failed without a reason"
    assert c.step == 4


def test_tokens_in_order_none_twice_none_skipped() -> None:
    c = Checker()
    c.accepted = {"r0", "r1"}
    got = _feed(c, _tokens("r0", 0, 2), _tokens("r0", 2, 1), _tokens("r0", 2, 1), _tokens("r1", 1, 1),
                _done("r0", out=3))  # fmt: skip
    assert got == [("tokens", "r0: tokens 2..2 arrived after 3 streamed: streamed twice"),
                   ("tokens", "r1: tokens 1..1 arrived after 0 streamed: skipped")]  # fmt: skip
    c2 = Checker()
    c2.accepted = {"r0"}
    assert _feed(c2, _tokens("r0", 0, 2), _done("r0", out=3)) == [
        ("tokens", "r0: completed with 3 output tokens, 2 streamed")]
    _feed(c2, _tokens("r0", 2, 1))
    assert c2.late_chunks == 1 and c2.count == 1  # a chunk after the terminal state: counted apart


def _chunk(rid: str, task: str, first: int, ids: tuple[int, ...]) -> TokenBatch:
    return TokenBatch(chunks=(TaskTokens(task_id=f"{rid}/{task}", request_id=rid, first_index=first, token_ids=ids,
                                         times_s=(0.5,) * len(ids)),))  # fmt: skip


def test_a_migrated_stream_with_no_duplicate_and_no_missing_token_passes() -> None:
    c = Checker()
    c.accepted = {"r0"}
    # chat.2 resumes at 1 (what the JE knew) while the client has 3: tokens 1..2 re-generated, the
    # same ones, dropped; then chat.1's late chunk (its TE died) is dropped too
    got = _feed(c, _chunk("r0", "chat.1", 0, (5, 6, 7)), _chunk("r0", "chat.2", 1, (6, 7, 8)),
                _chunk("r0", "chat.1", 3, (9,)), _chunk("r0", "chat.2", 4, (9,)), _done("r0", out=5))  # fmt: skip
    assert got == [] and c.taken_over == {"r0"} and c.superseded_chunks == 1 and c.streamed["r0"] == 5


def test_a_migrated_stream_with_a_duplicate_or_a_missing_token_is_a_migration_violation() -> None:
    c = Checker()
    c.accepted = {"r0", "r1"}
    got = _feed(c, _chunk("r0", "chat.1", 0, (5, 6, 7)), _chunk("r0", "chat.2", 1, (5, 6, 7, 8)),
                _chunk("r1", "chat.1", 0, (5, 6)), _chunk("r1", "chat.2", 4, (9,)))  # fmt: skip
    assert got == [("migration", "r0: r0/chat.2 re-sent token 1 as 5, the client has 6 there: a duplicate or a lost token"),
                   ("migration", "r1: r1/chat.2 took the stream over at token 4 after 2 streamed: tokens 2..3 missing")]  # fmt: skip
