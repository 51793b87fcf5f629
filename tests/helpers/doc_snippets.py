"""Code blocks of the docs as tests copy them: a block is named by its first line (a
comment such as ``# mysite/celery.py``), so a test takes the block a reader would copy,
verbatim, and a renamed or removed block fails the test instead of being skipped."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", flags=re.DOTALL | re.MULTILINE)


def code_blocks(page: str | Path) -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced block of ``page`` (a path under the repository,
    e.g. ``"docs/operations.md"``), in order."""
    text = (ROOT / page).read_text(encoding="utf-8")
    return [(language, body) for language, body in _BLOCK.findall(text)]


def named_block(page: str | Path, first_line: str) -> str:
    """The one block of ``page`` whose first line is ``first_line``."""
    found = [body for _, body in code_blocks(page) if body.split("\n", 1)[0] == first_line]
    assert len(found) == 1, f"{page}: {len(found)} blocks start with {first_line!r}"
    return found[0]
