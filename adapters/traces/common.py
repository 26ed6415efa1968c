"""What every trace reader yields, and the one error a bad trace raises.

A trace row becomes a `TraceRequest`: arrival time, prompt and output lengths, and — when the
trace publishes them — the prefix block ids (Mooncake's `hash_ids`, 512 tokens a block). Readers
stream: they hold one row at a time, so a trace of any length costs constant memory.
"""

from __future__ import annotations

import msgspec

# Limits on a single row (DESIGN: limits on everything). Far above any published trace
# (Mooncake's longest prompt is 191,378 tokens), low enough to refuse garbage early.
MAX_PROMPT_TOKENS = 4_194_304
MAX_OUTPUT_TOKENS = 1_048_576
MAX_LINE_BYTES = 16 * 1024 * 1024
MOONCAKE_BLOCK_TOKENS = 512  # the block size of Mooncake's published hash_ids


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file, the line and the field."""

    def __init__(self, path: str, line: int, field: str, problem: str) -> None:
        self.path, self.line, self.field, self.problem = path, line, field, problem
        where = f"{path}:{line}" if line > 0 else path
        super().__init__(f"{where}: {field}: {problem}")


class TraceRequest(msgspec.Struct, frozen=True):
    """One request of a trace, in the trace's own terms (no tokens, no model)."""

    index: int  # 0-based position among the trace's requests
    line: int  # 1-based line of the file it came from (for messages)
    arrival_s: float  # seconds from the trace's first arrival
    prompt_tokens: int
    output_tokens: int
    # Mooncake: one id per 512-token block of the prompt (the last may be partial); two requests
    # whose first k ids agree share their first k*512 prompt tokens. None: no sharing published.
    hash_ids: tuple[int, ...] | None = None


def check_lengths(path: str, line: int, prompt_field: str, prompt: int,
                  output_field: str, output: int) -> None:  # fmt: skip
    """The bounds every format shares (after the format's own parsing)."""
    if not 1 <= prompt <= MAX_PROMPT_TOKENS:
        raise TraceError(path, line, prompt_field, f"{prompt} is outside 1..{MAX_PROMPT_TOKENS}")
    if not 1 <= output <= MAX_OUTPUT_TOKENS:
        raise TraceError(path, line, output_field, f"{output} is outside 1..{MAX_OUTPUT_TOKENS}")


# The latest arrival a trace may give, 1e8 s (~3.2 years) after its first: virtual time is a
# float of seconds, whose resolution there is still 15 ns (the emulated timings need far below
# a microsecond). A row at 1e22 s failed its request with a bogus NPU timeout instead.
MAX_ARRIVAL_S = 1e8


def check_order(path: str, line: int, field: str, arrival_s: float, previous_s: float) -> None:
    """Rows must come in arrival order (the simulator injects them as it reads them), within
    `MAX_ARRIVAL_S` of the start."""
    if not arrival_s <= MAX_ARRIVAL_S:
        raise TraceError(
            path, line, field,
            f"arrival {arrival_s:.6g} s after the trace's start is beyond the {MAX_ARRIVAL_S:.0e} s "
            "a simulation can time precisely",
        )  # fmt: skip
    if arrival_s < previous_s:
        raise TraceError(
            path, line, field,
            f"arrival {arrival_s:.6f} s is before the previous row's {previous_s:.6f} s "
            "(a trace must be sorted by arrival time)",
        )  # fmt: skip
