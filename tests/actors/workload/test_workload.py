"""The workload actor's bookkeeping against a test-double TE: round-robin, the PD two-step,
retries on rejection, exactly one terminal record per request."""

from __future__ import annotations

from typing import Any

import pytest
from fake_te import FakeTe

from deepserve.actors.flowserve.messages import Prompt, Sampling
from deepserve.actors.workload.actor import Workload
from deepserve.actors.workload.messages import Arrive, EndOfRun, RequestDone
from deepserve.core import SimDriver
from deepserve.persistence import open_log, open_sink
from deepserve.replay import verify


def _arrive(i: int, prompt: int = 1000, out: int = 11) -> Arrive:
    return Arrive(
        request_id=f"r{i}", model="llama3-8b", prompt=Prompt(num_tokens=prompt),
        sampling=Sampling(max_tokens=out, target_output_tokens=out, seed=i, ignore_eos=True),
    )  # fmt: skip


def _run(mode: str, fakes: dict[str, dict[str, Any]], n: int, sink: Any = None,
         **roles: list[str]) -> tuple[SimDriver, list[RequestDone]]:  # fmt: skip
    driver = SimDriver(1, sink=sink)
    done: list[RequestDone] = []
    driver.on_external = lambda t, env: done.append(env.msg) if isinstance(env.msg, RequestDone) else None
    for addr, kw in fakes.items():
        driver.spawn(addr, FakeTe, **kw)
    driver.spawn("workload", Workload, mode=mode, **roles)
    for i in range(n):
        driver.inject("workload", _arrive(i), at=0.5 * i, corr=f"r{i}", src="ext/client")
    driver.run()
    return driver, done


def test_colocated_round_robin_and_one_terminal_each() -> None:
    driver, done = _run("colocated", {"te/0": {}, "te/1": {}, "te/2": {}}, 9,
                        tes=["te/0", "te/1", "te/2"])  # fmt: skip
    assert sorted(d.request_id for d in done) == sorted(f"r{i}" for i in range(9))
    assert [d.te for d in sorted(done, key=lambda d: int(d.request_id[1:]))] == ["te/0", "te/1", "te/2"] * 3
    s = driver.actor("workload").state
    assert (s.arrived, s.completed, s.failed, len(s.pending)) == (9, 9, 0, 0)
    d = done[0]
    assert d.status == "completed" and d.output_tokens == 11 and d.cached_prompt_tokens == 500
    assert d.first_token_s - d.arrival_s == pytest.approx(1000 * 1e-4 + 0.001)


def test_pd_prefill_then_decode_keeps_prefill_first_token() -> None:
    _, done = _run("pd", {"te/0": {}, "te/1": {"tpot_s": 0.02}}, 4,
                   prefill_tes=["te/0"], decode_tes=["te/1"])  # fmt: skip
    assert len(done) == 4 and all(d.status == "completed" for d in done)
    for d in done:
        assert d.te == "te/1"  # the decode TE produced the output
        assert d.first_token_s - d.arrival_s == pytest.approx(0.101)  # from the prefill
        assert d.cached_prompt_tokens == 500  # the prefill's cache hit, not the decode's
        assert d.finish_s - d.first_token_s == pytest.approx(9 * 0.02 + 0.001)


def test_rejected_prefill_retried_then_failed_with_reason() -> None:
    _, done = _run("pd", {"te/0": {"reject": True}, "te/1": {}, "te/2": {}}, 2,
                   prefill_tes=["te/0", "te/1"], decode_tes=["te/2"])  # fmt: skip
    assert all(d.status == "completed" for d in done)  # r0: te/0 refuses, te/1 serves
    _, done = _run("pd", {"te/0": {"reject": True}, "te/2": {}}, 1,
                   prefill_tes=["te/0"], decode_tes=["te/2"])  # fmt: skip
    assert [(d.status, d.reason) for d in done] == [("failed", "rejected by te/0: queue full")]


def test_duplicate_terminal_ignored_and_counted() -> None:
    driver, done = _run("colocated", {"te/0": {"duplicate": True}}, 3, tes=["te/0"])
    assert [d.status for d in done] == ["completed"] * 3
    s = driver.actor("workload").state
    assert (s.completed, s.failed, s.duplicates) == (3, 0, 3)


def test_end_of_run_fails_what_is_pending_once() -> None:
    driver, done = _run("colocated", {"te/0": {"hang": True}}, 2, tes=["te/0"])
    assert done == []
    driver.inject("workload", EndOfRun(), src="ext/operator")
    driver.inject("workload", EndOfRun(), src="ext/operator")
    driver.run()
    assert sorted((d.request_id, d.status) for d in done) == [("r0", "failed"), ("r1", "failed")]
    assert "ended before" in done[0].reason


def test_workload_log_replays_identically(tmp_path: Any) -> None:
    path = str(tmp_path / "w.db")
    sink = open_sink(path, "async")
    _run("pd", {"te/0": {}, "te/1": {}}, 5, sink=sink, prefill_tes=["te/0"], decode_tes=["te/1"])
    sink.close()
    with open_log(path) as log:
        report = verify(log)
    assert report.identical, report


def test_mode_needs_its_tes() -> None:
    with pytest.raises(ValueError, match="needs at least one decode TE"):
        Workload(mode="pd", prefill_tes=["te/0"])
