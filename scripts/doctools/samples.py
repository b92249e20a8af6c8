"""The sample outputs in README.md and the guides, held against what their commands print.

A sample is a plain fenced block (no language) whose first line is a shell prompt,
``$ COMMAND``, followed by what the command printed; one block may hold several prompts.
The prompt may end in a comment that says where and when the sample was taken
(``$ lptrain  # 2026-12-05, AMD EPYC, 2 threads, no GPU, torch 2.14.1+cu130: 26 s``):
``scripts/doc_samples.py`` writes it from :mod:`doctools.machine`, so each sample names the
one machine it ran on. Stating the command in the block leaves no doubt about which
command of a list printed it.

A sample is compared line by line with the command's output, after :func:`mask` has hidden
the figures that move from run to run and machine to machine (times, rates, percentages,
losses, accuracies, spreads); every other number (sizes, counts, steps, a simulator's
predictions, a tuning file's answers) must be what the command prints. A line ``...``
stands for any number of lines (the sample is shortened there), and a line that ends in
``...`` for any line that starts as it does. Without a leading ``...`` the sample starts
where the output starts, without a trailing one it ends where the output ends.

Both ``tests/test_docs_commands.py`` (cheap commands, on every test run) and
``scripts/doc_samples.py`` (every command, rewriting the samples) use this module, so the
test and the rewriter agree on what a sample means.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

NUMBER = r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?"
# The figures that vary: a number with a unit of time, rate (per byte too) or share; a loss, an accuracy or a
# spread (sd); the exposed and hand-off parts of a time; a clock (mm:ss). Each is replaced by '#'.
VARYING = re.compile(
    rf"(?P<before>\b(?:loss|accuracy|acc|sd|exposed|hand-off)\s+){NUMBER}"
    rf"|(?<![\w.]){NUMBER}(?P<unit>\s*(?:ms|us|s|min|ps/B|GB/s|MB/s|Gbit/s|Mbit/s|img/s|images/s|%)(?![\w/]))"
    r"|\b\d{2}:\d{2}\b"
)
ANY_NUMBER = re.compile(rf"(?<![\w.@]){NUMBER}")
ELLIPSIS = "..."
PROMPT = "$ "
COMMENT = re.compile(r"\s+#\s.*$")


class SampleError(Exception):
    """A sample does not match its command's output (one line, naming the sample line)."""


@dataclass
class Sample:
    """One ``$ COMMAND`` of a document and the output lines shown under it."""

    document: str
    line: int  # of the prompt, counted from 1
    command: str  # as it runs: the prompt's comment dropped
    comment: str  # the prompt's trailing comment, '' if none
    lines: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.document}:{self.line}: $ {self.command}"

    def prompt(self) -> str:
        return f"{PROMPT}{self.command}{'  # ' + self.comment if self.comment else ''}"


def mask(line: str) -> str:
    """``line`` with the figures that vary replaced by ``#`` and runs of spaces made one (so
    that a wider number does not shift a table's columns)."""

    def hide(m: re.Match) -> str:
        if m.group("before") is not None:
            return m.group("before") + "#"
        if m.group("unit") is not None:
            return "#" + m.group("unit")
        return "#"

    return " ".join(VARYING.sub(hide, line).split())


def loosely(line: str) -> str:
    """``line`` with every number hidden: what is left is the line's shape."""
    return " ".join(ANY_NUMBER.sub("#", mask(line)).split())


def samples(document: str, text: str) -> list[Sample]:
    """Every sample of a document: the plain fenced blocks that start with a ``$`` prompt."""
    found: list[Sample] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        fence = lines[i].strip()
        if not fence.startswith("```"):
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```")), len(lines))
        body = lines[i + 1 : end]
        if fence == "```" and body and body[0].startswith(PROMPT):
            current: Sample | None = None
            for offset, row in enumerate(body):
                if row.startswith(PROMPT):
                    command, comment = _split_prompt(row[len(PROMPT) :])
                    current = Sample(document, i + 2 + offset, command, comment)
                    found.append(current)
                elif current is not None:
                    current.lines.append(row.rstrip())
        i = end + 1
    return found


def _split_prompt(prompt: str) -> tuple[str, str]:
    m = COMMENT.search(prompt)
    if not m:
        return prompt.strip(), ""
    return prompt[: m.start()].strip(), m.group(0).strip()[1:].strip()


def _same(shown: str, printed: str) -> bool:
    if shown.strip() != ELLIPSIS and shown.rstrip().endswith(ELLIPSIS):
        return mask(printed).startswith(mask(shown.rstrip()[: -len(ELLIPSIS)]))
    return mask(shown) == mask(printed)


def _chunks(lines: list[str]) -> tuple[list[list[str]], bool, bool]:
    """The sample's runs of lines between ``...`` lines, and whether it is open at the start
    and at the end."""
    chunks: list[list[str]] = [[]]
    for row in lines:
        if row.strip() == ELLIPSIS:
            chunks.append([])
        else:
            chunks[-1].append(row)
    open_start = bool(lines) and lines[0].strip() == ELLIPSIS
    open_end = bool(lines) and lines[-1].strip() == ELLIPSIS
    return [c for c in chunks if c], open_start, open_end


def _at(chunk: list[str], output: list[str], position: int) -> bool:
    return position + len(chunk) <= len(output) and all(
        _same(s, o) for s, o in zip(chunk, output[position : position + len(chunk)], strict=False)
    )


def mismatch(shown: list[str], output: list[str]) -> str | None:
    """None where the sample lines ``shown`` are what ``output`` holds; else one line saying
    which sample line is not there and what the command printed nearest to it."""
    output = [o.rstrip() for o in output]
    while output and not output[-1].strip():
        output.pop()
    chunks, open_start, open_end = _chunks(shown)
    position = 0
    for n, chunk in enumerate(chunks):
        last = n == len(chunks) - 1
        if n == 0 and not open_start:
            candidates = [0]
        elif last and not open_end:
            candidates = [len(output) - len(chunk)] if len(output) - len(chunk) >= position else []
        else:
            candidates = range(position, len(output) - len(chunk) + 1)
        found = next((p for p in candidates if _at(chunk, output, p)), None)
        if found is None:
            return _nearest(chunk, output, list(candidates) or [position])
        position = found + len(chunk)
    if not open_end and position < len(output):
        return f"the command printed more after the sample's last line: {output[position]!r}"
    return None


def _nearest(chunk: list[str], output: list[str], candidates: list[int]) -> str:
    """Where ``chunk`` comes closest to ``output`` (most leading lines alike), the first line
    that differs."""

    def alike(p: int) -> int:
        k = 0
        while k < len(chunk) and p + k < len(output) and _same(chunk[k], output[p + k]):
            k += 1
        return k

    best = max(candidates, key=alike)
    k = alike(best)
    printed = output[best + k] if 0 <= best + k < len(output) else "(no more output)"
    return f"the sample's line {chunk[k]!r} is not what the command printed there: {printed!r}"


def refreshed(shown: list[str], output: list[str]) -> list[str]:
    """``shown`` with each line replaced by the output line it stands for (the same line
    with the same figures if there is one, else the next line of the same shape), ``...``
    lines kept. Raises :class:`SampleError` where a line has no counterpart, or where the
    result still differs from the output (the command prints lines the sample lacks)."""
    output = [o.rstrip() for o in output]
    while output and not output[-1].strip():
        output.pop()
    # The lines after the sample's last '...' end where the output ends (unless a '...' ends
    # the sample): they stand for the output's last lines, not for the first lines of
    # their shape (a table's last row is the same shape as its first).
    last = max((i for i, row in enumerate(shown) if row.strip() == ELLIPSIS), default=None)
    tail_from = last + 1 if last is not None and last < len(shown) - 1 else len(shown)
    new: list[str] = []
    position = 0
    for i, row in enumerate(shown):
        if row.strip() == ELLIPSIS:
            new.append(row)
            continue
        if i >= tail_from:
            p = len(output) - (len(shown) - i)
            exact = loose = p if p >= position and _same_shape(row, output[p]) else None
        else:
            exact = next((p for p in range(position, len(output)) if _same(row, output[p])), None)
            loose = next((p for p in range(position, len(output)) if _same_shape(row, output[p])), None)
        found = exact if exact is not None else loose
        if found is None:
            raise SampleError(f"no line of the command's output has the shape of the sample's {row!r}")
        printed = output[found]
        if row.rstrip().endswith(ELLIPSIS) and row.strip() != ELLIPSIS:
            words = len(row.rstrip()[: -len(ELLIPSIS)].split())
            printed = " ".join(printed.split()[:words]) + " " + ELLIPSIS
        new.append(printed)
        position = found + 1
    problem = mismatch(new, output)
    if problem:
        raise SampleError(f"{problem} (the command prints lines the sample lacks: add them, or a '...' line)")
    return new


def _same_shape(shown: str, printed: str) -> bool:
    if shown.rstrip().endswith(ELLIPSIS):
        return loosely(printed).startswith(loosely(shown.rstrip()[: -len(ELLIPSIS)]))
    return loosely(shown) == loosely(printed)
