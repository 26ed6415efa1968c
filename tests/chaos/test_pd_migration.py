"""Request migration in a P/D cluster, in virtual time (xLLM §3.5, issue 33): the decode TE
serving streamed requests is killed mid-stream; each moved request gets a new prefill of its
prompt and the tokens its client has (`resume_from`), whose first token is the client's next
one, then a decode continuing from there — every stream ends with its whole output, no
duplicate and no skip (the chaos checkers: `tokens`, `migration`, `terminal`, `replay`)."""

from __future__ import annotations

from typing import Any

import pytest

from deepserve.adapters.scenario.faults import FaultSpec
from deepserve.chaos import runner
from deepserve.chaos.platform import load_config


@pytest.fixture
def takeovers(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, int, int]]:
    """Every chunk the token checker follows: (request, task, first index, client's next index)."""
    seen: list[tuple[str, str, int, int]] = []
    real = runner.Checker._chunk

    def chunk(self: Any, rid: str, task_id: str, first: int, n: int, src: str, ids: tuple[int, ...] = ()) -> None:
        seen.append((rid, task_id, first, self.streamed.get(rid, 0)))
        real(self, rid, task_id, first, n, src, ids)

    monkeypatch.setattr(runner.Checker, "_chunk", chunk)
    # one fault: the first decode TE's pod dies 6 s after the cluster is ready (mid-stream)
    monkeypatch.setattr(runner.schedule, "draw", lambda *a, **k: (FaultSpec(at_s=6.0, kind="kill-te", target="te/1"),))
    return seen


def test_a_killed_decode_te_s_streams_resume_at_the_client_s_token(tmp_path, takeovers) -> None:
    cfg = load_config("pd-1p1d", ("cluster.decode_tes=2", "workload.requests=12"))
    r = runner.run_seed(cfg, 1, None, str(tmp_path))
    assert r.violations == 0, r.first
    assert r.faults == ("6s kill-te te/1",) and (r.completed, r.failed) == (r.requests, 0)
    firsts: dict[tuple[str, str], tuple[int, int]] = {}  # (request, task) -> its first chunk, the client's next
    for rid, tid, first, client in takeovers:
        firsts.setdefault((rid, tid), (first, client))
    moved = {rid: v for (rid, tid), v in firsts.items() if "/prefill." in tid and not tid.endswith(".1")}
    assert len(moved) >= 2, "the kill missed the streams"
    for rid, (first, client) in moved.items():
        # resumed at what the JE knows the client has (no skip), not restarted from token 0
        assert 0 < first <= client, (rid, first, client)
        decode = next(v for (r2, tid), v in firsts.items() if r2 == rid and tid.startswith(f"{rid}/decode.") and
                      not tid.endswith(".1"))  # fmt: skip
        assert decode[0] == first + 1  # the decode continues after the prefill's token
    assert any(client > first for first, client in moved.values())  # some had more: re-generated, checked
