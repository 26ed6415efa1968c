"""What a handler may touch: the context, and the outputs it collects.

One `Context` per actor is reused for every delivery (no allocation on the hot
path). Everything a handler does is appended to `outputs`/`events` and carried out
by the driver *after* the handler returns, so the handler itself stays pure.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from .address import deterministic_id
from .envelope import ReplyHandle
from .messages import AskFailed, Event, Message, Started
from .rng import DeliveryRng, address_hash, delivery_seed

if TYPE_CHECKING:
    from .cell import Cell
    from .envelope import Envelope

# Out.kind values mirror records.SEND..STOP
_SEND, _TIMER, _CANCEL, _SPAWN, _STOP = 0, 1, 2, 3, 4


class Out:
    """One output of a handler, not yet routed."""

    __slots__ = ("kind", "dst", "msg", "delay", "msg_id", "corr", "reply_to", "ask", "key")

    def __init__(
        self,
        kind: int,
        dst: str,
        msg: Any,
        delay: float,
        msg_id: int,
        corr: str | None,
        reply_to: int | None = None,
        ask: bool = False,
        key: str | None = None,
    ) -> None:
        self.kind = kind
        self.dst = dst
        self.msg = msg
        self.delay = delay
        self.msg_id = msg_id
        self.corr = corr
        self.reply_to = reply_to
        self.ask = ask
        self.key = key


class Context:
    """The handler's only window on time, randomness, identity and other actors."""

    __slots__ = (
        "_cell", "_seed", "_addr_hash", "env", "_now", "events", "outputs", "_rng", "_ids", "stopping",
        "event_blobs",
    )

    def __init__(self, cell: Cell, seed: int) -> None:
        self._cell = cell
        self._seed = seed
        self._addr_hash = address_hash(cell.addr)
        self.env: Envelope | None = None
        self._now = 0.0
        self.events: list[Event] = []
        self.event_blobs: list[bytes] = []  # encodings of `events`, made once by the cell
        self.outputs: list[Out] = []
        self._rng: random.Random | None = None
        self._ids = 0
        self.stopping = False

    def _begin(self, env: Envelope, now: float) -> None:
        self.env = env
        self._now = now
        self.events = []
        self.event_blobs = []
        self.outputs = []
        self._rng = None
        self._ids = 0
        self.stopping = False

    # ---- reading --------------------------------------------------------
    @property
    def self(self) -> str:
        return self._cell.addr

    @property
    def sender(self) -> str:
        assert self.env is not None
        return self.env.src

    @property
    def corr(self) -> str | None:
        assert self.env is not None
        return self.env.corr

    @property
    def seq(self) -> int:
        return self._cell.seq

    def now(self) -> float:
        """Seconds since the run started: virtual in `SimDriver`, wall in `AsyncDriver`."""
        return self._now

    @property
    def rng(self) -> random.Random:
        """Seeded from run seed + address + delivery number: replay redraws the same."""
        if self._rng is None:
            self._rng = DeliveryRng(delivery_seed(self._seed, self._addr_hash, self._cell.seq))
        return self._rng

    def new_id(self) -> str:
        self._ids += 1
        return deterministic_id(self._seed, self._cell.addr, self._cell.seq, self._ids)

    # ---- acting ---------------------------------------------------------
    def record(self, event: Event) -> None:
        """Record a state change and apply it at once through `evolve`."""
        cell = self._cell
        cell.actor.state = cell.actor.evolve(cell.actor.state, event)
        self.events.append(event)

    def send(self, dst: str, msg: Message, corr: str | None = None) -> int:
        """Fire-and-forget; returns the message id. `corr` defaults to the input's."""
        cell = self._cell
        cell.out_seq += 1
        if corr is None and self.env is not None:
            corr = self.env.corr
        self.outputs.append(Out(_SEND, dst, msg, 0.0, cell.out_seq, corr))
        return cell.out_seq

    def reply_handle(self) -> ReplyHandle:
        """The return address of the message being handled, to answer it later
        (a device replies from the timer that ends its work, not from the request)."""
        env = self.env
        assert env is not None, "reply_handle() outside a delivery"
        return ReplyHandle(env.src, env.msg_id, env.corr)

    def reply(self, msg: Message, to: ReplyHandle | None = None) -> int:
        """Answer the message being handled, or the one `to` names. The receiver
        sees `reply_to` set, which also cancels an `ask`'s timeout."""
        if to is None:
            env = self.env
            assert env is not None
            to = ReplyHandle(env.src, env.msg_id, env.corr)
        cell = self._cell
        cell.out_seq += 1
        self.outputs.append(Out(_SEND, to.addr, msg, 0.0, cell.out_seq, to.corr, to.msg_id))
        return cell.out_seq

    def ask(self, dst: str, msg: Message, timeout_s: float, corr: str | None = None) -> int:
        """Request/reply over messages. The answer arrives as a message whose
        envelope has `reply_to` equal to the returned id; if the target is dead,
        full, or silent for `timeout_s`, an `AskFailed` with that id arrives instead.
        """
        assert timeout_s > 0, "ask needs a positive timeout"
        rid = self.send(dst, msg, corr)
        self.outputs[-1].ask = True
        fail = AskFailed(request_id=rid, target=dst, reason=f"timeout after {timeout_s}s")
        self.after(timeout_s, fail, key=f"ask:{rid}")
        return rid

    def after(self, delay_s: float, msg: Message, key: str | None = None) -> str:
        """A timer to self. Setting a key again replaces the pending timer."""
        assert delay_s >= 0, f"timers cannot fire in the past (or at NaN): {delay_s}"
        delay_s += 0.0  # -0.0 -> 0.0: the log stores what the handler meant
        cell = self._cell
        cell.out_seq += 1
        key = key if key is not None else f"t{cell.out_seq}"
        corr = self.env.corr if self.env is not None else None
        self.outputs.append(Out(_TIMER, cell.addr, msg, delay_s, cell.out_seq, corr, key=key))
        return key

    def cancel(self, key: str) -> None:
        cell = self._cell
        cell.out_seq += 1
        self.outputs.append(Out(_CANCEL, cell.addr, None, 0.0, cell.out_seq, None, key=key))

    def spawn(self, addr: str, cls: type, **kwargs: Any) -> str:
        """Start a child actor at `addr`, built as `cls(**kwargs)`."""
        from .actor import class_path

        cell = self._cell
        cell.out_seq += 1
        started = Started(cls=class_path(cls), args=kwargs, parent=cell.addr)
        corr = self.env.corr if self.env is not None else None
        self.outputs.append(Out(_SPAWN, addr, started, 0.0, cell.out_seq, corr))
        return addr

    def stop(self, addr: str | None = None) -> None:
        """Stop self (after this handler) or another actor (a `Stop` message to it)."""
        if addr is None or addr == self._cell.addr:
            self.stopping = True
            return
        cell = self._cell
        cell.out_seq += 1
        self.outputs.append(Out(_STOP, addr, None, 0.0, cell.out_seq, None))
