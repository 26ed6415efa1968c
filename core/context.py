"""What a handler may touch: the context, and the outputs it collects.

One `Context` per actor is reused for every delivery (no allocation on the hot
path). Everything a handler does is appended to `outputs`/`events` and carried out
by the driver *after* the handler returns, so the handler itself stays pure.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, Final

from .address import deterministic_id
from .classpath import class_path
from .messages import AskFailed, Event, Message, ReplyHandle, Started
from .records import CANCEL, SEND, SPAWN, STOP, TIMER
from .rng import DeliveryRng, address_hash, delivery_seed

if TYPE_CHECKING:
    from .cell import Cell
    from .envelope import Envelope


# (`Final`: a C static in the compiled build, compiled.py; a module global is a dict lookup)
# Output kinds as plain ints: an `IntEnum` member costs msgspec a slow path each time a
# record carrying it is encoded (`OutputRec.kind`), and the drivers compare them as ints.
_SEND: Final = int(SEND)
_TIMER: Final = int(TIMER)
_CANCEL: Final = int(CANCEL)
_SPAWN: Final = int(SPAWN)
_STOP: Final = int(STOP)
_AskFailed: Final = AskFailed
# An ask's timeout reason by its timeout: formatting the float costs more than the rest of an
# ask (a round trip is ~26k instructions; the f-string ~1k), and a program uses a few timeouts.
_TIMEOUT_REASONS: Final[dict[float, str]] = {}
MAX_TIMEOUT_REASONS: Final = 256


def timeout_reason(timeout_s: float) -> str:
    """`timeout after {timeout_s}s`, the float's repr (an int timeout reads `1.0s`, as the
    compiled build, which receives a C double, always wrote it)."""
    t = timeout_s + 0.0
    reason = _TIMEOUT_REASONS.get(t)
    if reason is None:
        if len(_TIMEOUT_REASONS) >= MAX_TIMEOUT_REASONS:
            _TIMEOUT_REASONS.clear()
        reason = _TIMEOUT_REASONS[t] = f"timeout after {t}s"
    return reason


class Out:
    """One output of a handler, not yet routed. A plain class: compiled (compiled.py), its
    fields are C struct members the drivers read directly, where a msgspec Struct's are found
    by name (about 9 reads a send; pure Python builds a Struct ~2.5x faster, but the compiled
    build is the one that runs)."""

    __slots__ = ("kind", "dst", "msg", "delay", "msg_id", "corr", "reply_to", "ask", "key", "payload")

    def __init__(
        self, kind: int, dst: str, msg: Any, delay: float, msg_id: int, corr: str | None,
        reply_to: int | None = None, ask: bool = False, key: str | None = None,
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
        # The message's encoding, once a logged delivery has recorded it (`steps.make_row`):
        # the receiver's input record reuses it (a message is encoded once).
        self.payload: bytes | None = None

    def __repr__(self) -> str:
        return f"Out({self.kind!r}, {self.dst!r}, {self.msg!r}, msg_id={self.msg_id})"


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
        # Reset for every delivery by `cell.execute` (inlined there: the hot path).
        self.env: Envelope | None = None
        self._now = 0.0
        self.events: list[Event] = []
        self.event_blobs: list[bytes] = []  # encodings of `events`, made once by the cell
        self.outputs: list[Out] = []
        self._rng: random.Random | None = None
        self._ids = 0
        self.stopping = False

    # ---- reading --------------------------------------------------------
    @property
    def self(self) -> str:
        return self._cell.addr

    def _env(self) -> Envelope:
        env = self.env
        if env is None:
            raise RuntimeError("the context is read outside a delivery")
        return env

    @property
    def sender(self) -> str:
        return self._env().src

    @property
    def corr(self) -> str | None:
        return self._env().corr

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
        actor = self._cell.actor
        assert actor is not None  # a context records only for a started actor
        actor.state = actor.evolve(actor.state, event)
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
        env = self._env()
        return ReplyHandle(env.src, env.msg_id, env.corr)

    def reply(self, msg: Message, to: ReplyHandle | None = None) -> int:
        """Answer the message being handled, or the one `to` names. The receiver
        sees `reply_to` set, which also cancels an `ask`'s timeout."""
        cell = self._cell
        cell.out_seq += 1
        if to is None:  # the envelope's return address, read directly (the ask's answer path)
            env = self._env()
            self.outputs.append(Out(_SEND, env.src, msg, 0.0, cell.out_seq, env.corr, env.msg_id))
        else:
            self.outputs.append(Out(_SEND, to.addr, msg, 0.0, cell.out_seq, to.corr, to.msg_id))
        return cell.out_seq

    def ask(self, dst: str, msg: Message, timeout_s: float, corr: str | None = None) -> int:
        """Request/reply over messages. The answer arrives as a message whose
        envelope has `reply_to` equal to the returned id; if the target is dead,
        full, or silent for `timeout_s`, an `AskFailed` with that id arrives instead.
        """
        if not timeout_s > 0:
            raise ValueError(f"ask needs a positive timeout_s, got {timeout_s!r}")
        # `send` then `after`, inlined (the ask path): the same two outputs.
        cell, env, outputs = self._cell, self.env, self.outputs
        env_corr = env.corr if env is not None else None
        rid = cell.out_seq = cell.out_seq + 1
        outputs.append(Out(_SEND, dst, msg, 0.0, rid, env_corr if corr is None else corr, None, True))
        fail = _AskFailed(request_id=rid, target=dst, reason=timeout_reason(timeout_s))
        cell.out_seq += 1
        # The timeout names its request in reply_to, as every AskFailed does.
        outputs.append(Out(_TIMER, cell.addr, fail, timeout_s + 0.0, cell.out_seq, env_corr, rid, False, f"ask:{rid}"))
        return rid

    def after(self, delay_s: float, msg: Message, key: str | None = None) -> str:
        """A timer to self. Setting a key again replaces the pending timer."""
        if not delay_s >= 0:
            raise ValueError(f"timers cannot fire in the past (or at NaN): delay_s={delay_s!r}")
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
