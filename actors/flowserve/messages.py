"""The Task Executor's message interface: what a JE (or the workload stand-in, or a test) sends
to a TE shell, and what comes back. Kept stable; extended only additively (issue 6's JE uses it).

Flow (colocated): requester --SubmitTask(kind="chat")--> TE shell --> a DP-group master, which
answers `TaskAccepted` (or `TaskRejected`) to the requester, streams `TaskTokens` straight to
`reply_to` (output short-circuiting, xDeepServe §4.2: not through the shell or the JE) — or, with
`stream_to`, each pass's chunks as one `TokenBatch` to that address (a live frontend) and only each
task's first chunk to `reply_to` — and ends with exactly one `TaskFinished` to `reply_to`.

Flow (PD-disaggregated, xDeepServe §5.1): SubmitTask(kind="prefill") to the P TE; its master
prefills, streams the first token, registers a transfer (metadata only) and finishes the task
with `TaskFinished(kv=KvHandle(...))`. The requester then sends SubmitTask(kind="decode",
kv_source=that handle) to a D TE; the D master checks its KV capacity (deferring the receive when
short: backpressure), pulls the KV through DistFlow, verifies every block's fingerprint, tells P
to free its blocks, and decodes the remaining tokens.

A prompt is not a token list: `Prompt(num_tokens, block_hashes)` carries one 64-bit chain hash
per FULL block of the cluster-wide `kv_block_tokens` (see tokens.py for how they are made).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from deepserve.core.messages import Message

TaskKind = Literal["chat", "prefill", "decode"]
TaskStatus = Literal["completed", "failed", "cancelled"]

MAX_OUTPUT_TOKENS = 1 << 20  # a limit on everything


class Prompt(msgspec.Struct, frozen=True, kw_only=True):
    num_tokens: int
    block_hashes: tuple[int, ...] = ()  # chain hash of each full block, in order


class Sampling(msgspec.Struct, frozen=True, kw_only=True):
    max_tokens: int
    target_output_tokens: int | None = None  # trace replay: stop here, ignoring EOS
    seed: int = 0  # the emulated token stream and EOS position derive from it
    ignore_eos: bool = False
    # The emulated model's sampling (actors/flowserve/sampling.py): temperature 0 or top_k 1 is
    # greedy (the output depends on the prompt only); top_k/top_p/min_p narrow the draw.
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: off
    min_p: float = 0.0
    min_tokens: int = 0  # no EOS before this many output tokens
    prompt_key: int = 0  # a digest of the prompt's tokens: what the output continues


class KvHandle(msgspec.Struct, frozen=True, kw_only=True):
    """A registered PD transfer: where a prefilled prompt's KV lives (metadata only).

    `src` is the P side's DistFlow endpoint (the DP master that owns the blocks), `npus` its
    NPUs (the bytes leave from there), `block_ids` the raw block addresses in its pool,
    `fingerprints` one per block (f(model, chain hash)) for verification on receive."""

    transfer_id: str
    src: str
    npus: tuple[str, ...]
    model: str
    num_tokens: int
    block_ids: tuple[int, ...]
    fingerprints: tuple[int, ...]
    block_bytes: int  # bytes of one block's KV on one NPU (all layers)
    first_token_id: int  # the token the prefill produced (decode continues after it)


class SubmitTask(Message, frozen=True, kw_only=True):
    task_id: str
    request_id: str
    kind: TaskKind
    model: str
    prompt: Prompt
    sampling: Sampling
    reply_to: str  # receives TaskTokens and the one TaskFinished (output short-circuit)
    kv_source: KvHandle | None = None  # kind="decode" in PD mode: the P side's registered KV
    context_id: str | None = None  # explicit context cache to reuse (RTC MatchByID)
    arrival_s: float | None = None  # when the request entered the platform (for TTFT)
    # False: the requester wants the terminal message only (TaskFinished / TaskRejected carry the
    # timings), no TaskAccepted and no TaskTokens — a trace replay that only measures. The token
    # timeline stays in the master's log (BatchPlanned entries + BatchEnded pass end times).
    stream: bool = True
    # Output short-circuit to a live frontend (xDeepServe §4.2): the master sends the tokens of
    # each pass, for all its tasks with the same `stream_to`, as one `TokenBatch` there; the
    # requester gets only the first chunk of the task (it learns that output went out) and the
    # terminal message. "": every chunk to `reply_to` (simulations, the workload stand-in).
    stream_to: str = ""
    # False: no `TaskTokens` to `reply_to` (`TaskAccepted` and the terminal message still come;
    # `stream_to` is unaffected): a requester whose client sees output only at the end (a JE's
    # non-streaming job in a simulation) needs nothing from the chunks, and each would be a
    # delivery and a record.
    tokens: bool = True
    # Request migration by recomputation (xLLM §3.5): a task that continues a stream whose first
    # `resume_from` output tokens were produced elsewhere (a failed TE). A `chat` task prefills the
    # prompt and those tokens (the emulated stream is a pure function of the seed and the index,
    # so they need not be sent) and emits from index `resume_from` on; in P/D, the `prefill` task
    # does the same and emits token `resume_from` only (its KV handle covers prompt + resume_from
    # tokens), and the `decode` task, given that handle, emits from `resume_from + 1`. 0: fresh.
    resume_from: int = 0


class CancelTask(Message, frozen=True, kw_only=True):
    task_id: str
    reason: str = "cancelled by the requester"


class CancelOwner(Message, frozen=True, kw_only=True):
    """Cancel every task whose requester (`SubmitTask.reply_to`) is `owner`: the owner is gone
    (a lost JE), so its tasks are zombies (P/D-Serve §3.4) — nobody reads their tokens, and they
    hold KV blocks and batch slots. Sent by the cluster manager to each TE shell, which passes
    it to its DP masters."""

    owner: str
    reason: str


class TaskAccepted(Message, frozen=True, kw_only=True):
    task_id: str
    te: str
    dp: int  # the DP group the shell dispatched it to
    master: str  # the DP master's address (cancel may be sent there directly)
    # the TE has no other DP group: its shell only forwards, so the requester may send the TE's
    # next tasks to `master` directly (one delivery a task less)
    solo: bool = False


class TaskRejected(Message, frozen=True, kw_only=True):
    task_id: str
    reason: str  # e.g. the prefill queue is over its bound (P/D-Serve on-demand forwarding)


class TaskTokens(Message, frozen=True, kw_only=True):
    """Output tokens `first_index ..` of a task, with the time each was produced. In the
    aggregated simulation path one message carries a whole run of tokens. A TE configured with
    `token_ids = false` (simulations that only measure) leaves `token_ids` empty: then
    `len(times_s)` is the number of tokens."""

    task_id: str
    request_id: str
    first_index: int
    token_ids: tuple[int, ...]
    times_s: tuple[float, ...]


class TokenBatch(Message, frozen=True, kw_only=True):
    """One forward pass's output chunks for the tasks streaming to one address (`stream_to`):
    one message and one log record per pass, whatever the batch size."""

    chunks: tuple[TaskTokens, ...]


# The reason of a decode task whose KV never arrived starts with this: the JE then keeps the job's
# retries off the prefill TE too (the KV path between the two may be what failed).
KV_TRANSFER_FAILED = "KV transfer failed"


class TaskFinished(Message, frozen=True, kw_only=True):
    """The one terminal message of a task."""

    task_id: str
    request_id: str
    status: TaskStatus
    reason: str  # "length", "target", "stop", "prefilled", or why it failed/was cancelled
    prompt_tokens: int
    cached_prompt_tokens: int  # prompt tokens whose KV came from the prefix/context cache
    output_tokens: int
    first_token_s: float | None
    finish_s: float
    te: str = ""
    dp: int = -1
    preemptions: int = 0
    kv: KvHandle | None = None  # kind="prefill": the registered transfer for the decode side
    # vLLM's QUEUED and first SCHEDULED times on the master (None: never scheduled)
    queued_s: float | None = None
    scheduled_s: float | None = None


# ---- TE shell: registration, load, context caching -------------------------------------------


class DpLoad(msgspec.Struct, frozen=True, kw_only=True):
    dp: int
    waiting: int
    running: int
    kv_blocks_used: int
    kv_blocks_total: int
    kv_blocks_reserved: int  # space promised to running requests' remaining outputs
    prompt_tokens: int  # totals since start: prefix hit rate = cached / prompt
    cached_prompt_tokens: int
    prefill_tokens_waiting: int = 0  # prompt tokens still to compute (queued + partial)
    max_num_seqs: int = 0
    device_lost: str = ""  # its NPU crashed or faulted (`DeviceLost`): it takes no requests


class RegisterTe(Message, frozen=True, kw_only=True):
    te: str
    model: str
    role: Literal["colocated", "prefill", "decode"]
    dp_groups: int
    npus: tuple[str, ...]


class TeLoadReport(Message, frozen=True, kw_only=True):
    te: str
    at_s: float
    healthy: bool
    waiting: int
    running: int
    kv_usage: float  # used / total blocks over all DP groups
    prefix_hit_rate: float  # cached prompt tokens / prompt tokens since start
    dps: tuple[DpLoad, ...] = ()


class CreateContext(Message, frozen=True, kw_only=True):
    """Context caching (DeepServe §4.1): prefill `prompt` once and keep its KV under `context_id`."""

    req_id: str
    context_id: str
    model: str
    prompt: Prompt
    reply_to: str = ""  # who gets the ContextInfo (the shell fills in its requester)


class GetContext(Message, frozen=True, kw_only=True):
    req_id: str
    context_id: str
    reply_to: str = ""


class DeleteContext(Message, frozen=True, kw_only=True):
    req_id: str
    context_id: str
    reply_to: str = ""


class ContextInfo(Message, frozen=True, kw_only=True):
    """The answer to the three context-caching requests."""

    req_id: str
    context_id: str
    found: bool
    num_tokens: int = 0
    dp: int = -1
    error: str | None = None
