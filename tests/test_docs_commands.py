"""The commands in README.md and docs/*.md still run, so the front page and the guides cannot rot.

Every line of a ```bash block, and every inline command in a README table, is taken from a
copy of the checkout (its tracked and unignored files only) and checked by what it costs:

- cheap ones run for real: ``--help``, ``--cfg``, ``--list``, and ``lptrain`` runs of the
  default small network for a few steps (``trainer.steps`` or ``trainer.stop_at`` of at
  most 20), plus the cheap helper scripts in ``RUN_SCRIPTS``;
- every other ``lptrain`` command (torchrun's included) is composed and checked with
  ``--cfg job``: its groups, keys and values must hold; only a path or a device of the
  user's machine (an image folder, a checkpoint, a GPU) may be missing here;
- every other command must name a console script that answers ``--help``, or a file of the
  checkout (``python scripts/X.py --help`` is run).

The commands of one document run in order in one scratch folder that stands in for /tmp,
so that a resume finds the run its document made just before.

A sample output (a plain block that starts with ``$ COMMAND``, ``doctools.samples``) is
compared line by line with what its command prints, the figures that vary masked, where
the command is cheap: one the rules above run, a ``lptrain-sim predict``, an ``lptrain``
command whose sample is its one-line refusal, and the first lines of an ``lptrain`` run
(a sample that ends in ``...``: the run is stopped once they are all there). The others
are rewritten from a real run by ``python scripts/doc_samples.py``.
"""

from __future__ import annotations

import os
import queue
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from doctools.samples import ELLIPSIS, Sample, mismatch, samples

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
CONSOLE_SCRIPTS = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])
CHEAP_FLAGS = ("--help", "-h", "--cfg", "--list")
CHEAP_STEPS = 20
# Scripts cheap enough to run as written (seconds on two cores).
RUN_SCRIPTS = ("scripts/make_imagefolder.py", "scripts/trace_figure.py")
# What a document may name that this machine cannot have; --cfg job may refuse only for these.
USERS_MACHINE = re.compile(r"needs CUDA|does not exist|is not a folder|no such file|has no GPU", re.IGNORECASE)
# Set-up commands (the README's install line is what CI itself runs) and the test run itself.
SET_UP = re.compile(r"^(python3? -m venv|\S*pip install|\S*(python -m )?pytest |cd |\. |source |export |apt-get )")
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z0-9_]{2,}\b")  # outputs/DATE/TIME, OUT_DIR, FILE ...


@dataclass
class Command:
    document: str
    line: int
    text: str


def bash_commands(document: str, text: str) -> list[Command]:
    """Every command of the ```bash blocks (continuations joined, comments dropped) and, in
    README.md, every inline command of a table row that starts with a console script."""
    commands, block, pending, start = [], False, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            block = stripped == "```bash" and not block
            continue
        if block:
            code = re.sub(r"(^|\s)#.*$", "", line).rstrip()
            if not pending:
                start = number
            if code.endswith("\\"):
                pending += code[:-1] + " "
                continue
            full = " ".join((pending + code).split())
            pending = ""
            if full:
                commands.append(Command(document, start, full))
        elif document == "README.md" and stripped.startswith("|"):
            for span in re.findall(r"`([^`]+)`", line):
                if span.split()[0] in CONSOLE_SCRIPTS or span.startswith(("torchrun ", "python ", "bash ")):
                    commands.append(Command(document, number, span))
    return commands


def all_commands() -> list[Command]:
    return [c for doc in DOCUMENTS for c in bash_commands(doc, (ROOT / doc).read_text())]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of the checkout's tracked and unignored files: what a clean clone holds."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    )
    copy = tmp_path_factory.mktemp("checkout")
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    return copy


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def steps_of(args: list[str]) -> int | None:
    """How many steps an ``lptrain`` command trains (``stop_at`` ends it early)."""
    values = dict(a.split("=", 1) for a in args if "=" in a and not a.startswith("-"))
    steps = values.get("trainer.stop_at") or values.get("trainer.steps")
    return int(steps) if steps and steps.isdigit() else None


def plan(command: Command, scratch: Path) -> tuple[str, list[str], dict[str, str]]:
    """(how it is checked, the argv to run, extra environment) for one documented command."""
    words = shlex.split(command.text.replace("/tmp/", f"{scratch}/"))
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    if words and words[0] == "sudo":
        words.pop(0)
    words = [w.removeprefix(".venv/bin/") if i == 0 else w for i, w in enumerate(words)]
    program = words[0]
    if program in ("python", "python3"):
        words[0] = sys.executable
    if program == "mpirun":  # Open MPI may be absent here: check what it runs
        inner = next(i for i, w in enumerate(words) if w in CONSOLE_SCRIPTS)
        return "help", [words[inner], "--help"], env
    if program == "torchrun":
        module = words.index("-m") + 1 if "-m" in words else None
        if module and words[module] in ("lptrain", "lptrain.cli"):
            return "cfg", ["lptrain", *words[module + 1 :], "--cfg", "job"], env
        if module:
            return "help", [sys.executable, "-m", words[module], "--help"], env
        program = next((w for w in words[1:] if w.endswith(".py") or w in CONSOLE_SCRIPTS), None)
        assert program, f"{command.document}:{command.line}: torchrun runs neither a module, a script nor lptrain's"
        return ("file", [program], env) if program.endswith(".py") else ("help", [program, "--help"], env)
    if program == "lptrain":
        args = words[1:]
        cheap = any(a in CHEAP_FLAGS for a in args) or (
            "-m" not in args
            and not any(a.startswith(("+recipe=", "model=")) for a in args)
            and (steps_of(args) or CHEAP_STEPS + 1) <= CHEAP_STEPS
        )
        if PLACEHOLDER.search(" ".join(args)):
            return "help", ["lptrain", "--help"], env
        return ("run", words, env) if cheap else ("cfg", [*words, "--cfg", "job"], env)
    if program in CONSOLE_SCRIPTS:
        cheap = any(a in CHEAP_FLAGS for a in words[1:])
        return "run" if cheap else "help", words if cheap else [program, "--help"], env
    if words[0] == sys.executable and len(words) > 1 and words[1].endswith(".py"):
        cheap = words[1] in RUN_SCRIPTS or any(a in CHEAP_FLAGS for a in words[2:])
        if cheap and not PLACEHOLDER.search(" ".join(words[2:])):
            return "run", words, env
        return "help", [sys.executable, words[1], "--help"], env
    if words[0] == sys.executable and words[1:2] == ["-m"]:
        return "help", [sys.executable, "-m", words[2], "--help"], env
    if program == "bash" or program == "tensorboard":
        return "file", [words[1]] if program == "bash" else [], env
    raise AssertionError(f"{command.document}:{command.line}: no rule says how to check {command.text!r}")


def test_the_documents_hold_commands_and_every_one_has_a_rule(tmp_path):
    commands = all_commands()
    assert len([c for c in commands if c.document == "README.md"]) >= 8
    guides = {c.document for c in commands}
    for guide in ("docs/training.md", "docs/collectives.md", "docs/distributed.md", "docs/gpu.md", "docs/simulator.md"):
        assert guide in guides, f"{guide} has no command in a ```bash block"
    for command in commands:
        if not SET_UP.match(command.text):
            plan(command, tmp_path)  # raises for a command no rule covers
    for document in DOCUMENTS:
        for sample in samples(document, (ROOT / document).read_text()):
            plan(Command(document, sample.line, sample.command), tmp_path)
    # the extractor itself: a continuation, a comment and an inline table command
    sample = "```bash\nlptrain a=1 \\\n    b=2   # why\n```\n| x | `lptrain-bench --help` |\n"
    assert [c.text for c in bash_commands("README.md", sample)] == ["lptrain a=1 b=2", "lptrain-bench --help"]


# The training guide runs or composes eighteen commands (about 90 s): with the slow tests, to keep CI short.
SLOW_DOCUMENTS = {"docs/training.md"}


@pytest.mark.parametrize(
    "document", [pytest.param(d, marks=pytest.mark.slow) if d in SLOW_DOCUMENTS else d for d in DOCUMENTS]
)
def test_the_commands_of_a_document_run_from_a_clean_checkout(document, checkout, tmp_path):
    commands = [c for c in bash_commands(document, (checkout / document).read_text()) if not SET_UP.match(c.text)]
    if not commands:
        pytest.skip(f"{document} has no commands")
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "PYTHONPATH": str(checkout), "PATH": path}
    for command in commands:
        how, argv, extra = plan(command, tmp_path)
        where = f"{document}:{command.line}: {command.text}"
        if how == "file":
            assert not argv or (checkout / argv[0]).is_file(), f"{where}: {argv[0]} is not in the checkout"
            continue
        if how == "run" and argv[0] == "lptrain" and not any(a in CHEAP_FLAGS for a in argv):
            argv = [*argv, "trainer.progress=false"]
        result = run(argv, checkout, {**env, **extra})
        said = (result.stderr.strip().splitlines() or [""])[-1]
        if how == "cfg" and result.returncode == 2 and USERS_MACHINE.search(said):
            continue  # a path or a device of the user's machine; the keys and values were checked first
        assert result.returncode == 0, f"{where}\n{said}"


def sample_argv(sample: Sample, scratch: Path) -> list[str] | None:
    """The argv that prints ``sample`` here, or None where that costs too much for every
    test run (a long training run, a benchmark, a cluster)."""
    how, argv, _ = plan(Command(sample.document, sample.line, sample.command), scratch)
    words = shlex.split(sample.command.replace("/tmp/", f"{scratch}/"))
    refusal = bool(sample.lines) and sample.lines[-1].startswith("lptrain: error:")
    first_lines = bool(sample.lines) and sample.lines[-1].strip() == ELLIPSIS
    if how == "run":
        return argv
    if words[:2] == ["lptrain-sim", "predict"] or (words[0] == "lptrain" and (refusal or first_lines)):
        return words
    return None


def printed(sample: Sample, argv: list[str], cwd: Path, env: dict[str, str], scratch: Path) -> list[str]:
    """What ``argv`` prints, stdout and stderr in the order written, the scratch folder shown
    as /tmp. A sample of the first lines stops the command once they are all there."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for row in proc.stdout:
            lines.put(row)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    output: list[str] = []
    deadline = time.monotonic() + 120
    try:
        while True:
            row = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if row is None:
                break
            output.append(row.rstrip("\n").replace(str(scratch), "/tmp"))
            if sample.lines[-1:] == [ELLIPSIS] and mismatch(sample.lines, output) is None:
                break
    except queue.Empty:
        pass  # the comparison below says what was missing
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=30)
    return output


SAMPLE_DOCUMENTS = [d for d in DOCUMENTS if samples(d, (ROOT / d).read_text())]


@pytest.mark.parametrize("document", SAMPLE_DOCUMENTS)
def test_the_samples_of_a_document_are_what_their_commands_print(document, checkout, tmp_path):
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "PYTHONPATH": str(checkout), "PATH": path, "PYTHONUNBUFFERED": "1"}
    compared = 0
    for sample in samples(document, (checkout / document).read_text()):
        argv = sample_argv(sample, tmp_path)
        if argv is None:
            continue
        problem = mismatch(sample.lines, printed(sample, argv, checkout, env, tmp_path))
        assert problem is None, f"{sample.where}: {problem}"
        compared += 1
    if not compared:
        pytest.skip(f"{document}'s samples come from long runs (scripts/doc_samples.py rewrites them)")


def test_a_sample_is_held_to_every_figure_that_does_not_vary():
    shown = [
        "lptrain: small (0.22M parameters, 0.8 MiB communicated per step) on mnist, lp over 4 x cpu, 300 steps",
        "...",
        "  communication   1.4 ms per iteration (sd 0.9; 3% of the step), 0.63 GB/s",
    ]
    output = [
        "lptrain: small (0.22M parameters, 0.8 MiB communicated per step) on mnist, lp over 4 x cpu, 300 steps",
        "step  10/300 | loss 2.0975 | acc  29.5% | data    0.4 ms",
        "  communication   12.8 ms per iteration (sd 10.2; 13% of the step), 0.07 GB/s",
    ]
    assert mismatch(shown, output) is None  # times, spreads, shares and rates vary
    assert "300 steps" in mismatch([shown[0].replace("300", "200"), *shown[1:]], output)
    assert "0.22M" in mismatch([shown[0].replace("0.22M", "0.23M"), *shown[1:]], output)
    assert mismatch(shown[:1], output)  # the output goes on: the sample must say so with '...'
    assert mismatch([*shown[:2], "lptrain: error: x"], output)
    # the parts of a step's communication vary as its time does
    step = "step  10/300 | loss 2.0975 | comm     2.8 ms (exposed    2.5, hand-off  0.3) |  1414 img/s"
    assert mismatch([step], [step.replace("2.5, hand-off  0.3", "3.7, hand-off  0.8")]) is None


def test_the_benchmarks_full_run_time_is_the_sum_of_its_sections_estimates():
    import benchmark_sections

    minutes = sum(s.minutes for s in benchmark_sections.SECTIONS if s.default)
    opening = (ROOT / "docs" / "BENCHMARKS.md").read_text().split("\n\n")[1]
    assert f"about {minutes} minutes" in opening, (
        f"BENCHMARKS.md's opening should say a full run takes about {minutes} minutes"
    )


def test_every_generator_names_its_machine_in_the_shared_words():
    """A script that writes a document says where it measured through doctools.machine, so
    that every document names a machine the same way."""
    writes = re.compile(r"\b(update_sections|rewrite_keeping_sections|write_atomically|replace_section)\(")
    generators = [p for p in sorted((ROOT / "scripts").glob("*.py")) if writes.search(p.read_text())]
    assert len(generators) >= 4
    assert "scripts/cluster_results.py" in {str(p.relative_to(ROOT)) for p in generators}
    for script in generators:
        name = str(script.relative_to(ROOT))
        assert "from doctools.machine import" in script.read_text(), (
            f"{name} writes a document without doctools.machine"
        )
