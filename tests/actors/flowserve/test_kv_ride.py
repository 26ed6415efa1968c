"""A DP master's KV events ride on a task answer of the same delivery (`MasterConfig.kv_ride`,
master/kv_publish.py) instead of travelling as a second message. The JE must learn exactly what it
learnt from the separate batch, in the same order: the same run with riding on and off simulates
the same requests to the same numbers and leaves the JE with the same prompt trees, in fewer
deliveries. A spawn config without riding is recorded as before it existed (old logs replay)."""

from __future__ import annotations

from typing import Any

import pytest

from deepserve.actors.flowserve.master import kv_publish
from deepserve.actors.flowserve.master.kv_publish import TaskAnswerKv, ride
from deepserve.actors.flowserve.master.state import MasterConfig, spawn_config
from deepserve.actors.flowserve.messages import TaskAccepted, TaskFinished
from deepserve.actors.flowserve.rtc.kv_events import BlockStored, KVEventBatch
from deepserve.cluster import te as cluster_te
from deepserve.cluster.config import load
from deepserve.cluster.sim import run
from deepserve.core import MemorySink, encode
from deepserve.core.context import Out
from deepserve.core.records import SEND, TIMER

BATCH = KVEventBatch(ts=1.0, events=(BlockStored(block_hashes=(7,), parent_block_hash=None, token_ids=(),
                                                 block_size=512, medium="GPU"),), data_parallel_rank=0)  # fmt: skip


def _accepted(tid: str) -> TaskAccepted:
    return TaskAccepted(task_id=tid, te="te/0", dp=0, master="te/0/dp/0", solo=True)


def test_a_batch_rides_on_the_last_answer_to_its_subscriber() -> None:
    first, last = _accepted("r1/chat/0"), _accepted("r2/chat/0")
    outs = [Out(int(SEND), "je/0", first, 0.0, 1, None), Out(int(SEND), "je/0", last, 0.0, 2, None),
            Out(int(SEND), "je/1", _accepted("r3/chat/0"), 0.0, 3, None)]  # fmt: skip
    assert ride(outs, "je/0", BATCH)
    assert outs[0].msg is first and outs[2].msg.task_id == "r3/chat/0"
    assert outs[1].msg == TaskAnswerKv(answer=last, batch=BATCH) and outs[1].msg_id == 2


def test_nothing_to_ride_on_leaves_the_outputs_alone() -> None:
    outs = [Out(int(SEND), "hw/npu", _accepted("r1/chat/0"), 0.0, 1, None),  # not the subscriber
            Out(int(TIMER), "je/0", _accepted("r2/chat/0"), 0.5, 2, None)]  # a timer, not a send
    assert not ride(outs, "je/0", BATCH)
    assert [type(o.msg) for o in outs] == [TaskAccepted, TaskAccepted]


def test_a_config_without_riding_is_recorded_as_before() -> None:
    base = dict(model="llama3-8b", npus=("hw/s0/npu0",), kv_block_bytes=1, hbm_blocks=8)
    assert "kv_ride" not in spawn_config(MasterConfig(**base))  # type: ignore[arg-type]
    assert spawn_config(MasterConfig(**base, kv_ride=True))["kv_ride"] is True  # type: ignore[arg-type]


def _run(monkeypatch: pytest.MonkeyPatch, kv_ride: bool) -> tuple[Any, MemorySink, Any]:
    original = cluster_te.master_config

    def master_config(*args: Any) -> dict[str, Any]:
        return {**original(*args), "kv_ride": kv_ride}

    monkeypatch.setattr(cluster_te, "master_config", master_config)
    sink, drivers = MemorySink(), []
    result = run(load("mooncake-16te", ("cluster.tes=4",)), requests=300, sink=sink, on_end=drivers.append)
    return result, sink, drivers[0]


def test_riding_batches_change_no_simulated_number_and_no_je_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    off, off_sink, off_driver = _run(monkeypatch, False)
    on, on_sink, on_driver = _run(monkeypatch, True)
    assert on.summary["completed"] == off.summary["completed"] == 300
    assert on.summary == off.summary
    rode = sum(1 for s in on_sink.steps if s.input.type == "TaskAnswerKv")
    assert rode > 0 and not any(s.input.type == "TaskAnswerKv" for s in off_sink.steps)
    # every batch still reaches the JE (alone or riding); the riders are deliveries saved (the
    # drain after the last request runs whole chunks of timers, so the totals differ by a few timers either way)
    batches = sum(1 for s in off_sink.steps if s.input.type == "KVEventBatch")
    assert sum(1 for s in on_sink.steps if s.input.type == "KVEventBatch") + rode == batches
    assert on.deliveries < off.deliveries
    jes = sorted({s.input.actor for s in on_sink.steps if s.input.type == "TaskAnswerKv"})
    assert jes
    for addr in jes:
        a, b = off_driver.actor(addr).state, on_driver.actor(addr).state
        assert encode(a.trees) == encode(b.trees) and a.trees, addr
        assert a.publishing == b.publishing


def test_the_riding_message_is_known_to_the_publisher_module() -> None:
    assert kv_publish.TaskAnswerKv is TaskAnswerKv and TaskFinished in kv_publish._ANSWERS
