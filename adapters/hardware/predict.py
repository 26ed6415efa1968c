"""The quick-look table behind `deepserve hw predict --model M --npu N --tp T`.

predict() validates its input (ValueError naming the field; a layout the cluster cannot hold is
refused naming the limit and its source) and returns structured rows; render() turns them into
a plain-text table. Both are pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from msgspec import Struct

from deepserve.adapters.hardware.batch import Parallel, decode_batch, prefill_batch, validate
from deepserve.adapters.hardware.compute import forward_time
from deepserve.adapters.hardware.layout import (
    Cluster,
    check_layout,
    check_scale_up_domain,
    cluster_for,
)
from deepserve.adapters.hardware.loading import local_load, npu_fork
from deepserve.adapters.hardware.memory import (
    RESERVE_FRACTION,
    activation_bytes,
    kv_bytes_per_token_per_npu,
    kv_capacity_tokens,
    usable_hbm_bytes,
    weights_per_npu_bytes,
)
from deepserve.adapters.hardware.models import ModelProfile, model_profile
from deepserve.adapters.hardware.mtp import mtp_decode_iteration
from deepserve.adapters.hardware.specs import NpuSpec, link_spec, npu_spec
from deepserve.adapters.hardware.transfer import transfer_time_s

DEFAULT_BATCH_SIZES = (1, 8, 32, 64)
DEFAULT_CONTEXT_TOKENS = (1024, 4096, 16384)


PD_LINKS = ("roce", "hccs", "ub")


class LatencyRow(Struct, frozen=True, kw_only=True):
    batch_size: int
    context_tokens: int
    prefill_s: float  # batch_size prompts of context_tokens, from an empty cache
    decode_step_s: float  # one token for each of batch_size sequences at that context
    # None when the cell does not fit in HBM: a throughput it cannot reach is not printed.
    decode_tokens_per_s: float | None
    # batch_size x context_tokens of KV plus the prefill's activations fit the HBM left after
    # weights and the reserve (memory.activation_bytes)
    fits_kv: bool
    activation_bytes: float  # peak activations of the cell's prefill on one NPU
    mtp_tpot_s: float | None = None  # with --mtp: (MTP iteration) / (1 + acceptance)
    mtp_tokens_per_s: float | None = None  # per DP group; None when the cell does not fit
    kv_transfer_s: float | None = None  # with --pd-link: the batch's KV, prefill TE -> decode TE
    ttft_s: float | None = None  # prefill + KV transfer + first decode step (a PD pair)


class LoadRow(Struct, frozen=True, kw_only=True):
    path: str
    seconds: float | None  # None: the layout cannot use this path (see `refused`)
    refused: str = ""


class Prediction(Struct, frozen=True, kw_only=True):
    model: str
    npu: str
    server: str
    cluster: str
    servers: int
    tp: int
    dp: int
    ep: int
    mtp_acceptance: float | None
    pd_link: str | None
    weight_bytes_per_npu: float
    usable_hbm_bytes: float
    kv_bytes_per_token_per_npu: float
    kv_capacity_tokens: int
    latency: tuple[LatencyRow, ...]
    loads: tuple[LoadRow, ...]


def _positive_ints(field: str, values: Sequence[int]) -> tuple[int, ...]:
    if not values:
        raise ValueError(f"{field}: must list at least one value")
    for v in values:
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{field}: every value must be a positive integer, got {v!r}")
    return tuple(values)


def predict(
    model: str,
    npu: str,
    tp: int,
    *,
    dp: int = 1,
    ep: int = 1,
    shared_expert_ranks: int = 0,
    redundant_experts: int = 0,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    context_tokens: Sequence[int] = DEFAULT_CONTEXT_TOKENS,
    reserve_fraction: float = RESERVE_FRACTION,
    cluster: str | None = None,
    servers: int | None = None,
    mtp_acceptance: float | None = None,
    pd_link: str | None = None,
    fork_targets: int = 1,
) -> Prediction:
    """Predicted latencies, KV capacity and load times of `model` on `tp` NPUs of kind `npu`
    (times `dp` data-parallel groups with experts spread over `ep` ranks, for MoE models:
    ep = 1, or ep = dp x tp as in xDeepServe §7.1's DP288/EP288). Batch sizes are per DP group.

    The layout must fit `cluster` (default: Gen1 for 910b, CloudMatrix384 for 910c) with
    `servers` servers. `mtp_acceptance` adds MTP decode (one draft, xDeepServe §4.6);
    `pd_link` adds the TTFT of a PD pair of this layout whose KV moves over that link;
    `fork_targets` new TEs are forked at once (a broadcast) in the npu-fork rows."""
    m = model_profile(model)
    spec = npu_spec(npu)
    where = cluster_for(spec, cluster, servers)
    server = where.server
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ValueError(f"tp: must be a positive integer, got {tp!r}")
    if tp > server.npus:
        raise ValueError(f"tp: {tp} exceeds the {server.npus} NPUs of one {server.kind} server")
    sizes = _positive_ints("batch_sizes", batch_sizes)
    contexts = _positive_ints("context_tokens", context_tokens)
    par = _layout(m.moe is not None, tp, dp, ep)
    par = _experts(par, shared_expert_ranks, redundant_experts)
    check_layout(m, par, where)
    validate(m, decode_batch(1, 1), par)
    _check_extras(m, par, where, mtp_acceptance, pd_link, fork_targets)
    usable = usable_hbm_bytes(spec, reserve_fraction)
    weights = weights_per_npu_bytes(m, par)
    if weights >= usable:
        raise ValueError(
            f"tp: {model} needs {weights / 1e9:.1f} GB of weights per NPU at tp={tp}, more than "
            f"the {usable / 1e9:.1f} GB usable on a {npu}; use a larger tp"
            + (" or ep" if m.moe is not None else "")
        )
    rows = tuple(
        _row(m, spec, par, b, c, usable - weights, mtp_acceptance, pd_link)
        for b in sizes
        for c in contexts
    )
    # Every NPU of a server loads its own shard at once: they share the server's PCIe side.
    shard, loaders = int(weights), min(server.npus, tp * dp)
    loads = (
        local_load(m, server, tp, dram_hit=False, loaders=loaders, bytes_per_npu=shard),
        local_load(m, server, tp, dram_hit=True, loaders=loaders, bytes_per_npu=shard),
        *(
            npu_fork(m, link_spec(kind), tp, bytes_per_npu=shard, targets=fork_targets)
            for kind in fork_links(where)
        ),
    )
    load_rows = tuple(_load_row(e.path, e.seconds, par, where, fork_targets) for e in loads)
    return Prediction(
        model=model,
        npu=npu,
        server=server.kind,
        cluster=where.spec.kind,
        servers=where.servers,
        tp=tp,
        dp=dp,
        ep=ep,
        mtp_acceptance=mtp_acceptance,
        pd_link=pd_link,
        weight_bytes_per_npu=weights,
        usable_hbm_bytes=usable,
        kv_bytes_per_token_per_npu=kv_bytes_per_token_per_npu(m, par),
        kv_capacity_tokens=kv_capacity_tokens(m, spec, par, reserve_fraction),
        latency=rows,
        loads=load_rows,
    )


def _check_extras(
    m: ModelProfile, par: Parallel, where: Cluster,
    mtp_acceptance: float | None, pd_link: str | None, fork_targets: int,
) -> None:  # fmt: skip
    if mtp_acceptance is not None:
        if m.mtp_layers == 0:
            raise ValueError(f"mtp: {m.name} ships no MTP module (num_nextn_predict_layers 0)")
        number = isinstance(mtp_acceptance, int | float) and not isinstance(mtp_acceptance, bool)
        if not number or not 0.0 <= mtp_acceptance <= 1.0:
            raise ValueError(f"mtp: acceptance must be in [0, 1], got {mtp_acceptance!r}")
    if pd_link is not None:
        if pd_link not in PD_LINKS:
            raise ValueError(f"pd_link: must be one of {', '.join(PD_LINKS)}, got {pd_link!r}")
        # The prefill TE and the decode TE (the same layout) must share the link's domain.
        pair = 2 * par.dp * par.tp * par.pp
        check_scale_up_domain(link_spec(pd_link), pair, where, "pd_link")
    if not isinstance(fork_targets, int) or isinstance(fork_targets, bool) or fork_targets < 1:
        raise ValueError(f"fork_targets: must be a positive integer, got {fork_targets!r}")


def _row(
    m: ModelProfile, spec: NpuSpec, par: Parallel, b: int, c: int, free_bytes: float,
    mtp_acceptance: float | None, pd_link: str | None,
) -> LatencyRow:  # fmt: skip
    """One cell of the grid: b prompts of c tokens, then decoding them at context c."""
    prefill_batch_ = prefill_batch(b, c)
    prefill = forward_time(m, spec, prefill_batch_, par).total_s
    decode = forward_time(m, spec, decode_batch(b, c), par).total_s
    act = activation_bytes(m, prefill_batch_, par)
    kv_per_token = kv_bytes_per_token_per_npu(m, par)
    fits = b * c * kv_per_token + act <= free_bytes
    extra: dict[str, float | None] = {}
    if mtp_acceptance is not None:
        it = mtp_decode_iteration(m, spec, batch_size=b, context_tokens=c, par=par,
                                  acceptance=mtp_acceptance)  # fmt: skip
        extra["mtp_tpot_s"] = it.tpot_s
        extra["mtp_tokens_per_s"] = it.tokens_per_s if fits else None
    if pd_link is not None:
        # Block-free (contiguous) transfer, every NPU of the prefill TE to its peer of the
        # decode TE at once (P/D-Serve §2, §3.6): each moves its own share of the batch's KV.
        transfer = transfer_time_s(b * c * kv_per_token, link_spec(pd_link))
        extra["kv_transfer_s"] = transfer
        extra["ttft_s"] = prefill + transfer + decode
    return LatencyRow(
        batch_size=b, context_tokens=c, prefill_s=prefill, decode_step_s=decode,
        decode_tokens_per_s=b / decode if fits else None, fits_kv=fits, activation_bytes=act,
        **extra,
    )  # fmt: skip


def fork_links(where: Cluster) -> tuple[str, ...]:
    """The link kinds between the NPUs of `where`, scale-up first: the npu-fork rows. Only
    links the cluster has (a CloudMatrix384 moves NPU data over UB alone — its RoCE plane
    leads to other SuperPods, xDeepServe §2.2 — so it has no npu-fork-roce row; the device
    actors route NPU data on the same kinds, `devices.topology.fork_link_kinds`)."""
    return tuple(dict.fromkeys((where.server.intra_link, where.server.inter_link)))


def _load_row(path: str, seconds: float, par: Parallel, where: Cluster, targets: int) -> LoadRow:
    """An NPU-fork row whose source and target TEs cannot share the link's domain is refused
    (HCCS stays inside one Gen1 server), with the limit named."""
    if not path.startswith("npu-fork-"):
        return LoadRow(path=path, seconds=seconds)
    npus = (targets + 1) * par.dp * par.tp * par.pp
    try:
        check_scale_up_domain(link_spec(path.removeprefix("npu-fork-")), npus, where, path)
    except ValueError as exc:
        return LoadRow(path=path, seconds=None, refused=str(exc))
    return LoadRow(path=path, seconds=seconds)


def _layout(moe: bool, tp: int, dp: int, ep: int) -> Parallel:
    for field, v in (("dp", dp), ("ep", ep)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{field}: must be a positive integer, got {v!r}")
    if ep > 1 and not moe:
        raise ValueError(f"ep: {ep} > 1 needs a mixture-of-experts model")
    if ep not in (1, tp * dp):
        raise ValueError(f"ep: must be 1 or dp x tp = {tp * dp} (experts on the attention ranks)")
    return Parallel(tp=tp, dp=dp, ep=ep)


def _experts(par: Parallel, shared_ranks: int, redundant: int) -> Parallel:
    """xDeepServe §7.1 serves shared experts on dedicated ranks and adds redundant expert
    replicas (EPLB, §4.5): both change the hottest rank's load, hence decode time."""
    for field, v in (("shared_expert_ranks", shared_ranks), ("redundant_experts", redundant)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{field}: must be a non-negative integer, got {v!r}")
    if (shared_ranks or redundant) and par.ep == 1:
        raise ValueError("ep: shared_expert_ranks and redundant_experts need ep > 1")
    if shared_ranks >= par.ep:
        raise ValueError(f"shared_expert_ranks: {shared_ranks} leaves no routed-expert rank of {par.ep}")
    return Parallel(tp=par.tp, dp=par.dp, ep=par.ep, shared_expert_ranks=shared_ranks,
                    redundant_experts=redundant)


def render(p: Prediction) -> str:
    """Plain-text table of a Prediction."""
    layout = f"TP{p.tp}" + (f" DP{p.dp}" if p.dp > 1 else "") + (f" EP{p.ep}" if p.ep > 1 else "")
    extras = (f", MTP acceptance {p.mtp_acceptance:g}" if p.mtp_acceptance is not None else "")
    extras += f", PD pair over {p.pd_link}" if p.pd_link is not None else ""
    lines = [
        f"{p.model} on {p.npu}, {layout} ({p.server} server, {p.servers}-server {p.cluster} "
        f"cluster){extras}",
        f"weights per NPU      {p.weight_bytes_per_npu / 1e9:10.2f} GB",
        f"usable HBM per NPU   {p.usable_hbm_bytes / 1e9:10.2f} GB",
        f"KV per token per NPU {p.kv_bytes_per_token_per_npu / 1024:10.2f} KiB",
        f"KV capacity          {p.kv_capacity_tokens:10,d} tokens",
        "",
        _header(p),
    ]
    lines += [_render_row(p, r) for r in p.latency]
    lines += ["", f"{'load path':<16} {'seconds':>8}"]
    for row in p.loads:
        seconds = "n/a" if row.seconds is None else f"{row.seconds:.2f}"
        note = f"  {row.refused}" if row.refused else ""
        lines.append(f"{row.path:<16} {seconds:>8}{note}")
    return "\n".join(lines) + "\n"


# A cell that does not fit shows this instead of a throughput it cannot reach.
NO_FIT = "no-fit"


def _header(p: Prediction) -> str:
    cols = f"{'batch':>6} {'context':>8} {'prefill_ms':>11} {'decode_ms':>10} {'decode_tok/s':>13}"
    if p.mtp_acceptance is not None:
        cols += f" {'mtp_tpot_ms':>11} {'mtp_tok/s':>10}"
    if p.pd_link is not None:
        cols += f" {'kv_xfer_ms':>10} {'ttft_ms':>10}"
    return cols + f" {'act_GB':>7} {'fits_kv':>7}"


def _num(value: float | None, width: int, digits: int) -> str:
    return f"{NO_FIT:>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def _render_row(p: Prediction, r: LatencyRow) -> str:
    text = (
        f"{r.batch_size:>6d} {r.context_tokens:>8d} {r.prefill_s * 1e3:>11.1f} "
        f"{r.decode_step_s * 1e3:>10.2f} {_num(r.decode_tokens_per_s, 13, 1)}"
    )
    if p.mtp_acceptance is not None:
        text += f" {(r.mtp_tpot_s or 0.0) * 1e3:>11.2f} {_num(r.mtp_tokens_per_s, 10, 1)}"
    if p.pd_link is not None:
        text += f" {(r.kv_transfer_s or 0.0) * 1e3:>10.2f} {(r.ttft_s or 0.0) * 1e3:>10.1f}"
    return text + f" {r.activation_bytes / 1e9:>7.2f} {'yes' if r.fits_kv else 'no':>7}"
