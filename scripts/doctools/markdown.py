"""Markdown as the documents use it: pipe tables and GitHub's anchors for headings."""

from __future__ import annotations

import re


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A pipe table's lines: the header, the ``|---|`` rule, then one line per row."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def anchor(heading: str) -> str:
    """GitHub's anchor for a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")
