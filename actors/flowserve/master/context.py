"""Explicit context caching in the DP master (DeepServe §4.1 endpoints → RTC MatchByID).

CreateContext prefills the prompt as an internal task (`ctx:<id>`) and, when its KV is computed,
names the blocks in the RTC's ID index (they stay in HBM until deleted); Get answers from
`match_by_id`; Delete drops the name (the blocks become ordinary cached blocks)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from deepserve.actors.flowserve import rtc
from deepserve.actors.flowserve.master.state import Req, TaskEnded, TaskQueued
from deepserve.actors.flowserve.messages import (
    ContextInfo,
    CreateContext,
    DeleteContext,
    GetContext,
    Sampling,
    SubmitTask,
)
from deepserve.core import Context

if TYPE_CHECKING:
    from deepserve.actors.flowserve.master.actor import DpMaster

CONTEXT = "context"  # Req.stop of a context-creating task
PREFIX = "ctx:"


def handle(m: DpMaster, ctx: Context, msg: CreateContext | GetContext | DeleteContext) -> None:
    st, cfg = m.state, m.cfg
    to = msg.reply_to or ctx.sender
    found = rtc.match_by_id(st.rtc, msg.context_id)
    info = ContextInfo(req_id=msg.req_id, context_id=msg.context_id, found=found is not None,
                       num_tokens=len(found[0]) * cfg.block_tokens if found else 0, dp=cfg.dp)  # fmt: skip
    if isinstance(msg, GetContext):
        ctx.send(to, info)
    elif isinstance(msg, DeleteContext):
        if found is not None:
            ctx.record(rtc.delete_cache(st.rtc, msg.context_id))
        ctx.send(to, info)
    else:
        task = SubmitTask(
            task_id=PREFIX + msg.context_id, request_id=msg.req_id, kind="prefill", model=msg.model,
            prompt=msg.prompt, sampling=Sampling(max_tokens=1), reply_to=to,
        )  # fmt: skip
        reason = m.check(task)
        if found is not None or reason is not None:
            ctx.send(to, ContextInfo(req_id=msg.req_id, context_id=msg.context_id, found=found is not None,
                                     dp=cfg.dp, error=reason or "exists already"))  # fmt: skip
            return
        ctx.record(TaskQueued(task=task, out_len=1, stop=CONTEXT))
        m.advance(ctx)


def created(m: DpMaster, ctx: Context, r: Req) -> None:
    """The context's prompt is computed: name its blocks, release the task's own hold."""
    st, cfg = m.state, m.cfg
    tid = r.task.task_id
    cid = tid[len(PREFIX):]
    hashes = r.task.prompt.block_hashes
    ctx.record(rtc.create_cache(st.rtc, cid, tid, hashes))
    ctx.record(rtc.free(st.rtc, tid))
    ctx.record(TaskEnded(task_id=tid, status="completed", reason=CONTEXT))
    ctx.send(r.task.reply_to, ContextInfo(req_id=r.task.request_id, context_id=cid, found=True,
                                          num_tokens=len(hashes) * cfg.block_tokens, dp=cfg.dp),
             corr=r.task.request_id)  # fmt: skip
