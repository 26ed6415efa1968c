"""The gateway: admission control, then the request becomes a job on a JE drawn at random
(xDeepServe §5.1 step 1: JEs are stateless peers, so a uniform draw balances them without
shared state). Admission: at most `max_inflight_per_model` requests of one model in flight;
beyond it a `Refused` (HTTP 429 with Retry-After), never an unbounded queue.

Accepts `ApiRequest` (the HTTP layer) and, for the simulator, the workload stand-in's `Arrive`
(answers go to the metrics collector; a refusal there is a failed `RequestDone` whose reason says
429, so the run still counts every arrival once). P/D-Serve's on-demand forwarding to prefill
instances is done one hop down, by the JE, which owns task dispatch (docs/scheduling.md).
"""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.actors.je.messages import JobRequest
from deepserve.actors.workload.messages import METRICS_ADDR, Arrive, EndOfRun, RequestDone
from deepserve.core import Actor, Context, Event, Message

from .messages import (
    REFUSED_429,
    ApiRequest,
    Client,
    GatewayDone,
    GatewayDuplicate,
    GatewayRefused,
    GatewayRouted,
    GatewayState,
    JeDraw,
    Refused,
)


class GatewayConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    jes: tuple[str, ...]
    max_inflight_per_model: int = 10_000
    retry_after_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.jes:
            raise ValueError("gateway.jes: at least one JE")
        if self.max_inflight_per_model < 1 or not self.retry_after_s > 0:
            raise ValueError("gateway: max_inflight_per_model >= 1 and retry_after_s > 0")


class Gateway(Actor[GatewayState]):
    snapshot_every = 4096

    def __init__(self, config: dict[str, Any]) -> None:
        self.cfg = msgspec.convert(config, GatewayConfig)

    def initial_state(self) -> GatewayState:
        return GatewayState()

    def evolve(self, s: GatewayState, e: Event) -> GatewayState:
        t = type(e)
        if t is GatewayRouted:
            s.arrived += 1
            s.inflight[e.model] = e.inflight  # type: ignore[attr-defined]
            s.clients[e.request_id] = Client(model=e.model, reply_to=e.reply_to, je=e.je)  # type: ignore[attr-defined]
        elif t is GatewayDone:
            c = s.clients.pop(e.request_id)  # type: ignore[attr-defined]
            s.inflight[c.model] -= 1
            st = e.status  # type: ignore[attr-defined]
            s.completed += st == "completed"
            s.failed += st == "failed"
            s.cancelled += st == "cancelled"
        elif t is GatewayRefused:
            s.refused += 1
        elif t is GatewayDuplicate:
            s.duplicates += 1
        return s

    def handle(self, ctx: Context, msg: Message) -> None:
        t = type(msg)
        if t is RequestDone:
            self._done(ctx, msg)  # type: ignore[arg-type]
        elif t is Arrive:
            m: Any = msg
            self._admit(ctx, m.request_id, m.model, m.prompt, m.sampling, METRICS_ADDR, None, m.stream, api=False)
        elif t is ApiRequest:
            m = msg
            self._admit(ctx, m.request_id, m.model, m.prompt, m.sampling, m.reply_to, m.predicted_bucket, m.stream,
                        api=True)
        elif t is EndOfRun:
            for je in self.cfg.jes:
                ctx.send(je, msg)

    def _admit(self, ctx: Context, rid: str, model: str, prompt: Any, sampling: Any, reply_to: str,
               bucket: int | None, stream: bool, api: bool) -> None:
        s, cfg = self.state, self.cfg
        if rid in s.clients:
            ctx.record(GatewayDuplicate(request_id=rid))  # already in flight: its one answer stands
            return
        inflight = s.inflight.get(model, 0)
        if inflight >= cfg.max_inflight_per_model:
            why = f"{inflight} requests of model {model!r} in flight (limit {cfg.max_inflight_per_model})"
            ctx.record(GatewayRefused(request_id=rid, model=model, inflight=inflight,
                                      limit=cfg.max_inflight_per_model, reason=why))  # fmt: skip
            if api:
                ctx.send(reply_to, Refused(request_id=rid, retry_after_s=cfg.retry_after_s, reason=why), corr=rid)
            else:
                ctx.send(reply_to, RequestDone(
                    request_id=rid, status="failed", reason=f"{REFUSED_429}{why}", arrival_s=ctx.now(),
                    first_token_s=None, finish_s=ctx.now(), prompt_tokens=0, cached_prompt_tokens=0,
                    output_tokens=0, te=""), corr=rid)  # fmt: skip
            return
        k = ctx.rng.randrange(len(cfg.jes))
        je = cfg.jes[k]
        ctx.record(GatewayRouted(request_id=rid, model=model, je=je, reply_to=reply_to, arrival_s=ctx.now(),
                                 inflight=inflight + 1, limit=cfg.max_inflight_per_model,
                                 draw=JeDraw(candidates=cfg.jes, draw=k)))  # fmt: skip
        ctx.send(je, JobRequest(request_id=rid, model=model, prompt=prompt, sampling=sampling,
                               reply_to=ctx.self, arrival_s=ctx.now(), predicted_bucket=bucket, stream=stream),
                 corr=rid)

    def _done(self, ctx: Context, m: RequestDone) -> None:
        c = self.state.clients.get(m.request_id)
        if c is None:
            return  # not ours (or already answered): the JE sends exactly one per job
        ctx.record(GatewayDone(request_id=m.request_id, status=m.status))
        ctx.send(c.reply_to, m, corr=m.request_id)
