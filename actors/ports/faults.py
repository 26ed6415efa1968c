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


class HbmRegionFault(Message, frozen=True, kw_only=True, omit_defaults=True):
    """An HBM region goes bad: allocations and graphs touching it fail naming it; others run.

    `span` (lo, hi), 0 <= lo < hi <= 1: only that part of the region is bad (the runtime names
    the faulty addresses); the device then calls it `npu.span_region(region, lo, hi)`, which a
    user may mask (`NpuMaskRegion`: HBM fault masking) instead of giving the device up. Empty:
    the whole region (as before; `omit_defaults` keeps such a fault's log bytes unchanged)."""

    region: str
    span: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.span and not (len(self.span) == 2 and 0.0 <= self.span[0] < self.span[1] <= 1.0):
            raise ValueError(f"span: must be (lo, hi) with 0 <= lo < hi <= 1, got {self.span}")


class NpuReset(Message, frozen=True, kw_only=True):
    """Recovery: back to healthy with empty HBM. Pending requests fail with kind "reset"."""

    clear_faults: bool = True  # False keeps faulted regions masked (HBM fault masking)
    # A repair (a scenario's `npu-reset`): acts only on a crashed, hung or HBM-faulted device. A
    # healthy one is left as is — the control plane may have re-initialised it already for a
    # replacement TE, which must keep its weights; `NpuResetSkipped` records the no-op.
    repair: bool = False


class NpuLinkError(Message, frozen=True, kw_only=True):
    """A transient error on the NPU's collective link (a switch flap, BGP convergence): the
    graph running now fails with `NpuError(kind="link_error")`; the device stays healthy and
    runs what comes next (xDeepServe §6.2 stage 3: answered by token recomputation)."""

    reason: str = "injected transient link error"


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


NPU_FAULTS = (NpuCrash, NpuHang, HbmRegionFault, NpuReset, NpuLinkError)
LINK_FAULTS = (LinkDown, LinkUp, LinkDegrade, LinkFlap)
