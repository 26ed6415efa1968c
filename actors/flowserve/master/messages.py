"""Messages between a TE shell and its DP-group masters, and the master's own timers."""

from __future__ import annotations

from deepserve.actors.flowserve.messages import DpLoad
from deepserve.core import Message


class Launch(Message, frozen=True):
    """Timer of masters before the NPU took `start_delay_s` (no longer armed): kept so that logs
    recorded then still decode."""

    step: int


class DpStatusQuery(Message, frozen=True, kw_only=True):
    req_id: str


class DpStatus(Message, frozen=True, kw_only=True):
    """A DP group's status for the TE shell's balancer (xDeepServe §4.3)."""

    req_id: str
    load: DpLoad
    max_num_seqs: int
    block_tokens: int
    prefix_hit_blocks: tuple[tuple[str, int], ...] = ()  # (task id, HBM-resident prefix blocks)


class DpMatchQuery(Message, frozen=True, kw_only=True):
    """The leader's all-gather: how many of each prompt's blocks this group has cached."""

    req_id: str
    prompts: tuple[tuple[int, ...], ...]


class DpMatch(Message, frozen=True, kw_only=True):
    req_id: str
    hit_blocks: tuple[int, ...]
    load: DpLoad
