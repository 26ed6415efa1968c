"""The cluster manager's and the heartbeat monitor's messages (DeepServe §3, xDeepServe §6.1).

Kept stable (helpers code against it); extended only additively.

Boot (inside a TE's pod, from `TeBoot` to the manager):
    TeBootStep(step, duration_s) for te_pre_load, ssd_to_dram, dram_to_npu, post_load;
    then RegisterTe (flowserve.messages) — or TeBootFailed(reason). With `[scaling]` on, the steps
    are DeepServe Table 2's: scaler_pre, te_pre_load, te_load, te_post_load (each with a detail:
    pre-warmed or created/cold, dram-hit/dram-miss/npu-fork-<link>, the warm-up).
NPU-fork (TeBoot ↔ `cluster/fork`, actors/cluster/fork.py):
    ForkRequest → ForkLoaded(path, duration_s) | ForkNone(reason): no source, load locally.
Heartbeats (first tier, xDeepServe §6.1):
    monitor --Heartbeat--> TE shell --(forwards)--> `{te}/hb` --ask DpHeartbeat--> each DP master
    `{te}/hb` --HeartbeatAck(ok)--> monitor, once every master answered (ok=False names the one
    that did not). A master answers only while its loop is alive: it stays silent when the same
    forward pass is still outstanding that it reported at the previous heartbeat (`last_step`).
    No ack by the next tick is a miss; `misses` consecutive misses → TeFailed to the manager.
Manager inputs from outside (admin, every one an external input in the log):
    ScaleGroup(group, size), DrainTe(te) — RemoveTe (actors/je/cluster.py) is kept as an alias path.
Manager outputs:
    TeGroupMembership (actors/je/messages.py) to every JE on every change of a group;
    DirectoryUpdate to every directory subscriber on every change of address → endpoint;
    WatchTe / UnwatchTe to the monitor; LaunchPod / StopPod to the pod launcher.
"""

from __future__ import annotations

from typing import Literal

from deepserve.core.messages import Message

# The last four: DeepServe Table 2's steps as the fast-scaling pipeline reports them ([scaling] on,
# actors/cluster/prewarm.py); Scaler-Post is `registered` minus the boot's steps.
BootStepName = Literal["pod_start", "te_pre_load", "ssd_to_dram", "dram_to_npu", "post_load", "registered",
                       "scaler_pre", "te_load", "te_post_load",
                       "python_start"]  # processes mode: a real process's start, measured
TeStateName = Literal["starting", "ready", "failed", "replacing", "draining", "stopped"]

# ---- boot (TeBoot → manager) --------------------------------------------------------------------


class TeBootStep(Message, frozen=True, kw_only=True):
    te: str
    generation: int
    pod_id: str
    step: BootStepName
    duration_s: float
    detail: str = ""  # e.g. the host's load path: "ssd", "dram-hit"


class TeBootFailed(Message, frozen=True, kw_only=True):
    te: str
    generation: int
    pod_id: str
    reason: str


# ---- heartbeats ----------------------------------------------------------------------------------


class WatchTe(Message, frozen=True, kw_only=True):
    """Manager → monitor: heartbeat this TE (a new generation replaces the old watch)."""

    te: str
    generation: int


class UnwatchTe(Message, frozen=True, kw_only=True):
    te: str


class StopMonitor(Message, frozen=True, kw_only=True):
    """Stop the periodic ticks (the run is ending): no timer stays pending."""

    reason: str = "the run is ending"


class LoseHeartbeats(Message, frozen=True, kw_only=True):
    """A fault (a scenario's `heartbeat-loss`): the TE's heartbeat answers are lost on their way
    to the monitor for `duration_s` — the TE itself is fine. The monitor's rules decide: lost
    for `misses` rounds, the TE is declared failed (diagnosis "silent") and replaced."""

    te: str
    duration_s: float


class HeartbeatTick(Message, frozen=True):
    """The monitor's timer."""


class Heartbeat(Message, frozen=True, kw_only=True):
    """Monitor → TE shell (which forwards it to `{te}/hb`)."""

    te: str
    generation: int
    seq: int
    reply_to: str  # the monitor
    # > 0: lease the answer (heartbeat.py): each DP group's NPU is probed for a promise to tell
    # the monitor of any fault within `lease_s`, and the ack says until when it holds
    lease_s: float = 0.0


class HeartbeatAck(Message, frozen=True, kw_only=True):
    te: str
    generation: int
    seq: int
    ok: bool  # every DP master answered
    reason: str = ""  # ok=False: which master did not answer, and why
    diagnosis: str = ""  # ok=False: DEVICE_LOST or HUNG
    steps: tuple[int, ...] = ()  # per DP group: the forward pass outstanding (-1: none)
    lease_until_s: float = 0.0  # ok and leased: no need to ask again before then (0: no lease)


class DpHeartbeat(Message, frozen=True, kw_only=True):
    """`{te}/hb` → a DP master (an ask). `last_step`: the outstanding forward that master
    reported at the previous heartbeat (-1: none); still the same one → the loop is stalled."""

    seq: int
    last_step: int = -1


class DpHeartbeatAck(Message, frozen=True, kw_only=True):
    dp: int
    seq: int
    step: int  # the launched forward pass outstanding now (-1: none)
    failed: str = ""  # the loop runs but cannot serve: its device is lost (why)
    # The same pass as at the last answer, but an aggregated run (the simulator's fast path for
    # many decode passes in one NPU request): not stuck by itself; the asker probes the NPU.
    in_run: bool = False


class HbDropDp(Message, frozen=True, kw_only=True):
    """Manager → `{te}/hb`: stop asking DP group `dp`'s master, its device is lost and the TE
    serves on with its other groups (the recovery ladder's decode vertical scaling)."""

    dp: int


class TeFailed(Message, frozen=True, kw_only=True):
    """Monitor (or an operator) → manager: declare the TE's `generation` failed."""

    te: str
    generation: int
    reason: str
    diagnosis: str = ""  # one of DIAGNOSES ("": not said)


# The recorded diagnosis of a failed TE (xDeepServe §6.1: crash vs stuck vs silent):
DEVICE_LOST = "device-lost"  # a DP master answered that its NPU crashed, was reset or its HBM faulted
HUNG = "hang"  # the shell answered, a DP master did not: its loop is stuck on a forward pass
SILENT = "silent"  # no answer from the TE at all: its process is gone or its heartbeats are lost
EXITED = "exited"  # the pod launcher saw the TE's process end
BOOT = "boot"  # its boot failed or timed out
DIAGNOSES = (DEVICE_LOST, HUNG, SILENT, EXITED, BOOT)


# ---- manager admin and queries -------------------------------------------------------------------


class ScaleGroup(Message, frozen=True, kw_only=True):
    """Set a TE group's target size by hand: launch TEs on free slots, or drain and stop."""

    group: str  # "{model}/{role}", e.g. "llama3-8b/colocated"
    size: int


class DrainTe(Message, frozen=True, kw_only=True):
    te: str
    reason: str = "drained by the operator"


class DrainPoll(Message, frozen=True, kw_only=True):
    """The manager's timer: is the draining TE idle yet?"""

    te: str
    generation: int


class DirectoryUpdate(Message, frozen=True, kw_only=True):
    """Address prefix → endpoint entries, the whole current table (`version` grows per change)."""

    version: int
    routes: dict[str, str]
    removed: tuple[str, ...] = ()


class RemoveTe(Message, frozen=True, kw_only=True):
    """Take a TE out of its group (the stand-in's operator input, kept): drained and stopped
    when the manager runs pods, else dropped from the group at once."""

    te: str
    reason: str = "removed by the operator"


class BootTimeout(Message, frozen=True, kw_only=True):
    """The manager's timer: the TE's generation did not register in time."""

    te: str
    generation: int


class RelaunchTe(Message, frozen=True, kw_only=True):
    """The manager's timer: a failed boot's backoff is over, boot the slot's next generation."""

    te: str
    generation: int  # the failed one


class ClusterStatusQuery(Message, frozen=True, kw_only=True):
    req_id: str = ""


class ClusterStatus(Message, frozen=True, kw_only=True):
    """The manager's state as data (`CmState` to_builtins): TEs with generation and state,
    groups with targets, the directory."""

    req_id: str
    state: dict[str, object]


# ---- NPU-fork (a booting TE ↔ the fork coordinator, actors/cluster/fork.py) ---------------------


class ForkRequest(Message, frozen=True, kw_only=True):
    """A booting TE asks for its weights from a running TE of its model (DeepServe §6.2)."""

    te: str
    generation: int
    model: str
    tp: int
    server: int
    npus: tuple[str, ...]  # DP group g owns npus[g*tp:(g+1)*tp]
    reply_to: str


class ForkLoaded(Message, frozen=True, kw_only=True):
    te: str
    generation: int
    source: str  # the running TE that streamed its weights
    path: str  # "npu-fork-hccs", "npu-fork-roce", "npu-fork-ub"
    duration_s: float  # from the request to the weights on the NPUs (gather + broadcast + init)
    fork_id: str


class ForkNone(Message, frozen=True, kw_only=True):
    """No fork: no running TE of the model (scaling from zero), or the broadcast failed."""

    te: str
    generation: int
    reason: str


class ForkGather(Message, frozen=True):
    """The coordinator's timer: requests gathered this long go out as one broadcast."""


# ---- DRAM pre-loading (to `cluster/preload`, actors/cluster/preload.py) --------------------------


class PreloadModel(Message, frozen=True, kw_only=True):
    """A prediction (an autoscaler's, an operator's): `model` will scale onto these hosts — read
    it into their DRAM page caches now, so the scale-out's TE-Load is a DRAM hit."""

    model: str
    hosts: tuple[str, ...]
    reason: str = ""


# ---- the pod launcher's pools (`pods`, actors/cluster/pods.py) ------------------------------------


class PoolsQuery(Message, frozen=True, kw_only=True):
    """What the pod launcher holds pre-warmed now (`deepserve status`, an autoscaler)."""

    req_id: str = ""


class PoolsStatus(Message, frozen=True, kw_only=True):
    req_id: str
    enabled: bool  # [scaling] on: the launcher keeps pools
    pods: int = 0
    masters: int = 0
    executors: dict[str, int] = {}  # str(server) -> pre-warmed executors there
    policy: str = ""  # fixed or predicted
