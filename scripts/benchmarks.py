#!/usr/bin/env python3
"""docs/BENCHMARKS.md, regenerated: every section measured by one command and rendered in place.

    python scripts/benchmarks.py                      # every default section: 12 to 30 minutes on 2 cores
    python scripts/benchmarks.py --only inprocess     # one section (or a list: --only trainer,auto)
    python scripts/benchmarks.py --render             # no measuring: the sections again from their JSON
    python scripts/benchmarks.py --list               # the sections, what each runs, when it last ran

Each section sits between ``<!-- benchmarks:NAME -->`` and ``<!-- /benchmarks:NAME -->`` and is
replaced there, the rest of the document byte for byte as it was. Its figures are kept in
docs/data/benchmarks/NAME.json (the cluster's in docs/data/cluster.json), from which
``--render`` writes it again. A section is written only once all of it was measured: one
that fails or is interrupted leaves its JSON and the document as they were (every file is
written to a temporary name and renamed). If README.md holds ``<!-- benchmarks:headline -->``
and its end marker, a short table of headline figures is written there from the JSON.

``cluster`` (root, about 45 minutes: ``scripts/cluster_results.py``) and ``gpu`` (a CUDA
machine: ``scripts/gpu_check.sh``) run only when named in ``--only``. Benchmarks, not tests:
nothing here is asserted.

Each section is a module of ``scripts/benchmark_sections/`` (measure, render, headline);
this script picks them, runs them and writes what they return.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmark_sections import BY_NAME, SECTIONS, Section, cluster
from benchmark_sections.page import (
    DATA,
    DOC,
    README,
    load_record,
    markers,
    replace_section,
    write_headline,
    write_section,
)
from doctools.commands import Run, duration
from doctools.document import MarkerError
from doctools.files import write_atomically
from doctools.machine import machine
from doctools.markdown import anchor

# Besides main: the pieces a test of this script (or another tool) reaches through it.
__all__ = ["BY_NAME", "SECTIONS", "MarkerError", "anchor", "main", "markers", "replace_section", "write_atomically"]


def measure(section: Section, work: Path, say: Callable[[str], None]) -> dict:
    """Measure ``section`` in the scratch folder ``work``: its record, with the date, time
    taken, load, machine and the commands it ran."""
    run = Run(section.name, work, say)
    began = time.time()
    load = list(os.getloadavg())
    results = section.measure(run)
    return {
        "section": section.name,
        "started": datetime.datetime.fromtimestamp(began, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "took_s": round(time.time() - began, 1),
        "load": [round(x, 2) for x in load],
        "load_end": [round(x, 2) for x in os.getloadavg()],
        "machine": machine(),
        "commands": run.commands,
        "results": results,
    }


def list_sections(data_dir: Path) -> None:
    for s in SECTIONS:
        record = load_record(s.name, data_dir)
        when = record["started"] if record else "never"
        kind = "default" if s.default else "only when named"
        print(f"{s.name:<10} {kind:<16} ~{s.minutes:>2} min  last run {when:<21}  #{anchor(s.heading)}")


def parse_only(p: argparse.ArgumentParser, text: str | None, rendering: bool) -> list[Section]:
    if text is None:
        return [s for s in SECTIONS if s.default or rendering]
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        p.error(f"--only: no section {', '.join(unknown)}; the sections: {', '.join(BY_NAME)}")
    return [BY_NAME[n] for n in names]


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def headline_readme(args: argparse.Namespace) -> Path | None:
    """Where the headline table goes: ``--readme``, else README.md when the document and its
    data are the checkout's own (a headline made from another data folder does not belong
    in the checkout's README)."""
    if args.readme is not None:
        return args.readme
    return README if (args.doc, args.data_dir) == (DOC, DATA) else None


def render_only(sections: list[Section], args: argparse.Namespace, say: Callable[[str], None]) -> int:
    for s in sections:
        record = load_record(s.name, args.data_dir)
        if record is None:
            say(f"{s.name}: no saved data, its section is left as it is")
            continue
        write_section(s, record, args.doc, args.data_dir)
    finish(args, say)
    say(f"rendered {', '.join(s.name for s in sections)} in {args.doc}")
    return 0


def measure_all(sections: list[Section], args: argparse.Namespace, say: Callable[[str], None]) -> int:
    failed = []
    began = time.time()
    for i, s in enumerate(sections, 1):
        say(f"== {s.name} ({i} of {len(sections)}, about {s.minutes} min): {s.heading}")
        started = time.time()
        with tempfile.TemporaryDirectory(prefix=f"benchmarks_{s.name}_") as tmp:
            try:
                record = measure(s, Path(tmp), say)
                if s.name == cluster.NAME:  # its record is docs/data/cluster.json's, as --render reads it
                    record = cluster.record(record["results"])
                write_section(s, record, args.doc, args.data_dir)
                if s.after:
                    s.after(Path(tmp))
            except KeyboardInterrupt:
                say(f"benchmarks: interrupted in {s.name}: its section and data are as they were")
                return 130
            except Exception as err:  # one section's failure leaves it as it was; the others still run
                say(f"benchmarks: {s.name} failed, its section and data are as they were: {err}")
                failed.append(s.name)
                continue
        say(f"== {s.name} written in {duration(time.time() - started)}: {args.doc}")
    finish(args, say)
    say(f"done in {duration(time.time() - began)}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def finish(args: argparse.Namespace, say: Callable[[str], None]) -> None:
    readme = headline_readme(args)
    if readme is None:
        say("no headline table: --doc or --data-dir is not the checkout's, and no --readme names one")
        return
    write_headline(readme, args.data_dir, say)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="sections: " + ", ".join(f"{s.name}{'' if s.default else ' (only when named)'}" for s in SECTIONS),
    )
    p.add_argument("--only", metavar="NAME[,NAME...]", help="these sections only (default: every default section)")
    p.add_argument("--render", action="store_true", help="measure nothing: the sections again from their JSON")
    p.add_argument("--list", action="store_true", help="list the sections and when each last ran")
    p.add_argument("--doc", type=Path, default=DOC, help=argparse.SUPPRESS)
    p.add_argument("--data-dir", type=Path, default=DATA, help=argparse.SUPPRESS)
    p.add_argument(
        "--readme",
        type=Path,
        default=None,
        help="where the headline table goes (default README.md, when the document and its data are the checkout's)",
    )
    args = p.parse_args(argv)

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    if args.list:
        list_sections(args.data_dir)
        return 0
    sections = parse_only(p, args.only, args.render)
    try:
        text = args.doc.read_text()
        for s in sections:  # every marker before any measuring: a missing one is found at once
            replace_section(text, s.name, [], where=str(args.doc))
    except (MarkerError, OSError) as err:
        print(f"benchmarks: error: {err}", file=sys.stderr)
        return 2
    if args.render:
        return render_only(sections, args, say)
    if any(s.name == "gpu" for s in sections) and not cuda_available():
        print(
            "benchmarks: error: the gpu section needs a CUDA GPU, and torch.cuda.is_available() is False here",
            file=sys.stderr,
        )
        return 2
    return measure_all(sections, args, say)


if __name__ == "__main__":
    sys.exit(main())
