"""Zombie protection on the gateway (P/D-Serve §3.4, issue 33), in virtual time: a JE dies with
streamed requests on it; with request migration on, the gateway moves each to a live JE, which
asks the frontend how far the client's stream got and resumes there (its task ids a new epoch,
so the frontend's merge abandons the lost JE's tasks) — every stream ends with its whole output,
no duplicate and no skip (the chaos checkers), and no request fails."""

from __future__ import annotations

from typing import Any

import pytest

from deepserve.actors.je.migration import StreamPosition, StreamPositionAsk
from deepserve.adapters.scenario.faults import FaultSpec
from deepserve.chaos import runner
from deepserve.chaos.platform import load_config
from deepserve.persistence import open_log
from deepserve.replay.why import request_hops, why_lines


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, int, int]]:
    """Each chunk the token checker follows (request, task, first index, client's next), with a
    frontend at the stream address answering `StreamPositionAsk` as the daemon's does."""
    out: list[tuple[str, str, int, int]] = []
    chunk, attach = runner.Checker._chunk, runner.Checker.attach

    def follow(self: Any, rid: str, task_id: str, first: int, n: int, src: str, ids: tuple[int, ...] = ()) -> None:
        out.append((rid, task_id, first, self.streamed.get(rid, 0)))
        chunk(self, rid, task_id, first, n, src, ids)

    def attached(self: Any, driver: Any) -> None:
        attach(self, driver)
        listen = driver.on_external

        def frontend(t: float, env: Any) -> None:
            listen(t, env)
            m = env.msg
            if type(m) is StreamPositionAsk:  # the client's next index, as the frontend has it
                at = StreamPosition(request_id=m.request_id, next_index=self.streamed.get(m.request_id, 0))
                driver.inject(m.reply_to, at, at=t, src="ext/stream")

        driver.on_external = frontend

    monkeypatch.setattr(runner.Checker, "_chunk", follow)
    monkeypatch.setattr(runner.Checker, "attach", attached)
    monkeypatch.setattr(runner.schedule, "draw", lambda *a, **k: (FaultSpec(at_s=6.0, kind="kill-je", target="je/1"),))
    return out


def test_a_lost_je_s_streams_move_to_another_je_and_resume_at_the_client_s_token(tmp_path, seen) -> None:
    cfg = load_config("pd-1p1d", ("cluster.decode_tes=2", "workload.requests=16", "scheduling.jes=2",
                                  "scheduling.migration.ask_stream_s=0.5"))  # fmt: skip
    r = runner.run_seed(cfg, 1, None, str(tmp_path), keep_log=True)
    assert r.violations == 0, r.first
    assert r.faults == ("6s kill-je je/1",) and (r.completed, r.failed) == (r.requests, 0), r.failed_reasons
    firsts: dict[tuple[str, str], tuple[int, int]] = {}
    for rid, tid, first, client in seen:
        firsts.setdefault((rid, tid), (first, client))
    moved = {k: v for k, v in firsts.items() if k[1].count(".") == 2}  # rid/phase.attempt.epoch
    assert moved, "the lost JE had no stream in flight"
    resumed = [(first, client) for (rid, tid), (first, client) in moved.items() if "/decode." not in tid]
    assert resumed and all(first == client for first, client in resumed)  # exactly where the client was
    assert any(first > 0 for first, _ in resumed)  # mid-stream, not restarted from token 0
    # `replay why` shows the move: on the new JE, by the gateway, naming the lost JE
    rid = next(iter(moved))[0]
    reader = open_log(r.log)
    try:
        lines = list(why_lines(request_hops(reader, rid)))
    finally:
        reader.close()
    assert any("MIGRATED here, moved by the gateway (its JE je/1 was lost" in ln for ln in lines), lines
