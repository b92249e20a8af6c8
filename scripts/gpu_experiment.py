#!/usr/bin/env python3
"""The paper's experiment on the GPUs of one machine, in one call that keeps to a device budget.

AlexNet, GoogLeNet and VGG-16 train from their recipes (``+recipe=NAME``: the recipe's
image size, batch, optimizer and initialisation) under ``lp``, ``mst``, ``be``, ``ring``
and ``nccl`` (sync ``allreduce``), plus the control of ``scripts/convergence.py``: ``lp``
with its chain reversed, the very same sums added in the opposite order. The replicas are
every GPU present, one each; on a machine with one GPU, four replicas share it (``nccl``
needs distinct GPUs, so there it is skipped with its own refusal). Every run trains the
recipe's whole schedule (AlexNet 160 steps, GoogLeNet 150, VGG-16 150; ``--steps``
changes it) from one seed on the same batches, so their final losses, accuracies and loss
curves compare directly, and the control says how far apart reordering alone puts them.

Writes into ``--out``, ready to paste into docs/CONVERGENCE.md and docs/BENCHMARKS.md:

- ``convergence.md``: per network, each communicator's final training loss, eval accuracy
  and largest distance from lp's loss curve, against the control's distance;
- ``comm.md``: per network and communicator, communication per iteration (ms), its share
  of the step, and its exposed part (what the step waited for; overlap is on);
- ``rows.jsonl``: one line per finished run, appended the moment it finishes.

A device is lent by the minute, so a time guard (``--budget``, 300 s) keeps the
experiment within it: a run whose predicted time (the longest finished run of its
network, else the plan's estimate) would end past the budget is skipped, and a run still
training at the budget is stopped as Ctrl-C stops lptrain (after its step) and left out of
the tables; both are named on stdout and in the files, and the runs finished before are
all there (the files are rewritten after every run). The runs go round the networks (lp on
each, then the control on each, then mst ...), so a guard that cuts the experiment short
leaves every network its reference and its control.

    GPU_CHECK_STEPS=experiment bash scripts/gpu_check.sh OUT   # on the GPU machine (the check's step)
    python scripts/gpu_experiment.py --setup-only              # anywhere: the plan, its checks
    python scripts/gpu_experiment.py --device cpu --out /tmp/exp   # CPU stand-ins: both tables, tiny runs

``--device cuda`` (the default) refuses in one line where CUDA is absent: it never falls
back to the CPU. ``--device cpu`` runs the same plan on the recipes' CPU replicas with
two images per replica and 3 steps (``--steps``): a check of the code path, not figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from convergence import (
    CONTROL,
    NETWORKS,
    TITLES,
    Interrupted,
    RunResult,
    RunSpec,
    fmt_pct,
    identical_curves,
    max_difference,
    steps_for,
    steps_option,
    train,
)
from doctools import ROOT
from doctools.files import write_atomically
from doctools.machine import briefly
from doctools.markdown import table
from gpu_wheels import BUILD, DOWNLOAD
from lptrain.settings.locations import compose_config

COMMS = ("lp", "mst", "be", "ring", "nccl")
SYNC = "allreduce"
BUDGET_S = 300.0
CPU_STEPS = 3  # the stand-in's default: enough for a curve of three points
CPU_STANDIN = ("trainer.batch_per_device=2",)  # the stand-in's runs: tiny batches, the recipe's CPU replicas
OUTPUTS = ("convergence.md", "comm.md", "rows.jsonl")
CHECK_COMMAND = 'GPU_CHECK_STEPS=experiment bash scripts/gpu_check.sh "$OUT"'
READING = (
    "Every run trains the recipe's whole schedule from one seed on the same batches (sync allreduce): only the",
    "order of the floating-point additions differs. The control, *lp, chain reversed*, adds lp's sums in the",
    "opposite order, so its distance from lp is what reordering alone does (on a GPU, where some kernels add in",
    "no fixed order, it holds run-to-run noise too); a communicator whose distance is of its order trains the same.",
)
# The plan's estimates, before a run of the network has been timed: seconds per step and
# seconds of set-up per run (building the replicas, the first step's one-off costs). The
# GPU's are guesses for four replicas sharing one H100 or H200 at the recipes' sizes, not
# yet measured; the first run of each network replaces them with its own time.
ESTIMATES = {
    "cuda": {"alexnet": (0.04, 4.0), "googlenet": (0.08, 4.0), "vgg16": (0.06, 8.0), "small": (0.01, 2.0)},
    "cpu": {"alexnet": (0.8, 4.0), "googlenet": (0.6, 4.0), "vgg16": (0.8, 6.0), "small": (0.05, 1.0)},
}
ONE_OFF_S = {"cuda": 20.0, "cpu": 2.0}  # the process's first run: CUDA's context, cuDNN, the kernels' compiles


@dataclass
class Run:
    """One planned run and what became of it: done, skipped, failed or cut short."""

    spec: RunSpec
    replicas: int  # the control reverses a chain of this length
    estimate_s: float
    status: str = "planned"
    why: str = ""
    result: RunResult | None = None
    took_s: float = 0.0  # the whole run: its replicas built, trained, evaluated

    @property
    def comm(self) -> str:
        return self.spec.comm


@dataclass(frozen=True)
class Layout:
    """Where the replicas live: the overrides that put them there, and what to call them."""

    device: str  # cuda or cpu
    gpus: int
    overrides: tuple[str, ...]
    replicas: int | None  # None: each recipe's own CPU replicas
    text: str


def layout(device: str, gpus: int) -> Layout:
    """Every GPU, one replica each; one GPU, four replicas sharing it; CPU: the recipes' replicas."""
    if device == "cpu":
        return Layout("cpu", 0, CPU_STANDIN, None, "each recipe's CPU replicas, 2 images each")
    if gpus == 1:
        shared = ",".join(["cuda:0"] * 4)
        return Layout(
            "cuda", 1, (f"trainer.devices=[{shared}]", "trainer.device_type=cuda"), 4, "4 replicas sharing cuda:0"
        )
    return Layout(
        "cuda", gpus, ("trainer.devices=cuda", "trainer.device_type=cuda"), gpus, f"{gpus} GPUs, one replica each"
    )


def nccl_refusal(devices: list[str], have_cuda: bool) -> str | None:
    """Why ``nccl`` cannot run on these replicas, in the communicator's own words; None if it can."""
    from lptrain.comm.errors import BackendUnavailableError, CollectiveInputError
    from lptrain.communicators import build_communicator

    if not have_cuda and devices[0].startswith("cuda"):  # planned here for a GPU machine
        if len(set(devices)) < len(devices):
            return f"single-process nccl needs distinct GPUs, got {devices}"
        return None
    try:
        build_communicator("nccl", devices)
    except (BackendUnavailableError, CollectiveInputError) as err:
        return str(err)
    return None


def base_overrides(network: str) -> list[str]:
    return [f"+recipe={network}"] if network in NETWORKS else [f"model={network}"]


def recipe_steps(network: str) -> int:
    return int(compose_config(base_overrides(network)).trainer.steps)


def plan(networks: list[str], comms: list[str], steps: dict[str, int], where: Layout, check: Layout) -> list[Run]:
    """The runs, round the networks: lp on each, then the control on each, then the others.

    ``check`` is the layout the configurations are composed with: ``where`` itself, or, when
    a GPU machine is planned on one without CUDA, as many CPU replicas in its place."""
    runs, first = [], True
    nccl_why: dict[str, str | None] = {}
    for comm in ("lp", CONTROL, *[c for c in comms if c != "lp"]):
        for network in networks:
            n = steps[network]
            extra = (*check.overrides, f"trainer.eval_every={n}")
            spec = RunSpec(network, comm, SYNC, n, n, extra)
            replicas = replicas_of(network, check)
            cfg = compose_config(spec.hydra_overrides(replicas))  # a bad key or value refuses here
            per_step, setup = ESTIMATES[where.device].get(network, ESTIMATES[where.device]["small"])
            estimate = n * per_step + setup + (ONE_OFF_S[where.device] if first else 0.0)
            where_spec = RunSpec(network, comm, SYNC, n, n, (*where.overrides, f"trainer.eval_every={n}"))
            run = Run(where_spec, replicas, estimate)
            if comm == "nccl":
                devices = [str(d) for d in cfg.devices] if check is where else planned_devices(where)
                key = ",".join(devices)
                if key not in nccl_why:
                    nccl_why[key] = nccl_refusal(devices, torch.cuda.is_available())
                if nccl_why[key]:
                    run.status, run.why, run.estimate_s = "skipped", nccl_why[key], 0.0
            first = first and run.status == "skipped"
            runs.append(run)
    return runs


def planned_devices(where: Layout) -> list[str]:
    return ["cuda:0"] * 4 if where.gpus == 1 else [f"cuda:{i}" for i in range(where.gpus)]


def replicas_of(network: str, where: Layout) -> int:
    """How many replicas a network's runs have (the control reverses a chain of that length)."""
    if where.replicas is not None:
        return where.replicas
    return len(compose_config([*base_overrides(network), *where.overrides]).devices)


class TimeGuard:
    """The experiment's budget: whether a run still fits, and a stop for the run in flight
    when the budget runs out (SIGINT to this process, which the trainer answers as it
    answers Ctrl-C: it finishes the step and returns)."""

    def __init__(self, budget_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget_s, self.clock = budget_s, clock
        self.start = clock()
        self.fired = False
        self._timer: threading.Timer | None = None

    def left(self) -> float:
        return self.budget_s - (self.clock() - self.start)

    def fits(self, predicted_s: float) -> bool:
        return predicted_s <= self.left()

    def arm(self) -> None:
        self._timer = threading.Timer(max(self.left(), 0.0), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self.fired = True
        os.kill(os.getpid(), signal.SIGINT)


def predicted(run: Run, runs: list[Run]) -> float:
    """The longest finished run of this network, scaled to this run's steps; else the plan's estimate."""
    done = [r for r in runs if r.status == "done" and r.spec.network == run.spec.network]
    if not done:
        return run.estimate_s
    return max(r.took_s * run.spec.stop_at / r.spec.stop_at for r in done)


def first_failure(err: BaseException) -> tuple[int, str]:
    """(exit code, one line) as lptrain's own command line would give them; a bug is 1 with its traceback."""
    from lptrain.cli import classify

    known = classify(err)
    if known is not None:
        return known
    traceback.print_exception(err)
    return 1, f"{type(err).__name__}: {err}"


def execute(runs: list[Run], guard: TimeGuard, work: Path, out: Path, render: Callable[[], None]) -> int:
    """Train the planned runs in order within the guard; each finished run's row is saved at once."""
    code = 0
    for i, run in enumerate(runs, 1):
        tag = f"[{i}/{len(runs)}] {run.spec.network} {run.comm}"
        if run.status == "skipped":
            print(f"{tag}: skipped: {run.why}", flush=True)
            continue
        if guard.fired or not guard.fits(predicted(run, runs)):
            run.status = "skipped"
            run.why = (
                f"time guard: {predicted(run, runs):.0f} s predicted, {max(guard.left(), 0):.0f} s of the budget left"
            )
            print(f"{tag}: skipped by the {run.why}", flush=True)
            continue
        print(f"{tag}, {run.spec.stop_at} steps ...", flush=True)
        guard.arm()
        began = time.monotonic()
        try:
            run.result = train(run.spec, run.replicas, work)
            run.status = "done"
        except (Interrupted, KeyboardInterrupt) as err:
            who = "the time guard" if guard.fired else "a signal"
            run.status, run.why = "cut short", f"{who} stopped it" + (f" ({err})" if str(err) else "")
        except Exception as err:  # one run's failure: the others still run, as in a sweep
            failed, line = first_failure(err)
            code = code or failed
            run.status, run.why = "failed", line
        finally:
            guard.disarm()
            run.took_s = time.monotonic() - began
        if run.status == "done":
            save_row(out / "rows.jsonl", run)
            r = run.result
            print(
                f"{tag}: loss {r.final_loss:.4f}, eval {fmt_pct(r.eval_accuracy)}, comm {r.comm_ms:.1f} ms/iter "
                f"({fmt_pct(r.comm_share)} of the step, {r.extra['exposed_ms']:.1f} ms exposed), {run.took_s:.0f} s",
                flush=True,
            )
        else:
            print(f"{tag}: {run.status}: {run.why}", flush=True)
        render()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if run.status == "cut short" and not guard.fired:
            return 130  # Ctrl-C or the check's time limit: stop, keeping what finished
    return code


def save_row(path: Path, run: Run) -> None:
    """Append the run's row and flush it to disk: a later stop of any kind cannot take it."""
    with open(path, "a") as f:
        f.write(json.dumps({"key": run.spec.key, **asdict(run.result)}) + "\n")
        f.flush()
        os.fsync(f.fileno())


# -- the two tables -------------------------------------------------------------------------


def by_network(runs: list[Run]) -> dict[str, list[Run]]:
    """Each network's runs, lp first, the control second, then the rest in the plan's order."""
    out: dict[str, list[Run]] = {}
    for run in runs:
        out.setdefault(run.spec.network, []).append(run)
    return out


def not_run(run: Run) -> str:
    return f"{run.status}: {run.why}" if run.why else run.status


def convergence_lines(runs: list[Run], header: list[str]) -> list[str]:
    """The convergence table of each network, as in docs/CONVERGENCE.md, with its verdict."""
    lines = ["## Convergence under every communicator", "", *header, *READING, ""]
    for network, group in by_network(runs).items():
        lines += [f"### {TITLES.get(network, network)}", ""]
        reference = group[0].result if group[0].status == "done" else None
        body = []
        for run in group:
            r = run.result
            if r is None:
                body.append([run.comm, str(run.spec.stop_at), "-", "-", not_run(run)])
                continue
            distance = "reference" if r is reference else (f"{max_difference(r, reference):.2e}" if reference else "-")
            body.append([run.comm, str(max(r.losses)), f"{r.final_loss:.4f}", fmt_pct(r.eval_accuracy), distance])
        lines += [
            *table(["communicator", "steps", "final train loss", "eval accuracy", "max \\|loss - lp\\|"], body),
            "",
        ]
        lines += [verdict(group, reference), ""]
    return lines


def verdict(group: list[Run], reference: RunResult | None) -> str:
    """The control's distance, and the largest distance of any communicator against it."""
    done = [run.result for run in group if run.result is not None]
    control = next((run.result for run in group if run.comm == CONTROL and run.result is not None), None)
    if reference is None or control is None:
        return "No verdict: the reference (lp) or the control did not finish."
    yardstick = max_difference(control, reference)
    others = [
        (f"{r.spec['comm']}", max_difference(r, reference)) for r in done if r is not reference and r is not control
    ]
    text = f"Reordering alone (the control) moves the loss by up to {yardstick:.2e} over {max(control.losses)} steps"
    if others:
        name, worst = max(others, key=lambda x: x[1])
        text += f"; the largest distance of any communicator is {worst:.2e} ({name})"
        text += f", {worst / yardstick:.1f}x the control." if yardstick > 0 else "."
    else:
        text += "."
    twins = identical_curves(done) if len(done) > 1 else []
    if twins:
        text += " Bitwise the same curves: " + "; ".join(" = ".join(g) for g in twins) + "."
    diverged = [r.spec["comm"] for r in done if r.extra.get("identical") is False]
    if diverged:
        text += f" **Replicas diverged** in: {', '.join(diverged)}."
    return text


def comm_lines(runs: list[Run], header: list[str]) -> list[str]:
    """The per-iteration communication table: ms, share of the step, the exposed part."""
    body = []
    for run in [run for group in by_network(runs).values() for run in group]:
        r = run.result
        name = TITLES.get(run.spec.network, run.spec.network)
        if r is None:
            body.append([name, run.comm, "-", "-", "-", "-", "-", not_run(run)])
            continue
        step_ms = r.comm_ms / r.comm_share if r.comm_share else float("nan")
        body.append(
            [name, run.comm, f"{r.comm_ms:.2f}", fmt_pct(r.comm_share), f"{r.extra['exposed_ms']:.2f}",
             f"{step_ms:.1f}", f"{r.compute_ms:.1f}", ""]
        )  # fmt: skip
    header_row = [
        "network",
        "communicator",
        "comm ms / iteration",
        "share of step",
        "exposed ms",
        "step ms",
        "compute ms",
        "not run",
    ]
    return [
        "## Communication per iteration",
        "",
        *header,
        *table(header_row, body),
        "",
        "*comm ms* is the gradients' collective per iteration (the mean over the timed steps, the first left out);",
        "*share of step* is that over the step (compute, exposed communication, hand-off and update; the data wait",
        "excluded); *exposed ms* is the part of it the step waited for: with overlap on (the default), each bucket's",
        "collective runs while backward goes on ([numbers.md](numbers.md)).",
        "",
    ]


def header_lines(where: Layout, command: str, today: str) -> list[str]:
    if where.device == "cuda":
        names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
        machine = (
            f"{torch.cuda.device_count()} x {', '.join(names)}, {where.text}; torch {torch.__version__}, "
            f"CUDA {torch.version.cuda}"
        )
        note = f"Measured on {machine}, on {today}."
    else:
        note = f"CPU stand-ins ({where.text}) on {briefly()}, on {today}: a check of the code path, not GPU figures."
    return [note, "", "```", command, "```", "", f"On a GPU machine, the check's step runs it: `{CHECK_COMMAND}`.", ""]


# -- the command line ----------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cuda (default), or cpu: stand-ins")
    parser.add_argument("--setup-only", action="store_true", help="print the plan and check it; train nothing")
    parser.add_argument("--networks", default=",".join(NETWORKS), help="comma-separated (default: %(default)s)")
    parser.add_argument("--comms", default=",".join(COMMS), help="comma-separated (default: %(default)s)")
    parser.add_argument(
        "--steps", type=steps_option, default={}, help=f"N or NETWORK=N,... (default: the recipe's; cpu: {CPU_STEPS})"
    )
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds (default %(default)s): the time guard")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs to plan for where CUDA is absent (--setup-only)")
    parser.add_argument("--out", type=Path, default=Path("gpu_experiment"), help="where the tables go")
    parser.add_argument("--work", type=Path, help="the runs' folders (default: a temporary one, removed)")
    parser.add_argument("--wheels", type=Path, default=ROOT / ".whl", help="--setup-only: the wheels to carry")
    args = parser.parse_args(argv)
    valid = (*NETWORKS, "small")
    for name in args.networks.split(","):
        if name not in valid:
            parser.error(f"--networks: unknown network {name!r}; valid: {', '.join(valid)}")
    for name in args.comms.split(","):
        if name not in COMMS:
            parser.error(f"--comms: unknown communicator {name!r}; valid: {', '.join(COMMS)}")
    if "lp" not in args.comms.split(","):
        parser.error("--comms: lp is the reference every distance is measured from; keep it")
    if args.budget <= 0 or args.gpus < 1:
        parser.error("--budget must be positive seconds and --gpus at least 1")
    return args


def missing_wheels(folder: Path) -> list[str]:
    """The wheels scripts/gpu_wheels.py prepares that ``folder`` lacks (at their pinned versions)."""
    have = {"-".join(w.name.split("-")[:2]).lower().replace("_", "-") for w in folder.glob("*.whl")}
    pinned = {**DOWNLOAD, **BUILD}
    return [f"{name} {version}" for name, version in pinned.items() if f"{name}-{version}".lower() not in have]


def model_sizes(networks: list[str], where: Layout) -> dict[str, str]:
    """Each network built on the meta device (no memory, no time): its parameters and gradient."""
    from lptrain.models import build_model, parameter_count

    sizes = {}
    for network in networks:
        cfg = compose_config([*base_overrides(network), *where.overrides])
        with torch.device("meta"):
            model = build_model(cfg.model.name, 10, cfg.model.image_size, init=cfg.model.init)
        n = parameter_count(model)
        sizes[network] = f"{n / 1e6:.1f}M parameters, a {n * 4 / 2**20:.0f} MiB gradient, {cfg.model.image_size} px"
    return sizes


def show_plan(runs: list[Run], where: Layout, check: Layout, args: argparse.Namespace, networks: list[str]) -> int:
    """--setup-only: the plan, the estimate against the budget, the files, and the checks' outcome."""
    if check is not where:
        print(f"gpu_experiment: CUDA is absent here; the plan is for {where.gpus} GPU(s) (--gpus), its configurations "
              f"checked with CPU replicas in place of the GPUs'")  # fmt: skip
    print(f"gpu_experiment: {len(runs)} runs on {where.text}, sync {SYNC}; in this order:")
    for i, run in enumerate(runs, 1):
        when = f"skipped: {run.why}" if run.status == "skipped" else f"~{run.estimate_s:.0f} s"
        print(f"  {i:2d}. {run.spec.network:9s} {run.comm:18s} {run.spec.stop_at:4d} steps  {when}")
    total = sum(r.estimate_s for r in runs)
    print(f"estimated {total:.0f} s of the {args.budget:.0f} s budget (the plan's estimates, until a run is timed)")
    for network, size in model_sizes(networks, check).items():
        print(f"  {network}: {size}")
    print(f"writes: {', '.join(str(args.out / name) for name in OUTPUTS)}")
    problems = []
    if where.device == "cuda":
        lacking = missing_wheels(args.wheels)
        if lacking:
            problems.append(f"{args.wheels} lacks the wheels {', '.join(lacking)}: run python3 scripts/gpu_wheels.py")
    for line in problems:
        print(f"gpu_experiment: {line}", file=sys.stderr)
    wheels = "" if where.device == "cpu" else f", wheels {'missing' if problems else 'found'} in {args.wheels}"
    print(f"checks: {len(runs)} configurations composed, {len(networks)} models built{wheels}")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even where a launcher left SIGINT ignored
    have_cuda = torch.cuda.is_available()
    if args.device == "cuda" and not have_cuda and not args.setup_only:
        print(
            f"gpu_experiment: --device cuda needs a CUDA GPU, but torch.cuda.is_available() is False here "
            f"(torch {torch.__version__}); --device cpu runs the CPU stand-ins, --setup-only checks the plan",
            file=sys.stderr,
        )
        return 2
    gpus = torch.cuda.device_count() if have_cuda else args.gpus
    where = layout(args.device, gpus)
    check = where
    if where.device == "cuda" and not have_cuda:  # planned here for the GPU machine
        check = Layout("cpu", 0, (f"trainer.devices=cpu*{where.replicas}",), where.replicas, where.text)
    networks, comms = args.networks.split(","), args.comms.split(",")
    default = CPU_STEPS if where.device == "cpu" else None
    steps = {n: steps_for(args.steps, n) or default or recipe_steps(n) for n in networks}
    from lptrain.errors import ConfigError

    try:
        runs = plan(networks, comms, steps, where, check)
    except ConfigError as err:
        print(f"gpu_experiment: {err}", file=sys.stderr)
        return 2
    if args.setup_only:
        return show_plan(runs, where, check, args, networks)

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rows.jsonl").unlink(missing_ok=True)  # this experiment's rows only
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu_experiment."))
    command = "python scripts/gpu_experiment.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    header = header_lines(where, command, datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"))

    def render() -> None:
        write_atomically(args.out / "convergence.md", "\n".join(convergence_lines(runs, header)))
        write_atomically(args.out / "comm.md", "\n".join(comm_lines(runs, header)))

    guard = TimeGuard(args.budget)
    print(
        f"gpu_experiment: {len(runs)} runs on {where.text}, within {args.budget:.0f} s; tables in {args.out}",
        flush=True,
    )
    try:
        code = execute(runs, guard, work, args.out, render)
    except KeyboardInterrupt:  # between two runs: the finished ones are saved
        print("gpu_experiment: interrupted; the finished runs are in the tables", file=sys.stderr)
        code = 130
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    render()
    counts = {s: sum(r.status == s for r in runs) for s in ("done", "skipped", "failed", "cut short")}
    print(
        f"gpu_experiment: {counts['done']} runs done, {counts['skipped']} skipped, {counts['failed']} failed, "
        f"{counts['cut short']} cut short in {time.monotonic() - guard.start:.0f} s; "
        f"{args.out / 'convergence.md'} and {args.out / 'comm.md'}",
        flush=True,
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
