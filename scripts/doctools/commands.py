"""Commands written as a user types them (``lptrain-bench ...``, ``torchrun ...``,
``python scripts/x.py ...``), run with this interpreter and the checkout's scripts, their
output passed on line by line. A document shows the command as written, so what it shows
is what ran."""

from __future__ import annotations

import os
import queue
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from doctools import ROOT
from doctools.files import read_json

HEARTBEAT_S = 60.0  # a line this often while a command is silent, so a long run shows it is alive


def executable(tokens: list[str]) -> list[str]:
    """The command as shown (``lptrain-bench``, ``torchrun``, ``python scripts/x.py``) as run:
    with this interpreter, the scripts by their path, so that it does not matter what PATH holds."""
    first = {
        "lptrain-bench": [sys.executable, "-m", "lptrain.bench"],
        "torchrun": [sys.executable, "-m", "torch.distributed.run"],
        "python": [sys.executable],
    }
    argv: list[str] = []
    for i, token in enumerate(tokens):
        if token == "python" or (i == 0 and token in first):
            argv += first[token]
        elif token.startswith("scripts/") and (ROOT / token).exists():
            argv.append(str(ROOT / token))
        else:
            argv.append(token)
    return argv


class Run:
    """One measurement's commands: each runs in a scratch folder and is remembered, in the
    order it ran, for the document to show."""

    def __init__(self, name: str, work: Path, say: Callable[[str], None]):
        self.name, self.work, self.say = name, work, say
        self.commands: list[str] = []

    def __call__(self, command: str, ok: tuple[int, ...] = (0,)) -> str:
        """Run ``command``, written as a user types it; return its standard output."""
        self.commands.append(command)
        self.say(f"[{self.name}] $ {command}")
        argv = executable(shlex.split(command))
        return stream(argv, self.work, lambda line: self.say(f"[{self.name}]   {line}"), ok)

    def json(self, name: str) -> Any:
        """The JSON file ``name`` a command wrote into the scratch folder."""
        return read_json(self.work / name)


def stream(argv: list[str], cwd: Path, say: Callable[[str], None], ok: tuple[int, ...] = (0,)) -> str:
    """Run ``argv``, passing its output on line by line (and a line a minute while it is
    silent); return its standard output. An exit status not in ``ok`` raises with its last lines."""
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        argv, cwd=cwd, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
    )
    lines: queue.Queue = queue.Queue()
    out: list[str] = []
    err: list[str] = []

    def pump(pipe, into: list[str]) -> None:
        for line in pipe:
            into.append(line)
            lines.put(line.rstrip("\n"))
        lines.put(None)

    readers = [
        threading.Thread(target=pump, args=(proc.stdout, out), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, err), daemon=True),
    ]
    for r in readers:
        r.start()
    began = last = time.monotonic()
    open_pipes = 2
    try:
        while open_pipes:
            try:
                line = lines.get(timeout=5)
            except queue.Empty:
                if time.monotonic() - last >= HEARTBEAT_S:
                    say(f"... running, {duration(time.monotonic() - began)} so far")
                    last = time.monotonic()
                continue
            if line is None:
                open_pipes -= 1
            elif not line.startswith("W1") and "OMP_NUM_THREADS" not in line and line.strip("* "):
                say(line)
                last = time.monotonic()
        proc.wait()
    except BaseException:
        proc.terminate()
        proc.wait()
        raise
    if proc.returncode not in ok:
        tail = " | ".join(line.strip() for line in (err or out)[-3:])
        raise RuntimeError(f"{shlex.join(argv[:4])} ... exited with {proc.returncode}: {tail}")
    return "".join(out)


def duration(seconds: float) -> str:
    """``2 min 5 s`` or ``42 s``."""
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s} s" if m else f"{s} s"
