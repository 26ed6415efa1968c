"""Helpers for the issue-10 acceptance scenarios: build a scenario from a built-in one plus
`--set` overrides, run it, and look at the TEs' DP masters."""

from __future__ import annotations

from typing import Any

from deepserve.actors.flowserve import rtc
from deepserve.adapters.scenario.loader import load_scenario
from deepserve.cluster.run import RunResult, run_scenario
from deepserve.core import SimDriver


def scenario(base: str, *overrides: str) -> Any:
    return load_scenario(base, list(overrides))


def masters(driver: SimDriver) -> dict[str, Any]:
    """DP-group master actors by address (`te/{i}/dp/{g}`)."""
    return {
        a: c.actor for a, c in sorted(driver.cells.items())
        if a.rpartition("/dp/")[2].isdigit() and c.actor is not None  # not te/1/dp/0/df/0
    }  # fmt: skip


def leaked_blocks(driver: SimDriver) -> dict[str, int]:
    """HBM blocks still held per DP group after the run (a leak when not 0)."""
    out = {}
    for addr, m in masters(driver).items():
        used = rtc.hbm_used_blocks(m.state.rtc)
        if used or m.state.rtc.seqs:
            out[addr] = used
    return out


def run(s: Any, requests: int, **kw: Any) -> tuple[RunResult, dict[str, int]]:
    """Run; returns the result and the blocks leaked at the end."""
    leaks: dict[str, int] = {}
    result = run_scenario(s, requests=requests, on_end=lambda d: leaks.update(leaked_blocks(d)), **kw)
    return result, leaks


def show(label: str, summary: dict[str, Any]) -> None:
    keys = ("requests", "completed", "failed", "prefix_hit_rate", "ttft_ms_mean", "ttft_ms_p50",
            "ttft_ms_p99", "tpot_ms_mean", "tpot_ms_p50", "tpot_ms_p99")  # fmt: skip
    print(label, {k: round(summary[k], 4) if isinstance(summary[k], float) else summary[k] for k in keys})


class Observer:
    """A log sink that keeps (decoded) inputs and events of some types — the scenario tests'
    window on what the actors did, read from the same records the log holds."""

    def __init__(self, inputs: tuple[str, ...] = (), events: tuple[str, ...] = ()) -> None:
        self.want_inputs, self.want_events = set(inputs), set(events)
        self.inputs: list[tuple[str, float, dict[str, Any]]] = []  # (actor, time, payload)
        self.events: list[tuple[str, dict[str, Any]]] = []

    def begin_run(self, run: Any) -> None:
        pass

    def append(self, step: Any) -> int:
        import msgspec

        rec = step.input
        if rec.type in self.want_inputs and rec.seq >= 0:
            self.inputs.append((rec.actor, rec.t, msgspec.msgpack.decode(rec.payload)))
        for ev in step.events:
            if ev.type in self.want_events:
                self.events.append((ev.actor, msgspec.msgpack.decode(ev.payload)))
        return 0

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass
