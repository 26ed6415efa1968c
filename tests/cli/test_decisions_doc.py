"""docs/decisions.md stays a record of decisions (issue 31 §6): every entry is `### YYYY-MM-DD —
title` with 3-8 lines of context, decision and consequences, and the index at the top lists every
entry under its area, linking to it."""

from __future__ import annotations

import re
from pathlib import Path

DECISIONS = Path(__file__).resolve().parents[2] / "docs" / "decisions.md"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _entries(text: str) -> list[tuple[str, list[str]]]:
    """(heading, non-empty body lines) of every `###` entry."""
    found = []
    for chunk in re.split(r"^### ", text, flags=re.MULTILINE)[1:]:
        heading, *rest = chunk.split("\n## ", 1)[0].split("\n")  # an entry ends at the next section
        body = [line for line in rest if line.strip() and not line.startswith("#")]
        found.append((heading, body))
    return found


def test_every_entry_is_dated_and_short() -> None:
    entries = _entries(DECISIONS.read_text())
    assert len(entries) > 50, len(entries)
    for heading, body in entries:
        assert re.fullmatch(r"\d{4}-\d\d-\d\d — \S.*", heading), heading
        assert 3 <= len(body) <= 8, f"{heading}: {len(body)} lines (an entry is 3-8)"
        assert "**Decision.**" in " ".join(body), f"{heading}: says no **Decision.**"


def test_the_index_links_every_entry_once() -> None:
    text = DECISIONS.read_text()
    index = text.split("\n## Index\n", 1)[1].split("\n## ", 1)[0]
    linked = re.findall(r"\]\(#([^)]+)\)", index)
    entries = {_slug(heading): heading for heading, _ in _entries(text)}
    assert len(entries) == len(_entries(text)), "two entries share a heading"
    missing = [
        f"- [{entries[a].partition(' — ')[2]}](#{a}) ({entries[a].partition(' — ')[0]})"
        for a in entries
        if a not in linked
    ]
    assert not missing, "index lines to add under the entry's area:\n" + "\n".join(missing)
    stale = sorted(set(linked) - set(entries))
    assert not stale, f"the index links entries that do not exist: {stale}"
    assert len(linked) == len(set(linked)), "the index lists an entry twice"


def test_the_checks_see_a_bad_entry() -> None:
    bad = "### someday — no date\nonly one line\n"
    [(heading, body)] = _entries(bad)
    assert not re.fullmatch(r"\d{4}-\d\d-\d\d — \S.*", heading) and len(body) == 1
