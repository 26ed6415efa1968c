"""Properties of the performance model (hypothesis)."""

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from deepserve.adapters.hardware.batch import Batch, Parallel, Seq
from deepserve.adapters.hardware.compute import forward_time
from deepserve.adapters.hardware.fairshare import Flow, completion_times_s, max_min_rates
from deepserve.adapters.hardware.loading import local_load
from deepserve.adapters.hardware.models import model_profile
from deepserve.adapters.hardware.specs import link_spec, npu_spec, server_spec
from deepserve.adapters.hardware.stragglers import (
    sample_barrier_latencies_s,
    sample_expert_popularity,
)
from deepserve.adapters.hardware.transfer import (
    allreduce_time_s,
    path_time_s,
    transfer_time_s,
    ub_best_send_time_s,
)

FAST = settings(max_examples=60, deadline=None)

SETUPS = {
    "llama3-8b/910b/tp1": (model_profile("llama3-8b"), npu_spec("910b"), Parallel()),
    "llama3-70b/910b/tp8": (model_profile("llama3-70b"), npu_spec("910b"), Parallel(tp=8)),
    "deepseek-r1/910c/tp16": (model_profile("deepseek-r1"), npu_spec("910c"), Parallel(tp=16)),
    "deepseek-r1/910c/ep288": (
        model_profile("deepseek-r1"),
        npu_spec("910c"),
        Parallel(dp=288, ep=288, shared_expert_ranks=32, redundant_experts=256),
    ),
    # EP across four Gen1 servers: all-to-all over HCCS and RoCE, native routing (no EPLB)
    "deepseek-v3/910b/tp8-dp4-ep32": (
        model_profile("deepseek-v3"),
        npu_spec("910b"),
        Parallel(tp=8, dp=4, ep=32),
    ),
}

seqs = st.lists(
    st.builds(Seq, st.integers(1, 3000), st.integers(0, 40_000)), min_size=1, max_size=5
)


@st.composite
def batch_and_bigger(draw):
    """A batch and the same batch with more work: more new tokens, context, or sequences."""
    base = draw(seqs)
    i = draw(st.integers(0, len(base) - 1))
    how = draw(st.sampled_from(["new", "context", "seq"]))
    extra = draw(st.integers(1, 2000))
    bigger = list(base)
    if how == "new":
        bigger[i] = Seq(base[i].new_tokens + extra, base[i].context_tokens)
    elif how == "context":
        bigger[i] = Seq(base[i].new_tokens, base[i].context_tokens + extra)
    else:
        bigger.append(draw(st.builds(Seq, st.integers(1, 3000), st.integers(0, 40_000))))
    return Batch(seqs=tuple(base)), Batch(seqs=tuple(bigger))


@FAST
@given(st.sampled_from(sorted(SETUPS)), batch_and_bigger())
def test_more_tokens_is_never_faster(setup, batches):
    model, npu, par = SETUPS[setup]
    small, big = batches
    before = forward_time(model, npu, small, par).total_s
    assert forward_time(model, npu, big, par).total_s >= before


@FAST
@given(st.sampled_from(sorted(SETUPS)), seqs, st.floats(1.0, 8.0))
def test_more_hbm_bandwidth_is_never_slower(setup, batch_seqs, factor):
    model, npu, par = SETUPS[setup]
    faster = msgspec.structs.replace(npu, hbm_bw_bytes_per_s=npu.hbm_bw_bytes_per_s * factor)
    batch = Batch(seqs=tuple(batch_seqs))
    before = forward_time(model, npu, batch, par).total_s
    assert forward_time(model, faster, batch, par).total_s <= before


@FAST
@given(
    st.sampled_from(["ub", "hccs", "roce", "pcie", "vpc"]),
    st.floats(0, 1e11),
    st.integers(1, 10_000),
    st.integers(1, 64),
    st.floats(1.0, 10.0),
)
def test_more_link_bandwidth_is_never_slower(kind, nbytes, messages, ranks, factor):
    link = link_spec(kind)
    wide = msgspec.structs.replace(link, bw_bytes_per_s=link.bw_bytes_per_s * factor)
    ub = link_spec("ub")
    assert transfer_time_s(nbytes, wide, messages=messages) <= transfer_time_s(
        nbytes, link, messages=messages
    )
    assert path_time_s(nbytes, [wide, ub]) <= path_time_s(nbytes, [link, ub])
    assert allreduce_time_s(nbytes, ranks, wide) <= allreduce_time_s(nbytes, ranks, link)
    if kind == "ub":
        assert ub_best_send_time_s(nbytes, 2, wide) <= ub_best_send_time_s(nbytes, 2, link)


@settings(max_examples=20, deadline=None)
@given(st.floats(1.0, 8.0), st.integers(1, 8), st.booleans())
def test_more_host_bandwidth_never_slows_loading(factor, tp, hit):
    server = server_spec("gen1-910b")
    wide = msgspec.structs.replace(
        server, host_aggregate_bw_bytes_per_s=server.host_aggregate_bw_bytes_per_s * factor
    )
    m = model_profile("llama3-70b")
    before = local_load(m, server, tp, dram_hit=hit).seconds
    assert local_load(m, wide, tp, dram_hit=hit).seconds <= before


@st.composite
def network(draw):
    n_links = draw(st.integers(1, 6))
    links = [f"l{i}" for i in range(n_links)]
    caps = {name: draw(st.floats(0.1, 1000.0)) for name in links}
    n_flows = draw(st.integers(0, 8))
    flows = {}
    for f in range(n_flows):
        path = draw(st.lists(st.sampled_from(links), min_size=1, max_size=n_links, unique=True))
        flows[f"f{f}"] = path
    return caps, flows


@settings(max_examples=200, deadline=None)
@given(network())
def test_fair_sharing_conserves_capacity_and_bottlenecks_every_flow(net):
    caps, flows = net
    rates = max_min_rates(caps, flows)
    assert set(rates) == set(flows)
    load = {link: 0.0 for link in caps}
    for flow, path in flows.items():
        assert rates[flow] > 0
        for link in path:
            load[link] += rates[flow]
    for link, cap in caps.items():
        assert load[link] <= cap * (1 + 1e-9)  # no link over capacity
    for flow, path in flows.items():
        # a bottleneck: a saturated link on which no flow gets more than this one
        assert any(
            load[link] >= caps[link] * (1 - 1e-6)
            and all(rates[flow] >= rates[g] * (1 - 1e-6) for g, p in flows.items() if link in p)
            for link in path
        )


@settings(max_examples=100, deadline=None)
@given(network(), st.data())
def test_flows_never_finish_faster_than_alone(net, data):
    caps, paths = net
    flows = {
        name: Flow(
            path=tuple(p),
            nbytes=data.draw(st.floats(0, 1e4)),
            start_s=data.draw(st.floats(0, 5)),
        )
        for name, p in paths.items()
    }
    done = completion_times_s(caps, flows)
    assert set(done) == set(flows)
    for name, flow in flows.items():
        alone = flow.nbytes / min(caps[link] for link in flow.path)
        assert done[name] >= flow.start_s + alone * (1 - 1e-9)


@FAST
@given(st.integers(0, 2**32), st.floats(1e-6, 1e-3), st.floats(0, 1e-3), st.integers(0, 200))
def test_seeded_stragglers_are_deterministic(seed, base, wait, n):
    a = sample_barrier_latencies_s(base, wait, n, seed)
    assert a == sample_barrier_latencies_s(base, wait, n, seed)
    assert len(a) == n and all(base <= x <= 10 * base * (1 + 1e-12) for x in a)
    assert sample_expert_popularity(64, seed) == sample_expert_popularity(64, seed)


@FAST
@given(
    st.floats(0.0, 1e9), st.floats(0.0, 1e9), st.integers(2, 768), st.sampled_from([1, 8, 16]),
    st.floats(1.0, 8.0),
)
def test_all_to_all_on_spanned_links_is_monotone(b1, b2, ranks, server_npus, factor):
    """More bytes never cost less; a faster inter-server link never costs more; sending every
    peer over one RoCE NIC never costs less than the spanned layout. (Pricing every peer on the
    HCCS mesh is NOT an upper bound of the spanned cost: the RoCE NIC runs in parallel with the
    mesh and adds bandwidth — hypothesis found ranks=17, 16 NPUs a server, where they tie.)"""
    from deepserve.adapters.hardware.layout import Span
    from deepserve.adapters.hardware.moe import a2a_base_s

    hccs, roce = link_spec("hccs"), link_spec("roce")
    span = Span(intra=hccs, inter=roce, server_npus=server_npus)
    small, big = sorted((b1, b2))
    assert a2a_base_s(big, ranks, span) >= a2a_base_s(small, ranks, span)
    faster = Span(intra=hccs, server_npus=server_npus,
                  inter=msgspec.structs.replace(roce, bw_bytes_per_s=roce.bw_bytes_per_s * factor))
    assert a2a_base_s(big, ranks, faster) <= a2a_base_s(big, ranks, span) * (1 + 1e-12)
    assert a2a_base_s(big, ranks, span) <= a2a_base_s(big, ranks, Span.single(roce)) * (1 + 1e-12)
