"""The swap-out memo's arithmetic (state.SwapMemo) against the plain walk it replaces."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from deepserve.actors.flowserve.rtc.pool import _left_lru
from deepserve.actors.flowserve.rtc.state import SwapMemo


def _memo(flags: list[bool]) -> SwapMemo:
    memo = SwapMemo()
    memo.remember(list(range(len(flags))), bytes(flags))
    return memo


@given(
    flags=st.lists(st.booleans(), max_size=40),
    data=st.data(),
    cold=st.integers(0, 5),
    window=st.integers(0, 50),
)
def test_unsaved_within_is_the_walk(flags: list[bool], data: st.DataObject, cold: int, window: int) -> None:
    """Marked blocks 0..n-1 (block b at scan position b), some left the LRU in batches,
    `cold` saved blocks put at the front: the unsaved blocks among the first `window` of
    the LRU as it now is, and the first one's position, are what walking it gives."""
    memo = _memo(flags)
    left = data.draw(st.lists(st.sets(st.integers(0, max(len(flags) - 1, 0))), max_size=4))
    gone: set[int] = set()
    for batch in left:
        batch = [b for b in batch if b not in gone and b < len(flags)]
        for b in batch:
            _left_lru(memo, b)
        gone.update(batch)
    for i in range(cold):  # saved blocks released cold (apply._swap_out_finished)
        memo.marks[1000 + i] = -1
        memo.cold += 1
    lru = [None] * cold + [b for b in range(len(flags)) if b not in gone]
    walk = [(at, b) for at, b in enumerate(lru[:window]) if b is not None and not flags[b]]
    first, blocks = memo.unsaved_within(window)
    assert list(blocks) == [b for _, b in walk]
    assert first == (walk[0][0] if walk else 0)
    assert memo.unsaved_within(window) == (first, blocks)  # asked again: the kept answer


@given(flags=st.lists(st.booleans(), max_size=40), data=st.data(), window=st.integers(0, 50))
def test_unsave_is_the_walk(flags: list[bool], data: st.DataObject, window: int) -> None:
    """Saved marked blocks losing their DRAM copy (`SwapMemo.unsave`, pool._take_dram) between
    removals: each answer is what walking the LRU with the flags as they now are gives, the
    one kept before an unsave included."""
    memo = _memo(flags)
    flags = list(flags)
    gone: set[int] = set()
    for _ in range(data.draw(st.integers(0, 4))):
        memo.unsaved_within(window)  # an answer kept, to be dropped by what follows
        left = data.draw(st.sets(st.integers(0, 40)))
        for b in sorted(left - gone):
            if b < len(flags):
                _left_lru(memo, b)
                gone.add(b)
        saved = [b for b in range(len(flags)) if flags[b] and b not in gone]
        for b in data.draw(st.sets(st.sampled_from(saved))) if saved else ():
            memo.unsave(b)
            flags[b] = False
        lru = [b for b in range(len(flags)) if b not in gone]
        walk = [(at, b) for at, b in enumerate(lru[:window]) if not flags[b]]
        first, blocks = memo.unsaved_within(window)
        assert list(blocks) == [b for _, b in walk]
        assert first == (walk[0][0] if walk else 0)


def test_unsave_of_a_cold_block_forgets() -> None:
    """A saved block put at the front since the scan has no position: the memo starts over."""
    memo = _memo([True, False])
    memo.marks[7] = -1
    memo.cold += 1
    memo.unsave(7)
    assert memo.known() == 0 and not memo.marks
