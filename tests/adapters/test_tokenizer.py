"""The tokenizer at the edge: deterministic, ~4 chars a token, shared text prefix ⇒ shared block
hashes (so prompts hit the prefix cache), readable emulated output."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deepserve.adapters import tokenizer
from deepserve.adapters.tokenizer import (
    ApproxTokenizer,
    HfTokenizer,
    make_tokenizer,
    output_text,
    prompt_of_text,
)


@given(st.text(max_size=400), st.text(max_size=200), st.text(max_size=200))
def test_a_shared_text_prefix_is_a_shared_token_prefix(prefix: str, a: str, b: str) -> None:
    tok = ApproxTokenizer()
    cut = len(prefix) - len(prefix) % 4  # whole 4-character pieces of the shared prefix
    ta, tb = tok.encode(prefix + a), tok.encode(prefix + b)
    assert ta[: cut // 4] == tb[: cut // 4]
    assert len(ta) == -(-len(prefix + a) // 4)


def test_prompts_sharing_a_prefix_share_block_hashes() -> None:
    tok = ApproxTokenizer()
    system = "You are a helpful assistant. " * 20  # 580 chars = 145 tokens = 9 blocks of 16
    pa, _ = prompt_of_text(tok, system + "What is the capital of France?", 16)
    pb, _ = prompt_of_text(tok, system + "Tell me a joke about NPUs.", 16)
    shared = sum(1 for x, y in zip(pa.block_hashes, pb.block_hashes, strict=False) if x == y)
    assert shared == 145 // 16
    assert pa.block_hashes != pb.block_hashes or pa.num_tokens // 16 == shared


def test_deterministic_across_instances_and_decodes_what_it_encoded() -> None:
    text = "the quick brown fox jumps"
    assert ApproxTokenizer().encode(text) == ApproxTokenizer().encode(text)
    tok = ApproxTokenizer()
    assert tok.decode(tok.encode(text)) == text


def test_output_text_is_words() -> None:
    text = output_text([1, 2, 3, 40_000])
    assert len(text.split()) == 4 and text.replace(" ", "").isalpha()


def test_bad_tokenizer_path_names_the_field(tmp_path) -> None:
    with pytest.raises(ValueError, match="tokenizer"):
        make_tokenizer(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="tokenizer"):
        HfTokenizer(str(tmp_path))


@given(st.lists(st.text(max_size=40), max_size=8))
def test_remembered_piece_ids_agree_with_hashing_every_piece(texts: list[str]) -> None:
    fast, readable = ApproxTokenizer(vocab=1000), ApproxTokenizer(vocab=1000)
    for text in texts + texts:  # the second time round, every piece is remembered
        ids = fast.encode(text)
        assert ids == readable.encode_readable(text)
        assert fast.decode(ids) == readable.decode(ids)


def test_remembered_pieces_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokenizer, "MAX_REMEMBERED", 3)
    tok = ApproxTokenizer()
    assert tok.encode("aaaabbbbccccddddeeee") == tok.encode_readable("aaaabbbbccccddddeeee")
    assert len(tok._ids) == 3 and len(tok._pieces) == 3
