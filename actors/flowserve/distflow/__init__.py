"""DistFlow (DeepServe §4.4, xDeepServe §5.1, P/D-Serve §3.6): KV transfer between DP groups."""

from __future__ import annotations

from typing import Any


def channel_for(master: Any, ctx: Any, src: Any) -> Any:  # replaced below when the channel lands
    raise NotImplementedError("DistFlow channels: not built yet")
