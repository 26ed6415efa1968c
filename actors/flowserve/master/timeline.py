"""Each task's token timeline, rebuilt from a DP master's recorded events alone (the log is the
record: the aggregated path writes one `BatchEnded` per run, and this recovers every token's
time from it exactly as the stepwise path would have streamed it)."""

from __future__ import annotations

from collections.abc import Iterable

from deepserve.actors.flowserve.master.evolve import evolve_master
from deepserve.actors.flowserve.master.state import BatchEnded, MasterConfig, new_state
from deepserve.core import Event


def token_timeline(cfg: MasterConfig, events: Iterable[Event]) -> dict[str, list[float]]:
    """task id -> the sample time of each of its output tokens produced by this master."""
    st = new_state(cfg)
    out: dict[str, list[float]] = {}
    for e in events:
        if isinstance(e, BatchEnded) and st.in_flight is not None and not e.failed:
            before = {
                x.task_id: st.reqs[x.task_id].emitted
                for x in st.in_flight.entries
                if x.task_id in st.reqs
            }
            emit_from = st.in_flight.first_emits()
            st = evolve_master(st, e)
            for tid, first in before.items():
                r = st.reqs.get(tid)
                got = 0 if r is None else r.emitted - first
                if got and r is not None:
                    f = emit_from.get(tid, 0)
                    times = e.ends_s[f : f + got] if len(e.ends_s) > 1 else e.ends_s * got
                    out.setdefault(tid, []).extend(times)
            continue
        st = evolve_master(st, e)
    return out
