"""A decision over a `Pool` (what the JE runs: pd_aware and combined build `Candidate` records
for the chosen subgroup only) is the decision over every candidate, field for field and byte
for byte once encoded, for every policy, on random groups: loads, prefixes, ties, one subgroup
empty, the load bound overriding the heatmap."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deepserve.actors.scheduling import POLICIES, PdHeatmap, Policy, Pool, RouteRequest

HEAT = PdHeatmap(prefill_edges=(0, 1024), ratio_edges=(0.0, 0.25), values=((-0.5, 0.3), (0.4, -0.1)))
TES = [f"te/{i}" for i in range(12)]


@st.composite
def pools(draw: st.DrawFn) -> Pool:
    tes = draw(st.lists(st.sampled_from(TES), unique=True, min_size=1, max_size=12))
    cut = draw(st.integers(0, len(tes)))
    load = {te: draw(st.integers(0, 9)) for te in tes if draw(st.booleans())}  # a TE absent: 0 open
    held = {te: draw(st.integers(0, 6)) for te in tes if draw(st.booleans())}
    return Pool(tes[:cut], tes[cut:], load, held, draw(st.integers(0, 3)))


@pytest.mark.parametrize("name", POLICIES)
@settings(max_examples=150, deadline=None)
@given(pool=pools(), tokens=st.integers(1, 4096), bucket=st.one_of(st.none(), st.integers(0, 31)),
       turn=st.integers(0, 50), bound=st.integers(0, 5))
def test_a_decision_over_the_pool_is_the_decision_over_every_candidate(
        name: str, pool: Pool, tokens: int, bucket: int | None, turn: int, bound: int) -> None:
    params = {"subgroup_load_bound": bound} if name in ("pd_aware", "combined") else {}
    policy = Policy(name, params, HEAT)
    req = RouteRequest(request_id="r", prompt_tokens=tokens, prompt_blocks=tokens // 128, predicted_bucket=bucket)
    every = policy.select(req, pool.all(), turn)
    lazy = policy.select_pool(req, pool, turn)
    assert lazy == every
    assert msgspec.msgpack.encode(lazy) == msgspec.msgpack.encode(every)


def test_the_pool_lists_colocated_first_with_each_sides_fields() -> None:
    pool = Pool(["te/0"], ["te/1", "te/2"], {"te/1": 2}, {"te/0": 5, "te/2": 1}, decode_load=3)
    got = [(c.te, c.subgroup, c.load, c.prefix_blocks, c.decode_load) for c in pool.all()]
    assert got == [("te/0", "colocated", 0, 5, 0), ("te/1", "pd", 2, 0, 3), ("te/2", "pd", 0, 1, 3)]
    assert (pool.least("colocated"), pool.least("pd")) == (0, 3)
    assert not Pool([], [], {}, {})
