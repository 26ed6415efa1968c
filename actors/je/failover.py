"""The JE's side of the control plane: a pushed membership change (a TE that left its group has
its open tasks failed over — retried on another TE while nothing has streamed, else failed with
the reason; draining TEs keep theirs) and a cancel from the frontend (to the TE holding the
job's task, which frees its KV; ended here if that TE never answers)."""

from __future__ import annotations

from typing import Any

from deepserve.actors.flowserve.master.kv_publish import SubscribeKvEvents
from deepserve.actors.flowserve.messages import CancelTask
from deepserve.core import Context

from .messages import (
    CancelDeadline,
    CancelJob,
    JobCancelRequested,
    MembershipChanged,
    TeGroupMembership,
)


def membership(je: Any, ctx: Context, m: TeGroupMembership) -> None:
    known = je.state.groups.get(m.model, {}).get(m.role, [])
    ctx.record(MembershipChanged(model=m.model, role=m.role, tes=m.tes, draining=m.draining))
    if je.cfg.kv_events and m.role != "decode":  # the prompt tree mirrors the TEs' caches
        for te in m.tes:
            if te not in known:  # new, or a replacement at the same address: its cache is empty
                ctx.send(te, SubscribeKvEvents(subscriber=ctx.self))
    st = je.state
    members = {te for tes in st.groups.get(m.model, {}).values() for te in tes}
    prefix = f"{m.model}/"
    members |= {te for k, tes in st.draining.items() if k.startswith(prefix) for te in tes}
    for rid in [r for r in st.parked if st.jobs[r].model == m.model]:
        ctx.cancel(f"park/{rid}")
        je._dispatch(ctx, rid, st.jobs[rid], "chat", 1)
    for rid, j in list(st.jobs.items()):
        if j.model == m.model and j.te and j.te not in members:
            je._task_failed(ctx, rid, j, f"{j.te} left the {m.role} group")
    if m.role == "prefill" and je.cfg.forwarding.mode == "on_demand":
        for te in m.tes:
            if te not in known:
                je._feed(ctx, te)  # a new prefill is idle


def cancel(je: Any, ctx: Context, m: CancelJob) -> None:
    j = je.state.jobs.get(m.request_id)
    if j is None or j.cancelled:
        return  # not this JE's job (cancels go to every JE), or cancelled already
    ctx.record(JobCancelRequested(request_id=m.request_id, reason=m.reason, completed=m.completed))
    if not j.te:  # parked, queued, or between tasks: nothing runs
        je._finish(ctx, m.request_id, j, "cancelled", m.reason)
        return
    ctx.send(j.te, CancelTask(task_id=j.task_id, reason=m.reason), corr=m.request_id)
    ctx.after(je.cfg.forwarding.accept_timeout_s, CancelDeadline(request_id=m.request_id),
              key=f"cancel/{m.request_id}")  # fmt: skip
