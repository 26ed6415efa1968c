"""`replay whatif --from T` restores the driver at T from the log (core/restore.py, replay/fork.py,
cluster/whatif_restore.py): restored with no change and run on, it makes the log's own steps
after T, byte for byte (every live actor's state, clock, counters, asks, timers and the inputs
still ahead put back in their order); with a change it gives what the re-run of the prefix gives;
and it does not re-run the prefix. The shipped incident's first 250 requests (a crash at 30 s, a
kill at 60 s)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import msgspec
import pytest
from cliproc import in_process

from deepserve.cluster.whatif import _rerun_prefix, admin_faults, config_of, original, whatif
from deepserve.cluster.whatif_fork import changed_actors
from deepserve.cluster.whatif_restore import restored_run
from deepserve.persistence import open_log
from deepserve.replay.decisions import Comparer
from deepserve.replay.fork import Cut
from deepserve.replay.inputs import open_run

SCENARIO = str(Path(__file__).resolve().parents[2] / "configs" / "scenarios" / "incident-prefill-crash.toml")


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("fork")
    path = tmp / "incident.db"
    res = in_process("sim", SCENARIO, "--requests", "250", "--log", str(path), cwd=tmp)
    assert res.returncode == 0, res.stderr
    return path


class StepHash:
    """A log sink hashing each step as the log encodes it."""

    def __init__(self) -> None:
        self.h = hashlib.blake2b(digest_size=32)
        self.steps = 0

    def begin_run(self, run: Any) -> None:
        return None

    def append(self, step: Any) -> int:
        self.h.update(msgspec.msgpack.encode(step))
        self.steps += 1
        return self.steps

    def flush(self) -> None:
        return None

    def close(self) -> None:
        return None


def logged_after(path: Path, run_id: str, t: float) -> tuple[str, int]:
    sink = StepHash()
    reader = open_log(str(path), upgrade=False)
    try:
        for step in reader.steps(run_id):
            if step.input.t > t:
                sink.append(step)
    finally:
        reader.close()
    return sink.h.hexdigest(), sink.steps


# before the crash, between the crash and the kill, across a replacement's boot, near the end
@pytest.mark.parametrize("at", [10.0, 30.5, 40.0, 61.0, 80.0])
def test_restored_with_no_change_makes_the_logs_steps_after_t(log: Path, at: float) -> None:
    cut = Cut(at)
    inputs = open_run(str(log), cut=cut)
    base = config_of(inputs, None, [])
    sink = StepHash()
    result = restored_run(inputs, base, base, cut, admin_faults(inputs), [], {}, [], sink=sink)  # type: ignore[arg-type]
    want = logged_after(log, inputs.run_id, at)
    assert want[1] > 50  # a real suffix (70 steps after 80 s: the run ends with its last request)
    assert (sink.h.hexdigest(), sink.steps) == want
    assert result.summary["requests"] == 250 and result.deliveries == inputs.deliveries


def test_a_change_from_t_gives_what_re_running_the_prefix_gives(log: Path) -> None:
    at, change = 40.0, ["control.heartbeat_misses=6"]
    cut = Cut(at)
    inputs = open_run(str(log), cut=cut)
    cfg = config_of(inputs, None, change)
    restored = whatif(inputs, cfg, inputs.manager, changes=change, from_s=at)
    assert "restored from the log at t=40" in restored.changes[-1]
    again = open_run(str(log), prefix_until_s=at)
    base = config_of(again, None, [])
    rerun = _rerun_prefix(again, base, cfg, original(again, cfg, again.manager), Comparer(again.decisions),
                          admin_faults(again), at, change, 0.0, changed_actors(base, cfg))  # fmt: skip
    wall = ("wall_s",)
    a = {k: v for k, v in restored.whatif.summary.items() if k not in wall}
    b = {k: v for k, v in rerun.whatif.summary.items() if k not in wall}
    assert a == b and a != {k: v for k, v in restored.original.summary.items() if k not in wall}
    assert restored.first_difference == rerun.first_difference and restored.first_difference is not None
    assert restored.whatif.deliveries == rerun.whatif.deliveries


def test_the_restore_does_not_re_run_the_prefix(log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every delivery the fork makes is after T: the kernel's `execute` never sees a time up to T."""
    from deepserve.core import sim as core_sim

    at = 61.0
    seen: list[float] = []
    real = core_sim.execute

    def spy(cell: Any, env: Any, now: float) -> bool:
        seen.append(now)
        return real(cell, env, now)

    import deepserve
    from deepserve.cluster import whatif as whatif_mod

    def no_rerun(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the fork re-ran the prefix")

    monkeypatch.setattr(core_sim, "execute", spy)
    monkeypatch.setattr(whatif_mod, "_rerun_prefix", no_rerun)
    cut = Cut(at)
    inputs = open_run(str(log), cut=cut)
    cfg = config_of(inputs, None, [])
    out = whatif(inputs, cfg, inputs.manager, changes=[], from_s=at)
    assert out.whatif.deliveries > cut.delivered > 0
    if deepserve.BUILD == "compiled":  # its SimDriver calls `execute` in C, past the patched attribute
        return
    assert seen and min(seen) > at
    assert len(seen) == inputs.deliveries - cut.delivered == out.whatif.deliveries - cut.delivered


def test_where_the_log_cannot_say_the_driver_at_t_the_prefix_is_re_run(log: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback: an actor whose output counter at T the log cannot say (replay/fork.py
    `Cut.unsure`) sends the fork back to re-running the prefix, checked against the log, and
    the what-if says so; its numbers are the restore's."""
    at, change = 40.0, ["control.heartbeat_misses=6"]
    cut = Cut(at)
    inputs = open_run(str(log), cut=cut)
    cfg = config_of(inputs, None, change)
    restored = whatif(inputs, cfg, inputs.manager, changes=change, from_s=at)
    monkeypatch.setattr(Cut, "unsure", lambda self: ["je/0"])
    cut = Cut(at)
    inputs = open_run(str(log), cut=cut)
    rerun = whatif(inputs, cfg, inputs.manager, changes=change, from_s=at)
    said = " ".join(rerun.changes)
    assert "je/0 failed a delivery after its last logged output" in said and "re-ran the prefix instead" in said
    assert "re-run and checked against the log" in said
    wall = ("wall_s",)
    assert ({k: v for k, v in rerun.whatif.summary.items() if k not in wall}
            == {k: v for k, v in restored.whatif.summary.items() if k not in wall})  # fmt: skip
