"""The Dynamo side of `deepserve bench sim --dynamo`, run as a script in its own process.

`python sim_dynamo_child.py TRACE CONFIG_JSON` replays a Mooncake trace through NVIDIA Dynamo's
mocker in its offline (virtual-clock) mode, with the KV router, and prints one JSON object: the
mocker's own wall time and the summary fields the bench compares. Run by path, not as a module, so
the process imports only the standard library and Dynamo (not deepserve): its start-up is the
mocker's. `dynamo._core.run_mocker_trace_replay` is what `dynamo.replay.run_trace_replay` (the
`ai-dynamo` package) calls for an offline run without a planner; calling it directly needs only
`ai-dynamo-runtime` (one wheel) instead of ai-dynamo's dependencies (kubernetes, transformers, ...).
"""

from __future__ import annotations

import json
import sys
import time

KEPT = ("num_requests", "completed_requests", "duration_ms", "wall_time_ms",
        "prefix_cache_reused_ratio", "median_ttft_ms", "median_tpot_ms")  # fmt: skip


def main(argv: list[str]) -> int:
    trace, config = argv[1], json.loads(argv[2])
    from dynamo._core import run_mocker_trace_replay

    t0 = time.perf_counter()
    result = run_mocker_trace_replay(
        [trace],
        extra_engine_args={"engine": config["engine"]},
        num_workers=config["workers"],
        router_mode="kv_router",
        replay_mode="offline",
        trace_format="mooncake",
        trace_block_size=config["engine"]["block_size"],
    )
    wall_s = time.perf_counter() - t0
    summary = result.summary
    print(json.dumps({"wall_s": wall_s, **{key: summary.get(key) for key in KEPT}}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
