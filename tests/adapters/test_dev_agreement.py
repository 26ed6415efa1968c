"""`hw predict`'s load rows and the device actors agree, row by row: the same shard bytes per
die and the same seconds, for dense TP layouts and expert-parallel ones (DeepSeek-V3 DP32/EP32
on a CloudMatrix384: 40.1 GB per die, not the whole model over a server's 16 dies); and a row
`hw predict` refuses (no seconds: an NPU-fork the link's domain cannot hold, RoCE between the
dies of a CloudMatrix384) is a fork the fabric refuses too."""

from __future__ import annotations

import math

import pytest
from dev_harness import answer_for, make_driver, send

from deepserve.actors.ports.host import HostFork, HostLoad, HostLoadDone, HostLoadFailed
from deepserve.adapters.hardware.devices.topology import (
    build,
    fork_link_kinds,
    host_addr,
    npu_addr,
)
from deepserve.adapters.hardware.models import model_profile
from deepserve.adapters.hardware.predict import predict, render
from deepserve.adapters.hardware.sizes import weight_bytes
from deepserve.adapters.hardware.specs import npu_spec, server_spec

RTOL = 1e-9  # the same arithmetic, up to float rounding of the fair-share steps

CASES = [
    ("llama3-70b", "910b", 4, 1, 1),
    ("llama3-70b", "910b", 4, 2, 1),  # two TEs load one server at once: they share it
    ("deepseek-v3", "910b", 8, 4, 32),  # EP32 over four Gen1 servers
    ("deepseek-v3", "910c", 1, 32, 32),  # the row: DP32/EP32 over two cm384 servers
    ("qwen2-72b", "910c", 4, 1, 1),
]


def _fork_pairs(kind: str, dies: int, per_server: int, first_free: int, fits: bool):
    """Sources (the running TE's first ranks) and targets for a fork over `kind`: inside
    server 0 when the link cannot leave it and the new TE fits there, else on a free server."""
    k = min(dies, per_server)
    if kind == "hccs" and fits:
        return [npu_addr(0, i) for i in range(k)], [npu_addr(0, dies + i) for i in range(k)]
    return [npu_addr(0, i) for i in range(k)], [npu_addr(first_free, i) for i in range(k)]


@pytest.mark.parametrize(("model", "npu", "tp", "dp", "ep"), CASES)
def test_every_load_row_of_hw_predict_is_what_the_actors_do(model, npu, tp, dp, ep):
    p = predict(model, npu, tp, dp=dp, ep=ep, batch_sizes=(1,), context_tokens=(1024,))
    rows = {r.path: r for r in p.loads}
    server = server_spec(npu_spec(npu).default_server)
    links = npu_spec(npu)
    # the fork rows are the link kinds the device actors route NPU data on: no row the
    # hardware lacks (a CloudMatrix384 has no npu-fork-roce row)
    assert list(rows) == ["ssd", "dram-hit", *(f"npu-fork-{k}" for k in fork_link_kinds(server.kind))]
    assert f"npu-fork-{links.scale_up_link}" in rows
    dies, per = tp * dp, server.npus
    layout_servers = math.ceil(dies / per)
    topo = build("gen1" if npu == "910b" else "cm384", layout_servers + 1)
    d = make_driver(topo)
    layout = {"tp": tp, "dp": dp, "ep": ep}
    for s in range(layout_servers):  # each server's host loads its own dies of the layout
        mine = tuple(npu_addr(s, j) for j in range(min(per, dies - s * per)))
        send(d, host_addr(s), HostLoad(req_id=f"ssd{s}", model=model, targets=mine, **layout))
        send(d, host_addr(s), HostLoad(req_id=f"hit{s}", model=model, targets=mine, **layout),
             at=1000.0)  # fmt: skip
    forks = [path.removeprefix("npu-fork-") for path in rows if path.startswith("npu-fork-")]
    for n, kind in enumerate(forks):
        fits = rows[f"npu-fork-{kind}"].seconds is not None
        src, dst = _fork_pairs(kind, dies, per, layout_servers, fits)
        fork = HostFork(req_id=f"fork-{kind}", model=model, sources=tuple(src),
                        targets=tuple(dst), via=kind, **layout)  # fmt: skip
        send(d, host_addr(0), fork, at=2000.0 + 100 * n)
    d.run()
    shard = int(p.weight_bytes_per_npu)
    got = {}
    for s in range(layout_servers):
        for req, path in ((f"ssd{s}", "ssd"), (f"hit{s}", "dram-hit")):
            done = answer_for(d, req)[1]
            assert isinstance(done, HostLoadDone) and done.path == path, done
            assert done.bytes_per_npu == shard
            got.setdefault(path, []).append(done.duration_s)
    for kind in forks:
        done = answer_for(d, f"fork-{kind}")[1]
        if rows[f"npu-fork-{kind}"].seconds is None:  # refused by both
            assert isinstance(done, HostLoadFailed) and kind in done.reason.lower(), done
            assert kind not in fork_link_kinds(server.kind) or kind == "hccs"
            continue
        assert isinstance(done, HostLoadDone) and done.bytes_per_npu == shard, done
        got[done.path] = [done.duration_s]
    timed = {path: r.seconds for path, r in rows.items() if r.seconds is not None}
    assert got.keys() == timed.keys()
    for path, seconds in got.items():
        assert seconds == pytest.approx([timed[path]] * len(seconds), rel=RTOL), path


def test_deepseek_v3_dp32_ep32_shard_is_40_gb_not_the_model_over_16_dies():
    """The issue's numbers: the layout's shard (40.1 GB, ~107 s from SSD) where splitting the
    whole model over a server's 16 targets gave 42.8 GB and ~114 s."""
    m = model_profile("deepseek-v3")
    d = make_driver(build("cm384", 2))
    dies = tuple(npu_addr(0, j) for j in range(16))
    send(d, host_addr(0), HostLoad(req_id="ep", model="deepseek-v3", targets=dies, tp=1, dp=32,
                                   ep=32))  # fmt: skip
    send(d, host_addr(1), HostLoad(req_id="even", model="deepseek-v3",
                                   targets=tuple(npu_addr(1, j) for j in range(16))))  # fmt: skip
    d.run()
    ep, even = answer_for(d, "ep")[1], answer_for(d, "even")[1]
    assert ep.bytes_per_npu / 1e9 == pytest.approx(40.1, abs=0.05)
    assert even.bytes_per_npu == weight_bytes(m) // 16 and even.bytes_per_npu / 1e9 > 42.7
    assert ep.duration_s == pytest.approx(107.2, abs=0.1) and even.duration_s > 113.0


def test_a_layout_the_model_cannot_take_is_refused_naming_the_field():
    d = make_driver(build("cm384", 1))
    dies = tuple(npu_addr(0, j) for j in range(4))
    send(d, host_addr(0), HostLoad(req_id="dense-ep", model="llama3-70b", targets=dies, tp=4,
                                   ep=4))  # fmt: skip
    send(d, host_addr(0), HostLoad(req_id="wide", model="deepseek-v3", targets=dies, tp=1, dp=2,
                                   ep=2))  # fmt: skip
    d.run()
    assert answer_for(d, "dense-ep")[1].reason.startswith("ep: llama3-70b is dense")
    assert answer_for(d, "wide")[1].reason == "targets: the layout has 2 dies (tp x dp), got 4"


def test_no_roce_fork_between_the_dies_of_a_cloudmatrix384_in_predict_or_fabric():
    """The cm384 topology routes NPU data over UB only (its RoCE plane leads to other
    SuperPods, not modeled): `hw predict` prints no RoCE fork row, the host fails it."""
    assert fork_link_kinds("cm384-910c") == ("ub",)
    assert fork_link_kinds("gen1-910b") == ("hccs", "roce")
    p = predict("deepseek-v3", "910c", 1, dp=32, ep=32, batch_sizes=(1,), context_tokens=(1,))
    assert [r.path for r in p.loads] == ["ssd", "dram-hit", "npu-fork-ub"]
    assert "roce" not in render(p)
    d = make_driver(build("cm384", 2))
    send(d, host_addr(0), HostFork(req_id="f", model="deepseek-v3", sources=(npu_addr(0, 0),),
                                   targets=(npu_addr(1, 0),), via="roce", tp=1, dp=32, ep=32))
    d.run()
    failed = answer_for(d, "f")[1]
    assert isinstance(failed, HostLoadFailed) and "over 'ub', got 'roce'" in failed.reason
