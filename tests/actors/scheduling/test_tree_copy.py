"""The prompt tree's hand-written `__deepcopy__` (the kernel deep-copies the JE's state at each
snapshot) against `deepcopy_reference`, the generic walk: the same nodes, fresh holders dicts."""

from __future__ import annotations

import copy

from hypothesis import given
from hypothesis import strategies as st

from deepserve.actors.scheduling.locality import DRAM, HBM, ROUTED, PromptTree
from deepserve.core import encode

TES = st.sampled_from(["te/0", "te/1", "te/2"])
OPS = st.lists(st.tuples(st.sampled_from(["insert", "remove"]), TES,
                         st.lists(st.integers(0, 40), max_size=6), st.sampled_from([HBM, DRAM, ROUTED])),
               max_size=40)  # fmt: skip


@given(OPS, st.integers(1, 64))
def test_deepcopy_is_the_reference_copy(ops: list, max_blocks: int) -> None:
    tree = PromptTree(max_blocks=max_blocks)
    for op, te, hashes, bits in ops:
        getattr(tree, op)(te, hashes, bits)
    fast, slow = copy.deepcopy(tree), tree.deepcopy_reference()
    assert fast == slow == tree and encode(fast) == encode(slow)
    for h, holders in fast.nodes.items():  # nothing shared with the original
        assert holders is not tree.nodes[h]
    if tree.nodes:
        h = next(iter(tree.nodes))
        fast.nodes[h]["te/9"] = HBM
        assert "te/9" not in tree.nodes[h]
