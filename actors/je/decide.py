"""The JE's decisions, pure: each reads the JE's state (or one job) and one input and returns a
value — which TE takes a task, whether a failed task is retried or the job ends and why, what a
task's result means for its job, the client's terminal record. No effects: `flow.py` and
`core.py` sequence these into records, sends and timers.
"""

from __future__ import annotations

import msgspec

from deepserve.actors.flowserve.messages import TaskFinished
from deepserve.actors.scheduling import Candidate, Decision, Policy
from deepserve.actors.scheduling.decision import Excluded, ranked
from deepserve.actors.scheduling.forwarding import ForwardingParams, next_offer
from deepserve.actors.scheduling.least_load import select_least_load
from deepserve.actors.workload.messages import RequestDone, RequestStatus

from . import routing
from .config import MAX_BATCH_ITEMS
from .messages import JeState, Job, Phase, SubmitBatch
from .migration import MigrationParams


def task_id(request_id: str, phase: str, attempt: int, epoch: int = 0) -> str:
    """`epoch`: the times the gateway moved the request to another JE (its ids stay apart)."""
    return f"{request_id}/{phase}.{attempt}.{epoch}" if epoch else f"{request_id}/{phase}.{attempt}"


route_request = routing.route_request


# ---- routing ----------------------------------------------------------------------------------


decide = routing.decide  # the policy's choice for a chat-or-prefill task (compiled with the walk's reads)


def decide_decode(s: JeState, rid: str, j: Job) -> Decision | None:
    """The decode TE for a prefilled job: the least loaded one it has not failed on."""
    cands = routing.candidates(s, j, ("decode",))[0]
    return select_least_load(route_request(rid, j), cands) if cands else None


class Offered(msgspec.Struct, frozen=True):
    phase: Phase
    decision: Decision


class OfferStop(msgspec.Struct, frozen=True):
    reason: str  # the TTFT deadline passed: the job fails with this


class OfferWait(msgspec.Struct, frozen=True):
    """Every prefill refused this sweep: the task waits in the JE."""


def offer(s: JeState, policy: Policy, fw: ForwardingParams, rid: str, j: Job,
          now: float) -> Offered | OfferStop | OfferWait:  # fmt: skip
    """On-demand forwarding (P/D-Serve §3.5): the next prefill after a refusal, or a wait, or
    the timeout; with no prefill able to take the task (each set aside or refused it for good),
    the colocated subgroup now rather than at the TTFT deadline."""
    cands, gone = routing.candidates(s, j, ("prefill",), now, fallback=False)
    if not cands:
        colo, cgone = routing.candidates(s, j, ("colocated",), now)
        if colo:
            d = policy.select(route_request(rid, j), colo, s.turns)
            why = f"no prefill TE can take it ({', '.join(t for e in gone for t in e.tes) or 'none in the group'})"
            return Offered("chat", msgspec.structs.replace(d, reason=f"{why}: colocated subgroup; {d.reason}",
                                                           excluded=d.excluded + gone + cgone))  # fmt: skip
        cands, gone = routing.candidates(s, j, ("prefill",), now)  # the set-aside ones: a last resort
    nxt = next_offer(cands, tuple(j.refused), now, j.arrival_s, fw)
    if nxt.stop:
        return OfferStop(f"timeout: {nxt.stop}")
    if nxt.te is None:
        return OfferWait()
    order = sorted((c for c in cands if c.te not in j.refused), key=lambda c: (c.load, c.te))
    refused = tuple(c.te for c in cands if c.te in j.refused)
    busy = (Excluded(tes=refused, subgroup="pd", reason="refused this sweep (busy)"),) if refused else ()
    why = (f"refused by {', '.join(j.refused)} this sweep: next fewest open streams" if j.refused else
           f"a new sweep (the last one refused by {', '.join(j.last_refused) or 'none'}): fewest open streams")
    return Offered("prefill", Decision(policy="on_demand", params={"ttft_deadline_s": fw.ttft_deadline_s},
                                       chosen=nxt.te, subgroup="pd", ranked=ranked(order), reason=why,
                                       order_by=("load",), excluded=busy + gone))  # fmt: skip


def feed(s: JeState, j: Job, te: str, now: float) -> Decision | None:
    """P/D-Serve batch forwarding: `te` just took a task or freed a slot, so it is likely idle —
    the oldest waiting prefill task `j` goes to it, unless `te` cannot take it (None)."""
    if te in j.excluded or te not in s.groups.get(j.model, {}).get("prefill", ()) or s.set_aside.get(te, -1.0) > now:
        return None
    tree = s.trees.get(j.model)  # the prefix it holds: the one TE's walk
    held = tree.match(j.prompt.block_hashes, [te])[te] if tree is not None else 0
    cand = Candidate(te=te, subgroup="pd", load=s.open.get(te, 0), prefix_blocks=held)
    return Decision(policy="batch_forwarding", params={}, chosen=te, subgroup="pd", ranked=ranked([cand]),
                    reason=f"{te} is taking work: the oldest of {len(s.waiting)} waiting prefill tasks, "
                    "until it refuses")  # fmt: skip


def sweep_delay_s(fw: ForwardingParams, misses: int) -> float:
    """The pause before the next fallback sweep: doubles per sweep that found no idle prefill."""
    return min(fw.retry_backoff_s * 2.0 ** min(misses, 30), fw.max_backoff_s)


def no_te_why(j: Job, phase: str, last: str) -> str:
    """Why no TE can take the job's next task, as it is: the group is empty, or every TE
    that could take it failed this job (named)."""
    if j.excluded:
        tail = f"; last: {last}" if last else ""
        return f"no {phase} TE of model {j.model!r} left for it: {', '.join(j.excluded)} failed this job{tail}"
    return f"no TE for model {j.model!r} (its TE group is empty)"


# ---- a task's answer and what it means for the job ---------------------------------------------


class Retry(msgspec.Struct, frozen=True):
    phase: Phase
    attempt: int
    last: str  # the failure, named if no TE is left for the retry


class End(msgspec.Struct, frozen=True):
    status: RequestStatus
    reason: str


def moves(j: Job, phase: str, p: MigrationParams) -> bool:
    """Whether a failed task's request migrates (migration.py) rather than the retry rule
    deciding: a streamed request whose client has seen output, with migration on, moved fewer
    than `max_migrations` times."""
    seen = j.stream and (j.streamed or phase == "decode")
    return p.enabled and seen and not j.cancelled and j.migrations < p.max_migrations


def after_failure(j: Job, phase: str, attempt: int, reason: str, max_attempts: int) -> Retry | End:
    """A task of `j` failed (`phase`, `attempt`: the task's): retry while nothing reached the
    client, at most `max_attempts` tries of a phase; else the job ends with the reason."""
    if j.cancelled:
        return End("cancelled", j.cancelled)
    if j.stream and (j.streamed or phase == "decode"):  # the client has seen output
        # "chat" is the colocated task's kind, whatever the API: a completion's said "chat task"
        what = "generation (prefill and decode)" if phase == "chat" else phase
        return End("failed", f"its {what} task failed after output streamed: {reason}")
    # Nothing reached the client (a non-streaming one sees output only at the end): retry. A
    # failed decode starts over from a new prefill (its KV went with the decode); the tokens
    # already produced are discarded (RouteDecided resets them, the frontend drops them).
    restart = phase == "decode"
    tries = j.start_attempt if restart else attempt
    if tries >= max_attempts:
        return End("failed", f"gave up after {tries} attempt{'s' if tries > 1 else ''}: {reason}")
    return Retry("chat" if restart or phase == "chat" else "prefill", tries + 1, reason)


class Finish(msgspec.Struct, frozen=True):
    """The job ends with the task's result."""

    status: RequestStatus
    reason: str
    first_token_s: float | None
    cached_prompt_tokens: int


class Failed(msgspec.Struct, frozen=True):
    reason: str  # the task failed: `after_failure` decides


class Prefilled(msgspec.Struct, frozen=True):
    """The prefill's KV is ready: its decode task is next."""


def task_result(j: Job, m: TaskFinished) -> Finish | Failed | Prefilled:
    """What the current task's `TaskFinished` means for its job."""
    pd = j.phase == "decode"
    if j.cancelled:
        status: RequestStatus = "completed" if m.status == "completed" and j.phase != "prefill" else "cancelled"
        return Finish(status, m.reason if status == "completed" else j.cancelled,
                      j.first_token_s if pd else m.first_token_s, m.cached_prompt_tokens)  # fmt: skip
    if m.status != "completed":
        return Failed(f"{m.status} on {j.te}: {m.reason}")
    if j.phase == "prefill":
        if m.kv is not None:
            return Prefilled()
        if m.reason != "prefilled":  # the prefill's first token was the whole answer (a 1-token target, EOS)
            return Finish("completed", m.reason, m.first_token_s, m.cached_prompt_tokens)
        return Failed(f"prefill on {j.te} finished without its KV handle")
    return Finish("completed", m.reason, j.first_token_s if pd else m.first_token_s,
                  j.cached_prompt_tokens if pd else m.cached_prompt_tokens)  # fmt: skip


def request_done(rid: str, j: Job, status: RequestStatus, reason: str, now: float,
                 m: TaskFinished | None = None, first: float | None = None, cached: int = 0) -> RequestDone:  # fmt: skip
    """The client's terminal record: from the task result `m` that ended the job, or (ended by
    the JE: no task result) from what the client was sent."""
    timed = j if j.phase == "decode" else m  # PD: the prefill's times (JePrefilled), as its first token
    if m is None:
        # a job its TE failed has left that TE (`excluded`): name it all the same
        te = j.te or (j.excluded[-1] if j.excluded else "")
        return RequestDone(request_id=rid, status=status, reason=reason, arrival_s=j.arrival_s,
                           first_token_s=j.first_token_s, finish_s=now,
                           prompt_tokens=j.prompt_tokens or j.prompt.num_tokens, cached_prompt_tokens=cached,
                           output_tokens=j.output_tokens, te=te, preemptions=0,
                           queued_s=timed.queued_s if timed is not None else None,
                           scheduled_s=timed.scheduled_s if timed is not None else None)  # fmt: skip
    return RequestDone(request_id=rid, status=status, reason=reason, arrival_s=j.arrival_s,
                       first_token_s=first, finish_s=m.finish_s, prompt_tokens=m.prompt_tokens,
                       cached_prompt_tokens=cached, output_tokens=m.output_tokens, te=m.te or j.te,
                       preemptions=m.preemptions, queued_s=timed.queued_s if timed is not None else None,
                       scheduled_s=timed.scheduled_s if timed is not None else None)  # fmt: skip


def refused_at_once(rid: str, reason: str, arrival_s: float, now: float) -> RequestDone:
    """A job the JE cannot take at all (it holds too many): ended before it is accepted."""
    return RequestDone(request_id=rid, status="failed", reason=reason, arrival_s=arrival_s, first_token_s=None,
                       finish_s=now, prompt_tokens=0, cached_prompt_tokens=0, output_tokens=0, te="")  # fmt: skip


def batch_refusal(s: JeState, m: SubmitBatch) -> str:
    """Why a batch cannot be taken ("": it can)."""
    ids = {it.request_id for it in m.items}
    clash = len(ids) < len(m.items) or any(i in s.jobs for i in ids)
    if not m.items:
        return "empty"
    if len(m.items) > MAX_BATCH_ITEMS:
        return "too large"
    if clash:
        return "a request id is already in flight"
    if m.batch_id in s.batches:
        return "duplicate batch id"
    return ""
