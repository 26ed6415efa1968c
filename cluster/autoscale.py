"""The autoscaler's wiring (issue 34 §5): spawned beside the control plane when a config's
`[autoscale]` is enabled, told each group's initial size, slots and DP groups, and each P/D
model's offline profile — eq. 1's T_p and T_d and the TTFT/TPOT predictors' slopes, priced by
the performance model for `autoscale.profile_*`'s prompt pattern (P/D-Serve §3.3: "profiling a
certain pattern on prompts"). Off: nothing is spawned and the gateway has no observer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from deepserve.actors.cluster.autoscaler_config import Autoscale
from deepserve.actors.cluster.autoscaler_policy import Profile
from deepserve.actors.ports.pod import TeSlot
from deepserve.adapters.scenario.schema import Cluster

from .control import MANAGER_ADDR
from .schema import PlatformConfig

AUTOSCALER_ADDR = "cluster/autoscaler"


def profile(c: Cluster, a: Autoscale) -> Profile:
    """One TE of `c` priced at batch 1 and `a.profile_decode_batch` (the performance model)."""
    from deepserve.adapters.hardware.predict import predict

    b_d = a.profile_decode_batch
    p = predict(c.model, c.hardware, c.tp, batch_sizes=(1, b_d), context_tokens=(a.profile_prompt_tokens,),
                pd_link=c.link if c.mode == "pd" else None)  # fmt: skip
    one, many = p.latency
    xi = one.kv_transfer_s or 0.0
    return Profile(prefill_tokens_per_s=a.profile_prompt_tokens / one.prefill_s, tpot_base_ms=one.decode_step_s * 1e3,
                   tpot_per_seq_ms=max(many.decode_step_s - one.decode_step_s, 0.0) * 1e3 / max(b_d - 1, 1),
                   ttft_s=one.prefill_s, b_p=1.0, tpot_s=many.decode_step_s, b_d=float(b_d), kv_transfer_s=xi,
                   output_tokens=float(a.profile_output_tokens))  # fmt: skip


def autoscaler_config(cfg: PlatformConfig, layout_slots: tuple[TeSlot, ...], groups: dict[str, int]) -> dict[str, Any]:
    a = cfg.autoscale
    slots: dict[str, int] = {}
    dp: dict[str, int] = {}
    for s in layout_slots:
        slots[s.group] = slots.get(s.group, 0) + 1
        dp[s.group] = s.dp_groups
    pd = {s.cluster.model: s.cluster for _, s in cfg.group_scenarios() if s.cluster.mode == "pd"}
    return {
        "autoscale": msgspec.to_builtins(a), "initial": dict(groups), "slots": slots, "dp_groups": dp,
        "profiles": {m: msgspec.to_builtins(profile(c, a)) for m, c in sorted(pd.items())},
        "slo_ttft_ms": cfg.slo.ttft_ms, "slo_tpot_ms": cfg.slo.tpot_ms,
    }  # fmt: skip


def spawn_autoscaler(driver: Any, cfg: PlatformConfig, slots: tuple[TeSlot, ...], groups: dict[str, int],
                     manager: str = MANAGER_ADDR) -> None:  # fmt: skip
    from deepserve.actors.cluster.autoscaler import Autoscaler

    driver.spawn(AUTOSCALER_ADDR, Autoscaler, config={**autoscaler_config(cfg, slots, groups), "manager": manager})


def pushed_to(cfg: PlatformConfig, jes: Sequence[str]) -> list[str]:
    """Who the manager pushes membership to: the JEs, and the autoscaler when on."""
    return [*jes, AUTOSCALER_ADDR] if cfg.autoscale.enabled else list(jes)


def autoscale_report(end: Any, out: dict[str, Any]) -> None:
    """`sim`'s summary keys: the autoscaler's scale-outs, scale-ins, flips and decisions (0 when
    it is off: a run with it off is the baseline beside a run with it on)."""
    cell = end.driver.cells.get(AUTOSCALER_ADDR)
    st = cell.actor.state if cell is not None and cell.actor is not None else None
    out["scale_outs"] = st.scale_outs if st is not None else 0
    if st is not None:
        mgr = end.driver.cells.get(MANAGER_ADDR)
        cm = mgr.actor.state if mgr is not None and mgr.actor is not None else None
        # TEs whose weights were loaded after the start: scale-outs do, flips must not
        out["te_loads_after_start"] = cm.launches - sum(end.built.layout.groups.values()) if cm is not None else 0
        out["scale_ins"], out["flips"], out["autoscale_decisions"] = st.scale_ins, st.flips, st.decisions
        out["autoscale_advisory"] = end.cfg.autoscale.advisory


def pools(cm: Any, autoscaler: Any) -> dict[str, dict[str, list[str]]]:
    """Each P/D model's instance pools (xLLM §3.2): P and D, and a TE flipped within
    `autoscale.settle_s` in the transition pool it is in (P->D, D->P) instead."""
    moving = dict(autoscaler.pools) if autoscaler is not None else {}
    out: dict[str, dict[str, list[str]]] = {}
    for te in sorted(cm.tes if cm is not None else {}):
        r = cm.tes[te]
        g = cm.groups.get(r.group)
        if r.state != "ready" or g is None or g.role not in ("prefill", "decode"):
            continue
        pool = moving[te][0] if te in moving else ("P" if g.role == "prefill" else "D")
        out.setdefault(g.model, {"P": [], "D": [], "P->D": [], "D->P": []})[pool].append(te)
    return out


def status(driver: Any, cm: Any) -> dict[str, Any]:
    """The daemon status' autoscaling keys: the role pools, and the autoscaler's counts when on."""
    cell = driver.cells.get(AUTOSCALER_ADDR) if driver is not None else None
    actor = cell.actor if cell is not None else None
    st = actor.state if actor is not None else None
    out: dict[str, Any] = {"pools": pools(cm, st)}
    if actor is not None and st is not None:
        a = actor.cfg.autoscale
        out["autoscale"] = {"policies": list(a.policies), "advisory": a.advisory, "decisions": st.decisions,
                            "scale_outs": st.scale_outs, "scale_ins": st.scale_ins, "flips": st.flips,
                            "last": st.last_decision}  # fmt: skip
    return out
