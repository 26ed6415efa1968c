"""The harness floor of `bench sim`: the same trace through the same run loop, trace reader,
block hashing, workload actor and kernel (log on), with TEs that answer every task at once. What
`sim_requests_per_wall_s` can never beat, whatever the engine does."""

from __future__ import annotations

from typing import Any

from deepserve.actors.flowserve.messages import SubmitTask, TaskAccepted, TaskFinished
from deepserve.core import Actor, Context, Message


class InstantTe(Actor[None]):
    """Accepts a task and finishes it in the same instant (no NPU, no batching)."""

    def initial_state(self) -> None:
        return None

    def handle(self, ctx: Context, msg: Message) -> None:
        if not isinstance(msg, SubmitTask):
            return
        now = ctx.now()
        out = msg.sampling.target_output_tokens or msg.sampling.max_tokens
        ctx.send(msg.reply_to, TaskAccepted(task_id=msg.task_id, te=ctx.self, dp=0, master=ctx.self))
        ctx.send(msg.reply_to, TaskFinished(
            task_id=msg.task_id, request_id=msg.request_id, status="completed", reason="target",
            prompt_tokens=msg.prompt.num_tokens, cached_prompt_tokens=0, output_tokens=out,
            first_token_s=now, finish_s=now, te=ctx.self,
        ))  # fmt: skip


def build_instant(driver: Any, scenario: Any) -> None:
    from deepserve.adapters.scenario.placement import place
    from deepserve.cluster.assembly import spawn_workload

    placement = place(scenario.cluster)
    for te in placement.tes:
        driver.spawn(te.addr, InstantTe)
    spawn_workload(driver, scenario, placement)
