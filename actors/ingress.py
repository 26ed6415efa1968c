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
from deepserve.actors.workload.messages import Arrive
from deepserve.core import Context, Message

STREAM_ADDR = "ext/stream"  # where relayed output tokens go (the frontend)


class CancelRequest(Message, frozen=True, kw_only=True):
    request_id: str
    reason: str = "the client disconnected"


class Ingress(Workload):
    """Colocated TEs and a P/D pool side by side: each arrival goes to the next colocated TE, or
    (with one share, like one more TE) to the P/D pool, by the count of arrivals so far."""

    def __init__(self, mode: str = "colocated", tes: list[str] | None = None,
                 prefill_tes: list[str] | None = None, decode_tes: list[str] | None = None) -> None:  # fmt: skip
        self.has_pd = bool(prefill_tes) and bool(decode_tes)
        base = "pd" if self.has_pd and not tes else mode
        super().__init__(base, tes, prefill_tes, decode_tes)  # type: ignore[arg-type]

    def _on_arrive(self, ctx: Context, msg: Arrive) -> None:
        chat = len(self.roles["chat"])
        pool = "colocated" if chat else "pd"
        if self.has_pd and chat and self.state.arrived % (chat + 1) == chat:
            pool = "pd"
        # The workload's dispatch reads `mode`; it is set from recorded state only (deterministic).
        self.mode = pool  # type: ignore[assignment]
        super()._on_arrive(ctx, msg)

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
