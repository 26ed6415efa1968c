"""Many trace prompts' KV-block chain hashes at once, on numpy's uint64 arrays.

`tokens.chain_hashes_from_trace_blocks` hashes one prompt block by block: two SplitMix64 mixes a
block in Python's big-int arithmetic (~5k instructions, more than its memo saves: 69 % of the
Mooncake conversation trace's blocks miss it), ~400k instructions a simulated request with the
trace's parsing, a tenth of a whole simulation. A block's hash depends on its parent's, so one
prompt's chain is sequential; prompts are independent, so the same mixes run over the prompts of
a whole chunk of the trace at once, one block position at a time: numpy's uint64 multiply wraps
modulo 2**64 (the `& MASK` of the scalar code), shifts drop what leaves 64 bits. The same ints
come out (tests/adapters/test_traces.py compares both on every prompt of the Mooncake fixture).

Only the shape Mooncake traces take on the simulator's block sizes goes here: each KV block
inside one trace block (`trace_block_tokens % block_tokens == 0`), ids that cover the prompt
and fit 64 bits. Anything else is None, left to the scalar function (which raises its errors).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from deepserve.actors.flowserve.tokens import MAX_PROMPT_TOKENS, ROOT_HASH, combine

_U = np.uint64
_GOLDEN = 0x9E3779B97F4A7C15
_MASK = (1 << 64) - 1
_M1, _M2 = _U(0xBF58476D1CE4E5B9), _U(0x94D049BB133111EB)
_S23, _S41, _S30, _S27, _S31 = _U(23), _U(41), _U(30), _U(27), _U(31)
# Below this many prompts still hashing, a block position's ~20 array operations (~1 us each,
# whatever the length) cost more than the scalar mixes (~1 us a prompt): the tail goes scalar.
VECTOR_MIN = 12


def _combine(parent: NDArray[np.uint64], mixed: NDArray[np.uint64] | np.uint64) -> NDArray[np.uint64]:
    """`tokens.combine(parent, value)` elementwise, `mixed` being `((value + 1) * GOLDEN) mod 2**64`."""
    z = (parent << _S23) | (parent >> _S41)
    z ^= mixed
    z ^= z >> _S30
    z *= _M1
    z ^= z >> _S27
    z *= _M2
    z ^= z >> _S31
    return z


def _trace_ids(hash_ids: Sequence[int], num_tokens: int, trace_block_tokens: int) -> NDArray[np.uint64] | None:
    """The ids covering the prompt as uint64 (`int(id) & MASK`), or None for the scalar path."""
    if not 0 <= num_tokens <= MAX_PROMPT_TOKENS:
        return None
    need = -(-num_tokens // trace_block_tokens)
    if len(hash_ids) < need:
        return None
    try:
        return np.asarray(hash_ids[:need], dtype=np.int64).view(np.uint64)
    except (OverflowError, TypeError, ValueError):
        return None


def trace_chain_hashes_many(
    prompts: Sequence[tuple[Sequence[int], int]], block_tokens: int, trace_block_tokens: int
) -> list[tuple[int, ...] | None]:
    """`chain_hashes_from_trace_blocks(ids, n, block_tokens, trace_block_tokens)` of each
    `(ids, n)`, the same ints; None where the scalar function must answer (see the module)."""
    out: list[tuple[int, ...] | None] = [None] * len(prompts)
    if block_tokens <= 0 or trace_block_tokens <= 0 or trace_block_tokens % block_tokens:
        return out
    ids = [_trace_ids(h, n, trace_block_tokens) for h, n in prompts]
    todo = sorted((i for i, x in enumerate(ids) if x is not None), key=lambda i: -(prompts[i][1] // block_tokens))
    if not todo:
        return out
    lengths = [prompts[i][1] // block_tokens for i in todo]  # KV blocks, longest first
    longest = lengths[0]
    per = trace_block_tokens // block_tokens  # KV blocks a trace block holds
    which: NDArray[np.int64] = np.arange(longest) // per  # the trace block of each KV block
    table: NDArray[np.uint64] = np.zeros((len(todo), longest), dtype=np.uint64)  # ((id + 1) * GOLDEN), by block
    for row, (i, n) in enumerate(zip(todo, lengths, strict=True)):
        table[row, :n] = ids[i][which[:n]]  # type: ignore[index]
    table += _U(1)
    table *= _U(_GOLDEN)
    # Offsets inside the trace block: the second mix of every KV block, one constant per position
    offsets = [((((b % per) * block_tokens) + 1) * _GOLDEN) & _MASK for b in range(per)]
    hashes: NDArray[np.uint64] = np.empty((len(todo), longest), dtype=np.uint64)
    parent: NDArray[np.uint64] = np.full(len(todo), ROOT_HASH, dtype=np.uint64)
    live, b = len(todo), 0
    while b < longest:
        while lengths[live - 1] <= b:
            live -= 1
        if live < VECTOR_MIN:
            break
        h = _combine(_combine(parent[:live], table[:live, b]), _U(offsets[b % per]))
        hashes[:live, b] = h
        parent[:live] = h
        b += 1
    for row, (i, n) in enumerate(zip(todo, lengths, strict=True)):
        done = min(b, n)
        chain = hashes[row, :done].tolist()
        if done < n:  # the long tail, a few prompts: the scalar mixes cost less than arrays
            chain += _tail(int(parent[row]), prompts[i][0], done, n, per, block_tokens)
        out[i] = tuple(chain)
    return out


def _tail(parent: int, hash_ids: Sequence[int], lo: int, hi: int, per: int, block_tokens: int) -> list[int]:
    """KV blocks lo..hi-1 of a prompt whose block lo-1 hashed to `parent`, as the scalar
    function hashes them."""
    out: list[int] = []
    for b in range(lo, hi):
        parent = combine(combine(parent, int(hash_ids[b // per]) & _MASK), (b % per) * block_tokens)
        out.append(parent)
    return out
