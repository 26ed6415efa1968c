"""Actors whose messages, events and state hold sets and dicts of strings: their
log must not depend on the process's hash seed (importable by replay)."""

from __future__ import annotations

import msgspec

from deepserve.core import Actor, Context, Event, MemorySink, Message, SimDriver


class Tags(Message, frozen=True):
    tags: frozenset[str]
    weights: dict[str, int]


class Tagged(Event, frozen=True):
    tags: frozenset[str]
    counts: dict[str, int]


class TagState(msgspec.Struct, frozen=True):
    seen: frozenset[str] = frozenset()
    mutable_seen: set[str] = msgspec.field(default_factory=set)
    counts: dict[str, int] = {}


class Tagger(Actor[TagState]):
    snapshot_every = 2

    def initial_state(self) -> TagState:
        return TagState()

    def evolve(self, state: TagState, event: Event) -> TagState:
        assert isinstance(event, Tagged)
        counts = dict(state.counts)
        for k, v in event.counts.items():
            counts[k] = counts.get(k, 0) + v
        return TagState(state.seen | event.tags, set(state.mutable_seen) | set(event.tags), counts)

    def handle(self, ctx: Context, msg: Message) -> None:
        assert isinstance(msg, Tags)
        # A dict built by iterating a set: its insertion order follows the hash seed.
        counts = {t: msg.weights.get(t, 1) for t in msg.tags}
        ctx.record(Tagged(msg.tags, counts))
        ctx.send("ext/out", Tags(frozenset(self.state.seen), counts))


def run() -> MemorySink:
    sink = MemorySink()
    d = SimDriver(seed=3, sink=sink)
    d.spawn("tag/0", Tagger)
    words = [f"w{i}-{'x' * (i % 5)}" for i in range(40)]
    for i in range(10):
        tags = frozenset(words[i : i + 12])
        d.inject("tag/0", Tags(tags, {w: len(w) for w in sorted(tags, reverse=True)}), at=float(i))
    d.run()
    return sink


def print_digest() -> None:
    from deepserve.persistence.api import MemoryLog
    from deepserve.replay import digest, verify

    sink = run()
    result = verify(MemoryLog(sink))
    assert result.identical, result.divergence
    print(digest(MemoryLog(sink)))
