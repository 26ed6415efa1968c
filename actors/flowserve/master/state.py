"""The DP-group master's configuration, state, events and `evolve` (DeepServe §4.2).

The state holds the RTC master (`rtc.Rtc`, applied in place by `rtc.apply`) and the scheduler's
bookkeeping: every task's progress (`Req`), the waiting and running queues, the batch in flight.
State changes ONLY through the recorded events below and the RTC's events; `evolve` mutates the
state object in place and returns it (the kernel snapshots a deep copy every `snapshot_every`
events and restarts from snapshot + events, so in-place application is safe and cheap).

Token accounting follows vLLM v1: a task's known tokens are prompt + emitted outputs;
`num_computed` of them have KV. A step computes `n` more; when that reaches every known token the
step samples one new token (the first one ends a prefill).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from deepserve.actors.flowserve import rtc
from deepserve.actors.flowserve.messages import KvHandle, SubmitTask
from deepserve.core import Event

ARRIVED = "arrived"  # PD decode side: just queued, before the capacity check
WAITING = "waiting"  # ready to be scheduled
LOADING = "loading"  # its cached prefix is being populated from DRAM (prefetch)
RECEIVING = "receiving"  # PD decode side: KV on its way through DistFlow
DEFERRED = "deferred"  # PD decode side: not enough KV blocks to receive yet (backpressure)
RUNNING = "running"
HELD = "held"  # PD prefill side: done, blocks kept for the decode side to pull


class MasterConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One DP group. Times in seconds; the scheduling gap is the host's launch gap between two
    forwards with asynchronous execution, `sched_cpu_s` the host's scheduling + output work that
    asynchronous execution hides (it adds to the gap when `async_scheduling` is off)."""

    model: str
    npus: tuple[str, ...]  # the group's TP ranks; one forward drives all of them
    kv_block_bytes: int  # bytes of one block's KV on ONE NPU, all layers
    hbm_blocks: int
    dram_blocks: int = 0
    block_tokens: int = 128
    host: str = ""  # the server's host endpoint (DRAM tier copies go over its PCIe)
    fabric: str = "hw/fabric"
    role: Literal["colocated", "prefill", "decode"] = "colocated"
    tp: int = 1
    max_num_seqs: int = 64  # the batch limit
    max_num_batched_tokens: int = 2048  # the token budget of one step
    chunked_prefill: bool = True
    async_scheduling: bool = True
    sched_gap_s: float = 0.0005
    sched_cpu_s: float = 0.004
    preemption: Literal["recompute", "swap"] = "recompute"
    eos_rate: float = 0.0
    # (mu, sigma): output lengths lognormal (fitted to a trace) instead of the per-token eos_rate
    eos_lognormal: tuple[float, float] | None = None
    vocab: int = 32_000
    aggregate: bool = False  # the simulation fast path (NpuForwardRun); False: step every pass
    token_ids: bool = True  # False (simulation): TaskTokens carry times only, ids left empty
    solo: bool = False  # the TE's only DP group (set by its shell): TaskAccepted.solo
    # KV events ride on a task answer of the same delivery (kv_publish.py); False in spawn
    # configs written before it, whose logs replay with a separate batch as recorded
    kv_ride: bool = False
    max_run_iterations: int = 4_096
    # RTC background swap-out: copies of at least this many cold blocks (unless one is about to
    # be evicted). 32 of the default 64-block batch halves the copies of a Mooncake replay at
    # the same hit rate (docs/decisions.md, "Background swap-out copies at least 32 blocks").
    swap_min_blocks: int = 32
    max_waiting: int = 100_000
    npu_timeout_s: float = 120.0
    populate_bytes_per_s: float = 2.4e10  # prefetch cost model: DRAM -> HBM estimate (PCIe 4)
    prefill_tokens_per_s: float = 2.0e4  # initial recompute estimate; learned from prefills
    te: str = ""  # the owning TE's name (reported in TaskFinished)
    dp: int = 0
    kv_transfer: Literal["contiguous", "block"] = "contiguous"  # PD: P/D-Serve block-free or not
    kv_granularity: Literal["request", "layer"] = "request"
    kv_layers: int = 32  # the model's layers (by-layer transfer sends one message per layer)
    kv_transfer_timeout_s: float = 30.0
    pd_hold_timeout_s: float = 300.0  # P side: free a registered transfer nobody pulled
    # Fine-grained error handling (recovery.py), off by default: roll a pass back on a transient
    # link error (all `dp_groups` of the TE) instead of failing its tasks; mask a faulty part of
    # the KV region instead of losing the device.
    token_recompute: bool = False
    hbm_masking: bool = False
    kv_link_probe_s: float = 0.0  # PD decode side: DistFlow link probing (distflow/probe.py; 0: off)
    health_to: str = ""  # the host's device-health monitor, told of link-probe verdicts ("": none)
    dp_groups: int = 1  # the TE's DP groups (`{te}/dp/0..dp_groups-1`): the rollback's broadcast
    kv_backup: bool = False  # write each indexed prompt block through to host DRAM (distflow/migrate.py)

    def __post_init__(self) -> None:
        for name in ("kv_block_bytes", "hbm_blocks", "block_tokens", "tp", "max_num_seqs",
                     "max_num_batched_tokens", "max_run_iterations", "max_waiting", "swap_min_blocks"):  # fmt: skip
            if getattr(self, name) <= 0:
                raise ValueError(f"MasterConfig.{name}: must be > 0, got {getattr(self, name)}")
        if not self.npus:
            raise ValueError("MasterConfig.npus: at least one NPU address")
        if self.sched_gap_s < 0 or self.sched_cpu_s < 0:
            raise ValueError("MasterConfig.sched_gap_s/sched_cpu_s: must be >= 0")
        if self.dram_blocks > 0 and not self.host:
            raise ValueError("MasterConfig.host: needed when dram_blocks > 0 (DRAM tier copies)")

    def launch_gap_s(self) -> float:
        return self.sched_gap_s if self.async_scheduling else self.sched_gap_s + self.sched_cpu_s


# Settings added after logs existed, left out of a spawn's recorded config while at their
# defaults: a run that does not use them logs exactly what it logged before they were added.
_LATER_DEFAULTS = {"token_recompute": False, "hbm_masking": False, "kv_link_probe_s": 0.0, "dp_groups": 1,
                   "health_to": "", "kv_ride": False, "kv_backup": False}  # fmt: skip


def spawn_config(cfg: MasterConfig) -> dict[str, Any]:
    """`cfg` as the config dict a spawn records (`msgspec.to_builtins`, minus `_LATER_DEFAULTS`)."""
    out: dict[str, Any] = msgspec.to_builtins(cfg)
    for k, v in _LATER_DEFAULTS.items():
        if out.get(k) == v:
            del out[k]
    return out


class Req(msgspec.Struct, kw_only=True):
    """One task's progress (mutable; changed only by evolve)."""

    task: SubmitTask
    out_len: int  # output tokens it will produce (known in advance: tokens.output_length)
    stop: str  # why it stops at out_len ("length", "target", "stop", "prefilled")
    status: str = WAITING
    num_computed: int = 0
    emitted: int = 0
    cached_tokens: int = 0  # prompt tokens that came from the cache at first admission
    admitted: bool = False
    first_token_s: float | None = None
    preemptions: int = 0
    # vLLM's QUEUED and first SCHEDULED times (its queue and prefill phases); None in old logs
    queued_s: float | None = None
    scheduled_s: float | None = None  # the first batch that admitted it (a preemption keeps it)
    cancelled: str | None = None  # reason, when a cancel arrived while in a forward
    cancelled_at: float | None = None  # passes ending after this produce nothing for it
    copy_id: str | None = None  # the populate/receive it waits for

    @property
    def num_tokens(self) -> int:
        return self.task.prompt.num_tokens + self.emitted


class Entry(msgspec.Struct, frozen=True, array_like=True):
    """One task in a batch: `n` tokens computed per pass."""

    task_id: str
    n: int


class InFlight(msgspec.Struct, kw_only=True):
    step: int
    entries: tuple[Entry, ...]
    iterations: int
    lead: tuple[tuple[Entry, ...], ...] = ()  # BatchPlanned's
    emit_from: tuple[int, ...] = ()

    def first_emits(self) -> dict[str, int]:
        """task id -> the pass of its first token in this batch, where not pass 0 (a lead)."""
        if not self.emit_from:
            return {}
        return dict(zip((e.task_id for e in self.entries), self.emit_from, strict=True))
    launched: bool = False
    interrupt: bool = False  # something arrived: end a run after its current pass


class MasterState(msgspec.Struct, kw_only=True):
    rtc: rtc.Rtc
    reqs: dict[str, Req] = {}
    waiting: list[str] = []  # FCFS; preempted tasks go back to the front
    running: list[str] = []  # admission order
    deferred: list[str] = []  # PD decode: waiting for room to receive
    in_flight: InFlight | None = None
    step: int = 0
    prompt_tokens: int = 0  # totals, for the prefix hit rate
    cached_prompt_tokens: int = 0
    finished: int = 0
    prefill_tokens_per_s: float = 0.0  # learned estimate (EWMA over prefill steps)
    run_pass_s: float = 0.0  # learned time of one pass of a decode run, gap included (0: none yet)
    held: dict[str, KvHandle] = {}  # PD prefill side: registered transfers by transfer id
    channels: list[str] = []  # prefill masters this decode master has a DistFlow channel to
    corrupt: list[tuple[str | None, int]] = []  # armed KV corruption faults (task id, block)
    # The NPU crashed or its HBM faulted: every forward would fail until a reset, which the
    # TE's replacement brings (heartbeats report it; see `DeviceLost`). "" while healthy.
    device_lost: str = ""


# ---- events ------------------------------------------------------------------------------


class TaskQueued(Event, frozen=True, kw_only=True):
    task: SubmitTask
    out_len: int
    stop: str
    status: str = WAITING
    emitted: int = 0  # PD decode side: the prefill already produced the first token
    at_s: float | None = None  # when it was queued (None: recorded before the field existed)


class TaskStatus(Event, frozen=True, kw_only=True):
    """A task moves between waiting / loading / receiving / deferred / held."""

    task_id: str
    status: str
    num_computed: int | None = None  # set when its KV arrived (populate, receive)
    copy_id: str | None = None
    front: bool = False  # re-queue at the front (preemption)


class BatchPlanned(Event, frozen=True, kw_only=True, omit_defaults=True):
    """The next batch: entries, passes, admissions (with their cache hits) and preemptions.
    One a step: its fields at their defaults are left out of the log (`omit_defaults`)."""

    step: int
    entries: tuple[Entry, ...]
    iterations: int = 1
    # A run's passes 1..len(lead) when they differ from decoding every entry (the chunks that
    # finish its prompts, each pass's entries in order); then every entry decodes.
    lead: tuple[tuple[Entry, ...], ...] = ()
    emit_from: tuple[int, ...] = ()  # per entry, the pass of its first token here (() : all 0)
    admitted: tuple[tuple[str, int], ...] = ()  # (task id, cached prompt tokens)
    preempted: tuple[str, ...] = ()
    launched: bool = False  # handed to the NPU at once (which times the launch gap)
    at_s: float | None = None  # when it was planned: set when it admits a task (vLLM's SCHEDULED)


class BatchLaunched(Event, frozen=True, kw_only=True):
    step: int
    iterations: int


class BatchInterrupted(Event, frozen=True, kw_only=True):
    step: int


class DeviceLost(Event, frozen=True, kw_only=True):
    """The master's NPU answered `crashed` or `hbm_fault`: the master runs nothing more. Its
    tasks fail (the JE retries them elsewhere), new ones are refused, and its heartbeat
    answers say why, so the monitor declares the TE failed and the cluster manager replaces
    it (xDeepServe §6.2, stage 2: the TE fails over alone; remapping a faulted HBM region in
    place, stage 3, is not emulated)."""

    reason: str


class BatchEnded(Event, frozen=True, kw_only=True):
    """The NPU finished `len(ends_s)` passes of the batch; pass i's tokens were sampled at
    `ends_s[i]`. With `failed`, no pass counts (the device failed)."""

    step: int
    ends_s: tuple[float, ...]
    prefill_s: float = 0.0  # duration of the one pass when it held prefill chunks
    lead_s: tuple[float, ...] = ()  # durations of the lead passes that ran (see BatchPlanned)
    failed: str = ""


class TaskEnded(Event, frozen=True, kw_only=True):
    task_id: str
    status: str
    reason: str


class TaskCancelMarked(Event, frozen=True, kw_only=True):
    task_id: str
    reason: str
    at_s: float = 0.0


class TransferHeld(Event, frozen=True, kw_only=True):
    task_id: str
    handle: KvHandle


class TransferReleased(Event, frozen=True, kw_only=True):
    transfer_id: str


class ChannelOpened(Event, frozen=True, kw_only=True):
    addr: str


class CorruptionArmed(Event, frozen=True, kw_only=True):
    task_id: str | None
    block_index: int


class CorruptionUsed(Event, frozen=True, kw_only=True):
    index: int


MASTER_EVENTS = (
    TaskQueued, TaskStatus, BatchPlanned, BatchLaunched, BatchInterrupted, BatchEnded, TaskEnded,
    TaskCancelMarked, TransferHeld, TransferReleased, ChannelOpened,
)  # fmt: skip


def new_state(cfg: MasterConfig) -> MasterState:
    rc = rtc.RtcConfig(
        hbm_blocks=cfg.hbm_blocks, dram_blocks=cfg.dram_blocks, block_tokens=cfg.block_tokens,
        swap_min_blocks=cfg.swap_min_blocks,
    )
    return MasterState(rtc=rtc.new_rtc(rc), prefill_tokens_per_s=cfg.prefill_tokens_per_s)
