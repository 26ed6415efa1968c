"""JE routing decisions on a mixed group (colocated TEs, PD pairs), hashed: test_compiled runs
this under both builds. Loads move between decisions, so balanced, unbalanced and overruled
subgroup choices all occur; a sim scenario has no mixed group, so its log never reaches
`combined_pool`'s two-sided path."""

from __future__ import annotations

import hashlib
import random

import msgspec

from deepserve.actors.flowserve.messages import Prompt, Sampling
from deepserve.actors.je import routing
from deepserve.actors.je.actor import JobExecutor
from deepserve.actors.je.messages import Job
from deepserve.actors.scheduling import PdHeatmap
from deepserve.benchmarks.routing import MODEL, build_state

HEAT = PdHeatmap(prefill_edges=(0, 1024), ratio_edges=(0.0, 0.25), values=((-0.5, 0.3), (0.4, -0.1)))


def digest(prompts: int = 120) -> str:
    h = hashlib.sha256()
    for policy in ("combined", "pd_aware", "load_aware", "locality"):
        je = JobExecutor({"policy": policy, "heatmap": msgspec.to_builtins(HEAT) if policy in ("combined", "pd_aware") else None})
        je.state, kept = build_state(32, prompts, 1024, seed=5)
        rng = random.Random(7)
        tes = sorted(je.state.open)
        group = je.state.groups[MODEL]
        colocated, pairs = set(group["colocated"]), {*group["prefill"], *group["decode"]}
        for i, hashes in enumerate(kept):
            side = rng.choice((colocated, pairs))
            for te in tes:  # balanced (locality decides), unbalanced, or one side far busier
                je.state.open[te] = rng.randrange(0, 3) if i % 4 == 0 else rng.randrange(0, 12)
                if i % 4 == 3 and te in side:
                    je.state.open[te] += 20
            j = Job(model=MODEL, prompt=Prompt(num_tokens=rng.choice((256, 1024, 4000)), block_hashes=hashes),
                    sampling=Sampling(max_tokens=128), reply_to="ext/c", arrival_s=0.0)
            j.predicted_bucket = rng.choice((None, 0, 3, 20))
            match = routing.group_walk(je.state, MODEL, hashes)[0]
            h.update(msgspec.json.encode(je.decide(f"r{i}", j, 0.0, match)))
    return h.hexdigest()
