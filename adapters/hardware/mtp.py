"""Multi-token prediction (speculative decoding with MTP drafts, xDeepServe §4.6, §7.1).

One iteration = MTP forward (drafts) + sampling + main forward (verifies the drafts) + sampling
(§4.6 steps 1-4; step 5's acceptance check is folded into the second sampling). Accepted drafts
make an iteration yield more than one token per sequence.
"""

from __future__ import annotations

from msgspec import Struct

from deepserve.adapters.hardware.batch import Parallel, decode_batch
from deepserve.adapters.hardware.compute import forward_time, sampling_time_s
from deepserve.adapters.hardware.layout import Span
from deepserve.adapters.hardware.models import ModelProfile
from deepserve.adapters.hardware.specs import LinkSpec, NpuSpec


class MtpIteration(Struct, frozen=True, kw_only=True):
    mtp_forward_s: float
    mtp_sampling_s: float
    main_forward_s: float
    main_sampling_s: float
    iteration_s: float  # the four steps above
    gap_s: float  # scheduling bubble between iterations
    tokens_per_iteration: float  # per sequence, expected
    tpot_s: float
    tokens_per_s: float  # per NPU unit (a 910B chip or a 910C die)


def expected_tokens_per_iteration(acceptance: float, draft_tokens: int = 1) -> float:
    """1 verified token plus each draft, accepted only if every earlier draft was: 1 + a + a^2..

    `acceptance` is the per-draft acceptance rate (xDeepServe §4.6: 70-90 % for one MTP layer)."""
    if not 0.0 <= acceptance <= 1.0:
        raise ValueError(f"acceptance: must be in [0, 1], got {acceptance}")
    if draft_tokens < 0:
        raise ValueError(f"draft_tokens: must be >= 0, got {draft_tokens}")
    return sum(acceptance**i for i in range(draft_tokens + 1))


def mtp_decode_iteration(
    m: ModelProfile,
    npu: NpuSpec,
    *,
    batch_size: int,
    context_tokens: int,
    par: Parallel = Parallel(),  # noqa: B008 - frozen struct, safe as a default
    acceptance: float,
    draft_tokens: int = 1,
    gap_s: float = 0.0,
    link: LinkSpec | Span | None = None,
) -> MtpIteration:
    """One MTP decode iteration for a DP group decoding batch_size sequences.

    The main model verifies 1 + draft_tokens positions per sequence; the MTP module runs on the
    same positions (static graph shapes; assumption, as vLLM's EAGLE-style proposer)."""
    if gap_s < 0:
        raise ValueError(f"gap_s: must be >= 0, got {gap_s}")
    if draft_tokens < 1:
        raise ValueError(f"draft_tokens: must be >= 1 for MTP, got {draft_tokens}")
    batch = decode_batch(batch_size, context_tokens, tokens_per_seq=1 + draft_tokens)
    mtp = forward_time(m, npu, batch, par, link=link, part="mtp").total_s
    main = forward_time(m, npu, batch, par, link=link, part="main").total_s
    sample = sampling_time_s(m, npu, batch.tokens)
    iteration = mtp + sample + main + sample
    per_seq = expected_tokens_per_iteration(acceptance, draft_tokens)
    tpot = (iteration + gap_s) / per_seq
    return MtpIteration(
        mtp_forward_s=mtp,
        mtp_sampling_s=sample,
        main_forward_s=main,
        main_sampling_s=sample,
        iteration_s=iteration,
        gap_s=gap_s,
        tokens_per_iteration=per_seq,
        tpot_s=tpot,
        tokens_per_s=batch_size / tpot,
    )
