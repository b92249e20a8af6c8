"""The sections of docs/BENCHMARKS.md, one module each, all of one shape.

A section module says what it is in five constants, ``NAME`` (its markers' name and
``--only``'s), ``HEADING``, ``QUESTION`` (the sentence under the heading), ``MINUTES`` (about
how long it measures) and ``DEFAULT`` (whether a plain ``scripts/benchmarks.py`` runs it), and
does its work in three functions:

- ``measure(run)``: runs its commands through ``run`` (a :class:`doctools.commands.Run`,
  which records them for the document) and returns its results, a JSON-able dict;
- ``render(results)``: the section's tables and reading, as markdown lines;
- ``headline(results)``: its row of the README's headline table, ``[what, figure]``, or None.

Where a section leaves a file beside the document (a figure, a tuning file), its module
also has ``after(work)``, called once the section is written. Adding a section is a module
here and a line in ``MODULES``; ``page`` frames each one (heading, commands, machine) and
writes it between its markers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from benchmark_sections import auto, cluster, compiled, data, ddp_hook, gpu, inprocess, overlap, processes, trainer
from doctools.commands import Run

# The document's order, which is also the headline table's.
MODULES: tuple[ModuleType, ...] = (
    inprocess,
    processes,
    trainer,
    ddp_hook,
    data,
    overlap,
    compiled,
    auto,
    cluster,
    gpu,
)


@dataclass
class Section:
    """One section: its module's description and functions, gathered so that the runner
    (and a test) can hold and replace them."""

    name: str
    heading: str
    question: str
    minutes: int
    measure: Callable[[Run], dict]
    render: Callable[[dict], list[str]]
    headline: Callable[[dict], list[str] | None]
    after: Callable[[Path], None] | None = None
    default: bool = True

    @classmethod
    def of(cls, module: ModuleType) -> Section:
        return cls(
            module.NAME,
            module.HEADING,
            module.QUESTION,
            module.MINUTES,
            module.measure,
            module.render,
            module.headline,
            getattr(module, "after", None),
            module.DEFAULT,
        )


SECTIONS = [Section.of(m) for m in MODULES]
BY_NAME = {s.name: s for s in SECTIONS}
