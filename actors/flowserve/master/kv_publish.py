"""A DP master's KV cache events, published to its subscribers (issue 6 §2: the JE's global
prompt tree mirrors the TEs' local trees through their KV cache events; DeepServe §5.2).

A subscriber (a JE) sends `SubscribeKvEvents` to a TE shell, which forwards it to each of its DP
masters. After every delivery that changed the master's RTC index, the master sends each
subscriber ONE `KVEventBatch` (vLLM's shape, `actors/flowserve/rtc/kv_events.py`) with the
events of that delivery in order — so a step's allocations, evictions and newly cached prompt
blocks travel as one message, tagged with the DP rank; the subscriber tells the TE by the
sender's address (`te/0/dp/1` is under `te/0`). With no subscriber nothing is computed or sent:
the master's cost is one attribute test per delivery.

The subscriber list is the master's state, changed only by the recorded `KvSubscribed` (so a
replay rebuilds it), but it lives in this publisher beside the `MasterState` rather than in it;
`DpMaster.evolve` hands the event here. A subscriber that must survive the master's process
restarting subscribes again (the JE does on every membership push that adds the TE).

Riding (`MasterConfig.kv_ride`, on in every assembled cluster; absent from older spawn configs,
so their logs replay as written): when the same delivery also answers the subscriber about a
task (`TaskAccepted`, `TaskFinished`, `TaskRejected`: a quarter of the batches on the Mooncake
trace), the batch travels with that answer as one `TaskAnswerKv` instead of a second message.
The subscriber handles the answer, then folds the batch: the order in which it would have
received the two, with nothing delayed (the batch still leaves with the delivery that made it).
"""

from __future__ import annotations

from deepserve.actors.flowserve.messages import TaskAccepted, TaskFinished, TaskRejected
from deepserve.actors.flowserve.rtc.events import (
    RtcBlocksAllocated,
    RtcBlocksCached,
    RtcBlocksMasked,
    RtcCleared,
    RtcCopyFinished,
    RtcCopyStarted,
)
from deepserve.actors.flowserve.rtc.kv_events import KVCacheEvent, KVEventBatch, kv_events_of
from deepserve.core import Context, Event, Message
from deepserve.core.context import Out
from deepserve.core.records import SEND

MAX_SUBSCRIBERS = 64  # a limit on everything: subscribers one DP master sends to
_RTC_EVENTS = (RtcBlocksAllocated, RtcBlocksCached, RtcCleared, RtcCopyFinished, RtcCopyStarted, RtcBlocksMasked)
# The same, as a set of exact types (none is subclassed): `flush` tests every event of every DP
# master delivery (~250k on the Mooncake trace), where a set look-up costs a quarter of
# `isinstance` against the classes (measured: 0.03 s against 0.15 s for 400k events).
_RTC_TYPES = frozenset(_RTC_EVENTS)


class SubscribeKvEvents(Message, frozen=True, kw_only=True):
    """To a TE shell (forwarded to its DP masters) or a DP master: send `subscriber` a
    `KVEventBatch` after each change of the RTC index (`subscribe=False` stops it)."""

    subscriber: str
    subscribe: bool = True


class TaskAnswerKv(Message, frozen=True, kw_only=True):
    """A task answer with the KV events of the same delivery riding on it (see the module's
    docstring): to be handled as `answer` followed by `batch` from the same sender."""

    answer: TaskAccepted | TaskFinished | TaskRejected
    batch: KVEventBatch


_SEND = int(SEND)  # `Out.kind` is a plain int
# The answers a batch may ride on (exact types: none is subclassed).
_ANSWERS = frozenset((TaskAccepted, TaskFinished, TaskRejected))


def ride(outputs: list[Out], dst: str, batch: KVEventBatch) -> bool:
    """Put `batch` on the LAST plain send of this delivery's task answers to `dst` (so it is
    folded after every answer, as the separate batch sent at the end would be); False if none."""
    for o in reversed(outputs):
        if o.dst == dst and o.delay == 0.0 and o.kind == _SEND and type(o.msg) in _ANSWERS:
            o.msg = TaskAnswerKv(answer=o.msg, batch=batch)
            return True
    return False


class KvSubscribed(Event, frozen=True, kw_only=True):
    subscriber: str
    subscribed: bool


class QuietAccepts(Message, frozen=True, kw_only=True):
    """To a TE shell (forwarded to its DP masters) or a DP master: `requester` wants no
    `TaskAccepted` for a chat task it sends to the master directly (it learnt the master from an
    earlier `TaskAccepted.solo` and arms no accept timeout for such a task: JeConfig.quiet_accept).
    Sent beside `SubscribeKvEvents`, along the same path, so it is recorded before the first task."""

    requester: str


class AcceptsQuieted(Event, frozen=True, kw_only=True):
    requester: str


class KvPublisher:
    """The subscriber list and the per-delivery batching of one DP master."""

    __slots__ = ("block_tokens", "dp", "quiet", "refused", "ride", "subscribers")

    def __init__(self, block_tokens: int, dp: int, ride: bool = False) -> None:
        self.block_tokens, self.dp, self.ride = block_tokens, dp, ride
        self.subscribers: tuple[str, ...] = ()
        self.quiet: frozenset[str] = frozenset()  # requesters that asked for QuietAccepts
        self.refused = 0  # subscriptions beyond MAX_SUBSCRIBERS (not state: a count for tests)

    def evolve(self, e: KvSubscribed | AcceptsQuieted) -> None:
        if type(e) is AcceptsQuieted:
            self.quiet = self.quiet | {e.requester}
            return
        assert isinstance(e, KvSubscribed)
        subs = [s for s in self.subscribers if s != e.subscriber]
        if e.subscribed:
            subs.append(e.subscriber)
        self.subscribers = tuple(subs)

    def subscribe(self, ctx: Context, msg: SubscribeKvEvents) -> None:
        known = msg.subscriber in self.subscribers
        if known == msg.subscribe:
            return  # idempotent: nothing changes, nothing recorded
        if msg.subscribe and len(self.subscribers) >= MAX_SUBSCRIBERS:
            self.refused += 1
            return
        ctx.record(KvSubscribed(subscriber=msg.subscriber, subscribed=msg.subscribe))

    def quieten(self, ctx: Context, msg: QuietAccepts) -> None:
        if msg.requester not in self.quiet and len(self.quiet) < MAX_SUBSCRIBERS:
            ctx.record(AcceptsQuieted(requester=msg.requester))

    def acknowledges(self, ctx: Context, task_kind: str, reply_to: str) -> bool:
        """Whether a task is answered with `TaskAccepted`: all but the chat tasks a quiet
        requester sent here itself (not through the TE shell)."""
        return not (task_kind == "chat" and reply_to in self.quiet and ctx.sender == reply_to)

    def flush(self, ctx: Context) -> None:
        """One batch per subscriber with the KV events of the RTC events recorded in this
        delivery (none: nothing is sent)."""
        out: list[KVCacheEvent] = []
        bt = self.block_tokens
        for ev in ctx.events:
            if type(ev) in _RTC_TYPES:
                out += kv_events_of(ev, bt)
        if not out:
            return
        batch = KVEventBatch(ts=ctx.now(), events=tuple(out), data_parallel_rank=self.dp)
        for sub in self.subscribers:
            if not (self.ride and ride(ctx.outputs, sub, batch)):
                ctx.send(sub, batch)
