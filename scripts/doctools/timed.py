"""The long commands of README.md and the guides, each with the time it took on the machine
the documents are measured on.

A reader deciding whether to run a command wants to know whether it takes seconds or a
quarter of an hour. A command that states its time carries a ``time:`` mark, which
``scripts/doc_samples.py`` fills by running the command, so the time is measured, not
remembered:

- in a fenced block (not a sample), a trailing comment on the command's last line:
  ``lptrain-cluster --nodes 4 -- lptrain-bench  # time: ?``;
- elsewhere (a table's cell), a parenthesis after the command's code span:
  ```lptrain-cluster --nodes 4 -- lptrain-bench` (time: ?)``.

``?`` asks for a measurement; the script writes in its place the date, the machine in
:func:`doctools.machine.briefly`'s words and the wall clock, as a sample's prompt states
them (``# time: 2026-12-05, AMD EPYC, 2 threads, no GPU, torch 2.14.1: 1 min 10 s``), and
writes it again on every rerun.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from doctools.samples import PROMPT

UNMEASURED = "?"
# What a filled mark states: the date, the machine, the wall clock (doctools.commands.duration).
STATED = r"\?|\d{4}-\d{2}-\d{2}, [^`]*?: (?:\d+ min )?\d+ s"
IN_BLOCK = re.compile(rf"(?P<before>\s#\s+time:\s*)(?P<stated>{STATED})\s*$")
INLINE = re.compile(rf"`(?P<command>[^`]+)`(?P<before>\s+\(time:\s*)(?P<stated>{STATED})\)")


@dataclass
class TimedCommand:
    """One command of a document that carries a ``time:`` mark."""

    document: str
    line: int  # of the mark, counted from 1 (a continued command's last line)
    command: str  # as it runs: continuations joined, the mark dropped
    stated: str  # what the mark says: '?' or 'DATE, MACHINE: TIME'
    inline: bool  # a code span outside a block, rather than a line of a block

    @property
    def where(self) -> str:
        return f"{self.document}:{self.line}: {self.command}"


def timed_commands(document: str, text: str) -> list[TimedCommand]:
    """Every marked command of a document, in its order. A sample's block (one that starts
    with a ``$`` prompt) is left out: its prompt states its own time."""
    found: list[TimedCommand] = []
    in_block, sample, pending = False, False, ""
    for number, row in enumerate(text.splitlines(), 1):
        stripped = row.strip()
        if stripped.startswith("```"):
            in_block, sample, pending = not in_block, False, ""
            continue
        if in_block:
            if sample or (not pending and row.startswith(PROMPT)):
                sample = True
                continue
            m = IN_BLOCK.search(row)
            code = row[: m.start()] if m else re.sub(r"(^|\s)#.*$", "", row)
            if code.rstrip().endswith("\\"):
                pending += code.rstrip()[:-1] + " "
                continue
            command, pending = " ".join((pending + code).split()), ""
            if m and command:
                found.append(TimedCommand(document, number, command, m.group("stated"), inline=False))
        else:
            for m in INLINE.finditer(row):
                found.append(TimedCommand(document, number, m.group("command"), m.group("stated"), inline=True))
    return found


def stamped(text: str, timed: TimedCommand, stated: str) -> str:
    """``text`` with ``timed``'s mark stating ``stated``; every other character kept."""
    rows = text.splitlines(keepends=True)
    row = rows[timed.line - 1]
    if timed.inline:
        m = next((m for m in INLINE.finditer(row) if m.group("command") == timed.command), None)
    else:
        m = IN_BLOCK.search(row)
    if m is None:
        raise ValueError(f"{timed.where}: the line holds no time: mark for this command")
    rows[timed.line - 1] = row[: m.start("stated")] + stated + row[m.end("stated") :]
    return "".join(rows)
