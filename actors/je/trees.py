"""Folding TEs' KV cache events into the JE's global prompt trees (DeepServe §5.2: the global
tree shares an index with each TE's local tree). A batch comes from a DP master or RTC whose
address is under its TE's (`te/0/dp/1` belongs to `te/0`); the JE records the batch and folds it.
A TE's first batch makes it a publisher: its ROUTED guesses are dropped and no new ones are made
(the events say what it holds)."""

from __future__ import annotations

from deepserve.actors.flowserve.rtc.kv_events import KVEventBatch
from deepserve.actors.scheduling.locality import PromptTree
from deepserve.core import Event

from .messages import JeState


class KvEventsFolded(Event, frozen=True, kw_only=True):
    te: str  # the publisher's address (a TE, or an actor under it)
    batch: KVEventBatch


def owner(s: JeState, addr: str) -> tuple[str, str] | None:
    """(model, TE) of a publisher address, or None if no known TE owns it."""
    cut = addr.rfind("/dp/")  # a DP master, `{te}/dp/{i}` (the TE shell's naming): one look-up
    te = addr[:cut] if cut > 0 else addr
    for model, roles in s.groups.items():
        for tes in roles.values():
            if te in tes:
                return model, te
    for model, roles in s.groups.items():  # another publisher under a TE (a standalone RTC)
        for tes in roles.values():
            for te in tes:
                if addr == te or addr.startswith(te + "/"):
                    return model, te
    return None


def fold_kv_batch(s: JeState, e: KvEventsFolded, max_blocks: int) -> JeState:
    found = owner(s, e.te)
    if found is None:
        return s  # a TE that left the group: its events no longer matter
    model, te = found
    tree = s.trees.setdefault(model, PromptTree(max_blocks=max_blocks))
    if te not in s.publishing:
        s.publishing.append(te)
        tree.drop_routed(te)
    tree.fold_kv_events(te, e.batch.events, e.batch.data_parallel_rank)
    return s
