"""One walk of the prompt tree per routing decision (issue 29 §4): the predictor's longest
match and the candidates' prefixes come from the same walk (before: one walk for the
predictor, over decode TEs too, and one per role for the candidates)."""

from __future__ import annotations

from typing import Any

from test_je import done_of, job, run

from deepserve.actors.scheduling.locality import PromptTree

PRED = {"feature": [0, -2, -2], "threshold": [10.5, -2.0, -2.0], "left": [1, -1, -1],
        "right": [2, -1, -1], "bucket": [0, 1, 3]}


def test_a_decision_walks_the_prompt_tree_once(monkeypatch: Any) -> None:
    walks: list[tuple[str, ...]] = []
    real = PromptTree.walk  # `match` walks through it too

    def counted(self: PromptTree, hashes: Any, tes: list[str]) -> tuple[dict[str, int], int]:
        walks.append(tuple(tes))
        return real(self, hashes, tes)

    monkeypatch.setattr(PromptTree, "walk", counted)
    tes: dict[str, dict[str, Any]] = {"c/0": {}, "c/1": {}, "p/0": {}, "d/0": {}}
    roles = {"colocated": ["c/0", "c/1"], "prefill": ["p/0"], "decode": ["d/0"]}
    cfg = {"policy": "load_aware", "predictor": PRED, "kv_events": False}
    _, out = run(tes, roles, [job(i, prompt=384, blocks=(1, 2, 3)) for i in range(3)], cfg, gap_s=1.0)
    assert all(r.status == "completed" for r in done_of(out).values())
    assert walks == [("c/0", "c/1", "p/0")] * 3  # one a request, never over the decode TE


def test_an_arrivals_pool_is_the_general_loops() -> None:
    """The arrival's shortcut (no TE failed the job, none set aside) gives the pool the general
    loop gives: a set-aside entry that expired sends the same state down the loop."""
    from deepserve.actors.flowserve.messages import Prompt, Sampling
    from deepserve.actors.je import routing
    from deepserve.actors.je.messages import JeState, Job

    groups = {"m": {"colocated": ["c/0", "c/1"], "prefill": ["p/0", "p/1"], "decode": ["d/0", "d/1"]}}
    opened = {"c/0": 2, "p/1": 1, "d/0": 3, "d/1": 2}
    j = Job(model="m", prompt=Prompt(num_tokens=256, block_hashes=(1, 2)), sampling=Sampling(max_tokens=8),
            reply_to="ext/c", arrival_s=0.0)
    match = {"c/0": 1, "p/1": 2}
    short = routing.pool(JeState(groups=groups, open=dict(opened)), j, now=1.0, match=match)
    loop = routing.pool(JeState(groups=groups, open=dict(opened), set_aside={"p/0": 0.5}), j, now=1.0, match=match)
    assert short[0].all() == loop[0].all() and short[1] == loop[1] == ()
    assert short[0].decode_load == loop[0].decode_load == 2
