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

from deepserve.actors.flowserve.distflow.migrate import KvExportOffer
from deepserve.actors.scheduling import Decision
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
    # KV migration from a failed TE's host DRAM (actors/flowserve/distflow/migrate.py; its masters
    # write their prompt blocks through with `cluster.resilience.kv_backup`): ask the failed TE
    # which blocks its host still holds (waiting `survey_s` at most), and move them when cheaper
    kv: bool = False
    survey_s: float = 0.05
    import_timeout_s: float = 10.0
    host_bytes_per_s: float = 0.0  # the host side's rate the bytes leave DRAM at (PCIe); 0: the link's
    # Live migration: a TE draining (scaled in, flipped, its DP group dropped) has its streamed
    # requests moved with their KV (read from its working HBM) instead of finishing in place
    live: bool = False

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
        if not 0 < self.survey_s <= 60:
            raise ValueError("scheduling.migration.survey_s: must be in (0, 60]")
        if not 0 < self.import_timeout_s <= 600:
            raise ValueError("scheduling.migration.import_timeout_s: must be in (0, 600]")
        if self.host_bytes_per_s < 0:
            raise ValueError("scheduling.migration.host_bytes_per_s: must be >= 0")


Mode = Literal["migrate", "recompute"]


class Choice(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    mode: Mode
    kv_bytes: int  # the KV of the prompt and the generated tokens
    migrate_s: float | None  # None: the KV is not readable anywhere
    recompute_s: float
    reason: str
    # KV migration from host DRAM (`MigrationParams.kv`; left out of the record when unused, so
    # older records read the same): where the surviving blocks are, how many of them lead the
    # request's chain, what moving them sends, and the tokens recomputed either way
    master: str = ""  # the failed TE's DP master whose host DRAM holds them
    host: str = ""
    survived_blocks: int = 0
    block_bytes: int = 0  # one block's KV on ONE rank (the offer's)
    tp: int = 0
    moved_bytes: int = 0  # what migrating sends (blocks the target does not cache already)
    recompute_tokens: int = 0  # the tail prefilled when migrating
    srcs: tuple[str, ...] = ()  # live: the source NPUs (read from HBM), one a rank


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


def choose_kv(p: MigrationParams, prompt_tokens: int, generated: int, cached_tokens: int, te: str,
              offer: KvExportOffer | None, block_tokens: int) -> Choice:  # fmt: skip
    """Migrate or recompute when the failed TE's host may still hold the request's leading
    blocks (`offer`: its answer, None when none came): moving them (host DRAM -> the network ->
    the target's HBM, at the slower of the link and the host side) plus prefilling the tail they
    do not cover, against prefilling everything the target does not cache."""
    if offer is None or not offer.blocks:
        c = choose(p, prompt_tokens, generated, cached_tokens, "")
        return msgspec.structs.replace(c, reason=(
            f"recompute {prompt_tokens + generated - cached_tokens} tokens ({c.recompute_s * 1e3:.2f} ms): "
            f"{te or 'the failed TE'}'s host offered no KV within {p.survey_s:g}s (its HBM is lost; "
            "its process or node too, or nothing was written through to DRAM)"))  # fmt: skip
    tokens = prompt_tokens + generated
    kv_bytes = int(tokens * p.kv_bytes_per_token)
    recompute_s = max(tokens - cached_tokens, 1) / p.prefill_tokens_per_s
    survived = min(offer.blocks * block_tokens, prompt_tokens)
    movable = max(survived - cached_tokens, 0)
    host = p.host_bytes_per_s > 0 and not offer.srcs  # from host DRAM (a live source sends from HBM)
    rate = min(p.link_bytes_per_s, p.host_bytes_per_s) if host else p.link_bytes_per_s
    moved = int(movable * p.kv_bytes_per_token)
    tail = tokens - max(cached_tokens, survived)
    migrate_s = p.setup_s + moved / rate + max(tail, 1) / p.prefill_tokens_per_s
    mode: Mode = "migrate" if movable > 0 and migrate_s < recompute_s else "recompute"
    where = f"{offer.blocks} blocks in {offer.master}'s {'HBM' if offer.srcs else 'host DRAM'}"
    why = (f"migrate {moved} bytes ({where}) and recompute {tail} tokens ({migrate_s * 1e3:.2f} ms) < recompute "
           f"{tokens - cached_tokens} tokens ({recompute_s * 1e3:.2f} ms)" if mode == "migrate" else
           f"recompute {tokens - cached_tokens} tokens ({recompute_s * 1e3:.2f} ms) <= migrate {moved} bytes ({where}) "
           f"and recompute {tail} ({migrate_s * 1e3:.2f} ms)")  # fmt: skip
    return Choice(mode=mode, kv_bytes=kv_bytes, migrate_s=migrate_s, recompute_s=recompute_s, reason=why,
                  master=offer.master, host=offer.host, survived_blocks=offer.blocks, block_bytes=offer.block_bytes,
                  tp=offer.tp, moved_bytes=moved, recompute_tokens=tail if mode == "migrate" else tokens - cached_tokens,
                  srcs=offer.srcs)  # fmt: skip


def offer_of(request_id: str, c: Choice) -> KvExportOffer:
    """The source's offer a migrate choice was made on (what the target's importer pulls from)."""
    return KvExportOffer(request_id=request_id, master=c.master, host=c.host, blocks=c.survived_blocks,
                         block_bytes=c.block_bytes, tp=c.tp, srcs=c.srcs)  # fmt: skip


class KvSurveyStarted(Event, frozen=True, kw_only=True):
    """Moving the request: the JE asked the failed TE which of its KV blocks its host still
    holds (`KvExportAsk`), before it chooses between migrating and recomputing."""

    request_id: str
    task_id: str
    from_te: str
    resume_from: int
    failure: str
    basis: str = ""
    live: bool = False  # live migration: the old task runs on until the new one is sent


class KvImportSent(Event, frozen=True, kw_only=True):
    """The moved request's next task is routed (`decision`) but held back while its target pulls
    the surviving blocks (`KvImport`); it is sent when the import ends, either way."""

    request_id: str
    task_id: str
    phase: str
    attempt: int
    decision: Decision
    blocks: int


class KvImportEnded(Event, frozen=True, kw_only=True):
    request_id: str
    task_id: str
    ok: bool
    te: str = ""
    blocks: int = 0  # moved over the fabric
    nbytes: int = 0
    duration_s: float = 0.0
    reason: str = ""


class KvSurveyTimeout(Message, frozen=True, kw_only=True):
    request_id: str
    task_id: str


class KvImportTimeout(Message, frozen=True, kw_only=True):
    request_id: str
    task_id: str


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
