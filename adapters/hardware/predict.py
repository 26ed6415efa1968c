"""The quick-look table behind `deepserve hw predict --model M --npu N --tp T`.

predict() validates its input (ValueError naming the field) and returns structured rows;
render() turns them into a plain-text table. Both are pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from msgspec import Struct

from deepserve.adapters.hardware.batch import Parallel, decode_batch, prefill_batch, validate
from deepserve.adapters.hardware.compute import forward_time
from deepserve.adapters.hardware.devices.topology import fork_link_kinds
from deepserve.adapters.hardware.loading import local_load, npu_fork
from deepserve.adapters.hardware.memory import (
    RESERVE_FRACTION,
    kv_bytes_per_token_per_npu,
    kv_capacity_tokens,
    usable_hbm_bytes,
    weights_per_npu_bytes,
)
from deepserve.adapters.hardware.models import model_profile
from deepserve.adapters.hardware.specs import link_spec, npu_spec, server_spec

DEFAULT_BATCH_SIZES = (1, 8, 32, 64)
DEFAULT_CONTEXT_TOKENS = (1024, 4096, 16384)


class LatencyRow(Struct, frozen=True, kw_only=True):
    batch_size: int
    context_tokens: int
    prefill_s: float  # batch_size prompts of context_tokens, from an empty cache
    decode_step_s: float  # one token for each of batch_size sequences at that context
    decode_tokens_per_s: float
    fits_kv: bool  # batch_size x context_tokens fits the TP group's KV capacity


class LoadRow(Struct, frozen=True, kw_only=True):
    path: str
    seconds: float


class Prediction(Struct, frozen=True, kw_only=True):
    model: str
    npu: str
    server: str
    tp: int
    dp: int
    ep: int
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
) -> Prediction:
    """Predicted latencies, KV capacity and load times of `model` on `tp` NPUs of kind `npu`
    (times `dp` data-parallel groups with experts spread over `ep` ranks, for MoE models:
    ep = 1, or ep = dp x tp as in xDeepServe §7.1's DP288/EP288). Batch sizes are per DP group."""
    m = model_profile(model)
    spec = npu_spec(npu)
    server = server_spec(spec.default_server)
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise ValueError(f"tp: must be a positive integer, got {tp!r}")
    if tp > server.npus:
        raise ValueError(f"tp: {tp} exceeds the {server.npus} NPUs of one {server.kind} server")
    sizes = _positive_ints("batch_sizes", batch_sizes)
    contexts = _positive_ints("context_tokens", context_tokens)
    par = _layout(m.moe is not None, tp, dp, ep)
    par = _experts(par, shared_expert_ranks, redundant_experts)
    validate(m, decode_batch(1, 1), par)
    usable = usable_hbm_bytes(spec, reserve_fraction)
    weights = weights_per_npu_bytes(m, par)
    if weights >= usable:
        raise ValueError(
            f"tp: {model} needs {weights / 1e9:.1f} GB of weights per NPU at tp={tp}, more than "
            f"the {usable / 1e9:.1f} GB usable on a {npu}; use a larger tp"
            + (" or ep" if m.moe is not None else "")
        )
    capacity = kv_capacity_tokens(m, spec, par, reserve_fraction)
    rows = []
    for b in sizes:
        for c in contexts:
            prefill = forward_time(m, spec, prefill_batch(b, c), par).total_s
            decode = forward_time(m, spec, decode_batch(b, c), par).total_s
            rows.append(LatencyRow(
                batch_size=b, context_tokens=c, prefill_s=prefill, decode_step_s=decode,
                decode_tokens_per_s=b / decode, fits_kv=b * c <= capacity,
            ))  # fmt: skip
    # Every NPU of a server loads its own shard at once: they share the server's PCIe side.
    shard, loaders = int(weights), min(server.npus, tp * dp)
    # NPU-fork only over links the cluster's topology routes NPU data on (devices/topology.py).
    loads = (
        local_load(m, server, tp, dram_hit=False, loaders=loaders, bytes_per_npu=shard),
        local_load(m, server, tp, dram_hit=True, loaders=loaders, bytes_per_npu=shard),
        *(npu_fork(m, link_spec(k), tp, bytes_per_npu=shard) for k in fork_link_kinds(server.kind)),
    )
    return Prediction(
        model=model,
        npu=npu,
        server=server.kind,
        tp=tp,
        dp=dp,
        ep=ep,
        weight_bytes_per_npu=weights,
        usable_hbm_bytes=usable,
        kv_bytes_per_token_per_npu=kv_bytes_per_token_per_npu(m, par),
        kv_capacity_tokens=capacity,
        latency=tuple(rows),
        loads=tuple(LoadRow(path=e.path, seconds=e.seconds) for e in loads),
    )


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
    lines = [
        f"{p.model} on {p.npu}, {layout} ({p.server} server)",
        f"weights per NPU      {p.weight_bytes_per_npu / 1e9:10.2f} GB",
        f"usable HBM per NPU   {p.usable_hbm_bytes / 1e9:10.2f} GB",
        f"KV per token per NPU {p.kv_bytes_per_token_per_npu / 1024:10.2f} KiB",
        f"KV capacity          {p.kv_capacity_tokens:10,d} tokens",
        "",
        f"{'batch':>6} {'context':>8} {'prefill_ms':>11} {'decode_ms':>10} {'decode_tok/s':>13} "
        f"{'fits_kv':>7}",
    ]
    for r in p.latency:
        lines.append(
            f"{r.batch_size:>6d} {r.context_tokens:>8d} {r.prefill_s * 1e3:>11.1f} "
            f"{r.decode_step_s * 1e3:>10.2f} {r.decode_tokens_per_s:>13.1f} "
            f"{'yes' if r.fits_kv else 'no':>7}"
        )
    lines += ["", f"{'load path':<16} {'seconds':>8}"]
    lines += [f"{row.path:<16} {row.seconds:>8.2f}" for row in p.loads]
    return "\n".join(lines) + "\n"
