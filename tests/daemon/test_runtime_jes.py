"""The daemon's runtime over several JEs (`scheduling.jes`, built by deepserve/cluster/assembly.py),
in this process: every request answered once whichever JE the gateway drew, a cancel reaching the
JE that holds the job; and a config's `[[faults]]` said not to be injected (they are `sim`'s)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from inproc import FAST, load, quiet, started
from structlog.testing import capture_logs

from deepserve.actors.flowserve.messages import Sampling
from deepserve.actors.workload.messages import RequestDone
from deepserve.adapters.tokenizer import prompt_of_ids


def test_requests_spread_over_three_jes_and_a_cancel_finds_its_job(tmp_path: Path) -> None:
    async def scenario() -> None:
        rt, _ = await started(tmp_path / "run", *FAST, "scheduling.jes=3")
        try:
            assert rt.jes == ("je/0", "je/1", "je/2")
            done = await load(rt, requests=24, concurrency=6, tokens=4)
            assert [d.status for _, d in done] == ["completed"] * 24
            per_je = Counter({je: rt.driver.actor(je).state.completed for je in rt.jes})  # type: ignore[union-attr]
            assert sum(per_je.values()) == 24 and all(per_je[je] > 0 for je in rt.jes), per_je
            rid = rt.new_request_id("cmpl")
            q = await rt.submit(rid, prompt_of_ids(list(range(40)), 16), Sampling(max_tokens=5000, ignore_eos=True))
            await q.get()  # its first tokens: the job runs on one of the JEs
            await rt.cancel(rid, "the client went away")
            while not isinstance(last := await q.get(), RequestDone):
                pass
            assert last.status == "cancelled" and "the client went away" in last.reason
        finally:
            await rt.stop(grace_s=1.0)

    with quiet():
        asyncio.run(scenario())


def test_a_configs_faults_are_said_not_to_be_injected(tmp_path: Path) -> None:
    async def scenario() -> list[dict[str, object]]:
        with capture_logs() as logs:
            rt, _ = await started(tmp_path / "run", *FAST, "faults=[{at_s = 1.0, kind = 'npu-crash', target = 'hw/s0/npu0'}]")
            await rt.stop(grace_s=0.5)
        return logs

    logs = asyncio.run(scenario())
    said = [x for x in logs if x.get("log_level") == "warning" and "[[faults]]" in str(x.get("event"))]
    assert len(said) == 1 and said[0]["faults"] == 1, logs
