"""The autoscaler's decisions, pure (issue 34 §5): from a view of the TE groups (members, open
tasks per TE from the DP masters' status), the requests observed in the last windows and the
autoscaler's memory (cool-downs, transition pools), each policy returns what it would do —
`ScaleTo` a group's size or `Flip` a TE's role. The actor (autoscaler.py) records every decision
and, unless advisory, has the cluster manager carry it out. Unit-tested without a driver.

Policies (one interface, `POLICIES[name](cfg, view) -> decisions`):
- `load`: load- and SLO-violation-driven scaling of TE groups with cool-downs and bounds, and
  scale to zero for an idle model after its keep-alive (and back to one at its next request);
- `pd_ratio`: P/D-Serve §3.3 — the ratio from profiling (eq. 1, `eq1_split`) or online (E2E up
  with TTFT's share up → one prefill more; with TTFT's share down → one decode more), one TE
  moved between a model's groups per round;
- `role_switch`: xLLM §3.2 — stateless TEs in four pools (P, D, P→D, D→P), a TTFT predictor
  flips D→P, TPOT over the SLO or an idle prefill flips P→D, at least `min_decode` decode TEs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import msgspec

from .autoscaler_config import Autoscale


class TeLoad(msgspec.Struct, frozen=True):
    """One TE's last sampled load, summed over its DP groups."""

    waiting: int = 0
    running: int = 0
    prefill_tokens_waiting: int = 0


class GroupView(msgspec.Struct, frozen=True, kw_only=True):
    group: str  # "{model}/{role}"
    model: str
    role: str
    tes: tuple[str, ...]  # ready members
    target: int  # the size last asked for (members may still be booting)
    slots: int  # the most TEs the group can hold


class Window(msgspec.Struct, kw_only=True):
    """Requests of one model finished within one window (from the gateway's answers)."""

    requests: int = 0
    violated: int = 0  # completed outside the SLO, or failed
    ttft_ms_sum: float = 0.0
    e2e_ms_sum: float = 0.0

    def mean_e2e_ms(self) -> float:
        return self.e2e_ms_sum / self.requests if self.requests else 0.0

    def ttft_share(self) -> float:
        return self.ttft_ms_sum / self.e2e_ms_sum if self.e2e_ms_sum > 0 else 0.0


class Profile(msgspec.Struct, frozen=True, kw_only=True):
    """Offline-profiled figures of one model's TEs (the cluster layer prices them with the
    performance model): eq. 1's T_p, T_d, b_p, b_d and the predictors' slopes."""

    prefill_tokens_per_s: float  # one TE's prefill throughput (the TTFT predictor)
    tpot_base_ms: float  # TPOT at batch 1
    tpot_per_seq_ms: float  # TPOT's growth per running sequence (the TPOT predictor)
    ttft_s: float  # T_p: TTFT of a mean prompt at batch b_p (r_pre folded in)
    b_p: float
    tpot_s: float  # TPOT at batch b_d
    b_d: float
    kv_transfer_s: float  # xi
    output_tokens: float  # G: mean tokens generated


class View(msgspec.Struct, frozen=True, kw_only=True):
    now: float
    groups: dict[str, GroupView]
    loads: dict[str, TeLoad]  # te -> last sample
    window: dict[str, Window]  # model -> this window
    previous: dict[str, Window]  # model -> its last complete window with requests
    reference: dict[str, Window]  # model -> the window P/D ratio changes are judged against
    inflight: dict[str, int]  # model -> requests arrived and not answered
    last_active_s: dict[str, float]  # model -> its last request's arrival or answer
    last_out_s: dict[str, float]  # group -> its last scale-out
    last_change_s: dict[str, float]  # group -> its last scaling of any kind
    last_flip_s: dict[str, float]  # model -> its last flip
    pools: dict[str, tuple[str, float]]  # te -> (transition pool "P->D" | "D->P", since)
    slo_ttft_ms: float
    slo_tpot_ms: float
    profiles: dict[str, Profile]  # model -> profile (P/D models)


class ScaleTo(msgspec.Struct, frozen=True, kw_only=True):
    policy: str
    group: str
    size: int
    reason: str


class Flip(msgspec.Struct, frozen=True, kw_only=True):
    """Move a ready TE between its model's prefill and decode groups: no weight reload (the
    instance is stateless: a task's kind, not the TE, says prefill or decode)."""

    policy: str
    te: str
    src: str  # group it leaves
    dst: str  # group it joins
    reason: str


Decision = ScaleTo | Flip


def load_of(v: View, te: str) -> int:
    ld = v.loads.get(te)
    return ld.waiting + ld.running if ld is not None else 0


# ---- load- and SLO-violation-driven scaling --------------------------------------------------------


def bounds(cfg: Autoscale, g: GroupView) -> tuple[int, int]:
    hi = min(cfg.max_tes, g.slots) if cfg.max_tes else g.slots
    return min(cfg.min_tes, hi), hi


def load_policy(cfg: Autoscale, v: View) -> list[Decision]:
    out: list[Decision] = []
    for name in sorted(v.groups):
        g = v.groups[name]
        if cfg.groups and name not in cfg.groups:
            continue
        d = _scale_group(cfg, v, g)
        if d is not None:
            out.append(d)
    return out


def _scale_group(cfg: Autoscale, v: View, g: GroupView) -> ScaleTo | None:
    lo, hi = bounds(cfg, g)
    if g.target == 0:  # scaled to zero: the next request brings one TE back (a cold start)
        if v.inflight.get(g.model, 0) > 0 and hi > 0:
            return ScaleTo(policy="load", group=g.group, size=max(lo, 1),
                           reason=f"{v.inflight[g.model]} requests for {g.model}, which has no TE")  # fmt: skip
        return None
    if lo == 0 and cfg.keep_alive_s > 0 and v.inflight.get(g.model, 0) == 0:
        # idle since its last request came or was answered (a request parked through a cold
        # start is answered late), and never within keep_alive_s of the group's last change
        idle_s = v.now - max(v.last_active_s.get(g.model, 0.0), v.last_change_s.get(g.group, 0.0))
        if idle_s >= cfg.keep_alive_s:
            return ScaleTo(policy="load", group=g.group, size=0,
                           reason=f"no request for {idle_s:.1f}s >= keep_alive_s {cfg.keep_alive_s:g}")  # fmt: skip
    if len(g.tes) < g.target:
        return None  # a scaling still under way: judge the group once its TEs are up
    total = sum(load_of(v, te) for te in g.tes)
    n = len(g.tes)
    win = v.window.get(g.model, Window())
    violated = win.violated / win.requests if win.requests >= cfg.slo_min_requests else 0.0
    want = max(math.ceil(total / cfg.target_load), n)
    why = f"{total} open tasks on {n} TEs (target {cfg.target_load:g} per TE)"
    if violated > cfg.slo_violation_max and want == n:
        want, why = n + 1, f"{violated:.0%} of {win.requests} requests missed the SLO (max {cfg.slo_violation_max:.0%})"
    want = min(want, hi)
    out_ok = v.now - v.last_out_s.get(g.group, -math.inf) >= cfg.scale_out_cooldown_s
    if want > g.target and out_ok:
        return ScaleTo(policy="load", group=g.group, size=want, reason=why)
    in_ok = v.now - v.last_change_s.get(g.group, -math.inf) >= cfg.scale_in_cooldown_s
    if total < cfg.scale_in_load * n and violated <= cfg.slo_violation_max and g.target > max(lo, 1) and in_ok:
        return ScaleTo(policy="load", group=g.group, size=g.target - 1,
                       reason=f"{total} open tasks on {n} TEs (< {cfg.scale_in_load:g} per TE)")  # fmt: skip
    return None


# ---- P/D ratio (P/D-Serve §3.3) ----------------------------------------------------------------------


def eq1_split(p: Profile, total: int, min_prefill: int = 1, min_decode: int = 1) -> tuple[int, int]:
    """(n_p, n_d) with n_p + n_d = total closest to eq. 1, n_p·b_p/T_p ≈ n_d·b_d/T_d, where
    T_d = ξ + TPOT_bs·G: the split whose bottleneck capacity min(prefill, decode) is largest."""
    cap_p = p.b_p / p.ttft_s  # requests a second one prefill TE finishes
    cap_d = p.b_d / (p.kv_transfer_s + p.tpot_s * p.output_tokens)
    best, best_rate = (min_prefill, total - min_prefill), -1.0
    for n_p in range(min_prefill, total - min_decode + 1):
        rate = min(n_p * cap_p, (total - n_p) * cap_d)
        if rate > best_rate + 1e-12:
            best, best_rate = (n_p, total - n_p), rate
    return best


def pd_pair(v: View, model: str) -> tuple[GroupView, GroupView] | None:
    p, d = v.groups.get(f"{model}/prefill"), v.groups.get(f"{model}/decode")
    return (p, d) if p is not None and d is not None else None


def pd_ratio_policy(cfg: Autoscale, v: View) -> list[Decision]:
    out: list[Decision] = []
    for model in sorted({g.model for g in v.groups.values()}):
        pair = pd_pair(v, model)
        if pair is None or v.now - v.last_flip_s.get(model, -math.inf) < cfg.window_s:
            continue  # one step a window at most: the next judged on what this one did
        p, d = pair
        if cfg.ratio_source == "profile" and model in v.profiles:
            n_p, _ = eq1_split(v.profiles[model], len(p.tes) + len(d.tes), cfg.min_prefill, cfg.min_decode)
            why = f"eq. 1 from profiling: {n_p} prefill of {len(p.tes) + len(d.tes)}"
            more_prefill = n_p > len(p.tes) if n_p != len(p.tes) else None
        else:
            ref = v.reference.get(model)
            now = v.previous.get(model)
            more_prefill, why = _online(cfg, now, ref) if ref is not now else (None, "")
        if more_prefill is None:
            continue
        src, dst = (d, p) if more_prefill else (p, d)
        keep = cfg.min_decode if src.role == "decode" else cfg.min_prefill
        if len(src.tes) <= keep:
            continue
        te = min(src.tes, key=lambda t: (load_of(v, t), t))
        out.append(Flip(policy="pd_ratio", te=te, src=src.group, dst=dst.group, reason=why))
    return out


def _online(cfg: Autoscale, now: Window | None, before: Window | None) -> tuple[bool | None, str]:
    """P/D-Serve's monitor, the last complete window against the reference (the first window
    after the last change): E2E up with TTFT's share up → more prefill; E2E up with TTFT's share
    down → more decode; otherwise leave the ratio."""
    if now is None or before is None or not now.requests or not before.requests:
        return None, ""
    e2e, e2e0 = now.mean_e2e_ms(), before.mean_e2e_ms()
    if e2e0 <= 0 or e2e < e2e0 * (1 + cfg.e2e_rise):
        return None, ""
    share, share0 = now.ttft_share(), before.ttft_share()
    rise = f"E2E {e2e0:.0f} -> {e2e:.0f} ms, TTFT share {share0:.2f} -> {share:.2f}"
    if share >= share0 + cfg.share_delta:
        return True, rise
    if share <= share0 - cfg.share_delta:
        return False, rise
    return None, ""


# ---- dynamic PD role switching (xLLM §3.2) -------------------------------------------------------------


def pool_of(v: View, te: str, role: str) -> str:
    """P, D, or the transition pool a recently flipped TE is in."""
    return v.pools[te][0] if te in v.pools else ("P" if role == "prefill" else "D")


def predicted_ttft_ms(v: View, p: GroupView, prof: Profile) -> float:
    """A new prompt's TTFT on the least-queued prefill TE: its queued prompt tokens over one
    TE's prefill throughput (xLLM's TTFT predictor, from the profiled rate)."""
    if not p.tes:
        return math.inf
    queued = min(v.loads.get(te, TeLoad()).prefill_tokens_waiting for te in p.tes)
    return queued / prof.prefill_tokens_per_s * 1e3


def predicted_tpot_ms(v: View, d: GroupView, prof: Profile) -> float:
    """The decode TEs' mean batch priced by the profiled TPOT line."""
    if not d.tes:
        return math.inf
    running = sum(v.loads.get(te, TeLoad()).running for te in d.tes) / len(d.tes)
    return prof.tpot_base_ms + prof.tpot_per_seq_ms * running


def role_switch_policy(cfg: Autoscale, v: View) -> list[Decision]:
    out: list[Decision] = []
    for model in sorted(v.profiles):
        pair = pd_pair(v, model)
        if pair is None or v.now - v.last_flip_s.get(model, -math.inf) < cfg.flip_cooldown_s:
            continue
        d = _switch(cfg, v, *pair, v.profiles[model])
        if d is not None:
            out.append(d)
    return out


def _switch(cfg: Autoscale, v: View, p: GroupView, d: GroupView, prof: Profile) -> Flip | None:
    ttft = predicted_ttft_ms(v, p, prof)
    tpot = predicted_tpot_ms(v, d, prof)
    if ttft > cfg.ttft_headroom * v.slo_ttft_ms and len(d.tes) > cfg.min_decode:
        # D→P: the lightest decode TE, first from the P→D pool (it was a prefill a moment ago)
        te = min(d.tes, key=lambda t: (pool_of(v, t, "decode") != "P->D", load_of(v, t), t))
        return Flip(policy="role_switch", te=te, src=d.group, dst=p.group,
                    reason=f"predicted TTFT {ttft:.0f} ms > {cfg.ttft_headroom:g} x SLO {v.slo_ttft_ms:g} ms")  # fmt: skip
    idle = [te for te in p.tes if load_of(v, te) == 0]
    busy_decode = sum(load_of(v, te) for te in d.tes)
    over = tpot > v.slo_tpot_ms
    # an idle prefill helps decode only when decode is near its TPOT SLO: otherwise the flip
    # leaves prefill short at the next burst for nothing
    near = idle and busy_decode and ttft == 0 and tpot > cfg.tpot_headroom * v.slo_tpot_ms
    if (over or near) and len(p.tes) > cfg.min_prefill:
        pick = idle or list(p.tes)
        te = min(pick, key=lambda t: (pool_of(v, t, "prefill") != "D->P", load_of(v, t), t))
        why = (f"predicted TPOT {tpot:.1f} ms > SLO {v.slo_tpot_ms:g} ms" if over
               else f"{len(idle)} prefill TEs idle, predicted TPOT {tpot:.1f} ms near SLO {v.slo_tpot_ms:g} ms")  # fmt: skip
        return Flip(policy="role_switch", te=te, src=p.group, dst=d.group, reason=why)
    return None


Policy = Callable[[Autoscale, View], list[Decision]]
POLICIES: dict[str, Policy] = {"load": load_policy, "pd_ratio": pd_ratio_policy, "role_switch": role_switch_policy}


def decide(cfg: Autoscale, v: View) -> list[Decision]:
    """Every selected policy's decisions, in the configured order."""
    return [d for name in cfg.policies for d in POLICIES[name](cfg, v)]
