"""A document whose parts different generators own: each part sits between
``<!-- PREFIX:NAME -->`` and ``<!-- /PREFIX:NAME -->`` and is replaced there, the rest of
the document kept byte for byte, the file rewritten atomically."""

from __future__ import annotations

import re
from pathlib import Path

from doctools.files import write_atomically


class MarkerError(Exception):
    """A document lacks a section's markers (or has them twice, or out of order)."""


def markers(name: str, prefix: str) -> tuple[str, str]:
    """The begin and end marker lines of section ``name``."""
    return f"<!-- {prefix}:{name} -->", f"<!-- /{prefix}:{name} -->"


def replace_section(text: str, name: str, body: list[str], prefix: str, where: str = "the document") -> str:
    """``text`` with the lines between ``name``'s two markers replaced by ``body``; the
    markers and everything outside them are kept as they were. Raises :class:`MarkerError`
    (one line, naming ``where``) unless each marker is there once, in order."""
    begin, end = markers(name, prefix)
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise MarkerError(f"{where} needs one '{begin}' line and, after it, one '{end}' line around the {name} section")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return head + begin + "\n" + "\n".join(body) + "\n" + end + tail


def update_sections(path: Path, bodies: dict[str, list[str]], prefix: str) -> None:
    """Replace each named section of the file at ``path`` (every marker checked before the
    file is touched)."""
    text = path.read_text()
    for name, body in bodies.items():
        text = replace_section(text, name, body, prefix, where=str(path))
    write_atomically(path, text)


def marked_sections(text: str) -> list[str]:
    """Every marked section of ``text`` (markers included), each after a blank line: what a
    generator that rewrites the rest of a document keeps, because other scripts own it."""
    pattern = re.compile(r"^<!-- ([\w:-]+) -->\n.*?^<!-- /\1 -->$", flags=re.S | re.M)
    return ["\n" + match.group(0) for match in pattern.finditer(text)]


def rewrite_keeping_sections(path: Path, lines: list[str]) -> None:
    """Write ``lines`` as the whole document at ``path``, followed by the marked sections
    the old one held (other generators' parts), atomically."""
    kept = marked_sections(path.read_text()) if path.exists() else []
    write_atomically(path, "\n".join([*lines, *kept]) + "\n")
