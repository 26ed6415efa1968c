"""The prompt tree's walk: the fast path (`PromptTree.walk`, what every decision runs, and `match` through it) agrees
with the readable one (`match_reference`) on random trees — shared prefixes, holes, evictions,
TEs that hold nothing, duplicate hashes — and one decision walks the tree once."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from deepserve.actors.scheduling.locality import DRAM, HBM, PromptTree

TES = [f"te/{i}" for i in range(6)]
hashes = st.lists(st.integers(0, 12), min_size=0, max_size=10)


@settings(max_examples=300, deadline=None)
@given(inserts=st.lists(st.tuples(st.sampled_from(TES), hashes, st.sampled_from([HBM, DRAM])), max_size=12),
       removes=st.lists(st.tuples(st.sampled_from(TES), hashes), max_size=4),
       prompt=hashes, asked=st.lists(st.sampled_from([*TES, "te/x"]), unique=True, max_size=7))
def test_the_fast_walk_agrees_with_the_readable_one(inserts: list, removes: list, prompt: list[int],
                                                     asked: list[str]) -> None:
    tree = PromptTree()
    for te, hs, bits in inserts:
        tree.insert(te, hs, bits)
    for te, hs in removes:
        tree.remove(te, hs, HBM | DRAM)
    (fast, longest), slow = tree.walk(prompt, asked), tree.match_reference(prompt, asked)
    assert fast == slow and list(fast) == list(slow)  # same values, same order
    assert longest == max(slow.values(), default=0)  # the predictor's input, from the same walk
    assert tree.match(prompt, asked) == slow
