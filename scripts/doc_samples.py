"""Rewrite the sample outputs of README.md and the guides from real runs of their commands.

A sample is a plain fenced block that starts with ``$ COMMAND`` (``doctools.samples``).
This script runs each sample's command as written, from the checkout (its ``/tmp`` paths
included), stdout and stderr together, torchrun's own warning lines left out. It replaces
every line of the sample by the output line it stands for, keeps the ``...`` lines where
the sample is shortened, and ends the prompt with where and when it ran: the date, the
machine in :func:`doctools.machine.briefly`'s words and the wall clock. The documents are
written only once every chosen sample of one has run and matched, so a failure leaves it
as it was.

``tests/test_docs_commands.py`` runs the cheap samples on every test run and compares them
with the same rules; the long ones (the main job, the first run, the benchmarks) are
refreshed here, on the machine the documents are measured on, one command at a time:

    python scripts/doc_samples.py --list                        # every sample, and how long its run took
    python scripts/doc_samples.py docs/training.md              # one document's samples
    python scripts/doc_samples.py --only 'lptrain-bench --devices 4'
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from doctools import ROOT
from doctools.commands import duration, executable
from doctools.files import write_atomically
from doctools.machine import briefly
from doctools.samples import Sample, SampleError, refreshed, samples

DOCUMENTS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]


def torchrun_noise(line: str) -> bool:
    """torchrun's own warnings (the OMP_NUM_THREADS banner), which a sample leaves out."""
    return line.startswith("W1") or "OMP_NUM_THREADS" in line or (bool(line.strip()) and not line.strip("* "))


def run(sample: Sample, timeout: float) -> tuple[list[str], float]:
    """The sample's command, run as written from the checkout: its output lines and seconds.

    Its ``/tmp`` paths are a fresh scratch folder, shown as ``/tmp`` in the output: a run
    folder left by an earlier run (a finished run resumes and does nothing) would change
    what the command prints, and what is in the user's /tmp is not this script's to delete."""
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="doc_samples_") as scratch:
        done = subprocess.run(
            executable(shlex.split(sample.command.replace("/tmp/", f"{scratch}/"))),
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
    printed = done.stdout.replace(scratch, "/tmp")
    lines = [line for line in printed.splitlines() if not torchrun_noise(line)]
    while lines and not lines[0].strip():  # the blank line that opens torchrun's banner
        lines.pop(0)
    return lines, time.monotonic() - began


def rewrite(document: str, chosen: list[Sample], timeout: float) -> None:
    """Run every chosen sample of ``document``, then write the document once."""
    rows = (ROOT / document).read_text().splitlines(keepends=True)
    machine, today = briefly(), datetime.date.today().isoformat()
    for sample in sorted(chosen, key=lambda s: -s.line):  # from the bottom: line numbers stay valid
        print(f"{sample.where} ...", flush=True)
        output, seconds = run(sample, timeout)
        try:
            new = refreshed(sample.lines, output)
        except SampleError as e:
            raise SystemExit(f"doc_samples: error: {sample.where}: {e}") from None
        sample.comment = f"{today}, {machine}: {duration(seconds)}"
        start = sample.line - 1
        rows[start : start + 1 + len(sample.lines)] = [line + "\n" for line in (sample.prompt(), *new)]
        print(f"  {duration(seconds)}", flush=True)
    write_atomically(ROOT / document, "".join(rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("documents", nargs="*", help="README.md or docs/NAME.md (default: every one)")
    parser.add_argument("--only", default="", help="only the samples whose command contains this text")
    parser.add_argument("--list", action="store_true", help="list the samples and the time their prompts state")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds one command may take (default 1200)")
    args = parser.parse_args(argv)
    unknown = [d for d in args.documents if d not in DOCUMENTS]
    if unknown:
        parser.error(f"{unknown[0]} is not one of the documents: {', '.join(DOCUMENTS)}")
    for document in args.documents or DOCUMENTS:
        chosen = [s for s in samples(document, (ROOT / document).read_text()) if args.only in s.command]
        if args.list:
            for s in chosen:
                print(f"{document}:{s.line}: $ {s.command}  ({s.comment or 'not yet run by this script'})")
        elif chosen:
            rewrite(document, chosen, args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
