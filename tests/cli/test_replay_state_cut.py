"""`replay state` of an actor whose log just ends (its process killed: no final snapshot) says
so, instead of "alive" (a tour: a TE's DP master SIGKILLed at 48.4 read "alive" at --at 50)."""

from __future__ import annotations

from pathlib import Path

from cliproc import in_process

from deepserve.core.records import SNAPSHOT
from deepserve.persistence import open_log, open_sink

CUT = "its log ends there without a final snapshot"


def test_an_actor_whose_log_just_ends_is_not_called_alive(tmp_path: Path) -> None:
    assert in_process("sim", "example", "--log", "full.db", cwd=tmp_path).returncode == 0
    # the same log without its final snapshots: what a killed process leaves
    with open_log(str(tmp_path / "full.db")) as log, open_sink(str(tmp_path / "cut.db")) as sink:
        for run in log.runs():
            sink.begin_run(run)
            for step in log.steps(run.run_id):
                if step.input.kind != SNAPSHOT:
                    sink.append(step)
    full = in_process("replay", "state", "full.db", "--actor", "dispatch", cwd=tmp_path).stdout.splitlines()[0]
    cut = in_process("replay", "state", "cut.db", "--actor", "dispatch", cwd=tmp_path).stdout.splitlines()[0]
    assert ", alive, " in full and CUT not in full, full
    assert CUT in cut and "(its process was killed, or still runs)" in cut, cut
    # at a time the actor's records go past, it was alive then: no doubt to report
    early = in_process("replay", "state", "cut.db", "--actor", "dispatch", "--at", "50", cwd=tmp_path).stdout
    assert ", alive, " in early.splitlines()[0] and CUT not in early
