"""The JE's configuration (a scenario's `scheduling` section feeds it)."""

from __future__ import annotations

from typing import Any

import msgspec

from deepserve.actors.scheduling import DEFAULT_POLICY, Policy
from deepserve.actors.scheduling.forwarding import ForwardingParams
from deepserve.actors.scheduling.locality import MAX_BLOCKS_DEFAULT

from .migration import MigrationParams

MAX_JOBS = 1 << 20  # a limit on everything: jobs one JE holds at once
MAX_BATCH_ITEMS = 100_000


class JeConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    policy: str = DEFAULT_POLICY
    params: dict[str, int | float] = {}
    heatmap: dict[str, Any] | None = None  # a PdHeatmap as data (`deepserve profile heatmap`)
    forwarding: ForwardingParams = msgspec.field(default_factory=ForwardingParams)
    max_attempts: int = 3  # tasks tried per phase before the request fails
    batch_online_limit: int = 64  # batch items wait while this many online jobs are in flight
    batch_inflight: int = 8  # batch items dispatched at once at most
    batch_tick_s: float = 0.05
    max_tree_blocks: int = MAX_BLOCKS_DEFAULT
    predictor: dict[str, Any] | None = None  # a DecodeLengthTree as data (`deepserve profile predictor`)
    kv_block_tokens: int = 128  # the cluster's block size: prompt-tree matches in tokens
    stream_to: str = ""  # a live frontend's address: the TEs stream output tokens there ("": none)
    # No TaskAccepted for a chat task sent straight to a TE's only DP master (`JeState.direct`),
    # and no accept timeout armed for it: the JE asks each new TE (`QuietAccepts`, beside its KV
    # subscription); like an accepted task, a TE that dies holding one is found by the control
    # plane (its membership push fails the task). Absent from JE configs recorded before it.
    quiet_accept: bool = False
    kv_events: bool = True  # subscribe to the TEs' KV cache events (False: ROUTED guesses only)
    # A prefill TE whose KV failed to reach its decode TE, or that refused a task because it is
    # down (device lost: `forwarding.te_down`), gets no new P/D task for this long while another
    # TE can take it (outlier ejection: a down link is invisible to heartbeats, so every request
    # sent that way would find it down once). 0: never set aside.
    kv_fail_cooldown_s: float = 5.0
    # A decode whose KV path link probing found saturated (busy, not down: kvlinks.py) gets no new
    # decode task for this long while another decode can take one. Only a verdict sets it off.
    kv_saturated_s: float = 5.0
    # A streamed request on a failed TE moves to another (migration.py); off: it fails, as before
    migration: MigrationParams = msgspec.field(default_factory=MigrationParams)
    # Zombie protection (P/D-Serve §3.4) whatever `migration` says: a failed decode's prefill side
    # frees the KV it holds for it at once (its hold would otherwise last `pd_hold_timeout_s`; a
    # failed decode is never retried with the same KV). Absent from JE configs recorded before it.
    release_lost_decode_kv: bool = False
    # A job for a model whose TE groups are all empty parks until a TE joins (or its TTFT
    # deadline) instead of failing at once: an autoscaler may scale that model to zero and back
    # (actors/cluster/autoscaler_policy.py). Off: such a job fails naming the empty group.
    park_empty: bool = False
    # A what-if's fork at a decision (`deepserve replay whatif --at-decision`): task id -> the TE
    # its routing decision is made to choose instead of the policy's (recorded in RouteDecided)
    forced: dict[str, str] = {}

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("scheduling.max_attempts: must be >= 1")
        if not 0 <= self.kv_fail_cooldown_s <= 3600:
            raise ValueError("scheduling.kv_fail_cooldown_s: must be in [0, 3600]")
        if self.batch_inflight < 1 or self.batch_online_limit < 0 or not self.batch_tick_s > 0:
            raise ValueError("scheduling.batch_*: inflight >= 1, online_limit >= 0, tick_s > 0")
        Policy(self.policy, self.params, self.heatmap)  # validates name, params and heatmap
        if self.predictor is not None:
            from deepserve.actors.scheduling.predictor import DecodeLengthTree

            msgspec.convert(self.predictor, DecodeLengthTree)
