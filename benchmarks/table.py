"""Benchmark rows and their two renderings: a text table and JSON lines."""

from __future__ import annotations

import json

import msgspec

from deepserve import BUILD
from deepserve.compiled import describe


class Row(msgspec.Struct, frozen=True):
    name: str
    value: float
    unit: str
    baseline: str | None = None
    baseline_value: float | None = None


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.3g}"


def render(title: str, rows: list[Row]) -> str:
    header = ("row", "value", "unit", "baseline (same run)", "baseline value", "ratio")
    lines = [header]
    for r in rows:
        ratio = "-"
        if r.baseline_value:
            ratio = f"{r.value / r.baseline_value:.2f}x"
        lines.append((r.name, _num(r.value), r.unit, r.baseline or "-", _num(r.baseline_value), ratio))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = [title, describe(BUILD)]
    for n, line in enumerate(lines):
        out.append("  ".join(cell.ljust(w) if i in (0, 2, 3) else cell.rjust(w)
                             for i, (cell, w) in enumerate(zip(line, widths, strict=True))))
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def as_json_lines(rows: list[Row]) -> str:
    """One object a row, each saying which build it measured (compiled.py)."""
    return "\n".join(json.dumps({**msgspec.to_builtins(r), "build": BUILD}) for r in rows)
