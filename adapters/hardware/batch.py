"""What a forward pass runs (a batch of sequences) and where (a parallel layout)."""

from __future__ import annotations

from msgspec import Struct

from deepserve.adapters.hardware.models import ModelProfile

# Decode batches (one new token per sequence, or 1 + up to 3 MTP drafts being verified) have
# small static shapes and run as a compiled graph; anything longer is a prefill chunk and runs in
# single-op mode (xDeepServe §2.3). Assumption: at most 3 speculative drafts in graph mode.
GRAPH_MAX_NEW_TOKENS = 4


class Seq(Struct, frozen=True):
    """One sequence in a batch: tokens computed now, on top of tokens already in the KV cache."""

    new_tokens: int
    context_tokens: int = 0


class Batch(Struct, frozen=True):
    """The batch of ONE DP group (all TP ranks of the group run it together)."""

    seqs: tuple[Seq, ...]

    @property
    def tokens(self) -> int:
        return sum(s.new_tokens for s in self.seqs)


class Parallel(Struct, frozen=True, kw_only=True):
    """Parallel layout. EP ranks are the dp x tp attention ranks (MoE colocated with attention,
    xDeepServe §7.1) or 1 (every TP rank holds a TP slice of every expert)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    shared_expert_ranks: int = 0  # EP ranks hosting only shared experts (0: computed locally)
    redundant_experts: int = 0  # extra routed-expert replicas (EPLB slots, xDeepServe §4.5)


def prefill_batch(batch_size: int, prompt_tokens: int, cached_tokens: int = 0) -> Batch:
    """batch_size prompts of prompt_tokens each, of which cached_tokens hit the prefix cache."""
    if batch_size < 1 or prompt_tokens < 1 or not 0 <= cached_tokens < prompt_tokens:
        raise ValueError(
            "batch: need batch_size >= 1, prompt_tokens >= 1 and 0 <= cached_tokens < "
            f"prompt_tokens; got {batch_size}, {prompt_tokens}, {cached_tokens}"
        )
    seq = Seq(new_tokens=prompt_tokens - cached_tokens, context_tokens=cached_tokens)
    return Batch(seqs=(seq,) * batch_size)


def decode_batch(batch_size: int, context_tokens: int, tokens_per_seq: int = 1) -> Batch:
    """batch_size sequences each decoding tokens_per_seq tokens (1 + MTP drafts to verify)."""
    if batch_size < 1 or context_tokens < 0 or tokens_per_seq < 1:
        raise ValueError(
            "batch: need batch_size >= 1, context_tokens >= 0 and tokens_per_seq >= 1; got "
            f"{batch_size}, {context_tokens}, {tokens_per_seq}"
        )
    return Batch(seqs=(Seq(tokens_per_seq, context_tokens),) * batch_size)


def is_graph_batch(batch: Batch) -> bool:
    return all(s.new_tokens <= GRAPH_MAX_NEW_TOKENS for s in batch.seqs)


def logits_tokens(batch: Batch) -> int:
    """Positions that need logits: every decode/verify position; a prefill chunk needs only its
    last, but is charged up to GRAPH_MAX_NEW_TOKENS so cost never drops as a sequence grows
    (assumption; the head is a negligible share of a prefill)."""
    return sum(min(s.new_tokens, GRAPH_MAX_NEW_TOKENS) for s in batch.seqs)


def validate(model: ModelProfile, batch: Batch, par: Parallel) -> None:
    """Reject layouts and batches the model cannot run, naming the offending field."""
    for field in ("tp", "pp", "dp", "ep"):
        if getattr(par, field) < 1:
            raise ValueError(f"{field}: must be >= 1, got {getattr(par, field)}")
    if par.shared_expert_ranks < 0 or par.redundant_experts < 0:
        raise ValueError("shared_expert_ranks/redundant_experts: must be >= 0")
    if model.n_heads % par.tp:
        raise ValueError(
            f"tp: {par.tp} does not divide the {model.n_heads} attention heads of {model.name}"
        )
    if model.n_layers < par.pp:
        raise ValueError(f"pp: {par.pp} exceeds the {model.n_layers} layers of {model.name}")
    if par.ep > 1 and model.moe is None:
        raise ValueError(f"ep: {model.name} is dense; ep must be 1, got {par.ep}")
    if par.ep > 1 and par.ep > par.dp * par.tp:
        raise ValueError(f"ep: {par.ep} exceeds the dp x tp = {par.dp * par.tp} attention ranks")
    if par.shared_expert_ranks >= max(par.ep, 1) and par.shared_expert_ranks:
        raise ValueError("shared_expert_ranks: must leave at least one routed-expert rank")
    check_experts(model, par)
    if not batch.seqs:
        raise ValueError("batch: must hold at least one sequence")
    for seq in batch.seqs:
        if seq.new_tokens < 1 or seq.context_tokens < 0:
            raise ValueError(f"batch: each seq needs new_tokens >= 1, context >= 0; got {seq}")


def check_experts(m: ModelProfile, par: Parallel) -> None:
    """EP wider than the experts it can host leaves ranks with nothing to run: every routed
    rank must hold at least one routed expert or redundant replica (xDeepServe §4.5)."""
    if m.moe is None or par.ep <= 1:
        return
    routed_ranks = par.ep - par.shared_expert_ranks
    slots = m.moe.n_routed_experts + par.redundant_experts
    if routed_ranks > slots:
        raise ValueError(
            f"ep: {routed_ranks} routed-expert ranks (ep {par.ep} - shared_expert_ranks "
            f"{par.shared_expert_ranks}) exceed the {m.moe.n_routed_experts} routed experts "
            f"(n_routed_experts, {m.source} config.json) + {par.redundant_experts} redundant "
            f"replicas of {m.name}; lower ep or add redundant experts"
        )
