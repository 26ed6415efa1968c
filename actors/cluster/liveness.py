"""A DP master's answer to a heartbeat (xDeepServe §6.1): "each DP master runs a single-threaded
event loop and only responds to heartbeats when the loop is active".

An emulated master is an actor, so its handler always runs; what stalls is its loop's work: a
forward pass handed to a hung NPU never comes back. The master therefore stays silent when the
forward pass outstanding now is the one it reported at the previous heartbeat (`last_step`) —
the loop has not moved for a whole heartbeat interval — and answers otherwise. A pass longer
than the interval costs one miss; the monitor declares a failure only after `misses` in a row.

An aggregated decode run (`cluster.scheduler.aggregate`: one NPU request standing for many
passes) is the exception: a real loop would have answered after each of its passes, so a master
inside one says so (`in_run`) and the TE's responder probes the NPU instead — a busy device
answers at once, a hung one never does (`responder.py`).
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
        if master.state.in_flight.iterations > 1:
            # An aggregated run stands for many passes, each of which would have moved the loop
            # and answered: busy, not stuck — unless its NPU is. The asker probes the device.
            ctx.reply(DpHeartbeatAck(dp=master.cfg.dp, seq=msg.seq, step=step, in_run=True))
        return  # the loop is stuck on the same pass: no answer (the asker's timeout fires)
    # A loop that moves but whose device is lost (crashed, faulted HBM) answers, saying so:
    # the round fails at once, with the reason, rather than after the ask's timeout.
    lost = master.state.device_lost
    failed = f"device lost: {lost}" if lost else ""
    ctx.reply(DpHeartbeatAck(dp=master.cfg.dp, seq=msg.seq, step=step, failed=failed))
