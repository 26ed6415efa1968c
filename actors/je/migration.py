"""Request migration vs recomputation (xLLM §3.5), pure: when a streamed request's TE fails, the
JE moves the request to another TE instead of failing it, and the client's stream continues from
the token where it stood (no duplicate, no skip: the frontend merges a stream by token index,
`actors/je/stream.py`).

Two ways to rebuild the request's KV (prompt + the tokens generated so far) on the new TE, priced
with the performance model's figures (docs/perf-model.md; `cluster/assembly.py` fills them from
the cluster's model, NPU and link):

- migrate: the KV bytes cross the link from where they sit — `setup_s + tokens x
  kv_bytes_per_token / link_bytes_per_s` — possible only while that copy is readable;
- recompute: one prefill of the prompt and the generated tokens on the new TE — `(tokens - the
  prefix it caches) / prefill_tokens_per_s` — always possible (the emulated output is a pure
  function of the seed and the index, so the tokens themselves are known).

The cheaper one is chosen and recorded (`TaskMigrated`, shown by `replay why`). A failed TE's
HBM goes with it (crash, kill, device lost, a TE that left its group): its KV is not readable,
so those failures recompute, and the record says why migration was out.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from deepserve.core.messages import Event, Message


class MigrationParams(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`[scheduling.migration]`: off by default (a streamed request on a failed TE fails with the
    reason, as before); the cost figures are the performance model's for the cluster."""

    enabled: bool = False
    max_migrations: int = 3  # moves of one request at most; then it fails with the reason
    kv_bytes_per_token: float = 131072.0  # the whole model's KV of one token (llama3-8b, bf16)
    link_bytes_per_s: float = 25e9  # the link the KV would cross (RoCE's effective rate)
    prefill_tokens_per_s: float = 2.0e4  # one TE's prefill throughput
    setup_s: float = 0.001  # a transfer's fixed cost (connection, block list)
    # >0: ask the live frontend (`stream_to`) how far the client's stream got, and wait this long
    # for its answer before resuming at what the JE knows (the first chunk of each task)
    ask_stream_s: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.max_migrations <= 64:
            raise ValueError("scheduling.migration.max_migrations: must be in [1, 64]")
        for name in ("kv_bytes_per_token", "link_bytes_per_s", "prefill_tokens_per_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"scheduling.migration.{name}: must be > 0")
        if not 0 <= self.setup_s <= 60:
            raise ValueError("scheduling.migration.setup_s: must be in [0, 60]")
        if not 0 <= self.ask_stream_s <= 60:
            raise ValueError("scheduling.migration.ask_stream_s: must be in [0, 60]")


Mode = Literal["migrate", "recompute"]


class Choice(msgspec.Struct, frozen=True, kw_only=True):
    mode: Mode
    kv_bytes: int  # the KV of the prompt and the generated tokens
    migrate_s: float | None  # None: the KV is not readable anywhere
    recompute_s: float
    reason: str


def choose(p: MigrationParams, prompt_tokens: int, generated: int, cached_tokens: int,
           source: str) -> Choice:  # fmt: skip
    """Migrate or recompute a request of `prompt_tokens` with `generated` output tokens: `source`
    names where its KV is still readable ("" : nowhere), `cached_tokens` what the new TE already
    holds of the prompt (its prefix cache)."""
    tokens = prompt_tokens + generated
    kv_bytes = int(tokens * p.kv_bytes_per_token)
    recompute_s = max(tokens - cached_tokens, 1) / p.prefill_tokens_per_s
    if not source:
        return Choice(mode="recompute", kv_bytes=kv_bytes, migrate_s=None, recompute_s=recompute_s,
                      reason=f"recompute {tokens - cached_tokens} tokens ({recompute_s * 1e3:.2f} ms): the KV "
                      "sat on the failed TE's HBM, lost with it")  # fmt: skip
    migrate_s = p.setup_s + kv_bytes / p.link_bytes_per_s
    mode: Mode = "migrate" if migrate_s < recompute_s else "recompute"
    why = (f"migrate {kv_bytes} bytes from {source} ({migrate_s * 1e3:.2f} ms) < recompute ({recompute_s * 1e3:.2f} ms)"
           if mode == "migrate" else
           f"recompute {tokens - cached_tokens} tokens ({recompute_s * 1e3:.2f} ms) <= migrate from {source} "
           f"({migrate_s * 1e3:.2f} ms)")  # fmt: skip
    return Choice(mode=mode, kv_bytes=kv_bytes, migrate_s=migrate_s, recompute_s=recompute_s, reason=why)


class TaskMigrated(Event, frozen=True, kw_only=True):
    """A streamed request's task failed on `from_te`: the request moves on, its next task resuming
    at output token `resume_from` (what the JE knows the client was sent; the frontend drops what
    it already has), its KV rebuilt as `choice` says. The routing follows (`RouteDecided`)."""

    request_id: str
    task_id: str  # the failed task
    from_te: str
    resume_from: int
    failure: str
    choice: Choice
    basis: str = ""  # where `resume_from` comes from ("": the chunks the JE saw)


class MigrationAsked(Event, frozen=True, kw_only=True):
    """The request's task failed on `from_te`; the JE asked the frontend for the client's
    position (`StreamPositionAsk`) before it moves the request."""

    request_id: str
    task_id: str
    from_te: str
    failure: str


class StreamPositionAsk(Message, frozen=True, kw_only=True):
    """To the live frontend: the index of the request's next token its client gets."""

    request_id: str
    reply_to: str


class StreamPosition(Message, frozen=True, kw_only=True):
    request_id: str
    next_index: int


class AskTimeout(Message, frozen=True, kw_only=True):
    request_id: str
    task_id: str
