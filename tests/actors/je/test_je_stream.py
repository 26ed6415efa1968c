"""A request's stream merged by token index (actors/je/stream.py), as the frontend follows it:
a newer task takes over at or below the client's next token and what the client has is dropped;
an older task's chunks after that are dropped; nothing is taken twice, nothing that would leave
a gap is taken."""

from __future__ import annotations

from deepserve.actors.je.stream import DROP, StreamMerge, task_order


def test_tasks_are_ordered_by_attempt_then_prefill_before_decode() -> None:
    assert task_order("chat-1/prefill.1") < task_order("chat-1/decode.1") < task_order("chat-1/chat.2")
    assert task_order("r/chat.10") > task_order("r/chat.9")


def test_a_migrated_task_resuming_below_the_client_drops_what_the_client_has() -> None:
    m = StreamMerge()
    assert m.take("r/chat.1", 0, 5) == 0 and m.next == 5
    assert m.take("r/chat.2", 1, 2) == DROP and m.task == "r/chat.2"  # tokens 1..2: the client has them
    assert m.take("r/chat.1", 5, 3) == DROP  # the old task (its TE failed, or it hung): dropped
    assert m.take("r/chat.2", 3, 4) == 2 and m.next == 7  # tokens 3, 4 dropped; 5, 6 new


def test_a_pd_decode_continues_its_prefill_and_an_older_retry_is_ignored() -> None:
    m = StreamMerge()
    assert m.take("r/prefill.1", 0, 1) == 0
    assert m.take("r/decode.1", 1, 3) == 0 and m.next == 4
    assert m.take("r/chat.2", 0, 6) == 4 and m.next == 6  # a restart from scratch: its first 4 dropped
    assert m.take("r/decode.1", 4, 1) == DROP


def test_a_new_task_that_would_leave_a_gap_is_not_taken() -> None:
    m = StreamMerge()
    m.take("r/chat.1", 0, 2)
    assert m.take("r/chat.2", 5, 1) == DROP and m.task == "r/chat.1" and m.next == 2


def test_a_job_moved_to_another_je_is_a_new_epoch_and_the_lost_je_s_tasks_are_dropped() -> None:
    """The gateway moved the request after its JE was lost (JobRequest.epoch): the new JE's ids
    end in the epoch, newer than any task of the lost JE whatever its attempt."""
    assert task_order("r/prefill.1.1") > task_order("r/decode.7") > task_order("r/prefill.7")
    assert task_order("r/prefill.1.1") < task_order("r/decode.1.1") < task_order("r/chat.1.2")
    m = StreamMerge()
    assert m.take("r/prefill.3", 0, 1) == 0 and m.take("r/decode.3", 1, 8) == 0 and m.next == 9
    assert m.take("r/prefill.1.1", 9, 1) == 0 and m.next == 10  # resumed at the client's position
    assert m.take("r/decode.3", 9, 4) == DROP  # the lost JE's decode, still running: dropped
    assert m.take("r/decode.1.1", 10, 2) == 0 and m.next == 12
