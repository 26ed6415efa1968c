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

from .messages import HUNG, DpHeartbeat, DpHeartbeatAck


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


def stalled_past_limit(out: Any, watched: dict[str, Any], stall_from: dict[str, int], seq: int,
                       misses: int) -> Any:  # fmt: skip
    """Issue 31 §2's letter: a hung NPU is declared within `misses` x interval.

    Counting only unanswered rounds costs a hang one interval more: the round in which the
    stuck pass was first outstanding is answered (the pass looks new), so `misses` silent rounds
    end (misses + 1) intervals after the hang. But a master that goes silent on the pass it
    reported at its last answer (`last_step`, answered busy) has not moved since that answered
    round: the stall began at or before it. So a TE whose silence was diagnosed a hang (its
    shell answered, a master or its NPU did not — `HUNG`) is declared once `misses` rounds
    (ticks, each at least one interval apart) have passed since `stall_from[te]`: its last ok
    answer when that had a pass outstanding, or the round before its lease broke (the device
    said something happened after it; heartbeat.py). A dead or unreachable TE (`SILENT`) and an
    idle one keep the count of misses. `out` is `policy.TickOutcome`; returned with those TEs
    moved from pinged to failed."""
    failed = list(out.failed)
    done = {te for te, _, _ in failed}
    moved: set[str] = set()
    for te, n, why in out.missed:
        w = watched[te]
        since = stall_from.get(te)
        if te in done or w.diagnosis != HUNG or since is None or seq - since < misses:
            continue
        failed.append((te, w.generation, f"stuck on one forward pass for {seq - since} heartbeat rounds since "
                                         f"round {since} ({n} missed; last: {why})"))  # fmt: skip
        moved.add(te)
    if not moved:
        return out
    ping = tuple(te for te in out.ping if te not in moved)
    return type(out)(out.missed, tuple(failed), ping)
