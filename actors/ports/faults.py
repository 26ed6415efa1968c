"""Hardware faults: external inputs (from `deepserve fault`, a scenario's fault plan, or a test),
sent to the device they break. Being inputs, they are logged and replay re-injects them.

NPU faults go to the NPU's address ("hw/s0/npu3"); link faults go to the fabric ("hw/fabric")
and name the link ("s0/npu3/roce", "s1/hccs/2-5"). Killing a process is the daemon's fault kind,
not the hardware's.
"""

from __future__ import annotations

from deepserve.core.messages import Message


class NpuCrash(Message, frozen=True, kw_only=True):
    """The NPU crashes: pending and future requests fail with NpuError(kind="crashed")."""

    reason: str = "injected crash"


class NpuHang(Message, frozen=True, kw_only=True):
    """The NPU hangs: it keeps accepting requests up to its queue bound and answers none of
    them (a reset does); requests beyond the bound are refused with kind "queue_full"."""

    reason: str = "injected hang"


class HbmRegionFault(Message, frozen=True, kw_only=True):
    """An HBM region goes bad: allocations and graphs touching it fail naming it; others run."""

    region: str


class NpuReset(Message, frozen=True, kw_only=True):
    """Recovery: back to healthy with empty HBM. Pending requests fail with kind "reset"."""

    clear_faults: bool = True  # False keeps faulted regions masked (HBM fault masking)
    # A repair (a scenario's `npu-reset`): acts only on a crashed, hung or HBM-faulted device. A
    # healthy one is left as is — the control plane may have re-initialised it already for a
    # replacement TE, which must keep its weights; `NpuResetSkipped` records the no-op.
    repair: bool = False


class LinkDown(Message, frozen=True, kw_only=True):
    """Both directions of a link go down: its in-flight and new transfers fail."""

    link: str


class LinkUp(Message, frozen=True, kw_only=True):
    """The link is repaired: up, at full bandwidth, and no longer flapping."""

    link: str


class LinkDegrade(Message, frozen=True, kw_only=True):
    """The link runs at `bw_factor` (0 < f <= 1) of its bandwidth; in-flight transfers slow."""

    link: str
    bw_factor: float


class LinkFlap(Message, frozen=True, kw_only=True):
    """The link goes down for `down_s`, up for `up_s`, `count` times, starting on arrival."""

    link: str
    down_s: float
    up_s: float
    count: int = 1


NPU_FAULTS = (NpuCrash, NpuHang, HbmRegionFault, NpuReset)
LINK_FAULTS = (LinkDown, LinkUp, LinkDegrade, LinkFlap)
