"""Trace readers: Mooncake JSONL and the Azure LLM CSV, detected by content, streamed.

`open_trace(path)` → a `Trace` whose iteration yields `TraceRequest`s; any bad row raises
`TraceError` naming the file, the line and the field. `to_task_inputs` (in `prompts`) turns a
request into the TE's `Prompt` for a cluster's block size.
"""

from .common import MOONCAKE_BLOCK_TOKENS, TraceError, TraceRequest
from .reader import Trace, TraceFormat, detect_format, open_trace

__all__ = [
    "MOONCAKE_BLOCK_TOKENS",
    "Trace",
    "TraceError",
    "TraceFormat",
    "TraceRequest",
    "detect_format",
    "open_trace",
]
