"""The cluster manager's role flip (issue 34 §5, xLLM §3.2 and P/D-Serve §3.3): a ready TE moves
from its model's prefill group to its decode group or back — membership only. The instance is
stateless (a task's kind, not the TE, says prefill or decode), so no weights reload and its open
tasks run on: the new group is pushed first, so at every push the TE is in one of its model's
groups and no JE fails a task over.
"""

from __future__ import annotations

from typing import Any

from deepserve.core import Context

from .autoscaler_messages import FlipRefused, FlipTe, TeRoleFlipped
from .state import CmState, GroupTarget


def refusal(st: CmState, msg: FlipTe) -> str:
    """Why the flip cannot happen ("" when it can)."""
    r = st.tes.get(msg.te)
    src, dst = st.groups.get(msg.src), st.groups.get(msg.dst)
    if r is None or r.state != "ready":
        return f"te: {msg.te} is not a ready TE"
    if r.group != msg.src:
        return f"src: {msg.te} is in {r.group}, not {msg.src}"
    if src is None or dst is None or msg.src == msg.dst:
        return f"dst: no other TE group {msg.dst!r}"
    if src.model != dst.model:
        return f"dst: {msg.dst} serves {dst.model}, {msg.te} holds {src.model}'s weights"
    return ""


def flip(mgr: Any, ctx: Context, msg: FlipTe) -> None:
    """Carry out a `FlipTe` on the manager `mgr` (its state and `_do`), recorded."""
    from . import policy as P

    st = mgr.state
    why = refusal(st, msg)
    if why:
        ctx.record(FlipRefused(te=msg.te, dst=msg.dst, reason=why))
        return
    ctx.record(TeRoleFlipped(te=msg.te, src=msg.src, dst=msg.dst, reason=msg.reason, at_s=ctx.now()))
    for name, delta in ((msg.dst, 1), (msg.src, -1)):
        g = st.groups[name]
        ctx.record(GroupTarget(group=name, model=g.model, role=g.role, size=max(g.target + delta, 0)))
    mgr._do(ctx, P.Push(msg.dst))
    mgr._do(ctx, P.Push(msg.src))
