"""The output path (xDeepServe §4.2, output short-circuiting): what a finished pass produces for
each task — its emulated tokens with their sample times — and the terminal message. Pure."""

from __future__ import annotations

from deepserve.actors.flowserve.master.state import MasterConfig, Req
from deepserve.actors.flowserve.messages import KvHandle, TaskFinished, TaskTokens
from deepserve.actors.flowserve.sampling import sampled_tokens
from deepserve.actors.flowserve.tokens import eos_token_id


def token_message(
    r: Req, first: int, times_s: tuple[float, ...], cfg: MasterConfig
) -> TaskTokens:
    """Tokens `first .. first+len(times_s)` of `r` (its stream is a pure function of its seed;
    its last token is EOS when it stops there)."""
    count = len(times_s)
    ids: tuple[int, ...] = ()
    if cfg.token_ids:
        ids = sampled_tokens(r.task.sampling, first, count, cfg.vocab)
        if r.stop == "stop" and first + count == r.out_len:
            ids = (*ids[:-1], eos_token_id(cfg.vocab))
    return TaskTokens(
        task_id=r.task.task_id, request_id=r.task.request_id, first_index=first, token_ids=ids,
        times_s=times_s,
    )  # fmt: skip


def finished_message(
    r: Req, status: str, reason: str, now: float, cfg: MasterConfig, kv: KvHandle | None = None
) -> TaskFinished:
    return TaskFinished(
        task_id=r.task.task_id, request_id=r.task.request_id, status=status,  # type: ignore[arg-type]
        reason=reason, prompt_tokens=r.task.prompt.num_tokens, cached_prompt_tokens=r.cached_tokens,
        output_tokens=r.emitted, first_token_s=r.first_token_s, finish_s=now, te=cfg.te, dp=cfg.dp,
        preemptions=r.preemptions, kv=kv, queued_s=r.queued_s, scheduled_s=r.scheduled_s,
    )  # fmt: skip
