"""The autoscaler's settings (a config's `[autoscale]` section, issue 34 §5): data only, every
field bounded so a bad value is refused naming its key. Off by default: no autoscaler actor is
spawned, and a run's log is what it was before the autoscaler existed.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

PolicyName = Literal["load", "pd_ratio", "role_switch"]
POLICY_NAMES: tuple[str, ...] = ("load", "pd_ratio", "role_switch")
Seconds = Annotated[float, msgspec.Meta(ge=0, le=86_400)]
Fraction = Annotated[float, msgspec.Meta(ge=0, le=1)]


class Autoscale(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """One autoscaler, several selectable policies, each decision a recorded event
    (`AutoscaleDecided`); `advisory`: decisions are recorded, never carried out."""

    enabled: bool = False
    advisory: bool = False
    policies: tuple[PolicyName, ...] = ("load",)
    interval_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 1.0  # one decision round per interval
    groups: tuple[str, ...] = ()  # "{model}/{role}" groups the load policy scales; (): every group
    # ---- load- and SLO-violation-driven scaling (policy "load") ----
    min_tes: Annotated[int, msgspec.Meta(ge=0, le=4096)] = 1  # 0 allows scale to zero (keep_alive_s)
    max_tes: Annotated[int, msgspec.Meta(ge=0, le=4096)] = 0  # 0: every slot the group has
    target_load: Annotated[float, msgspec.Meta(gt=0, le=1e6)] = 16.0  # open tasks per TE aimed at
    scale_in_load: Annotated[float, msgspec.Meta(ge=0, le=1e6)] = 2.0  # below this per TE: one TE less
    slo_violation_max: Fraction = 0.1  # more of the window's requests missing the SLO: one TE more
    slo_min_requests: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 5  # fewer answered: no SLO verdict
    window_s: Annotated[float, msgspec.Meta(gt=0, le=86_400)] = 10.0  # the SLO window (and P/D's)
    scale_out_cooldown_s: Seconds = 5.0  # after a scale-out, no other one in the group for this long
    scale_in_cooldown_s: Seconds = 30.0  # after any scaling, no scale-in for this long
    keep_alive_s: Seconds = 0.0  # min_tes = 0: a model idle this long scales to zero (0: never)
    # ---- P/D ratio (policy "pd_ratio", P/D-Serve §3.3) ----
    ratio_source: Literal["profile", "online"] = "online"
    # the prompt pattern profiled (eq. 1's T_p, T_d and the role switch's predictors)
    profile_prompt_tokens: Annotated[int, msgspec.Meta(ge=1, le=1 << 20)] = 1024
    profile_output_tokens: Annotated[int, msgspec.Meta(ge=1, le=1 << 20)] = 256
    profile_decode_batch: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 64
    e2e_rise: Annotated[float, msgspec.Meta(ge=0, le=100)] = 0.2  # E2E up by this fraction: adjust
    share_delta: Fraction = 0.05  # TTFT's share of E2E moved by this much: its direction decides
    # ---- dynamic PD role switching (policy "role_switch", xLLM §3.2) ----
    min_decode: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 2
    min_prefill: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 1
    ttft_headroom: Annotated[float, msgspec.Meta(gt=0, le=10)] = 0.8  # predicted TTFT above this × SLO: D→P
    # an idle prefill TE goes P→D only when predicted TPOT is above this × SLO (decode needs it)
    tpot_headroom: Annotated[float, msgspec.Meta(gt=0, le=10)] = 0.8
    flip_cooldown_s: Seconds = 2.0  # between two flips of one model's groups
    settle_s: Seconds = 5.0  # a flipped TE stays in its transition pool (P→D, D→P) this long

    def __post_init__(self) -> None:
        if len(set(self.policies)) != len(self.policies):
            raise ValueError(f"policies: a policy named twice in {list(self.policies)}")
        if self.max_tes and self.max_tes < self.min_tes:
            raise ValueError(f"max_tes: must be 0 (every slot) or >= min_tes ({self.min_tes}), got {self.max_tes}")
        if self.scale_in_load >= self.target_load:
            raise ValueError(f"scale_in_load: must be below target_load ({self.target_load:g}), "
                             f"got {self.scale_in_load:g}")  # fmt: skip
        if "pd_ratio" in self.policies and "role_switch" in self.policies:
            raise ValueError("policies: pd_ratio and role_switch both move TEs between a model's prefill and "
                             "decode groups; choose one")  # fmt: skip
        for g in self.groups:
            if g.count("/") != 1:
                raise ValueError(f"groups: {g!r} is not a group name \"{{model}}/{{role}}\"")
