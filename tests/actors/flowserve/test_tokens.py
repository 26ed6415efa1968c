"""tokens.py: chain hashes share exactly the common prefix; the token stream is deterministic."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deepserve.actors.flowserve import tokens as tk


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@given(
    st.lists(st.integers(0, 50), min_size=0, max_size=12),
    st.lists(st.integers(0, 50), min_size=0, max_size=12),
    st.sampled_from([64, 128, 256, 512, 300]),
)
def test_trace_block_hashes_share_exactly_the_shared_token_prefix(
    ids_a: list[int], ids_b: list[int], block: int
) -> None:
    n_a, n_b = len(ids_a) * 512, len(ids_b) * 512
    ha = tk.chain_hashes_from_trace_blocks(ids_a, n_a, block)
    hb = tk.chain_hashes_from_trace_blocks(ids_b, n_b, block)
    assert len(ha) == n_a // block and len(hb) == n_b // block
    shared_tokens = _common_prefix(tuple(ids_a), tuple(ids_b)) * 512
    # a KV block is shared iff all its tokens lie inside the shared trace-block prefix
    assert _common_prefix(ha, hb) == shared_tokens // block


@given(st.lists(st.integers(0, 1000), max_size=300), st.lists(st.integers(0, 1000), max_size=300))
def test_token_hashes_share_exactly_the_full_blocks_of_the_common_prefix(
    a: list[int], b: list[int]
) -> None:
    ha, hb = tk.chain_hashes_from_tokens(a, 16), tk.chain_hashes_from_tokens(b, 16)
    assert _common_prefix(ha, hb) == _common_prefix(tuple(a), tuple(b)) // 16


def test_unique_hashes_share_nothing_and_fingerprints_depend_on_the_model() -> None:
    a, b = tk.unique_chain_hashes(1, 1024, 128), tk.unique_chain_hashes(2, 1024, 128)
    assert len(a) == 8 and not set(a) & set(b)
    assert tk.fingerprints("m1", a) != tk.fingerprints("m2", a)
    assert tk.fingerprints("m1", a) == tk.fingerprints("m1", a)


def test_bad_trace_blocks_name_the_field() -> None:
    with pytest.raises(ValueError, match="hash_ids: 1 ids cannot cover 1000 tokens"):
        tk.chain_hashes_from_trace_blocks([7], 1000, 128)
    with pytest.raises(ValueError, match="block_tokens"):
        tk.chain_hashes_from_tokens([1, 2], 0)


def test_output_length_stops_at_target_max_or_eos() -> None:
    assert tk.output_length(1, 100, 30, False, 0.5) == (30, "target")
    assert tk.output_length(1, 20, 30, False, 0.5) == (20, "length")
    assert tk.output_length(1, 50, None, True, 0.5) == (50, "length")
    n, why = tk.output_length(1, 10_000, None, False, 0.01)
    assert why == "stop" and n == tk.eos_index(1, 0.01) + 1
    # geometric with rate p: mean index (1-p)/p; 2000 seeds land near it
    mean = sum(tk.eos_index(s, 0.01) for s in range(2000)) / 2000
    assert 85 < mean < 115
    assert tk.emulated_tokens(9, 3, 4) == tuple(tk.emulated_token(9, j) for j in range(3, 7))
    assert tk.eos_token_id() not in tk.emulated_tokens(9, 0, 500)
