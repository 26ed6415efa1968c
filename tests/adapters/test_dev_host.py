"""The host actor: DRAM page cache (LRU, hit vs miss), loads through the fabric with PCIe shared
among concurrent loaders, tensor initialisation, and NPU-fork (broadcast) — against loading.py."""

from __future__ import annotations

import anyio
import pytest
from dev_harness import answer_for, assert_state_is_fold, events, make_driver, send

from deepserve.actors.ports.faults import LinkDown
from deepserve.actors.ports.host import (
    HostEvict,
    HostEvicted,
    HostFork,
    HostLoad,
    HostLoadDone,
    HostLoadFailed,
    HostPreload,
    HostPreloaded,
    HostProbe,
    HostStatus,
)
from deepserve.adapters.hardware.devices.fabric import Fabric
from deepserve.adapters.hardware.devices.host import Host
from deepserve.adapters.hardware.devices.topology import FABRIC, gen1_cluster, npu_addr
from deepserve.adapters.hardware.loading import TENSOR_INIT_S, local_load, npu_fork
from deepserve.adapters.hardware.models import model_profile
from deepserve.adapters.hardware.sizes import weight_bytes
from deepserve.adapters.hardware.specs import link_spec, server_spec
from deepserve.core import Actor, MemorySink, SimDriver
from deepserve.core.asyncdriver import AsyncDriver

HOST = "hw/s0/host"
SERVER = server_spec("gen1-910b")
# The fabric and loading.local_load charge the same setup and control cost: equal up to
# float rounding of the fair-share arithmetic.
LOAD_RTOL = 1e-9


def _driver(servers: int = 1, dram_bytes: int | None = None):
    d = make_driver()
    d.spawn(FABRIC, Fabric, cluster="gen1", servers=servers)
    for s in range(servers):
        d.spawn(f"hw/s{s}/host", Host, server=s, dram_bytes=dram_bytes)
    return d


def _npus(n: int, server: int = 0, first: int = 0) -> tuple[str, ...]:
    return tuple(npu_addr(server, first + i) for i in range(n))


def _wbytes(model: str) -> int:
    return weight_bytes(model_profile(model))


def test_miss_reads_ssd_and_fills_the_cache_then_a_hit_reads_dram():
    d = _driver()
    m = model_profile("llama3-70b")
    send(d, HOST, HostLoad(req_id="cold", model="llama3-70b", targets=_npus(8)))
    send(d, HOST, HostLoad(req_id="warm", model="llama3-70b", targets=_npus(8)), at=100.0)
    send(d, HOST, HostProbe(req_id="p"), at=200.0)
    d.run()
    cold, warm = answer_for(d, "cold")[1], answer_for(d, "warm")[1]
    assert isinstance(cold, HostLoadDone) and cold.path == "ssd" and warm.path == "dram-hit"
    miss, hit = local_load(m, SERVER, 8, dram_hit=False), local_load(m, SERVER, 8, dram_hit=True)
    assert cold.duration_s == pytest.approx(miss.seconds, rel=LOAD_RTOL)
    assert warm.duration_s == pytest.approx(hit.seconds, rel=LOAD_RTOL)
    assert cold.bytes_per_npu == miss.bytes_per_npu and cold.targets == _npus(8)
    status = answer_for(d, "p")[1]
    assert isinstance(status, HostStatus) and status.cached == ("llama3-70b",)
    assert d.actor(HOST).state.hits == 1 and d.actor(HOST).state.misses == 1
    assert_state_is_fold(d, HOST)


def test_concurrent_loads_share_the_host_side():
    d = _driver()
    send(d, HOST, HostPreload(req_id="pre", model="llama2-13b"))
    send(d, HOST, HostLoad(req_id="a", model="llama2-13b", targets=_npus(4)), at=50.0)
    send(d, HOST, HostLoad(req_id="b", model="llama2-13b", targets=_npus(4, first=4)), at=50.0)
    d.run()
    shared = local_load(model_profile("llama2-13b"), SERVER, 4, dram_hit=True, loaders=8)
    alone = local_load(model_profile("llama2-13b"), SERVER, 4, dram_hit=True)
    for req in ("a", "b"):
        assert answer_for(d, req)[1].duration_s == pytest.approx(shared.seconds, rel=LOAD_RTOL)
    assert shared.seconds > alone.seconds


def test_preload_lru_eviction_and_explicit_evict():
    small = _wbytes("llama2-7b")
    d = _driver(dram_bytes=small * 2 + _wbytes("llama2-13b") // 2)  # room for two 7B-sized files
    send(d, HOST, HostPreload(req_id="p7", model="llama2-7b"))
    send(d, HOST, HostPreload(req_id="p8", model="llama3-8b"), at=20.0)
    send(d, HOST, HostLoad(req_id="use7", model="llama2-7b", targets=_npus(1)), at=40.0)  # touch
    send(d, HOST, HostPreload(req_id="p7again", model="llama2-7b"), at=60.0)
    send(d, HOST, HostPreload(req_id="p13", model="llama2-13b"), at=80.0)  # evicts LRU: 8b
    send(d, HOST, HostProbe(req_id="probe"), at=120.0)
    send(d, HOST, HostEvict(req_id="ev", model="llama2-13b"), at=121.0)
    send(d, HOST, HostEvict(req_id="ev-none", model="llama3-8b"), at=121.0)
    d.run()
    p7 = answer_for(d, "p7")[1]
    assert isinstance(p7, HostPreloaded) and not p7.hit
    assert p7.duration_s == pytest.approx(small / SERVER.ssd_read_bw_bytes_per_s, rel=1e-12)
    assert answer_for(d, "use7")[1].path == "dram-hit"
    assert answer_for(d, "p7again")[1] == HostPreloaded(
        req_id="p7again", model="llama2-7b", hit=True, duration_s=0.0, evicted=()
    )
    assert answer_for(d, "p13")[1].evicted == ("llama3-8b",)
    assert answer_for(d, "probe")[1].cached == ("llama2-7b", "llama2-13b")
    assert answer_for(d, "ev")[1] == HostEvicted(
        req_id="ev", model="llama2-13b", nbytes=_wbytes("llama2-13b")
    )
    assert answer_for(d, "ev-none")[1].nbytes == 0
    assert d.actor(HOST).state.dram_bytes_used() == small
    assert_state_is_fold(d, HOST)


def test_npu_fork_over_hccs_and_roce_broadcasts_to_every_new_te():
    d = _driver(servers=3)
    m = model_profile("llama3-70b")
    src = _npus(4)
    send(
        d, HOST, HostFork(req_id="hccs", model="llama3-70b", sources=src, targets=_npus(4, first=4))
    )
    two_tes = _npus(4, server=1) + _npus(4, server=2)
    send(
        d,
        "hw/s1/host",
        HostFork(req_id="roce", model="llama3-70b", sources=src, targets=two_tes, via="roce"),
        at=10.0,
    )
    d.run()
    hccs, roce = answer_for(d, "hccs")[1], answer_for(d, "roce")[1]
    assert hccs.path == "npu-fork-hccs" and roce.path == "npu-fork-roce"
    assert hccs.duration_s == pytest.approx(npu_fork(m, link_spec("hccs"), 4).seconds, rel=1e-12)
    assert roce.duration_s == pytest.approx(
        npu_fork(m, link_spec("roce"), 4, targets=2).seconds, rel=1e-12
    )
    assert roce.targets == two_tes and roce.bytes_per_npu == _wbytes("llama3-70b") // 4


def test_a_link_going_down_fails_the_load():
    d = _driver()
    send(d, HOST, HostLoad(req_id="l", model="llama3-70b", targets=_npus(8)))
    send(d, FABRIC, LinkDown(link="s0/npu3/pcie"), at=1.0)
    d.run()
    t, msg = answer_for(d, "l")
    assert isinstance(msg, HostLoadFailed) and t == 1.0
    assert "s0/npu3/pcie went down" in msg.reason
    st = d.actor(HOST).state
    assert st.jobs == {} and st.loads_failed == 1 and st.cache == ()  # a failed read fills nothing
    assert [type(e).__name__ for e in events(d, HOST)][-1] == "HostJobEnded"
    # The other seven ranks' transfers were cancelled at once: nothing holds bandwidth on.
    fabric = d.actor(FABRIC).state
    assert fabric.xfers == {}
    failed = [e for e in events(d, FABRIC) if type(e).__name__ == "FabricXferFailed"]
    assert len(failed) == 8 and all(e.at_s == 1.0 for e in failed)
    assert sum(e.reason == "cancelled by the requester" for e in failed) == 7
    assert d.now == 1.0  # no transfer ran on to its end


def test_bad_load_requests_are_precise():
    d = _driver(dram_bytes=100 * 10**9)
    send(d, HOST, HostLoad(req_id="m", model="gpt-9", targets=_npus(1)))
    send(d, HOST, HostLoad(req_id="none", model="llama2-7b", targets=()))
    send(
        d,
        HOST,
        HostFork(req_id="k", model="llama2-7b", sources=_npus(2), targets=_npus(3, first=2)),
    )
    send(d, HOST, HostPreload(req_id="huge", model="llama3-70b"))
    d.run()
    assert "unknown model 'gpt-9'" in answer_for(d, "m")[1].reason
    assert answer_for(d, "none")[1].reason.startswith("targets:")
    assert answer_for(d, "k")[1].reason == "targets: need k x 2 target NPUs, got 3"
    assert "exceeds DRAM" in answer_for(d, "huge")[1].reason


def test_tensor_init_is_part_of_every_load():
    d = _driver(servers=1)
    send(
        d,
        HOST,
        HostFork(req_id="f", model="llama2-7b", sources=_npus(1), targets=_npus(1, first=1)),
    )
    d.run()
    got = answer_for(d, "f")[1].duration_s
    transfer = npu_fork(model_profile("llama2-7b"), link_spec("hccs"), 1).transfer_s
    assert got - transfer == pytest.approx(TENSOR_INIT_S, rel=1e-9)
    assert gen1_cluster(1).npus()[1] == "hw/s0/npu1"


def test_a_file_larger_than_dram_is_read_through_without_caching():
    d = _driver(dram_bytes=10 * 10**9)
    send(d, HOST, HostLoad(req_id="l", model="llama3-70b", targets=_npus(8)))
    d.run()
    assert answer_for(d, "l")[1].path == "ssd"
    assert d.actor(HOST).state.cache == () and d.actor(HOST).state.misses == 1


class Void(Actor[None]):
    """A fabric that never answers (hung, or its answers are lost)."""

    def handle(self, ctx, msg) -> None:
        return


def test_a_transfer_the_fabric_mailbox_drops_fails_the_load_at_once():
    """One fabric for a whole SuperPod has a bounded mailbox: a load whose transfer is dropped
    must still end (it used to wait forever)."""
    d = SimDriver(seed=0, sink=MemorySink(), mailbox_capacity=4)
    d.spawn(FABRIC, Fabric, cluster="gen1", servers=1)
    d.spawn(HOST, Host, server=0)
    send(d, HOST, HostLoad(req_id="l", model="llama3-70b", targets=_npus(8)))
    d.run()
    t, msg = answer_for(d, "l")  # exactly one answer
    assert isinstance(msg, HostLoadFailed) and t == 0.0
    assert "no answer from hw/fabric: target mailbox is full" in msg.reason
    assert d.actor(HOST).state.jobs == {} and d.actor(HOST).state.loads_failed == 1
    assert d.actor(FABRIC).state.xfers == {}  # the transfers that got in were cancelled
    assert_state_is_fold(d, HOST)


def test_a_fabric_that_never_answers_times_the_load_out():
    d = make_driver()
    d.spawn("hw/void", Void)
    d.spawn(HOST, Host, server=0, fabric="hw/void", load_timeout_s=30.0)
    d.spawn("hw/s1/host", Host, server=1, fabric="hw/nobody")  # no actor there at all
    send(d, HOST, HostLoad(req_id="l", model="llama2-7b", targets=_npus(2)))
    send(d, HOST, HostFork(req_id="f", model="llama2-7b", sources=_npus(1), targets=_npus(1, first=1)))
    send(d, "hw/s1/host", HostLoad(req_id="dead", model="llama2-7b", targets=_npus(1, server=1)))
    d.run()
    for req in ("l", "f"):
        t, msg = answer_for(d, req)
        assert isinstance(msg, HostLoadFailed) and t == 30.0
        assert msg.reason.endswith("no answer from hw/void: timeout after 30.0s")
    t, msg = answer_for(d, "dead")
    assert t == 0.0 and msg.reason.endswith("no answer from hw/nobody: target is dead")
    assert d.actor(HOST).state.jobs == {}


def test_the_default_load_timeout_leaves_slow_shared_loads_alone():
    """Eight TP1 loads of one model share the server's SSD: each takes ~8x its lone time, and
    none is cut short by the default timeout."""
    d = _driver()
    for j in range(8):
        send(d, HOST, HostLoad(req_id=f"l{j}", model="llama3-8b", targets=_npus(1, first=j)))
    d.run()
    done = [answer_for(d, f"l{j}")[1] for j in range(8)]
    assert all(isinstance(m, HostLoadDone) for m in done)
    alone = local_load(model_profile("llama3-8b"), SERVER, 1, dram_hit=False)
    assert min(m.duration_s for m in done) > 7 * alone.transfer_s


async def test_under_asyncdriver_a_load_whose_transfers_are_dropped_still_answers():
    """The daemon's driver: one fabric, bounded mailboxes, a 16-die load that overflows it."""
    dies = tuple(npu_addr(0, j) for j in range(16))
    async with AsyncDriver(seed=1, mailbox_capacity=8) as d:
        d.spawn(FABRIC, Fabric, cluster="cm384", servers=1)
        d.spawn(HOST, Host, server=0, server_kind="cm384-910c")
        await d.idle()
        reply = await d.ask(HOST, HostLoad(req_id="l", model="llama3-8b", targets=dies), 5.0)
        # What got in was cancelled, or (a cancel dropped at the full mailbox: the host is told
        # with `Undelivered`) ran to its end: either way the fabric holds nothing afterwards.
        # (Not `idle(timers=True)`: answers dropped at the host's full mailbox leave its asks
        # to time out, ~72 s of wall clock that tell nothing about the fabric.)
        with anyio.fail_after(30):
            while d.actor(FABRIC).state.xfers:
                await anyio.sleep(0.05)
    assert isinstance(reply, HostLoadFailed), reply
    assert "target mailbox is full" in reply.reason
