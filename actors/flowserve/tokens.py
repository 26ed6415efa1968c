"""Blocks, hashes, fingerprints and the emulated token stream — pure functions, no state.

A prompt travels as `Prompt(num_tokens, block_hashes)`: one 64-bit *chain hash* per FULL block of
`block_tokens` tokens (one cluster-wide KV block size). A block's chain hash depends on its own
tokens and on its parent's chain hash, so equal hashes mean equal prefixes (vLLM's prefix-caching
block hash, SGLang's radix key). Three sources:

- token ids (the daemon: a tokenizer at the edge): `chain_hashes_from_tokens`;
- a Mooncake trace's `hash_ids` (one id per 512-token trace block; requests sharing an id share
  that block's tokens): `chain_hashes_from_trace_blocks` derives the KV-block hashes;
- a trace without content (Azure): `unique_chain_hashes` — nothing is shared.

A block *fingerprint* is f(model, chain hash): the content digest a KV block carries so a decode
TE can verify that the KV it received is the KV the prefill produced (issue 10 §5).

The emulated token stream is deterministic from the request's seed: token j is
`emulated_token(seed, j)`, and the emulated EOS position is drawn once, in closed form, from the
seed (a geometric draw) — so the scheduler knows every request's output length in advance, which
is what lets the aggregated simulation path compute the next batch change without stepping.

Everything here uses SplitMix64 mixing or blake2b, never Python's salted `hash`, so results are
the same in every process and every run.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections.abc import Sequence

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
MOONCAKE_BLOCK_TOKENS = 512  # the Mooncake traces' hash_ids cover 512-token blocks
ROOT_HASH = 0x6A09E667F3BCC908  # the parent of every first block (sqrt(2) digits, arbitrary)
DEFAULT_VOCAB = 32_000
MAX_PROMPT_TOKENS = 1 << 22  # a limit on everything: 4 M tokens per prompt


def mix64(z: int) -> int:
    """SplitMix64's finaliser: a fast, well-spread 64-bit bijection."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def combine(parent: int, value: int) -> int:
    """Hash of `value` chained onto `parent` (both 64-bit): one SplitMix64 finaliser over the
    parent rotated and multiplied into the value (a bijection in `value` for a fixed parent)."""
    z = ((((parent << 23) | (parent >> 41)) & _MASK) ^ ((value + 1) * _GOLDEN)) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _check_block_tokens(block_tokens: int) -> None:
    if not isinstance(block_tokens, int) or block_tokens <= 0:
        raise ValueError(f"block_tokens: must be a positive int, got {block_tokens!r}")


def full_blocks(num_tokens: int, block_tokens: int) -> int:
    """How many FULL blocks `num_tokens` tokens fill."""
    _check_block_tokens(block_tokens)
    return num_tokens // block_tokens


def blocks_needed(num_tokens: int, block_tokens: int) -> int:
    """How many blocks (the last one possibly partial) hold `num_tokens` tokens."""
    _check_block_tokens(block_tokens)
    return -(-num_tokens // block_tokens)


def chain_hashes_from_tokens(
    token_ids: Sequence[int], block_tokens: int, parent: int = ROOT_HASH
) -> tuple[int, ...]:
    """Chain hashes of each full block of real token ids (a partial tail block has none)."""
    _check_block_tokens(block_tokens)
    if len(token_ids) > MAX_PROMPT_TOKENS:
        raise ValueError(f"token_ids: {len(token_ids)} tokens, limit {MAX_PROMPT_TOKENS}")
    out: list[int] = []
    for i in range(len(token_ids) // block_tokens):
        chunk = array("q", token_ids[i * block_tokens : (i + 1) * block_tokens]).tobytes()
        digest = hashlib.blake2b(chunk, digest_size=8, key=parent.to_bytes(8, "little")).digest()
        parent = int.from_bytes(digest, "little")
        out.append(parent)
    return tuple(out)


def chain_hashes_from_trace_blocks(
    hash_ids: Sequence[int],
    num_tokens: int,
    block_tokens: int,
    trace_block_tokens: int = MOONCAKE_BLOCK_TOKENS,
) -> tuple[int, ...]:
    """KV-block chain hashes of a prompt described by trace block ids (Mooncake `hash_ids`).

    KV block i covers tokens [i*B, (i+1)*B); its content is fixed by the trace blocks it
    overlaps, its position, and (through the chain) everything before it. Only full KV blocks
    inside `num_tokens` get a hash. Raises ValueError naming the field when the ids cannot
    cover the prompt."""
    _check_block_tokens(block_tokens)
    if trace_block_tokens <= 0:
        raise ValueError(f"trace_block_tokens: must be > 0, got {trace_block_tokens}")
    if not 0 <= num_tokens <= MAX_PROMPT_TOKENS:
        raise ValueError(f"num_tokens: must be in [0, {MAX_PROMPT_TOKENS}], got {num_tokens}")
    need = -(-num_tokens // trace_block_tokens)
    if len(hash_ids) < need:
        raise ValueError(
            f"hash_ids: {len(hash_ids)} ids cannot cover {num_tokens} tokens "
            f"of {trace_block_tokens}-token blocks (need {need})"
        )
    out: list[int] = []
    parent = ROOT_HASH
    memo = _TRACE_BLOCK_MEMO
    if len(memo) > _TRACE_BLOCK_MEMO_MAX:
        memo.clear()
    for i in range(num_tokens // block_tokens):
        first = (i * block_tokens) // trace_block_tokens
        last = ((i + 1) * block_tokens - 1) // trace_block_tokens
        offset = (i * block_tokens) % trace_block_tokens  # offset inside the block
        if first == last:  # one trace block: the common case, remembered
            key = (parent, int(hash_ids[first]) & _MASK, offset)
            h = memo.get(key)
            if h is None:
                h = memo[key] = combine(combine(parent, key[1]), offset)
            parent = h
        else:
            h = parent
            for t in range(first, last + 1):
                h = combine(h, int(hash_ids[t]) & _MASK)
            parent = combine(h, offset)
        out.append(parent)
    return tuple(out)


# (parent chain hash, trace block id, offset) -> the KV block's chain hash. Trace prompts share
# prefixes (37 % of the Mooncake conversation trace's blocks repeat one seen before), and a
# block's hash is two 64-bit mixes in Python big-int arithmetic (~2.5k instructions each).
# A pure function's values: bounded, dropped whole when full.
_TRACE_BLOCK_MEMO: dict[tuple[int, int, int], int] = {}
_TRACE_BLOCK_MEMO_MAX = 1 << 20


def unique_chain_hashes(request_key: int, num_tokens: int, block_tokens: int) -> tuple[int, ...]:
    """Hashes for a prompt that shares nothing (a trace without content, e.g. Azure): every
    request gets its own chain, derived from `request_key` (e.g. its index in the trace)."""
    _check_block_tokens(block_tokens)
    parent = combine(ROOT_HASH ^ 0x5BD1E995, request_key & _MASK)
    out: list[int] = []
    for _ in range(num_tokens // block_tokens):
        parent = combine(parent, 1)
        out.append(parent)
    return tuple(out)


def model_key(model: str) -> int:
    """A stable 64-bit key of a model name (fingerprints differ across models)."""
    return int.from_bytes(hashlib.blake2b(model.encode(), digest_size=8).digest(), "little")


def block_fingerprint(model_key_: int, chain_hash: int) -> int:
    """The fingerprint a KV block carries: a digest of (model, token prefix)."""
    return combine(model_key_ ^ 0xA5A5A5A5A5A5A5A5, chain_hash)


def fingerprints(model: str, chain_hashes: Sequence[int]) -> tuple[int, ...]:
    key = model_key(model)
    return tuple(block_fingerprint(key, h) for h in chain_hashes)


# ---- the emulated token stream ---------------------------------------------------------------


def emulated_token(seed: int, index: int, vocab: int = DEFAULT_VOCAB) -> int:
    """Output token `index` (0-based) of a request seeded `seed`; never the EOS id (vocab-1).
    A Weyl sequence from the mixed seed and one multiply a token: cheap (the simulation makes
    millions), deterministic, and spread enough for an emulated model."""
    base = mix64((seed & _MASK) ^ 0x2545F4914F6CDD1D)
    return ((((base + index * _GOLDEN) & _MASK) * 0xBF58476D1CE4E5B9 & _MASK) >> 24) % (vocab - 1)


def emulated_tokens(seed: int, start: int, count: int, vocab: int = DEFAULT_VOCAB) -> tuple[int, ...]:
    base = mix64((seed & _MASK) ^ 0x2545F4914F6CDD1D)
    v, m, mul = vocab - 1, _MASK, 0xBF58476D1CE4E5B9
    return tuple(
        ((((base + j * _GOLDEN) & m) * mul & m) >> 24) % v for j in range(start, start + count)
    )


def eos_token_id(vocab: int = DEFAULT_VOCAB) -> int:
    return vocab - 1


def eos_index(seed: int, eos_rate: float) -> int | None:
    """The 0-based output index at which the emulated model emits EOS (None: never).

    Each token is EOS with probability `eos_rate`, independently: the first EOS is a geometric
    draw, taken in closed form from one uniform derived from the seed."""
    if not 0.0 <= eos_rate <= 1.0 or math.isnan(eos_rate):
        raise ValueError(f"eos_rate: must be in [0, 1], got {eos_rate}")
    if eos_rate == 0.0:
        return None
    if eos_rate == 1.0:
        return 0
    u = ((combine(seed & _MASK, 0xE05) >> 11) + 0.5) * (1.0 / 9007199254740992.0)  # (0, 1)
    return int(math.log(u) / math.log1p(-eos_rate))


def output_length(
    seed: int, max_tokens: int, target_output_tokens: int | None, ignore_eos: bool, eos_rate: float
) -> tuple[int, str]:
    """(number of output tokens, stop reason) of a request — known before it runs.

    Stop reasons as vLLM/OpenAI name them: "length" (max_tokens), "target" (a trace's recorded
    output length, which implies ignoring EOS), "stop" (the emulated EOS, included in the count).
    """
    if max_tokens <= 0:
        raise ValueError(f"max_tokens: must be > 0, got {max_tokens}")
    if target_output_tokens is not None:
        if target_output_tokens <= 0:
            raise ValueError(f"target_output_tokens: must be > 0, got {target_output_tokens}")
        if target_output_tokens < max_tokens:
            return target_output_tokens, "target"
        return max_tokens, "length"
    eos = None if ignore_eos else eos_index(seed, eos_rate)
    if eos is not None and eos + 1 < max_tokens:
        return eos + 1, "stop"
    if eos is not None and eos + 1 == max_tokens:
        return max_tokens, "stop"
    return max_tokens, "length"


def kv_fingerprints(model: str, num_tokens: int, chain_hashes: Sequence[int], block_tokens: int) -> tuple[int, ...]:
    """One fingerprint per KV block holding `num_tokens` prompt tokens: full blocks from their
    chain hash; a partial tail block from its parent's chain and its token count."""
    key = model_key(model)
    out = [block_fingerprint(key, h) for h in chain_hashes]
    if num_tokens % block_tokens:
        parent = chain_hashes[-1] if chain_hashes else ROOT_HASH
        out.append(block_fingerprint(key, combine(parent, num_tokens)))
    return tuple(out)
