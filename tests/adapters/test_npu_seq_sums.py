"""npu_loop.seq_sums (dense_terms' one compiled loop over a pass's sequences) against its
readable version, npu_dense.seq_sums_reference; and dense_terms' error for a bad sequence."""

from __future__ import annotations

import random

import pytest

from deepserve.actors.ports.npu import NpuForward, SeqShape
from deepserve.adapters.hardware.batch import GRAPH_MAX_NEW_TOKENS
from deepserve.adapters.hardware.devices.npu_dense import dense_terms, seq_sums_reference
from deepserve.adapters.hardware.devices.npu_loop import seq_sums


def _shapes(rng: random.Random, k: int, bad: bool) -> tuple[SeqShape, ...]:
    out = [SeqShape(rng.choice((1, 1, 2, 4, 5, 300, 8192)), rng.choice((0, 17, 4095, 1 << 40))) for _ in range(k)]
    if bad and out:
        i = rng.randrange(len(out))
        out[i] = rng.choice((SeqShape(0, 5), SeqShape(-3, 5), SeqShape(2, -1)))
    return tuple(out)


def test_seq_sums_equal_the_reference() -> None:
    rng = random.Random(39)
    for _ in range(3000):
        seqs = _shapes(rng, rng.randrange(0, 40), bad=rng.random() < 0.3)
        for graph_max in (GRAPH_MAX_NEW_TOKENS, 1, 64):
            for check in (True, False):
                assert seq_sums(seqs, graph_max, check) == seq_sums_reference(seqs, graph_max, check)


def test_a_bad_sequence_is_named_as_validate_names_it() -> None:
    seqs = (SeqShape(1, 10), SeqShape(0, 7), SeqShape(-1, 3))
    msg = NpuForward(req_id="fwd:0", model="llama3-8b", seqs=seqs)
    with pytest.raises(ValueError, match=r"each seq needs new_tokens >= 1, context >= 0; got .*new_tokens=0, context_tokens=7"):
        dense_terms("910b", msg, check=True)
