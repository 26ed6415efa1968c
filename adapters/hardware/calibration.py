"""The calibrated constants: the only numbers fitted to published measurements.

Each constant is fitted ONCE, globally, for a hardware kind — never per test, never inside a test.
docs/perf-model.md ("Calibration") gives the procedure and the resulting table; docs/hardware.md
lists every constant with its source. Everything else in the spec tables is a published figure or
a stated assumption.
"""

from __future__ import annotations

from msgspec import Struct


class Efficiency(Struct, frozen=True, kw_only=True):
    """How close real kernels get to an NPU's peaks, plus the fixed software costs around them."""

    compute: float  # fraction of peak cube FLOPS/TOPS a large matmul or attention kernel reaches
    memory: float  # fraction of peak HBM bandwidth a streaming (weight/KV-reading) kernel reaches
    forward_fixed_s: float  # host cost per forward pass: input preparation + graph/first launch
    single_op_launch_s: float  # host dispatch per operator in single-op (eager) mode
    kernel_overhead_s: float  # device-side start/finish cost per kernel, in either mode
    sampling_fixed_s: float  # host cost per sampling step: device sync + output processing


# Ascend DaVinci dies (910B and each 910C die are the same die generation, so they share one set).
# compute: fitted so the MLA attention kernel is 21.8 % of the 93 ms iteration (xDeepServe §7.1).
# memory: then fitted so the whole iteration is 93 ms (xDeepServe §7.1, Fig. 20).
# forward_fixed_s, single_op_launch_s, kernel_overhead_s, sampling_fixed_s: assumptions (see docs).
DAVINCI_EFFICIENCY = Efficiency(
    compute=0.80,
    memory=0.59,
    forward_fixed_s=0.5e-3,
    single_op_launch_s=40e-6,
    kernel_overhead_s=5e-6,
    sampling_fixed_s=1.0e-3,
)

# Fraction of a link's nominal bandwidth a bulk transfer reaches. Assumptions (protocol and
# packet overheads), except UB's, which must also satisfy xDeepServe §3.1 (9 MB with 48 cores
# more than 2.5x faster than with 2 cores).
UB_EFFICIENCY = 0.90
HCCS_EFFICIENCY = 0.85
ROCE_EFFICIENCY = 0.85
PCIE_EFFICIENCY = 0.85
VPC_EFFICIENCY = 0.80

# Per-peer control cost of XCCL's all-to-all on UB (metadata field write + poll per rank,
# xDeepServe §3.2). Fitted so a combine with no waiting equals Fig. 20's minimum (165 us).
UB_PER_PEER_S = 0.26e-6

# MoE barrier model (xDeepServe §7.1, Fig. 20), fitted on the DP288/EP288 setup:
# coefficient of variation of each DP group's compute between two barriers (launch jitter, GC,
# uneven KV lengths): fitted to Fig. 20's average dispatch (234 us).
DP_COMPUTE_CV = 0.071
# Persistent part of the hottest EP rank's token load / mean load with EPLB active (the
# per-step sampling part, + z(ranks)/sqrt(tokens per rank), is added in moe.hot_rank_ratio):
# fitted to Fig. 20's average combine (312 us), where the sampling part is +0.086 (1,080
# token-expert pairs per routed rank). Above the ~1.25 that stragglers.eplb_placement reaches
# on the very statistics it placed from: live routing drifts from the minute-old statistics
# (xDeepServe §4.5), and that drift persists within a step.
EPLB_HOT_RATIO = 1.66
# Lognormal sigma of per-occurrence barrier waits: fitted so one iteration's 59 dispatches
# spread max/min ~7x, as Fig. 20's dispatch (1231 / 185 us).
BARRIER_JITTER_SIGMA = 1.2
