"""DistFlow link probing (xDeepServe §6.1; issue 33 §1): a decode TE pulling 3 prompts' KV from a
prefill TE over RoCE, `kv_link_probe_s` = 2 s on the decode side. A failed or timed-out transfer
makes the channel's prober send a dummy payload down the same path, and the recorded verdict
tells a link fault (the dummy is blocked too) from decode-side saturation (the dummy is delayed
but delivered); the detection time is in the log (`LinkDiagnosed.detected_s - failed_s`)."""

from __future__ import annotations

from typing import Any

from fsharness import assert_replays
from test_fs_pd import _msgs, run_pd

from deepserve.actors.flowserve.distflow.probe import (
    LINK_FAULT,
    SATURATION,
    LinkDiagnosed,
    LinkProbeSent,
)
from deepserve.actors.flowserve.messages import TaskFinished
from deepserve.actors.ports.faults import LinkDegrade, LinkDown
from deepserve.core import decode

LINK = "s1/npu0/roce"  # the decode NPU's RoCE port
PROBER = "te/d/dp/0/df/0/probe"


def recorded(d: Any, cls: type) -> list[tuple[str, Any]]:
    return [(s.input.actor, decode(e.type, e.payload)) for s in d.sink.steps for e in s.events
            if e.type == cls.__name__]  # fmt: skip


def test_a_down_link_is_diagnosed_a_link_fault_at_once() -> None:
    d = run_pd(n=3, faults=[(0.0, LinkDown(link=LINK))], kv_link_probe_s=2.0)
    verdicts = recorded(d, LinkDiagnosed)
    assert [(a, e.verdict, e.link) for a, e in verdicts] == [(PROBER, LINK_FAULT, LINK)] * 3
    assert all(e.detected_s - e.failed_s == 0.0 for _, e in verdicts)  # the dummy fails as it is sent
    assert all("failed too: link s1/npu0/roce is down" in e.reason for _, e in verdicts)
    assert_replays(d)


def test_a_saturated_path_is_diagnosed_saturation_not_a_link_fault() -> None:
    # the link at 0.05 % of its bandwidth: every transfer times out after 1 s, the 4 KB dummy gets through
    d = run_pd(n=3, faults=[(0.0, LinkDegrade(link=LINK, bw_factor=0.0005))], kv_link_probe_s=2.0,
               kv_transfer_timeout_s=1.0)  # fmt: skip
    assert all(m.status == "failed" and "timed out" in m.reason for m in _msgs(d, TaskFinished) if m.task_id.endswith(":d"))
    verdicts = recorded(d, LinkDiagnosed)
    assert [e.verdict for _, e in verdicts] == [SATURATION] * 3
    assert all(0 < e.delay_s < 0.01 and e.detected_s - e.failed_s == e.delay_s for _, e in verdicts)
    assert [e.cause for _, e in recorded(d, LinkProbeSent)] == ["timeout"] * 3
    assert_replays(d)


def test_probing_is_off_by_default() -> None:
    d = run_pd(n=3, faults=[(0.0, LinkDown(link=LINK))])
    assert recorded(d, LinkProbeSent) == [] and not any(s.input.actor == PROBER for s in d.sink.steps)
