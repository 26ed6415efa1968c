"""A DP master's messages about one task carry that request's correlation id, whatever input the
master was handling when it sent them (a user tour: `replay log --corr r232` missed r232's
TaskFinished, sent while the master handled r168's NPU completion, under r168's id). The run
record also says which trace and how many requests ran, when they override the scenario's."""

from __future__ import annotations

import json

from deepserve.adapters.scenario.loader import load_scenario
from deepserve.cluster.run import run_scenario
from deepserve.core import MemorySink, decode


def test_per_task_messages_carry_their_request_id_and_the_run_record_says_what_ran() -> None:
    sink = MemorySink()
    scenario = load_scenario("mooncake-16te", ("cluster.tes=2",))
    run_scenario(scenario, trace="builtin:mooncake_conv_1k", requests=60, sink=sink)
    seen = 0
    for step in sink.steps:
        if step.input.type in ("TaskFinished", "TaskTokens") and step.input.seq >= 0:
            msg = decode(step.input.type, step.input.payload)
            assert step.input.corr == msg.request_id, (step.input.corr, msg)
            seen += 1
    assert seen >= 60
    workload = json.loads(sink.runs[0].config)["workload"]
    assert (workload["trace"], workload["requests"]) == ("builtin:mooncake_conv_1k", 60)
