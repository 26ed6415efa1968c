"""Issue 33 §1: crash vs hang vs silence told apart in the recorded diagnosis (`TeDeclaredFailed`),
with the detection time of each kind measured on the recovery harness's 3-TE cluster (heartbeats
every 0.5 s, 3 misses), each fault on te/1 at 5 s while it decodes. A KV link fault is told apart
by link probing instead (its detection time: tests/actors/flowserve/test_fs_link_probe.py).

| fault            | diagnosis   | detected after | bound                          |
| npu-crash        | device-lost | 0.0 s          | one interval (its answer says) |
| hang-npu         | hang        | 1.5 s          | misses x interval (issue 31 §2) |
| kill-te          | silent      | 1.5 s          | (misses + 1) x interval        |
| kill-te-process  | exited      | 0.0 s          | the pod launcher sees it       |
"""

from __future__ import annotations

import pytest
from recovery_harness import build_run, events

from deepserve.actors.cluster.state import TeDeclaredFailed

INTERVAL_S, MISSES, AT_S = 0.5, 3, 5.0


@pytest.mark.parametrize(
    ("fault", "diagnosis", "detected_after_s", "bound_s"),
    [
        ({"kind": "npu-crash", "target": "hw/s0/npu1"}, "device-lost", 0.0, INTERVAL_S),
        ({"kind": "hang-npu", "target": "hw/s0/npu1"}, "hang", 1.5, MISSES * INTERVAL_S),
        ({"kind": "kill-te", "target": "te/1"}, "silent", 1.5, (MISSES + 1) * INTERVAL_S),
        ({"kind": "kill-te-process", "target": "te/1"}, "exited", 0.0, 0.0),
    ],
)  # fmt: skip
def test_each_fault_kind_is_diagnosed_and_detected_in_time(fault: dict, diagnosis: str, detected_after_s: float,
                                                           bound_s: float) -> None:  # fmt: skip
    d, _ = build_run([{"at_s": AT_S, **fault}], requests=12, until_s=20.0, interval_s=INTERVAL_S, misses=MISSES)
    declared = [(t - AT_S, e.te, e.diagnosis) for t, e in events(d, "cluster", TeDeclaredFailed)]
    assert declared == [(detected_after_s, "te/1", diagnosis)]
    assert detected_after_s <= bound_s
