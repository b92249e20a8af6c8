#!/usr/bin/env python3
"""The convergence study: the paper's networks trained under every communicator.

For each network (AlexNet, GoogLeNet, VGG-16, from their recipes) it trains one long run
with ``lp`` (allreduce) and shorter runs with every other communicator, in both sync
modes (``allreduce``, and the paper's ``reduce`` + broadcast), all from the same seed on
the same batches. Only the order of the floating-point additions differs between
communicators, so their loss curves must lie on lp's. How far apart is "on top"? A
control run answers it: ``lp`` with its chain reversed computes the very same sums in
another order, so its distance from lp is what reordering alone does to the curve.

Writes ``docs/CONVERGENCE.md`` and ``docs/figures/convergence_<network>.png``. Every
finished run is kept under ``--work`` (default ``runs/convergence``), so an interrupted
study continues where it stopped; ``--fresh`` starts over.

    python scripts/convergence.py                              # the CPU study, ~40 min on 2 cores
    python scripts/convergence.py --networks alexnet --short-steps 20
    python scripts/convergence.py trainer.devices=auto data=imagefolder data.root=/data/imagenet \\
        model.image_size=224 trainer.batch_per_device=64 --long-steps 5000 --short-steps 500   # on GPUs

Anything that is not an option is a Hydra override applied to every run.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import math
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from doctools.files import write_atomically, write_json  # noqa: E402
from doctools.machine import briefly  # noqa: E402
from lptrain.comm.algorithms import SCHEDULES  # noqa: E402
from lptrain.settings.locations import compose_config  # noqa: E402
from lptrain.train.trainer import Trainer  # noqa: E402

NETWORKS = ("alexnet", "googlenet", "vgg16")
TITLES = {"alexnet": "AlexNet", "googlenet": "GoogLeNet", "vgg16": "VGG-16", "small": "small CNN"}
COMMS = SCHEDULES  # every schedule; nccl is added where there are GPUs (--comms)
SYNCS = ("allreduce", "reduce")
CONTROL = "lp, chain reversed"  # the same sums as lp, added in the opposite order
# Where the GPU experiment (scripts/gpu_experiment.py) stands: its table goes here once a device ran it.
GPU_NOTE = (
    "## On a GPU",
    "",
    "These networks on a GPU, each recipe's whole schedule under lp, mst, be, ring and nccl (allreduce) with the",
    "control, four replicas sharing one GPU, wait for a device: no GPU has run them yet. One call of about six",
    "minutes of device time makes their table, `convergence.md` in `$OUT/experiment/` (`scripts/gpu_experiment.py`):",
    "",
    "```",
    'GPU_CHECK_STEPS=experiment bash scripts/gpu_check.sh "$OUT"',
    "```",
    "",
)


@dataclass(frozen=True)
class RunSpec:
    network: str
    comm: str  # the communicator's name, or CONTROL
    sync: str
    steps: int  # the schedule's length: the long run's, for every run
    stop_at: int  # where this run stops (trainer.stop_at)
    overrides: tuple[str, ...]

    @property
    def key(self) -> str:
        comm = "lp-reversed" if self.comm == CONTROL else self.comm
        return f"{self.network}-{comm}-{self.sync}"

    def hydra_overrides(self, devices: int) -> list[str]:
        comm = "lp" if self.comm == CONTROL else self.comm
        out = [f"+recipe={self.network}"] if self.network in NETWORKS else [f"model={self.network}"]
        out += [
            f"comm={comm}",
            f"trainer.sync={self.sync}",
            *self.overrides,
            f"trainer.steps={self.steps}",
            f"trainer.stop_at={self.stop_at}",
        ]
        out += ["trainer.log_every=1", "trainer.progress=false", "trainer.checkpoint_every=0"]
        if self.comm == CONTROL:
            out.append(f"comm.options.order=[{','.join(str(i) for i in reversed(range(devices)))}]")
        return out


@dataclass
class RunResult:
    spec: dict
    losses: dict[int, float]  # step -> training loss (of the global batch)
    evals: dict[int, float]  # step -> eval accuracy
    final_loss: float
    eval_accuracy: float | None
    comm_ms: float
    comm_share: float
    compute_ms: float
    wall_s: float
    devices: str
    extra: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)  # the resolved configuration the run trained with


def count_devices(overrides: list[str], network: str) -> int:
    """How many replicas the runs will have (the control run needs it to reverse the chain)."""
    base = [f"+recipe={network}"] if network in NETWORKS else [f"model={network}"]
    return len(compose_config(base + overrides).devices)


class Interrupted(Exception):
    """Ctrl-C or SIGTERM stopped a run early (the trainer finishes the step and returns)."""


def train(spec: RunSpec, devices: int, work: Path) -> RunResult:
    """One run in this process; its metrics.jsonl gives the per-step curve."""
    cfg = compose_config(spec.hydra_overrides(devices))
    run_dir = work / spec.key
    for stale in ("metrics.jsonl", "steps.jsonl"):  # a stopped earlier attempt's lines
        (run_dir / stale).unlink(missing_ok=True)
    trainer = Trainer(cfg, run_dir)
    t0 = time.perf_counter()
    summary = trainer.fit()
    wall = time.perf_counter() - t0
    if summary.steps < spec.stop_at:  # stopped by a signal: not a finished run, keep nothing
        raise Interrupted(f"{spec.key} stopped at step {summary.steps} of {spec.stop_at}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    result = RunResult(
        spec=asdict(spec),
        losses={int(r["step"]): float(r["loss"]) for r in rows if "loss" in r},
        evals={int(r["step"]): float(r["eval_accuracy"]) for r in rows if "eval_accuracy" in r},
        final_loss=summary.final_loss,
        eval_accuracy=summary.eval_accuracy,
        comm_ms=summary.mean_comm_ms,
        comm_share=summary.comm_fraction,
        compute_ms=summary.mean_compute_ms,
        wall_s=wall,
        devices=summary.devices,
        extra={
            "data_ms": summary.mean_data_ms,
            "identical": summary.replicas_identical,
            "exposed_ms": summary.mean_comm_exposed_ms,  # the part of comm_ms the step waited for
        },
        config=resolved(cfg),
    )
    del trainer
    gc.collect()
    return result


def resolved(config) -> dict:
    """The run's groups as plain data (what the trainer's checkpoints hold)."""
    return config.groups()


def same_config(kept: dict, now: dict, overrides: list[str]) -> bool:
    """Whether a kept run trained this configuration: equal, or equal apart from options
    added to lptrain since, which this run leaves at their defaults (those change nothing
    the kept run did; an option the run sets, or any changed value, trains anew)."""
    from lptrain.train.log import flatten

    old, new = flatten(kept), flatten(now)
    named = {o.lstrip("+").split("=", 1)[0] for o in overrides}
    added = set(new) - set(old)
    return set(old) <= set(new) and all(old[k] == new[k] for k in old) and not added & named


def cached(spec: RunSpec, devices: int, work: Path) -> RunResult | None:
    """A finished run of this configuration (an edited recipe or option trains anew)."""
    path = work / spec.key / "result.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    overrides = spec.hydra_overrides(devices)
    if not same_config(data.get("config") or {}, resolved(compose_config(overrides)), overrides):
        print(f"{spec.key}: the kept run had another configuration, training it again", flush=True)
        return None
    data["losses"] = {int(k): v for k, v in data["losses"].items()}
    data["evals"] = {int(k): v for k, v in data["evals"].items()}
    return RunResult(**data)


def save(result: RunResult, spec: RunSpec, work: Path) -> None:
    write_json(work / spec.key / "result.json", asdict(result))


def plan(network: str, comms: list[str], long_steps: int, short_steps: int, overrides: list[str]) -> list[RunSpec]:
    """lp allreduce first (the long reference), then the control, then everything else."""
    # The short runs follow the long run's schedule (trainer.steps) and stop early
    # (trainer.stop_at): with a schedule that depends on the run's length, such as cosine,
    # shorter runs would otherwise see other learning rates and leave lp's curve for a
    # reason that has nothing to do with the communicator.
    specs = [RunSpec(network, "lp", "allreduce", long_steps, long_steps, tuple(overrides))]
    specs.append(RunSpec(network, CONTROL, "allreduce", long_steps, short_steps, tuple(overrides)))
    for sync in SYNCS:
        for comm in comms:
            if (comm, sync) != ("lp", "allreduce"):
                specs.append(RunSpec(network, comm, sync, long_steps, short_steps, tuple(overrides)))
    return specs


def max_difference(run: RunResult, reference: RunResult) -> float:
    common = sorted(set(run.losses) & set(reference.losses))
    return max((abs(run.losses[s] - reference.losses[s]) for s in common), default=math.nan)


def identical_curves(results: list[RunResult]) -> list[list[str]]:
    """Groups of runs whose losses agree to the last bit over the steps they share."""
    groups: dict[tuple, list[str]] = {}
    steps = min(max(r.losses) for r in results)
    for r in results:
        groups.setdefault(tuple(r.losses[s] for s in range(1, steps + 1) if s in r.losses), []).append(label(r))
    return [g for g in groups.values() if len(g) > 1]


def label(result: RunResult) -> str:
    return f"{result.spec['comm']} ({result.spec['sync']})"


def figure(network: str, results: list[RunResult], out: Path) -> Path:
    """Left: every loss curve over lp's long one. Right: each run's distance from lp per step."""
    reference = results[0]
    fig, (ax, dx) = plt.subplots(1, 2, figsize=(13, 4.6))
    steps = sorted(reference.losses)
    ax.plot(steps, [reference.losses[s] for s in steps], color="black", lw=2.5, label=f"{label(reference)}, long run")
    styles = {"allreduce": "-", "reduce": "--"}
    markers = {"lp": "o", "mst": "s", "be": "^", "ring": "v", "nccl": "D", CONTROL: "x"}
    for r in results[1:]:
        xs = sorted(r.losses)
        kw = dict(ls=styles[r.spec["sync"]], marker=markers.get(r.spec["comm"], "."), markevery=max(1, len(xs) // 8))
        ax.plot(xs, [r.losses[s] for s in xs], lw=1.2, ms=4, label=label(r), **kw)
        common = [s for s in xs if s in reference.losses]
        diffs = [max(abs(r.losses[s] - reference.losses[s]), 1e-9) for s in common]
        dx.plot(common, diffs, lw=1.2, ms=4, label=label(r), **kw)
    short = max((max(r.losses) for r in results[1:]), default=0)
    if short:
        ax.axvline(short, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (global batch)")
    ax.set_title(f"{TITLES.get(network, network)}: loss under every communicator")
    ax.legend(fontsize=7, ncol=2)
    dx.set_yscale("log")
    dx.set_xlabel("step")
    dx.set_ylabel("|loss - lp's loss|")
    dx.set_title("distance from lp (allreduce); 1e-9 = identical")
    dx.legend(fontsize=7, ncol=2)
    fig.suptitle(f"measured on this machine's CPU, {datetime.date.today().isoformat()}", fontsize=9)
    fig.tight_layout()
    path = out / f"convergence_{network}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def fmt_pct(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def report(
    all_results: dict[str, list[RunResult]], command: str, doc: Path, figures: dict[str, Path], note: str = ""
) -> str:
    today = datetime.date.today().isoformat()
    lines = [
        "# Convergence under every communicator",
        "",
        f"Written by `scripts/convergence.py` on {today}; measured on this machine: {briefly()}.",
        "Nothing here ran on a GPU unless the line above names one.",
        "",
        *([note, ""] if note else []),
        "```",
        command,
        "```",
        "",
        "Each network trains from its recipe (`lptrain +recipe=<network>`): one long run with `lp` (allreduce),",
        "and shorter runs with every other communicator in both sync modes (`allreduce`: gradients allreduced,",
        "every replica updates; `reduce`: gradients reduced to the root, the root updates and broadcasts the",
        "weights, the paper's formulation). Same seed, same batches, same dropout masks: only the order of the",
        "floating-point additions differs. The control run, "
        f"*{CONTROL}*, computes lp's sums in the opposite order, so its distance",
        "from lp is what reordering alone does; a communicator whose distance is of the same order computes",
        "the same training. Losses are the training loss of each step's global batch.",
        "",
    ]
    for network, results in all_results.items():
        reference = results[0]
        control = next((r for r in results if r.spec["comm"] == CONTROL), None)
        short = max((max(r.losses) for r in results[1:]), default=None)
        title = TITLES.get(network, network)
        lines += [f"## {title}", ""]
        ref_eval = reference.evals.get(short) if short else None
        lines += [
            f"Long run: `lp` (allreduce) over {reference.devices}, {max(reference.losses)} steps: final training "
            f"loss {reference.final_loss:.4f}, eval accuracy {fmt_pct(reference.eval_accuracy)}"
            + (f" ({fmt_pct(ref_eval)} at step {short})" if ref_eval is not None else "")
            + f", {reference.wall_s / 60:.1f} min.",
            "",
            "| communicator | sync | steps | final train loss | eval accuracy | max \\|loss - lp\\| | "
            "comm ms / iteration | comm share of step |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in results:
            diff = "reference" if r is reference else f"{max_difference(r, reference):.2e}"
            lines.append(
                f"| {r.spec['comm']} | {r.spec['sync']} | {max(r.losses)} | {r.final_loss:.4f} | "
                f"{fmt_pct(r.eval_accuracy)} | {diff} | {r.comm_ms:.1f} | {fmt_pct(r.comm_share)} |"
            )
        lines.append("")
        if control is not None:
            yardstick = max_difference(control, reference)
            others = [(label(r), max_difference(r, reference)) for r in results[1:] if r is not control]
            worst = max(others, key=lambda x: x[1], default=None)
            if worst and yardstick > 0:
                verdict = (
                    f"the largest distance of any communicator is {worst[1]:.2e} ({worst[0]}), "
                    f"{worst[1] / yardstick:.1f}x the control."
                )
            elif worst and worst[1] > 0:
                verdict = f"yet {worst[0]} is {worst[1]:.2e} away: more than reordering explains."
            else:
                verdict = "every communicator matches lp exactly."
            if str(reference.devices).startswith("2 x ") or str(reference.devices).count(",") == 1:
                verdict += " (With two replicas every algorithm adds the same two numbers: a + b = b + a.)"
            lines.append(
                f"Reordering alone (the control) moves the loss by up to {yardstick:.2e} over {short} steps; " + verdict
            )
            lines.append("")
        twins = identical_curves(results)
        if twins:
            lines.append(
                "Bitwise the same curves (the same additions in the same order, so the same training): "
                + "; ".join(" = ".join(group) for group in twins)
                + "."
            )
            lines.append("")
        diverged = [label(r) for r in results if r.extra.get("identical") is False]
        if diverged:
            lines += [f"**Replicas diverged** in: {', '.join(diverged)}.", ""]
        lines += [f"![{title}](figures/{figures[network].name})", ""]
    lines += [
        "## Reading the numbers",
        "",
        "- *comm ms / iteration* is the mean over the timed steps (the first step is left out) of the gradient",
        "  collective plus, in `reduce` mode, the weight broadcast and, for batch-norm networks, the buffer",
        '  broadcast. On CPU replicas every "link" is a memory copy on the same two cores, so the ranking of',
        "  the communicators here says little about GPUs; `lptrain-bench` and `docs/PAPER_RESULTS.md` do that.",
        "- *comm share* is that time over the step (compute, exposed communication, hand-off and update; the data",
        "  wait excluded), as the run's summary and `lptrain-report` print it ([numbers.md](numbers.md)).",
        "- Over many steps tiny differences grow (training is chaotic), so the distances rise with the step",
        "  for every run, the control included; what matters is that every communicator stays of the",
        "  control's order.",
        "",
        "To repeat on GPUs with real data (ImageNet-style folder, every GPU of the machine, nccl added):",
        "",
        "```",
        "python scripts/convergence.py --comms lp,mst,be,ring,nccl trainer.devices=auto data=imagefolder \\",
        "    data.root=/data/imagenet model.image_size=224 trainer.batch_per_device=64 \\",
        "    --long-steps 20000 --short-steps 2000",
        "```",
        "",
        *GPU_NOTE,
    ]
    text = "\n".join(lines)
    write_atomically(doc, text)
    return text


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        description="Train the paper's networks under every communicator; write docs/CONVERGENCE.md.",
        epilog="Other arguments are Hydra overrides applied to every run (e.g. trainer.devices=cpu*2).",
    )
    parser.add_argument("--networks", default=",".join(NETWORKS), help="comma-separated (default: %(default)s)")
    default_comms = ",".join(COMMS + (("nccl",) if torch.cuda.device_count() > 1 else ()))
    parser.add_argument("--comms", default=default_comms, help="comma-separated (default: %(default)s)")
    parser.add_argument(
        "--long-steps",
        type=steps_option,
        default={},
        help="lp's run: N or NETWORK=N,... (default: the recipe's)",
    )
    parser.add_argument(
        "--short-steps", type=steps_option, default={}, help="the other runs: N, or NETWORK=N,... (default: a third)"
    )
    parser.add_argument("--out", type=Path, default=Path("docs"), help="CONVERGENCE.md here, figures in out/figures")
    parser.add_argument("--work", type=Path, default=Path("runs/convergence"), help="finished runs, kept for resuming")
    parser.add_argument("--fresh", action="store_true", help="ignore finished runs kept in --work")
    parser.add_argument("--note", default="", help="a paragraph to print under the header (conditions of the run)")
    args, overrides = parser.parse_known_args(argv)
    bad = [o for o in overrides if o.startswith("-") or "=" not in o]
    if bad:
        parser.error(f"unknown argument {bad[0]!r}: options are listed by --help, overrides look like key=value")
    valid = set(NETWORKS) | {"small"}
    for name in args.networks.split(","):
        if name not in valid:
            parser.error(f"--networks: unknown network {name!r}; valid: {', '.join(sorted(valid))}")
    for name in args.comms.split(","):
        if name not in COMMS + ("nccl",):
            parser.error(f"--comms: unknown communicator {name!r}; valid: {', '.join(COMMS + ('nccl',))}")
    for opt in ("long_steps", "short_steps"):
        for network, value in getattr(args, opt).items():
            if network is not None and network not in valid:
                parser.error(
                    f"--{opt.replace('_', '-')}: unknown network {network!r}; valid: {', '.join(sorted(valid))}"
                )
            if value < 2:
                parser.error(f"--{opt.replace('_', '-')} must be at least 2, got {value}")
    return args, overrides


def without_note(argv: list[str]) -> list[str]:
    """The command line as the report shows it: the note is printed on its own."""
    shown, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--note":
            skip = True
        elif not arg.startswith("--note="):
            shown.append(arg)
    return shown


def steps_option(text: str) -> dict[str | None, int]:
    """``40`` (every network) or ``alexnet=60,vgg16=30``."""
    out: dict[str | None, int] = {}
    try:
        for part in text.split(","):
            name, _, value = part.rpartition("=")
            out[name or None] = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not N or NETWORK=N,...") from None
    return out


def steps_for(option: dict[str | None, int], network: str) -> int | None:
    return option.get(network, option.get(None))


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(argv)
    command = "python scripts/convergence.py " + shlex.join(without_note(sys.argv[1:] if argv is None else argv))
    networks, comms = args.networks.split(","), args.comms.split(",")
    figures_dir = args.out / "figures"
    figures_dir.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    all_results: dict[str, list[RunResult]] = {}
    figures: dict[str, Path] = {}
    t_start = time.perf_counter()
    for network in networks:
        base = [f"+recipe={network}"] if network in NETWORKS else [f"model={network}"]
        long_steps = steps_for(args.long_steps, network) or int(compose_config(base + overrides).trainer.steps)
        short_steps = min(steps_for(args.short_steps, network) or max(2, long_steps // 3), long_steps)
        devices = count_devices(overrides, network)
        # Evaluate where the short runs stop too, so lp's accuracy there can be compared.
        extra = [f"trainer.eval_every={short_steps}"]
        specs = plan(network, comms, long_steps, short_steps, overrides + extra)
        results = []
        for i, spec in enumerate(specs, 1):
            result = None if args.fresh else cached(spec, devices, args.work)
            tag = f"[{network} {i}/{len(specs)}] {spec.comm} ({spec.sync}), {spec.stop_at} steps"
            if result is None:
                print(f"{tag} ...", flush=True)
                try:
                    result = train(spec, devices, args.work)
                except (Interrupted, KeyboardInterrupt) as err:
                    print(f"interrupted ({err}); the finished runs are kept in {args.work}: run the same", flush=True)
                    print("command again to continue from there", flush=True)
                    return 130
                save(result, spec, args.work)
            elapsed = (time.perf_counter() - t_start) / 60
            print(
                f"{tag}: loss {result.final_loss:.4f}, eval {fmt_pct(result.eval_accuracy)}, "
                f"comm {result.comm_ms:.1f} ms/iter, {result.wall_s:.0f} s (study: {elapsed:.1f} min)",
                flush=True,
            )
            results.append(result)
        all_results[network] = results
        figures[network] = figure(network, results, figures_dir)
        report(
            all_results, command, args.out / "CONVERGENCE.md", figures, args.note
        )  # after every network: nothing lost
    print(f"wrote {args.out / 'CONVERGENCE.md'} and {', '.join(str(p) for p in figures.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
