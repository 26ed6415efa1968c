"""A migrated stream's task (`SubmitTask.resume_from`, xLLM §3.5 by recomputation): the master
prefills the prompt and the tokens already generated in one go and emits from that index on —
the very tokens a fresh task of the same request emits there (sampling is a pure function of
the seed and the index), its end counting the whole output."""

from __future__ import annotations

import msgspec
from fsharness import assert_replays, driver, events_of, out_to
from fswire import REQ, hardware, master_config, task

from deepserve.actors.flowserve.master.actor import DpMaster
from deepserve.actors.flowserve.messages import TaskFinished, TaskRejected, TaskTokens

M = "te/0/dp/0"


def run(*tasks):
    d = driver()
    hardware(d)
    d.spawn(M, DpMaster, config=master_config(token_ids=True))
    for t in tasks:
        d.inject(M, t, at=0.0, src=REQ)
    d.run()
    return d


def chunks(d, tid: str) -> list[TaskTokens]:
    return [m for _, m in out_to(d, REQ) if isinstance(m, TaskTokens) and m.task_id == tid]


def test_a_resumed_task_recomputes_its_prefix_and_continues_with_the_same_tokens() -> None:
    fresh = task(1, 300, 50)
    resumed = msgspec.structs.replace(task(1, 300, 50), task_id="t1-moved", resume_from=30)
    d = run(fresh)
    e = run(resumed)
    want = [t for c in chunks(d, "t1") for t in c.token_ids]
    got = chunks(e, "t1-moved")
    assert got[0].first_index == 30 and all(b.first_index == a.first_index + len(a.token_ids)
                                            for a, b in zip(got, got[1:], strict=False))  # fmt: skip
    assert [t for c in got for t in c.token_ids] == want[30:]
    end = next(m for _, m in out_to(e, REQ) if isinstance(m, TaskFinished))
    assert (end.status, end.output_tokens) == ("completed", 50)
    first = events_of(e, M, "BatchPlanned")[0]
    assert first.entries[0].n == 330  # one prefill of the prompt and the 30 tokens generated elsewhere
    assert_replays(e)


def test_a_resume_point_out_of_range_is_refused_naming_the_field() -> None:
    bad = msgspec.structs.replace(task(2, 300, 50, max_tokens=50), resume_from=50)
    d = run(bad)
    refused = [m for _, m in out_to(d, REQ) if isinstance(m, TaskRejected)]
    assert refused and refused[0].reason.startswith("resume_from:")


def test_a_resume_past_the_requests_end_completes_at_once_with_its_whole_output() -> None:
    """The client had every token (the TE died between its last token and its end): the moved
    task ends at once, no token streamed again, nothing left on the master."""
    done = msgspec.structs.replace(task(3, 300, 10, max_tokens=50), resume_from=20)
    d = run(done)
    end = next(m for _, m in out_to(d, REQ) if isinstance(m, TaskFinished))
    assert (end.status, end.output_tokens) == ("completed", 10) and chunks(d, "t3") == []
    st = d.cells[M].actor.state
    assert st.reqs == {} and st.waiting == [] and st.rtc.seqs == {}
    assert_replays(d)
