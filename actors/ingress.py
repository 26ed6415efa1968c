"""The daemon's ingress actor: the ONE address the HTTP frontend talks to.

It is the workload actor (round-robin colocated TEs, or a prefill→decode P/D pair; one recorded
`RequestFinished` per request) plus what a live frontend needs:
- the output stream: `TaskTokens` from the TEs are relayed to `STREAM_ADDR` (outside the actor
  system, where the frontend demultiplexes them by request id);
- cancellation: `CancelRequest` (client gone, TTFT deadline) becomes `CancelTask` to the TE that
  holds the request's current task; the TE answers with a cancelled `TaskFinished`, which ends the
  request (its KV blocks are freed by the TE's master).
Issue 6's gateway replaces it by changing one config line (`daemon.ingress`): the frontend only
sends `Arrive`/`CancelRequest` and reads `TaskTokens`/`RequestDone`.
"""

from __future__ import annotations

from deepserve.actors.flowserve.messages import CancelTask, TaskTokens
from deepserve.actors.workload.actor import Workload, task_id
from deepserve.core import Context, Message

STREAM_ADDR = "ext/stream"  # where relayed output tokens go (the frontend)


class CancelRequest(Message, frozen=True, kw_only=True):
    request_id: str
    reason: str = "the client disconnected"


class Ingress(Workload):
    def handle(self, ctx: Context, msg: Message) -> None:
        if isinstance(msg, TaskTokens):
            p = self.state.pending.get(msg.request_id)
            if p is not None:  # tokens of a finished request are late: dropped by design
                ctx.send(STREAM_ADDR, msg, corr=msg.request_id)
        elif isinstance(msg, CancelRequest):
            p = self.state.pending.get(msg.request_id)
            if p is not None:
                tid = task_id(msg.request_id, p.phase, p.attempt)
                ctx.send(p.te, CancelTask(task_id=tid, reason=msg.reason), corr=msg.request_id)
        else:
            super().handle(ctx, msg)
