"""A DP master's answer to a heartbeat (xDeepServe §6.1): "each DP master runs a single-threaded
event loop and only responds to heartbeats when the loop is active".

An emulated master is an actor, so its handler always runs; what stalls is its loop's work: a
forward pass handed to a hung NPU never comes back. The master therefore stays silent when the
forward pass outstanding now is the one it reported at the previous heartbeat (`last_step`) —
the loop has not moved for a whole heartbeat interval — and answers otherwise. A pass longer
than the interval costs one miss; the monitor declares a failure only after `misses` in a row.
"""

from __future__ import annotations

from typing import Any

from deepserve.core import Context

from .messages import DpHeartbeat, DpHeartbeatAck


def outstanding_step(master: Any) -> int:
    """The launched forward pass the master waits for (-1: none)."""
    fl = master.state.in_flight
    return fl.step if fl is not None and fl.launched else -1


def answer_heartbeat(master: Any, ctx: Context, msg: DpHeartbeat) -> None:
    step = outstanding_step(master)
    if step >= 0 and step == msg.last_step:
        return  # the loop is stuck on the same pass: no answer (the asker's timeout fires)
    # A loop that moves but whose device is lost (crashed, faulted HBM) answers, saying so:
    # the round fails at once, with the reason, rather than after the ask's timeout.
    lost = master.state.device_lost
    failed = f"device lost: {lost}" if lost else ""
    ctx.reply(DpHeartbeatAck(dp=master.cfg.dp, seq=msg.seq, step=step, failed=failed))
