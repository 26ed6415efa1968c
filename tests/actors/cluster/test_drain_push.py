"""An operator's drain (`DrainTe`) reaches the JEs at once: the manager pushes the group's
membership with the TE among the draining ones as it starts draining (as scale-in through
`ScaleGroup` does), so no new task is routed to it; its running tasks finish and it stops.
Before, the push waited for the TE to stop and the JEs kept sending it new work meanwhile."""

from __future__ import annotations

from recovery_harness import GROUP, build_run, events

from deepserve.actors.cluster.messages import DrainTe
from deepserve.actors.cluster.state import MembershipPushed, TeDraining, TeStopped

DRAIN_AT_S = 2.0


def _tasks_to(d, te: str) -> list[float]:  # noqa: ANN001
    """When each task reached one of the TE's DP masters (the JE sends them there, or through
    the shell at first)."""
    return [s.input.t for s in d.sink.steps if s.input.actor.startswith(f"{te}/dp/") and s.input.type == "SubmitTask"]


def test_after_a_drain_no_new_task_is_routed_to_the_draining_te() -> None:
    d, out = build_run([], requests=12, output_tokens=100, again_at_s=3.0, until_s=30.0,
                       inputs=((DRAIN_AT_S, "cluster", DrainTe(te="te/1")),))  # fmt: skip
    assert [e.te for _, e in events(d, "cluster", TeDraining)] == ["te/1"]
    before = [t for t in _tasks_to(d, "te/1") if t < DRAIN_AT_S]
    after = [t for t in _tasks_to(d, "te/1") if t >= DRAIN_AT_S]
    assert len(before) >= 2, before  # it served before the drain: the routing would pick it again
    assert after == []
    pushes = [(t, e.tes, e.draining) for t, e in events(d, "cluster", MembershipPushed) if e.group == GROUP]
    assert (DRAIN_AT_S, ("te/0", "te/2"), ("te/1",)) in pushes
    stopped = [(e.te, e.reason) for _, e in events(d, "cluster", TeStopped)]
    assert stopped == [("te/1", "drained: no task left")]
    assert len(_tasks_to(d, "te/0")) + len(_tasks_to(d, "te/2")) == 24 - len(before)
