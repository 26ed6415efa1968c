"""The pod-launcher port: how the cluster manager creates, stops and (for fault injection) kills
the pod that holds a TE (DeepServe §6, step 1 "Scaler-Pre": creating pods to hold the TE).

The manager sends `LaunchPod` to the launcher's address (`pods` by default); the launcher answers
`PodLaunched(pod_id, te, endpoint)` once the pod runs, or `PodFailed(pod_id, reason)`; a pod
whose process later ends on its own is reported as `PodExited`. Inside the
pod the TE's bootstrap (`actors/cluster/boot.py: TeBoot`, at `{te}/boot`, built from the
`BootSpec` below) does TE-Pre-Load, loads the weights (TE-Load: for `source="cold"` SSD → DRAM page
cache → NPU through the host port), spawns the TE shell (TE-Post-Load), reports each step to the
manager (`TeBootStep`) and registers the TE (`RegisterTe`). The manager records each step's
duration and pushes the group's membership when the TE is ready (Scaler-Post, proactive pushing).

`StopPod` ends a pod the manager no longer wants (a failed TE before its replacement, a drained
TE on scale-down); the launcher answers `PodStopped`. `KillPod` is a fault: the pod dies without
telling anyone, exactly as a crashed process (single process: the TE's actors stop and only the
heartbeat monitor notices; processes mode: SIGKILL, which the supervisor reaps and reports as
`PodExited`, as it does any crash).

Two launchers implement this port (edge adapters, not the manager's business): in-process
(`actors/cluster/pods.py: InProcessPods`, spawns the TE's actors in the same driver) and
processes mode (`daemon/procs/`, one OS process per TE). `"dram"` (the host's page cache, hit
when DRAM pre-loading predicted the model, else the SSD) and `"fork"` (NPU-fork from a running TE,
`HostFork` through actors/cluster/fork.py; local loading when no TE runs the model) are the
fast-scaling pipeline's (`[scaling]`, actors/cluster/prewarm.py): the in-process launcher only.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from deepserve.core.messages import Message

TeRole = Literal["colocated", "prefill", "decode"]
# Where a new TE's weights come from (DeepServe §6.2, Figure 10):
#   cold     — SSD → DRAM page cache → NPU (a DRAM hit skips the SSD read, and says so);
#   dram     — straight from the host's DRAM page cache (pre-loaded: a hit), else the SSD;
#   fork     — NPU-fork from a running TE over HCCS/RoCE/UB (else as dram);
#   resident — already on the NPUs: the cluster's initial deployment, in place at the run's epoch.
LoadSource = Literal["cold", "dram", "fork", "resident"]
IMPLEMENTED_SOURCES: tuple[str, ...] = ("cold", "dram", "fork", "resident")


class TeSlot(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Where a TE runs and how it is configured: a server's NPUs and the TE shell's config.

    The builder (an adapter: it prices KV pools with the performance model) makes one slot per
    TE the cluster may hold — the initial TEs and the spare capacity a scale-up may use; a
    replacement reuses its failed TE's slot (its pod re-initialises the NPUs)."""

    te: str  # the TE's address ("te/3"); its masters are "{te}/dp/{i}"
    group: str  # "{model}/{role}"
    model: str
    role: TeRole
    server: int
    host: str  # the server's host actor ("hw/s0/host"): the weight-load path
    npus: tuple[str, ...]  # every NPU of the TE, DP group g owns npus[g*tp:(g+1)*tp]
    tp: int
    dp_groups: int
    te_config: dict[str, Any]  # the TE shell's `TeConfig` as data (cluster_manager left empty)


class BootSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the TE's bootstrap actor needs (`TeBoot(spec=...)`): the launcher builds it from
    `LaunchPod` and spawns `TeBoot` at `{te}/boot` inside the pod."""

    pod_id: str
    generation: int
    slot: TeSlot
    source: LoadSource
    manager: str  # receives TeBootStep / TeBootFailed / RegisterTe
    te_preload_s: float = 0.0  # TE-Pre-Load: FlowServe start (Python, NPU init, HCCL); 0 if resident
    heartbeat_timeout_s: float = 0.0  # > 0: spawn the heartbeat responder `{te}/hb` with this ask timeout


class LaunchPod(Message, frozen=True, kw_only=True):
    pod_id: str  # unique per launch: "{te}#g{generation}"
    te: str
    role: TeRole
    model: str
    generation: int  # 1 for a TE's first pod, +1 for each replacement
    slot: TeSlot
    source: LoadSource = "cold"
    manager: str = "cm"
    heartbeat_timeout_s: float = 0.0
    reply_to: str = ""  # "": the sender


class PodLaunched(Message, frozen=True, kw_only=True):
    pod_id: str
    te: str
    generation: int
    endpoint: str  # where the pod's actors are reached ("" in-process; "ipc://..." / "tcp://...")
    duration_s: float  # Scaler-Pre: from LaunchPod to a running pod


class PodFailed(Message, frozen=True, kw_only=True):
    pod_id: str
    te: str
    generation: int
    reason: str


class PodExited(Message, frozen=True, kw_only=True):
    """The pod's process ended without being asked to, after `PodLaunched` (processes mode: the
    supervisor reaped it). The manager fails the TE at once: while it boots (no heartbeat watches
    a TE before it registers; without this a crash during TE-Load waited for the boot timeout)
    and once registered (without this the JEs routed to a dead process for the heartbeats'
    misses). A hung process sends nothing: that one stays the heartbeat monitor's to notice."""

    pod_id: str
    te: str
    generation: int
    reason: str


class StopPod(Message, frozen=True, kw_only=True):
    pod_id: str
    te: str
    reason: str
    reply_to: str = ""  # "": the sender


class PodStopped(Message, frozen=True, kw_only=True):
    pod_id: str
    te: str


class KillPod(Message, frozen=True, kw_only=True):
    """A fault (`deepserve fault kill-te TE`): the TE's pod dies at once and tells no one — the
    heartbeats find it by its silence. With `exited` (a scenario's `kill-te-process`), the TE's
    process is what dies and its launcher sees it end, as a supervisor reaps a child: the
    launcher sends `PodExited` and the manager fails the TE at once."""

    te: str
    reason: str = "killed by the operator"
    exited: bool = False


def pod_id(te: str, generation: int) -> str:
    return f"{te}#g{generation}"


def te_actor_addrs(slot: TeSlot) -> tuple[str, ...]:
    """Every actor a TE's pod runs: bootstrap, heartbeat responder, shell, DP masters."""
    return (f"{slot.te}/boot", f"{slot.te}/hb", slot.te,
            *(f"{slot.te}/dp/{i}" for i in range(slot.dp_groups)))  # fmt: skip
