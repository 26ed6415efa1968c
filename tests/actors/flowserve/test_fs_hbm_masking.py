"""HBM fault masking on the P/D prefill side (master/recovery.py): a transfer the prefill TE holds
for its decode side, whose KV blocks sat in the masked part, is withdrawn — the decode side's pin
is refused and its request fails there (its JE would retry it) instead of pulling corrupted KV;
the other transfers are pulled and their requests complete. The decode pool is small (24 blocks),
so the prefill side still holds transfers when the fault comes; the device reports the fault at
the next graph touching the region (a ninth prompt at 1.5 s)."""

from __future__ import annotations

from fsharness import assert_replays, driver
from fswire import hardware, task
from test_fs_pd import CLIENT, D, P, PdClient, _msgs, _te, _with

from deepserve.actors.flowserve.master.recovery import HbmFaultMasked
from deepserve.actors.flowserve.messages import TaskFinished
from deepserve.actors.flowserve.te_shell import TeShell
from deepserve.actors.ports.faults import HbmRegionFault
from deepserve.chaos.invariants import block_problems
from deepserve.core import decode


def test_a_held_transfer_whose_blocks_were_masked_is_withdrawn_and_the_rest_complete() -> None:
    d = driver()
    hardware(d, servers=2)
    d.spawn(P, TeShell, config=_te(P, "prefill", "hw/s0/npu0", hbm_masking=True))
    d.spawn(D, TeShell, config=_te(D, "decode", "hw/s1/npu0", hbm_blocks=24))
    d.spawn(CLIENT, PdClient)
    for i in range(9):
        at = 0.01 * i if i < 8 else 1.5
        d.inject(CLIENT, _with(task(i, 1000, 600, kind="prefill", reply_to=CLIENT), task_id=f"t{i}:p"), at=at,
                 src="ext/wl")  # fmt: skip
    d.inject("hw/s0/npu0", HbmRegionFault(region="kv", span=(0.0, 0.005)), at=1.0, src="ext/fault")  # blocks 0-9
    d.run()
    [ev] = [decode(e.type, e.payload) for s in d.sink.steps if s.input.actor == f"{P}/dp/0" for e in s.events
            if e.type == HbmFaultMasked.__name__]  # fmt: skip
    assert ev.blocks == tuple(range(10)) and ev.failed == ("t3:p",)  # held for the decode side, in blocks 0-9
    fins = {m.task_id: m for m in _msgs(d, TaskFinished)}
    lost = {x.task_id.removesuffix(":d") for x in fins.values() if x.status == "failed"}
    assert lost == {"t3"} and all("peer refused" in fins[f"{t}:d"].reason for t in lost)
    done = [t for t, m in fins.items() if t.endswith(":d") and m.status == "completed"]
    assert len(done) + len(lost) == 9 and done
    assert block_problems(d.actor(f"{P}/dp/0").state) == [] and not d.actor(f"{P}/dp/0").state.held
    assert_replays(d)
