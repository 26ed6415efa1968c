"""The autoscaler's pure decisions (actors/cluster/autoscaler_policy.py), without a driver."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from deepserve.actors.cluster import autoscaler_policy as AP
from deepserve.actors.cluster.autoscaler_config import Autoscale

PROF = AP.Profile(prefill_tokens_per_s=10_000.0, tpot_base_ms=20.0, tpot_per_seq_ms=0.5, ttft_s=0.1, b_p=1.0,
                  tpot_s=0.03, b_d=64.0, kv_transfer_s=0.01, output_tokens=200.0)  # fmt: skip


def view(groups: list[AP.GroupView], **kw: Any) -> AP.View:
    base: dict[str, Any] = dict(now=100.0, groups={g.group: g for g in groups}, loads={}, window={}, previous={},
                                reference={},
                                inflight={}, last_active_s={}, last_out_s={}, last_change_s={}, last_flip_s={},
                                pools={}, slo_ttft_ms=2000.0, slo_tpot_ms=100.0, profiles={"m": PROF})  # fmt: skip
    base.update(kw)
    return AP.View(**base)


def group(role: str, tes: tuple[str, ...], target: int | None = None, slots: int = 4) -> AP.GroupView:
    return AP.GroupView(group=f"m/{role}", model="m", role=role, tes=tes,
                        target=len(tes) if target is None else target, slots=slots)  # fmt: skip


def loads(**per_te: int) -> dict[str, AP.TeLoad]:
    return {te.replace("_", "/"): AP.TeLoad(waiting=n, running=0) for te, n in per_te.items()}


def test_load_scales_out_to_the_target_load_within_the_bounds() -> None:
    cfg = Autoscale(enabled=True, target_load=10, max_tes=3)
    v = view([group("colocated", ("te/0",))], loads=loads(te_0=45))
    (d,) = AP.decide(cfg, v)
    assert isinstance(d, AP.ScaleTo) and d.size == 3 and "45 open tasks" in d.reason  # ceil(45/10)=5, max 3


def test_scale_out_waits_out_its_cooldown_and_a_boot_under_way() -> None:
    cfg = Autoscale(enabled=True, target_load=10, scale_out_cooldown_s=5)
    g = group("colocated", ("te/0",))
    assert AP.decide(cfg, view([g], loads=loads(te_0=45), last_out_s={"m/colocated": 97.0})) == []
    assert AP.decide(cfg, view([g], loads=loads(te_0=45), last_out_s={"m/colocated": 95.0})) != []
    booting = group("colocated", ("te/0",), target=2)
    assert AP.decide(cfg, view([booting], loads=loads(te_0=45))) == []


def test_slo_violations_add_one_te_even_at_low_load() -> None:
    cfg = Autoscale(enabled=True, target_load=10, slo_violation_max=0.1)
    win = {"m": AP.Window(requests=10, violated=3)}
    (d,) = AP.decide(cfg, view([group("colocated", ("te/0", "te/1"))], loads=loads(te_0=3, te_1=3), window=win))
    assert isinstance(d, AP.ScaleTo) and d.size == 3 and "30% of 10 requests missed the SLO" in d.reason
    few = {"m": AP.Window(requests=4, violated=3)}  # below slo_min_requests (5): no verdict yet
    assert AP.decide(cfg, view([group("colocated", ("te/0", "te/1"))], loads=loads(te_0=3, te_1=3), window=few)) == []


def test_scale_in_one_te_after_the_cooldown_never_below_min() -> None:
    cfg = Autoscale(enabled=True, target_load=10, scale_in_load=2, scale_in_cooldown_s=30, min_tes=1)
    g = group("colocated", ("te/0", "te/1"))
    assert AP.decide(cfg, view([g], last_change_s={"m/colocated": 80.0})) == []  # 20 s < 30 s
    (d,) = AP.decide(cfg, view([g], last_change_s={"m/colocated": 60.0}))
    assert isinstance(d, AP.ScaleTo) and d.size == 1
    assert AP.decide(cfg, view([group("colocated", ("te/0",))])) == []  # at min_tes


def test_scale_to_zero_after_keep_alive_and_back_on_demand() -> None:
    cfg = Autoscale(enabled=True, min_tes=0, keep_alive_s=30)
    g = group("colocated", ("te/0",))
    assert AP.decide(cfg, view([g], last_active_s={"m": 80.0})) == []  # idle 20 s
    (d,) = AP.decide(cfg, view([g], last_active_s={"m": 60.0}))
    assert isinstance(d, AP.ScaleTo) and d.size == 0 and "keep_alive_s 30" in d.reason
    assert AP.decide(cfg, view([g], last_active_s={"m": 60.0}, inflight={"m": 1})) == []  # a request runs
    zero = group("colocated", (), target=0)
    assert AP.decide(cfg, view([zero])) == []
    (up,) = AP.decide(cfg, view([zero], inflight={"m": 2}))
    assert isinstance(up, AP.ScaleTo) and up.size == 1 and "has no TE" in up.reason


def test_eq1_split_balances_prefill_and_decode_capacity() -> None:
    # one prefill TE: 1/0.1 = 10 req/s; one decode TE: 64/(0.01 + 0.03*200) = 10.65 req/s
    assert AP.eq1_split(PROF, 8) == (4, 4)
    long_out = msgspec.structs.replace(PROF, output_tokens=800.0)  # decode 2.66 req/s a TE
    assert AP.eq1_split(long_out, 8) == (2, 6)
    assert AP.eq1_split(long_out, 3, min_prefill=1, min_decode=2) == (1, 2)


def test_online_ratio_follows_e2e_and_ttft_share() -> None:
    cfg = Autoscale(enabled=True, policies=("pd_ratio",), window_s=10, min_decode=1)
    p, d = group("prefill", ("te/0", "te/1")), group("decode", ("te/2", "te/3"))
    before = {"m": AP.Window(requests=10, ttft_ms_sum=1000, e2e_ms_sum=10_000)}
    ttft_up = {"m": AP.Window(requests=10, ttft_ms_sum=6000, e2e_ms_sum=15_000)}  # E2E +50%, share .1 -> .4
    (f,) = AP.decide(cfg, view([p, d], previous=ttft_up, reference=before))
    assert isinstance(f, AP.Flip) and f.src == "m/decode" and f.dst == "m/prefill"
    ttft_down = {"m": AP.Window(requests=10, ttft_ms_sum=300, e2e_ms_sum=15_000)}  # share .1 -> .02
    (f,) = AP.decide(cfg, view([p, d], previous=ttft_down, reference=before))
    assert f.src == "m/prefill" and f.dst == "m/decode"
    flat = {"m": AP.Window(requests=10, ttft_ms_sum=1050, e2e_ms_sum=10_500)}  # E2E +5%: leave it
    assert AP.decide(cfg, view([p, d], previous=flat, reference=before)) == []
    assert AP.decide(cfg, view([p, d], previous=ttft_up, reference=before, last_flip_s={"m": 95.0})) == []
    assert AP.decide(cfg, view([p, d], previous=before, reference=before)) == []  # the reference itself


def test_profiled_ratio_moves_one_te_toward_eq1() -> None:
    cfg = Autoscale(enabled=True, policies=("pd_ratio",), ratio_source="profile", min_decode=1)
    p, d = group("prefill", ("te/0",)), group("decode", ("te/1", "te/2", "te/3"))
    (f,) = AP.decide(cfg, view([p, d], loads=loads(te_1=5, te_2=0, te_3=9)))
    assert isinstance(f, AP.Flip) and f.te == "te/2" and f.dst == "m/prefill"  # the lightest decode TE


def test_role_switch_d_to_p_on_predicted_ttft_keeping_two_decode() -> None:
    cfg = Autoscale(enabled=True, policies=("role_switch",), min_decode=2)
    p, d = group("prefill", ("te/0",)), group("decode", ("te/1", "te/2", "te/3"))
    hot = {"te/0": AP.TeLoad(waiting=20, running=1, prefill_tokens_waiting=30_000)}  # 3000 ms queued
    pools = {"te/3": ("P->D", 99.0)}
    (f,) = AP.decide(cfg, view([p, d], loads=hot, pools=pools))
    assert isinstance(f, AP.Flip) and f.te == "te/3" and "predicted TTFT 3000 ms" in f.reason  # P->D pool first
    two = group("decode", ("te/1", "te/2"))
    assert AP.decide(cfg, view([p, two], loads=hot)) == []  # at least two decode TEs stay


def test_role_switch_p_to_d_on_tpot_or_idle_prefill() -> None:
    cfg = Autoscale(enabled=True, policies=("role_switch",), min_decode=2)
    p, d = group("prefill", ("te/0", "te/1")), group("decode", ("te/2", "te/3"))
    full = {"te/2": AP.TeLoad(running=200), "te/3": AP.TeLoad(running=200), "te/0": AP.TeLoad(running=1)}
    (f,) = AP.decide(cfg, view([p, d], loads=full))  # TPOT 20 + 0.5*200 = 120 ms > 100
    assert isinstance(f, AP.Flip) and f.src == "m/prefill" and f.te == "te/1" and "TPOT 120.0 ms" in f.reason
    near = {"te/2": AP.TeLoad(running=150), "te/3": AP.TeLoad(running=150)}  # TPOT 95 ms, prefill idle
    (f,) = AP.decide(cfg, view([p, d], loads=near))
    assert "prefill TEs idle" in f.reason and "TPOT 95.0 ms" in f.reason
    assert AP.decide(cfg, view([p, d], loads=near, last_flip_s={"m": 99.0})) == []  # flip cool-down
    light = {"te/2": AP.TeLoad(running=10), "te/3": AP.TeLoad(running=10)}  # TPOT 25 ms: decode needs none
    assert AP.decide(cfg, view([p, d], loads=light)) == []
    assert AP.decide(cfg, view([group("prefill", ("te/0",)), d], loads=full)) == []  # min_prefill


@pytest.mark.parametrize(("kw", "key"), [
    ({"policies": ["load", "load"]}, "policies"), ({"min_tes": 3, "max_tes": 2}, "max_tes"),
    ({"scale_in_load": 20.0}, "scale_in_load"), ({"policies": ["pd_ratio", "role_switch"]}, "policies"),
    ({"groups": ["nogroup"]}, "groups"),
])  # fmt: skip
def test_bad_settings_are_refused_naming_the_field(kw: dict[str, Any], key: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=key):
        msgspec.convert(kw, Autoscale)
