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

from deepserve.actors.cluster.autoscaler_messages import RequestSeen
from deepserve.actors.cluster.heartbeat import HeartbeatWake
from deepserve.actors.flowserve.messages import CancelOwner
from deepserve.actors.je.messages import JobRequest
from deepserve.actors.workload.messages import METRICS_ADDR, Arrive, EndOfRun, RequestDone
from deepserve.core import Actor, Context, Event, Message

from .messages import (
    REFUSED_429,
    ApiRequest,
    Client,
    GatewayDone,
    GatewayDuplicate,
    GatewayJeDown,
    GatewayRefused,
    GatewayRouted,
    GatewayState,
    JeDraw,
    JeLost,
    Refused,
    Resubmit,
)


class GatewayConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    jes: tuple[str, ...]
    max_inflight_per_model: int = 10_000
    retry_after_s: float = 1.0
    # The heartbeat monitor to wake (`HeartbeatWake`) when a request comes after `wake_after_s`
    # with none: under idle backoff its next tick may be far, and a TE that died while idle must be
    # found as fast as under load (actors/cluster/heartbeat.py). "": none (the daemon's frontend
    # wakes it itself). One message an idle spell, none under load.
    wake: str = ""
    wake_after_s: float = 1.0
    # The cluster manager, told when a JE is lost (`CancelOwner`) so that the TEs cancel the lost
    # JE's tasks ("": nobody is told; its tasks run to their end for nobody).
    manager: str = ""
    # The autoscaler ("": none): told of each admitted request and sent a copy of its answer (its
    # demand and SLO signal, actors/cluster/autoscaler.py); two deliveries a request, only when on.
    observer: str = ""
    # Zombie protection for streams (P/D-Serve §3.4; on with `scheduling.migration`): a lost JE's
    # streaming jobs go to another JE too, which resumes each at its client's position (the
    # frontend merges a stream by token index: actors/je/stream.py). Off: they fail, naming the JE.
    migrate_streams: bool = False

    def __post_init__(self) -> None:
        if not self.jes:
            raise ValueError("gateway.jes: at least one JE")
        if self.max_inflight_per_model < 1 or not self.retry_after_s > 0 or not self.wake_after_s > 0:
            raise ValueError("gateway: max_inflight_per_model >= 1, retry_after_s > 0 and wake_after_s > 0")


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
            s.last_arrival_s = e.arrival_s  # type: ignore[attr-defined]
            s.inflight[e.model] = e.inflight  # type: ignore[attr-defined]
            s.clients[e.request_id] = Client(model=e.model, reply_to=e.reply_to, je=e.je,  # type: ignore[attr-defined]
                                             arrival_s=e.arrival_s, resubmit=e.resubmit)  # type: ignore[attr-defined]
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
        elif t is GatewayJeDown:
            s.down.append(e.je)  # type: ignore[attr-defined]
            for rid, je in e.retried:  # type: ignore[attr-defined]
                s.clients[rid].je = je
                s.clients[rid].epoch += 1
            s.je_retried += len(e.retried)  # type: ignore[attr-defined]
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
            for je in self._live():
                ctx.send(je, msg)
        elif t is JeLost:
            self._je_lost(ctx, msg)  # type: ignore[arg-type]

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
        live = self._live()
        if not live:
            why = f"no JE alive (lost: {', '.join(s.down)})"
            ctx.record(GatewayRefused(request_id=rid, model=model, inflight=inflight,
                                      limit=cfg.max_inflight_per_model, reason=why))  # fmt: skip
            self._fail(ctx, rid, reply_to, f"{REFUSED_429}{why}" if not api else why, ctx.now())
            return
        if cfg.wake and (s.last_arrival_s < 0 or ctx.now() - s.last_arrival_s >= cfg.wake_after_s):
            ctx.send(cfg.wake, HeartbeatWake())
        k = ctx.rng.randrange(len(live))
        je = live[k]
        keep = None
        if not stream:
            keep = Resubmit(prompt=prompt, sampling=sampling, predicted_bucket=bucket)
        elif cfg.migrate_streams:
            keep = Resubmit(prompt=prompt, sampling=sampling, predicted_bucket=bucket, stream=True)
        ctx.record(GatewayRouted(request_id=rid, model=model, je=je, reply_to=reply_to, arrival_s=ctx.now(),
                                 inflight=inflight + 1, limit=cfg.max_inflight_per_model,
                                 draw=JeDraw(candidates=live, draw=k), resubmit=keep))  # fmt: skip
        ctx.send(je, JobRequest(request_id=rid, model=model, prompt=prompt, sampling=sampling,
                               reply_to=ctx.self, arrival_s=ctx.now(), predicted_bucket=bucket, stream=stream),
                 corr=rid)
        if cfg.observer:
            ctx.send(cfg.observer, RequestSeen(request_id=rid, model=model))

    def _live(self) -> tuple[str, ...]:
        down = self.state.down
        return tuple(je for je in self.cfg.jes if je not in down) if down else self.cfg.jes

    def _je_lost(self, ctx: Context, m: JeLost) -> None:
        """A JE died: each of its jobs whose client has seen nothing (not streaming) goes to a
        JE drawn among the live ones, keeping its arrival time; with `migrate_streams` the
        streaming ones too (the new JE resumes each at its client's position); the others fail
        naming the JE (a streaming client may have seen tokens the gateway cannot know of)."""
        s = self.state
        if m.je not in self.cfg.jes or m.je in s.down:
            return
        live = tuple(je for je in self._live() if je != m.je)
        why = f"its JE {m.je} was lost ({m.reason})"
        retried: list[tuple[str, str]] = []
        failed: list[str] = []
        for rid, c in s.clients.items():
            if c.je != m.je:
                continue
            if c.resubmit is not None and live:
                retried.append((rid, live[ctx.rng.randrange(len(live))]))
            else:
                failed.append(rid)
        ctx.record(GatewayJeDown(je=m.je, reason=m.reason, retried=tuple(retried), failed=tuple(failed)))
        if self.cfg.manager:  # its tasks on the TEs: failed or sent again here, so nobody's any more
            ctx.send(self.cfg.manager, CancelOwner(owner=m.je, reason=why))
        for rid, je in retried:
            c = s.clients[rid]
            r = c.resubmit
            assert r is not None
            # moved by a gateway that moves streams: the new JE's task ids are the next epoch's
            epoch = c.epoch if self.cfg.migrate_streams else 0
            ctx.send(je, JobRequest(request_id=rid, model=c.model, prompt=r.prompt, sampling=r.sampling,
                                    reply_to=ctx.self, arrival_s=c.arrival_s, predicted_bucket=r.predicted_bucket,
                                    stream=r.stream, epoch=epoch, lost=why if epoch else ""), corr=rid)  # fmt: skip
        for rid in failed:
            c = s.clients[rid]
            reason = f"{why}; " + ("a streaming response cannot be resumed" if live else "no JE alive")
            ctx.record(GatewayDone(request_id=rid, status="failed"))
            self._fail(ctx, rid, c.reply_to, reason, c.arrival_s)

    def _fail(self, ctx: Context, rid: str, reply_to: str, reason: str, arrival_s: float) -> None:
        """Answer a request the gateway itself ends: a failed `RequestDone` (the HTTP layer maps it)."""
        ctx.send(reply_to, RequestDone(
            request_id=rid, status="failed", reason=reason, arrival_s=arrival_s, first_token_s=None,
            finish_s=ctx.now(), prompt_tokens=0, cached_prompt_tokens=0, output_tokens=0, te=""), corr=rid)  # fmt: skip

    def _done(self, ctx: Context, m: RequestDone) -> None:
        c = self.state.clients.get(m.request_id)
        if c is None:
            return  # not ours (or already answered): the JE sends exactly one per job
        ctx.record(GatewayDone(request_id=m.request_id, status=m.status))
        ctx.send(c.reply_to, m, corr=m.request_id)
        if self.cfg.observer:
            ctx.send(self.cfg.observer, m)
