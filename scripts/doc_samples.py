"""Rewrite the sample outputs of README.md and the guides from real runs of their commands.

A sample is a plain fenced block that starts with ``$ COMMAND`` (``doctools.samples``).
This script runs each sample's command as written, from the checkout (its ``/tmp`` paths
included), stdout and stderr together, torchrun's own warning lines left out. It replaces
every line of the sample by the output line it stands for, keeps the ``...`` lines where
the sample is shortened, and ends the prompt with where and when it ran: the date, the
machine in :func:`doctools.machine.briefly`'s words and the wall clock. The documents are
written only once every chosen sample of one has run and matched, so a failure leaves it
as it was.

A long command elsewhere (a line of a ```bash block, a command in a table) states its time
through a ``time:`` mark (``doctools.timed``): the script runs every marked command the
same way, its output discarded, and writes in the mark the date, the machine and the wall
clock. A command that fails stops the script with one line, its document unwritten.

``tests/test_docs_commands.py`` runs the cheap samples on every test run and compares them
with the same rules; the long ones (the main job, the first run, the benchmarks) are
refreshed here, on the machine the documents are measured on, one command at a time:

    python scripts/doc_samples.py --list                        # every sample and marked command, and its time
    python scripts/doc_samples.py docs/training.md              # one document's samples
    python scripts/doc_samples.py --only 'lptrain-bench --devices 4'
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from doctools import ROOT
from doctools.commands import duration, executable
from doctools.files import write_atomically
from doctools.machine import briefly
from doctools.samples import Sample, SampleError, refreshed, samples
from doctools.timed import UNMEASURED, TimedCommand, stamped, timed_commands

DOCUMENTS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]


def torchrun_noise(line: str) -> bool:
    """torchrun's own warnings (the OMP_NUM_THREADS banner), which a sample leaves out."""
    return line.startswith("W1") or "OMP_NUM_THREADS" in line or (bool(line.strip()) and not line.strip("* "))


def environment() -> dict[str, str]:
    """The environment a document's command runs in: unbuffered, this interpreter's console
    scripts first on PATH."""
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }


def run(sample: Sample, timeout: float) -> tuple[list[str], float]:
    """The sample's command, run as written from the checkout: its output lines and seconds.

    Its ``/tmp`` paths are a fresh scratch folder, shown as ``/tmp`` in the output: a run
    folder left by an earlier run (a finished run resumes and does nothing) would change
    what the command prints, and what is in the user's /tmp is not this script's to delete."""
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="doc_samples_") as scratch:
        done = subprocess.run(
            executable(shlex.split(sample.command.replace("/tmp/", f"{scratch}/"))),
            cwd=ROOT,
            env=environment(),
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


class CommandFailed(Exception):
    """A timed command did not succeed (its exit code, or its timeout)."""


def time_command(command: str, timeout: float) -> float:
    """Run ``command`` as written from the checkout, as a sample runs (its ``/tmp`` paths a
    fresh scratch folder), its output discarded: the wall clock in seconds.

    Past ``timeout`` it gets SIGTERM, which lptrain-cluster answers by ending its nodes and
    removing its namespaces, and SIGKILL only if it has not ended 60 s later."""
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="doc_samples_") as scratch:
        argv = executable(shlex.split(command.replace("/tmp/", f"{scratch}/")))
        child = subprocess.Popen(
            argv, cwd=ROOT, env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            code = child.wait(timeout)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            raise CommandFailed(f"ran past --timeout {timeout:g} s") from None
        except BaseException:  # Ctrl-C: the child got it too; wait for it to clean up
            child.wait()
            raise
    if code != 0:
        raise CommandFailed(f"exit code {code}")
    return time.monotonic() - began


def refresh_samples(document: str, text: str, chosen: list[Sample], timeout: float) -> str:
    """Run every chosen sample of ``document``: its text with each sample rewritten."""
    rows = text.splitlines(keepends=True)
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
    return "".join(rows)


def retime(text: str, chosen: list[TimedCommand], runner: Callable[[str], float], today: str, machine: str) -> str:
    """Run every chosen marked command with ``runner`` (seconds of one run): ``text`` with
    each mark stating ``today``, ``machine`` and that time. A command that fails ends the
    script with one line naming it, before anything is written."""
    for timed in chosen:
        print(f"{timed.where} ...", flush=True)
        try:
            seconds = runner(timed.command)
        except CommandFailed as e:
            raise SystemExit(f"doc_samples: error: {timed.where}: {e}") from None
        text = stamped(text, timed, f"{today}, {machine}: {duration(seconds)}")
        print(f"  {duration(seconds)}", flush=True)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("documents", nargs="*", help="README.md or docs/NAME.md (default: every one)")
    parser.add_argument("--only", default="", help="only the samples and time: marks whose command holds this")
    parser.add_argument("--list", action="store_true", help="list the samples and time: marks, with their times")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds one command may take (default 1200)")
    args = parser.parse_args(argv)
    unknown = [d for d in args.documents if d not in DOCUMENTS]
    if unknown:
        parser.error(f"{unknown[0]} is not one of the documents: {', '.join(DOCUMENTS)}")
    measured: dict[str, float] = {}  # a command two documents mark (README's and its guide's) runs once

    def timer(command: str) -> float:
        if command not in measured:
            measured[command] = time_command(command, args.timeout)
        return measured[command]

    for document in args.documents or DOCUMENTS:
        text = (ROOT / document).read_text()
        chosen = [s for s in samples(document, text) if args.only in s.command]
        timed = [t for t in timed_commands(document, text) if args.only in t.command]
        if args.list:
            for s in chosen:
                print(f"{document}:{s.line}: $ {s.command}  ({s.comment or 'not yet run by this script'})")
            for t in timed:
                print(f"{t.where}  (time: {'not yet measured' if t.stated == UNMEASURED else t.stated})")
            continue
        new = refresh_samples(document, text, chosen, args.timeout)
        new = retime(
            new,
            timed,
            timer,
            today=datetime.date.today().isoformat(),
            machine=briefly(),
        )
        if new != text:
            write_atomically(ROOT / document, new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
