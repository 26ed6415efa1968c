"""docs/overview.md, the page a newcomer reads first, names only files that exist, and the README
and the other docs lead to it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OVERVIEW = ROOT / "docs" / "overview.md"
# The section that says what issue 31 has not yet made true may name what is still to come.
NOT_YET = "### Issue 31: what is not yet true"


def _named_paths(text: str) -> list[str]:
    """Every code span that reads as a path inside the repository: `a/b.py`, `a/b/`, `docs/x.md`,
    `README.md` (not `../shared/DESIGN.md`, which lives beside a checkout, not in it)."""
    spans = re.findall(r"`([^`\s]+)`", text)
    return [s for s in spans if re.fullmatch(r"\w[\w.-]*(/[\w.-]+)*/?", s) and ("/" in s or s.endswith(".md"))]


def _checked_text() -> str:
    text = OVERVIEW.read_text()
    head, sep, rest = text.partition(NOT_YET)
    if not sep:
        return text
    after = re.search(r"^#{1,3} ", rest, flags=re.MULTILINE)
    return head + (rest[after.start():] if after else "")


def test_every_path_the_overview_names_exists() -> None:
    paths = _named_paths(_checked_text())
    assert len(paths) > 40, paths  # the concept table alone names more; a parsing slip would pass vacuously
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"docs/overview.md names paths that do not exist: {missing}"


def test_the_path_check_catches_a_missing_file() -> None:
    assert _named_paths("see `core/nothing_here.py` and `docs/kernel.md`") == ["core/nothing_here.py", "docs/kernel.md"]
    assert not (ROOT / "core/nothing_here.py").exists()


def test_the_readme_links_the_overview_near_its_top() -> None:
    head = "\n".join((ROOT / "README.md").read_text().splitlines()[:15])
    assert "docs/overview.md" in head


def test_every_doc_the_docs_name_exists() -> None:
    for page in sorted((ROOT / "docs").glob("*.md")):
        for name in re.findall(r"docs/([\w-]+\.md)", page.read_text()):
            assert (ROOT / "docs" / name).is_file(), f"{page.name} names docs/{name}"
