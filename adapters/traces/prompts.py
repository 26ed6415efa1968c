"""A trace request as the TE sees it: `Prompt(num_tokens, block_hashes)` for a cluster's block size.

Block hashing is the engine's (`actors/flowserve/tokens.py`): Mooncake `hash_ids` (512-token trace
blocks) become the chain hashes of the cluster's KV blocks, so two requests sharing their first k
trace ids share the KV blocks inside those k*512 tokens; an Azure request (no published content)
gets a chain of its own, keyed by its position in the trace, so nothing is shared.
"""

from __future__ import annotations

from deepserve.actors.flowserve.messages import Prompt
from deepserve.actors.flowserve.tokens import (
    chain_hashes_from_trace_blocks,
    unique_chain_hashes,
)

from .chains import trace_chain_hashes_many
from .common import MOONCAKE_BLOCK_TOKENS, TraceRequest


def prompt_of(req: TraceRequest, block_tokens: int, salt: int = 0) -> Prompt:
    """The prompt of `req` in `block_tokens`-token KV blocks. `salt` separates traces that
    share no content (two Azure files both start at index 0)."""
    if req.hash_ids is None:
        hashes = unique_chain_hashes((salt << 32) ^ req.index, req.prompt_tokens, block_tokens)
    else:
        hashes = chain_hashes_from_trace_blocks(
            req.hash_ids, req.prompt_tokens, block_tokens, MOONCAKE_BLOCK_TOKENS
        )
    return Prompt(num_tokens=req.prompt_tokens, block_hashes=hashes)


def prompts_of(reqs: list[TraceRequest], block_tokens: int) -> list[Prompt]:
    """`prompt_of(req, block_tokens)` of each request, the Mooncake ones' hashes computed
    together (`chains.trace_chain_hashes_many`: the same ints, a fraction of the work)."""
    mooncake = [(r.hash_ids, r.prompt_tokens) for r in reqs if r.hash_ids is not None]
    many = iter(trace_chain_hashes_many(mooncake, block_tokens, MOONCAKE_BLOCK_TOKENS))
    out: list[Prompt] = []
    for r in reqs:
        hashes = next(many) if r.hash_ids is not None else None
        out.append(prompt_of(r, block_tokens) if hashes is None
                   else Prompt(num_tokens=r.prompt_tokens, block_hashes=hashes))  # fmt: skip
    return out
