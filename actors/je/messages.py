"""The JE's messages (from the gateway, the cluster manager, timers) and its recorded events.

Requests keep the workload stand-in's terminal record (`RequestDone`, sent to the job's
`reply_to`), so the scenario run loop's metrics collector reads both the same way.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from deepserve.actors.flowserve.messages import KvHandle, Prompt, Sampling
from deepserve.actors.scheduling.decision import Decision
from deepserve.actors.scheduling.locality import PromptTree
from deepserve.actors.workload.messages import RequestDone
from deepserve.core.messages import Event, Message

from .migration import Choice, KvImportSent, KvSurveyStarted, MigrationAsked

GroupRole = Literal["colocated", "prefill", "decode"]
Phase = Literal["chat", "prefill", "decode"]


# ---- inputs ------------------------------------------------------------------------------------


class TeGroupMembership(Message, frozen=True, kw_only=True):
    """Pushed by the cluster manager whenever a TE group changes (no polling lag): the whole
    current membership of the (model, role) group, replacing what the JE knew."""

    model: str
    role: GroupRole
    tes: tuple[str, ...]
    version: int = 0
    # TEs being drained (scale-down): no new tasks, but their open tasks are not failed over
    draining: tuple[str, ...] = ()
    # where members the recovery ladder moved run (TE -> NPUs; the others run at their slot's):
    # the NPU-fork coordinator forks from there, whatever way the TE booted; JEs ignore it
    placed: dict[str, tuple[str, ...]] = {}


class CancelJob(Message, frozen=True, kw_only=True):
    """The client went away (or hit a stop sequence, or the TTFT deadline): cancel the job's
    current task on its TE (which frees its KV) and end the request as cancelled — or, with
    `completed` (a stop sequence: the client has all it asked for), as completed."""

    request_id: str
    reason: str = "the client disconnected"
    completed: bool = False


class JobRequest(Message, frozen=True, kw_only=True):
    """One API request as a job (from the gateway)."""

    request_id: str
    model: str
    prompt: Prompt
    sampling: Sampling
    reply_to: str  # receives the one RequestDone
    arrival_s: float | None = None  # None: now
    predicted_bucket: int | None = None  # decode-length bucket from the predictor, if any
    # False: the client sees no output before the job ends (one response body), so a task that
    # failed after producing tokens is retried from scratch, its tokens discarded
    stream: bool = True
    # >0: the gateway moved the job here after its JE was lost (`lost`: why), the `epoch`-th
    # time; a streamed one resumes at its client's position (zombie protection, gateway/actor.py)
    epoch: int = 0
    lost: str = ""


class BatchItem(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    prompt: Prompt
    sampling: Sampling


class SubmitBatch(Message, frozen=True, kw_only=True):
    """A batch-inference job: many requests, a deadline, best-effort behind online traffic."""

    batch_id: str
    model: str
    items: tuple[BatchItem, ...]
    deadline_s: float  # absolute virtual time
    reply_to: str  # receives a RequestDone per item and one BatchDone


class BatchDone(Message, frozen=True, kw_only=True):
    batch_id: str
    completed: int
    failed: int


class AcceptTimeout(Message, frozen=True, kw_only=True):
    task_id: str


class CancelDeadline(Message, frozen=True, kw_only=True):
    """The JE's timer: a cancelled job's TE did not answer the cancel in time."""

    request_id: str


class OfferAgain(Message, frozen=True, kw_only=True):
    """A waiting prefill task's TTFT deadline (on-demand forwarding)."""

    request_id: str


class SweepTick(Message, frozen=True, kw_only=True):
    """On-demand forwarding's fallback: offer the oldest waiting prefill task around again."""


class BatchTick(Message, frozen=True, kw_only=True):
    pass


class ParkTimeout(Message, frozen=True, kw_only=True):
    request_id: str


# ---- events ------------------------------------------------------------------------------------


class JobAccepted(Event, frozen=True, kw_only=True):
    request_id: str
    model: str
    prompt: Prompt
    sampling: Sampling
    reply_to: str
    arrival_s: float
    predicted_bucket: int | None = None
    batch_id: str = ""  # "" = online
    stream: bool = True  # JobRequest.stream
    epoch: int = 0  # JobRequest.epoch


class BatchAccepted(Event, frozen=True, kw_only=True):
    batch_id: str
    count: int
    deadline_s: float
    reply_to: str


class MembershipChanged(Event, frozen=True, kw_only=True):
    model: str
    role: GroupRole
    tes: tuple[str, ...]
    draining: tuple[str, ...] = ()


class JobCancelRequested(Event, frozen=True, kw_only=True):
    request_id: str
    reason: str
    completed: bool = False  # CancelJob.completed: the request ends completed


class RouteDecided(Event, frozen=True, kw_only=True):
    """A task of the request was sent to `decision.chosen` (the decision's inputs included):
    what `deepserve replay why` reads."""

    request_id: str
    task_id: str
    phase: Phase
    attempt: int
    decision: Decision


class TaskAcked(Event, frozen=True, kw_only=True):
    task_id: str
    # the TE's only DP master (TaskAccepted.solo): the TE's next tasks go there, past its shell
    direct: str = ""


class TaskStreamed(Event, frozen=True, kw_only=True):
    """Output of the current task was relayed: for a streaming client retrying it is no longer
    safe (a non-streaming one has seen nothing: its job is retried from scratch). Recorded
    for every token message, so that a job the JE ends itself (its TE failed, the daemon stops)
    records the tokens it did produce and when the first came."""

    task_id: str
    upto: int = 0  # output tokens streamed so far (the message's first_index + its tokens)
    first_token_s: float | None = None  # set by the message holding token 0


class OfferRefused(Event, frozen=True, kw_only=True):
    request_id: str
    task_id: str
    te: str
    reason: str
    # not "busy" (forwarding.is_busy): the TE cannot take this task at all (device lost, ...):
    # the job never offers it again (`Job.excluded`), instead of once per sweep
    permanent: bool = False


class RouteQueued(Event, frozen=True, kw_only=True):
    """The policy chose a prefill (its decision recorded whole) but older prefill tasks wait
    in the JE, so this one joins the wait instead of being offered (P/D-Serve: oldest first)."""

    request_id: str
    decision: Decision
    reason: str


class PrefillWaiting(Event, frozen=True, kw_only=True):
    """On-demand forwarding: no prefill took the task; it waits in the JE (P/D-Serve: at the
    gateway, not in a prefill's local queue), oldest first (`front`: back at the head)."""

    request_id: str
    reason: str
    front: bool = False


class SweepMissed(Event, frozen=True, kw_only=True):
    """A fallback sweep found no idle prefill: the next one waits twice as long (capped)."""


class JeTaskEnded(Event, frozen=True, kw_only=True):
    """The current task reached a terminal state (or was given up on: no answer, TE gone)."""

    request_id: str
    task_id: str
    te: str
    status: str
    reason: str
    # also excluded from the job's retries: the prefill TE whose KV never reached the failed
    # decode (the link between them may be what failed; no heartbeat covers a link)
    prefill_te: str = ""


class JePrefilled(Event, frozen=True, kw_only=True):
    request_id: str
    first_token_s: float | None
    cached_prompt_tokens: int
    prompt_tokens: int
    kv: KvHandle
    te: str = ""  # the prefill TE holding the KV: a failed decode excludes it too
    queued_s: float | None = None  # the prefill task's (RequestDone's, once the decode ends)
    scheduled_s: float | None = None


class PrefillSetAside(Event, frozen=True, kw_only=True):
    """A prefill TE's KV did not reach its decode TE: no new P/D task goes to it before
    `until_s` while another TE can take one (`JeConfig.kv_fail_cooldown_s`)."""

    te: str
    until_s: float
    reason: str


class JobFinished(Event, frozen=True, kw_only=True):
    done: RequestDone
    batch_id: str = ""


class JobParked(Event, frozen=True, kw_only=True):
    """No TE group of the job's model is known yet (the cluster manager has not pushed one):
    the job waits for the push, at most the TTFT deadline."""

    request_id: str


class JeLateMessage(Event, frozen=True, kw_only=True):
    """A message about a task that is not current (an earlier attempt, a finished job)."""

    task_id: str
    what: str


# ---- state -------------------------------------------------------------------------------------


class Job(msgspec.Struct, kw_only=True):
    model: str
    prompt: Prompt
    sampling: Sampling
    reply_to: str
    arrival_s: float
    predicted_bucket: int | None = None
    batch_id: str = ""
    queued: bool = False  # a batch item not dispatched yet
    phase: str = ""
    task_id: str = ""
    te: str = ""
    attempt: int = 0
    acked: bool = False
    streamed: bool = False  # the current task produced output (TaskStreamed)
    stream: bool = True  # JobRequest.stream: the client sees output as it is produced
    start_attempt: int = 0  # the attempt number of the job's latest chat or prefill task
    decodes: int = 0  # decode tasks sent (more than one: a non-streamed job restarted)
    excluded: list[str] = []  # TEs that failed this job (not offered again)
    refused: list[str] = []  # on-demand: prefills that refused in the current sweep
    last_refused: list[str] = []  # on-demand: who refused in the sweep before the task waited
    fed: bool = False  # on-demand: the current offer is batch forwarding to one prefill
    waited: bool = False  # on-demand: the task has waited in the JE (its deadline timer is set)
    first_token_s: float | None = None
    cached_prompt_tokens: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0  # produced by the current attempt so far (TaskStreamed)
    kv: KvHandle | None = None
    prefill_te: str = ""  # the TE that prefilled `kv` (JePrefilled)
    queued_s: float | None = None  # the prefill task's queued and first scheduled times (JePrefilled)
    scheduled_s: float | None = None
    cancelled: str = ""  # why the requester cancelled it ("": not cancelled)
    cancel_completes: bool = False  # ... and it ends completed, not cancelled (a stop sequence)
    migrations: int = 0  # times its stream moved to another TE (migration.TaskMigrated)
    asked: MigrationAsked | None = None  # moving: waiting for the frontend's stream position
    surveying: KvSurveyStarted | None = None  # moving: waiting for the failed TE's KV offer
    kv_move: Choice | None = None  # moved with KV migration chosen: its next task imports first
    importing: KvImportSent | None = None  # its next task waits while its target imports the KV
    switch: KvSurveyStarted | None = None  # live: the old task to cancel once the new one is sent
    resume_from: int = 0  # the output token its next chat task starts at (0: from the start)
    epoch: int = 0  # JobRequest.epoch: in its task ids (decide.task_id)


class Batch(msgspec.Struct, kw_only=True):
    count: int
    deadline_s: float
    reply_to: str
    completed: int = 0
    failed: int = 0


class JeState(msgspec.Struct, kw_only=True):
    groups: dict[str, dict[str, list[str]]] = {}  # model -> role -> TEs
    draining: dict[str, list[str]] = {}  # "model/role" -> TEs draining (no new tasks, not failed over)
    trees: dict[str, PromptTree] = {}  # model -> the global prompt tree of its TE group
    publishing: list[str] = []  # TEs whose KV events arrived (no ROUTED guesses for them)
    direct: dict[str, str] = {}  # TE -> its only DP master (TaskAcked.direct), until it leaves
    jobs: dict[str, Job] = {}
    open: dict[str, int] = {}  # TE -> current tasks on it from this JE
    parked: list[str] = []  # jobs waiting for their model's first membership push
    batch_queue: list[str] = []  # request ids of batch items waiting for room
    batches: dict[str, Batch] = {}
    turns: int = 0  # round-robin decisions so far
    waiting: list[str] = []  # on-demand: prefill tasks no prefill took yet, oldest first
    sweep_misses: int = 0  # on-demand: fallback sweeps in a row that found no idle prefill
    set_aside: dict[str, float] = {}  # prefill TE -> until when it gets no new task (PrefillSetAside)
    set_aside_why: dict[str, str] = {}  # prefill TE -> PrefillSetAside.reason (replay why, decisions)
    kv_down: dict[str, str] = {}  # KV paths not to pair over (kvlinks.py: "P>D", "nic:T") -> why
    kv_busy: dict[str, float] = {}  # decode TE -> until when it is backed off (a saturated KV path)
    online: int = 0  # online jobs in flight
    completed: int = 0
    failed: int = 0
    late: int = 0
