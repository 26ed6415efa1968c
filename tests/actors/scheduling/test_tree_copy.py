"""The prompt tree's hand-written `__deepcopy__` (the kernel deep-copies the JE's state at each
snapshot) against `deepcopy_reference`, the generic walk: the same nodes; the holders dicts are
shared, and never changed in place, so whatever either tree does after the copy leaves the other
as it was."""

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


@given(OPS, OPS, st.integers(1, 64))
def test_neither_copy_changes_the_other(before: list, after: list, max_blocks: int) -> None:
    tree = PromptTree(max_blocks=max_blocks)
    for op, te, hashes, bits in before:
        getattr(tree, op)(te, hashes, bits)
    fast, kept = copy.deepcopy(tree), tree.deepcopy_reference()
    for op, te, hashes, bits in after:  # the live tree goes on (the JE after a snapshot) ...
        getattr(tree, op)(te, hashes, bits)
    for te in ("te/0", "te/1"):
        tree.drop_routed(te)
    tree.forget("te/2")
    assert fast == kept and encode(fast) == encode(kept)  # ... and the snapshot stays as it was
    again = fast.deepcopy_reference()
    for op, te, hashes, bits in after:  # a restart from the snapshot (restore_state) ...
        getattr(fast, op)(te, hashes, bits)
    assert kept == again  # ... leaves the copy it was made from alone
