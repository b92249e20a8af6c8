"""The project's own experiment on the emulated cluster: collectives and training where the
link, not the CPU, sets the time, on a star and on racks joined by thin uplinks.

``scripts/cluster_results.py`` drives it; ``cluster_model`` holds the simulator against its
rows and ``cluster_tables`` renders them (``scripts/benchmarks.py`` as a section of
docs/BENCHMARKS.md): docs tooling, kept out of the wheel (``lptrain-cluster`` itself is the
user's feature). Each measurement is one ``lptrain-cluster`` run (real namespaces, shaped
links, one torchrun node per namespace); the rows are kept in a JSON file so that the
tables can be rendered again, and the simulator recalibrated, without measuring again.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from doctools.files import write_json
from doctools.launch import lptrain_cluster
from doctools.machine import machine
from lptrain.cluster.plan import DEFAULT_EGRESS, parse_rate
from lptrain.comm.algorithms import SCHEDULES, WITH_VARIANTS
from lptrain.comm.sizes import parse_size
from lptrain.sim.rates import parse_fraction

OPS = ("broadcast", "reduce", "allreduce")
SCHEDULE_ALGOS = SCHEDULES
BENCH_ALGOS = (*SCHEDULE_ALGOS, "nccl")  # nccl is the backend's own collective (gloo here)
TABLE_ALGOS = (*SCHEDULE_ALGOS, "gloo", "auto")  # as the benchmark's rows name them
# On racks, LP's allreduce in both of the paper's constructions: overlapped (lp) and reduce,
# then broadcast (lp-rb), whose flows take turns where the overlapped chain's two share an
# uplink's direction (4 racks) and wait in its FIFO together.
RACK_ALGOS = (*WITH_VARIANTS, "nccl", "auto")
RACK_TABLE_ALGOS = (*WITH_VARIANTS, "gloo", "auto")
SMALL, BIG = 4 << 20, 16 << 20  # the messages the documents' tables show (the default sizes' ends)
# How every node's port queues what it sends, named on each run and in each part's stamp; a
# stamp without it is from before 2026-12-07, when the only shaper was ``shared``.
EGRESS = DEFAULT_EGRESS


@dataclass(frozen=True)
class Layout:
    """How the emulated nodes are joined: one switch (``racks=1``, the star), or racks whose
    uplinks carry ``uplink`` of a port's rate each way (``lptrain-cluster --layout racks``)."""

    racks: int = 1
    uplink: str = "1"  # a fraction of a port, "1/2"
    placement: str = "contiguous"

    @property
    def uplink_fraction(self) -> float:
        return parse_fraction(self.uplink, "a layout's uplink")

    def options(self, link: str) -> tuple[str, ...]:
        if self.racks == 1:
            return ()
        uplink_kbit = round(parse_rate(link) * self.uplink_fraction / 1000)
        return ("--layout", "racks", "--racks", str(self.racks), "--uplink", f"{uplink_kbit}kbit",
                "--placement", self.placement)  # fmt: skip

    def describe(self) -> str:
        if self.racks == 1:
            return "star"
        where = ", interleaved" if self.placement == "interleaved" else ""
        return f"{self.racks} racks, uplinks {self.uplink} of a port{where}"

    def as_dict(self) -> dict:
        return {"racks": self.racks, "uplink": self.uplink, "placement": self.placement}


STAR = Layout()
# The thin-uplink grid: two and four racks, uplinks at a half and a quarter of a port.
RACK_LAYOUTS = (Layout(2, "1/2"), Layout(2, "1/4"), Layout(4, "1/2"), Layout(4, "1/4"))


def layout_of(row: dict) -> Layout:
    """A row's layout (rows measured before racks were star rows)."""
    return Layout(**row["layout"]) if row.get("layout") else STAR


def _cluster(
    nodes: int, link: str, logs: Path, command: list[str], timeout_s: float, layout: Layout = STAR
) -> list[str]:
    options = ("--nodes", str(nodes), "--link", link, "--egress", EGRESS, "--quiet", "--logs", str(logs),
               "--timeout", str(int(timeout_s)))  # fmt: skip
    return [*lptrain_cluster(*options, *layout.options(link)), *command]


def _run(argv: list[str], what: str) -> None:
    """Run one lptrain-cluster command. On Ctrl-C it has the SIGINT too (same process
    group) and removes what it made: wait for that instead of killing it mid-cleanup."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate()
    except BaseException:
        proc.wait()
        raise
    if proc.returncode != 0:
        last = (err.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"{what} failed (exit {proc.returncode}): {last}")


def conditions(link: str) -> dict:
    """What the figures depend on besides the code: the link and the machine's load
    (``scripts/cluster_results.py`` adds the date and the machine each time it saves)."""
    return {
        "link": link,
        "link_bytes_per_s": parse_rate(link) / 8,
        "load_before": os.getloadavg()[0],
        "nice": os.nice(0),
    }


def bench_on_cluster(
    nodes: int,
    link: str,
    sizes: tuple[str, str],
    trials: int,
    work: Path,
    layout: Layout = STAR,
    op: str = "all",
    algos: Sequence[str] | None = None,
) -> list[dict]:
    """lptrain-bench for ``op`` (every op by default) and ``algos`` (by default every
    algorithm, comm=auto with the topology it probes at start among them), on ``nodes``
    namespaces joined as ``layout``: its JSON rows, each with the node count, the layout and
    the run's fidelity check."""
    algos = tuple(algos or (*BENCH_ALGOS, "auto"))
    name = f"p{nodes}-{layout.racks}r-{layout.uplink.replace('/', 'of')}-{layout.placement}-{op}-{'-'.join(algos)}"
    out = work / f"bench-{name}.json"
    load = os.getloadavg()[0]
    bench = [sys.executable, "-m", "lptrain.bench", "--op", op, "-b", sizes[0], "-e", sizes[1], "-f", "4",
             "--algo", ",".join(algos), "--topology", "probe", "-n", "1", "--trials", str(trials),
             "--json", str(out), "--quiet", "--timeout", "120"]  # fmt: skip
    logs = work / f"logs-bench-{name}"
    _run(_cluster(nodes, link, logs, bench, 3600, layout), f"the benchmark on {nodes} nodes ({layout.describe()})")
    check = fidelity_of(logs)
    rows = json.loads(out.read_text())
    return [dict(row, nodes=nodes, load=load, fidelity=check, layout=layout.as_dict()) for row in rows]


def fidelity_of(logs: Path) -> dict:
    """What lptrain-cluster's fidelity check measured before a run (its fidelity.json):
    the slowest and the median flow against nominal with every port busy, and softirq."""
    check = json.loads((logs / "fidelity.json").read_text())
    said = [line for line in (logs / "cluster.txt").read_text().splitlines() if line.startswith("fidelity:")]
    kept = {k: check[k] for k in ("passed", "worst_ratio", "median_ratio", "softirq")}
    return {**kept, "line": said[0] if said else None}


def auto_on_cluster(nodes: int, link: str, work: Path) -> dict:
    """Tune comm=auto on the cluster (``--save-tuning``), then, in a second cluster run, time
    auto beside every fixed algorithm, so the pick is judged on fresh measurements. (Two
    runs: a second process group in the same torchrun workers would meet the first one's
    rendezvous keys in the store.)"""
    tuning, out = work / "tuning.json", work / "auto.json"
    load = os.getloadavg()[0]
    bench = [sys.executable, "-m", "lptrain.bench", "-b", "256K", "-e", "16M", "-f", "4", "--op", "allreduce",
             "-n", "1", "--trials", "3", "--quiet"]  # fmt: skip
    tune = [
        *bench,
        "--algo",
        ",".join(WITH_VARIANTS),
        "--json",
        str(work / "tune-rows.json"),
        "--save-tuning",
        str(tuning),
    ]
    _run(_cluster(nodes, link, work / "logs-tune", tune, 3600), "comm=auto's tuning on the cluster")
    timed = [*bench, "--algo", ",".join(("auto", *WITH_VARIANTS)), "--tuning", str(tuning), "--json", str(out)]
    _run(_cluster(nodes, link, work / "logs-auto", timed, 3600), "comm=auto timed on the cluster")
    return {"nodes": nodes, "tuning": json.loads(tuning.read_text()), "rows": json.loads(out.read_text()), "load": load}


@dataclass(frozen=True)
class TrainCase:
    """One training configuration: the paper's iteration is ``sync=reduce`` (gradients
    reduced to the root, the weights broadcast back)."""

    label: str
    overrides: tuple[str, ...]


TRAIN_CASES = (
    TrainCase("lp, reduce + broadcast (the paper's iteration)", ("comm=lp", "trainer.sync=reduce")),
    TrainCase("lp, allreduce", ("comm=lp",)),
    TrainCase("be, allreduce", ("comm=be",)),
    TrainCase("ring, allreduce", ("comm=ring",)),
    TrainCase("gloo's own allreduce", ("comm=nccl",)),
)
TRAIN_MODEL = ("model=googlenet", "model.image_size=64", "data=synthetic")


def train_on_cluster(nodes: int, link: str, case: TrainCase, steps: int, work: Path) -> dict:
    """A short GoogLeNet run (5.6 M parameters, 22 MB of gradients) on ``nodes`` namespaces:
    the communication ms of each step after the first."""
    load = os.getloadavg()[0]
    run = work / f"train-p{nodes}-{case.overrides[0].split('=')[1]}-{len(case.overrides)}"
    command = [sys.executable, "-m", "lptrain.cli", *TRAIN_MODEL, *case.overrides, "trainer.devices=cpu*1",
               f"trainer.steps={steps}", "trainer.batch_per_device=8", "trainer.overlap=false",
               "trainer.eval_every=0", "trainer.checkpoint_every=0", "trainer.progress=false",
               "trainer.tensorboard=false", "trainer.log_every=1", f"hydra.run.dir={run}"]  # fmt: skip
    _run(_cluster(nodes, link, run.with_name(run.name + "-logs"), command, 1800), f"training ({case.label}, P={nodes})")
    steps_seen = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines() if line.strip()]
    comm = [s["comm_ms"] for s in steps_seen[1:]]
    from lptrain.models import build_model

    model = build_model("googlenet", 10, 64)
    parameters = sum(p.numel() for p in model.parameters())
    return {"nodes": nodes, "case": case.label, "parameters": parameters, "load": load,
            "comm_ms": statistics.median(comm), "steps": len(steps_seen),
            "step_ms": statistics.median(s["step_ms"] for s in steps_seen[1:])}  # fmt: skip


DDP_VARIANTS = ("native", "hook:auto", "hook:ring", "trainer:auto")
# Steps run before the timed ones and timed apart: DDP sorts its buckets anew after its first
# step, and auto chooses for each new bucket size at its first message (bench_ddp_hook.py).
DDP_WARMUP = 2


def ddp_on_cluster(nodes: int, link: str, layout: Layout, steps: int, repeats: int, work: Path) -> dict:
    """Real training on the cluster: DDP native, DDP with lptrain.ddp's hook (auto on the
    probed topology, and ring) and lptrain's trainer (comm=auto), GoogLeNet, one after the
    other in interleaved rounds (``scripts/bench_ddp_hook.py``)."""
    out = work / f"ddp-p{nodes}-{layout.racks}r.json"
    load = os.getloadavg()[0]
    # not --quiet: the DDP runs hand their figures back on node 0's standard output
    cluster = " ".join(("--nodes", str(nodes), "--link", link, "--egress", EGRESS, *layout.options(link)))
    script = Path(__file__).resolve().parents[1] / "bench_ddp_hook.py"
    command = [sys.executable, str(script), "--recipe", "googlenet", "--steps", str(steps), "--repeats", str(repeats),
               "--warmup", str(DDP_WARMUP), "--variants", ",".join(DDP_VARIANTS), "--cluster", cluster,
               "--json", str(out)]  # fmt: skip
    _run(command, f"DDP on {nodes} nodes ({layout.describe()})")
    result = json.loads(out.read_text())
    return {"nodes": nodes, "layout": layout.as_dict(), "link": link, "load": load, "steps": steps,
            "rounds": result["rounds"], "warmup_steps": DDP_WARMUP, "warmup": result["warmup"]}  # fmt: skip


# Where real training is timed: thin-uplink racks and a star at the experiment's link rate,
# and the racks again at a quarter of it, where the link, not this host's compute, takes
# most of a step (the host computes GoogLeNet far slower than the GPUs it stands in for).
DDP_RUNS = ((8, Layout(2, "1/2"), None), (4, STAR, None), (8, Layout(2, "1/2"), "50mbit"))
# The same star at a second rate: times in n/B must not depend on the rate where the link, not
# the host, sets them. Both rates are measured in one run, one after the other, at P = 8 and at
# P = 16, where a cost fixed in seconds (a pipeline's fill, each hop waiting for one of 16
# processes to get a core) would read fewer n/B at half the rate.
RATE_NODES = (8, 16)
# LP's broadcast and reduce over the whole star again at a quarter of the rate. Every hop of
# the chain waits for its process to get one of the host's cores, a cost fixed in seconds:
# at P = 16 on 2 cores it is a tenth of a 4 MiB broadcast at 200mbit, and at a quarter of the
# rate a quarter of that in n/B (on 2026-12-06, P = 16, 4 MiB: 1.21, 1.08 and 1.02 n/B at 200,
# 100 and 50mbit, one run each). The fidelity check cannot see it: it times the ports with
# every one busy at once, not a chain of processes each waiting for the last.
PIPELINE_NODES = tuple(range(2, 17))
PIPELINE_OPS = ("broadcast", "reduce")
PARTS = ("bench", "racks", "ddp", "train", "auto", "rates", "pipeline")


def parts_measured(data: dict) -> dict[str, list[dict]]:
    """When and on which machine each part of ``data`` was measured: ``{part: [{date,
    machine, nodes}]}``, one stamp per run of the part that still has rows here (``nodes``:
    the star's node counts that run measured, None for a whole part). A record from before
    parts were stamped has one date and machine for all: each part it holds is given those."""
    c = data.get("conditions") or {}
    if "parts" in c:
        return {part: _stamps(stamps) for part, stamps in c["parts"].items()}
    held = {
        "bench": any(layout_of(r) == STAR for r in data.get("bench", [])),
        "racks": any(layout_of(r) != STAR for r in data.get("bench", [])),
        **{part: bool(data.get(part)) for part in ("ddp", "train", "auto", "rates", "pipeline")},
    }
    stamp = {"date": c.get("date", "?"), "machine": c.get("machine"), "nodes": None}
    parts = {part: [dict(stamp)] for part, has in held.items() if has}
    tuned = (data.get("auto") or {}).get("tuning")
    if "auto" in parts and tuned:  # the tuned comm=auto part records its own day and machine
        parts["auto"] = [{"date": tuned.get("date", "?"), "machine": tuned.get("machine"), "nodes": None}]
    return parts


def _stamps(stamps: dict | list[dict]) -> list[dict]:
    """A part's stamps as a list (a single stamp was once stored as it is)."""
    return [{"nodes": None, **s} for s in (stamps if isinstance(stamps, list) else [stamps])]


def stamp_part(
    parts: dict[str, list[dict]],
    part: str,
    stamp: dict,
    nodes: list[int] | None = None,
    held: Sequence[int] = (),
    rows: str | None = None,
) -> None:
    """Record that ``part`` was measured now (``stamp``: date and machine), for the node
    counts ``nodes`` only where given: earlier stamps keep the node counts not measured
    again (a whole-part stamp covered ``held``, the counts the record had), and a stamp left
    with none is dropped. ``rows`` (``ring reduce``) says that only those rows were measured
    again: the stamps of the rest stay as they are, and only an earlier stamp of the same
    rows loses the node counts measured now."""
    kept = [old for old in parts.get(part, []) if old.get("rows") != rows] if rows else []
    if nodes is not None:
        for old in parts.get(part, []):
            if rows and old.get("rows") != rows:
                continue  # other rows: kept whole above
            left = [p for p in (old["nodes"] if old["nodes"] is not None else held) if p not in nodes]
            if left:
                kept.append({**old, "nodes": left})
    new = {**stamp, "nodes": sorted(nodes) if nodes is not None else None}
    parts[part] = [*kept, {**new, "rows": rows} if rows else new]


def half_rate(link: str) -> str:
    """``link`` at half its rate, in tc's notation (200mbit -> 100000kbit)."""
    return f"{parse_rate(link) // 2000}kbit"


def measure_rates(data: dict, link: str, sizes: tuple[str, str], trials: int, work: Path, say, progress) -> None:
    """The star at ``RATE_NODES`` at ``link`` and at half of it, one after the other, into
    ``data["rates"]`` (each row with its rate), ``progress`` called after each run."""
    data["rates"] = []
    for p in RATE_NODES:
        for rate in (link, half_rate(link)):
            say(f"benchmark on {p} nodes at {rate} ({'half the rate' if rate != link else 'the rate'}) ...")
            rows = bench_on_cluster(p, rate, sizes, trials, work)
            data["rates"] += [dict(row, link=rate, link_bytes_per_s=parse_rate(rate) / 8) for row in rows]
            progress(data)


def kept_rows(rows: list[dict], keys: set, algos=None, ops=None) -> list[dict]:
    """The rows that are not measured again (the rest stay): not at a (nodes, size, layout) of
    ``keys``, or not of the ``algos`` or ``ops`` measured again where those are named."""
    return [r for r in rows if (r["nodes"], r["size"], layout_of(r)) not in keys
            or (algos and r["algo"] not in algos) or (ops and r["op"] not in ops)]  # fmt: skip


def measure_racks(
    data: dict, link: str, sizes: tuple[str, str], trials: int, work: Path, rack_nodes: tuple[int, ...], say, progress
) -> None:
    """The thin-uplink grid (``RACK_LAYOUTS`` at each of ``rack_nodes`` that divides into its
    racks): every allreduce row measured again in ``data["bench"]``, ``progress`` called after
    each run."""
    grid = [(p, layout) for p in rack_nodes for layout in RACK_LAYOUTS if p % layout.racks == 0]
    data["bench"] = kept_rows(data.get("bench", []), {(p, parse_size(s), lay) for p, lay in grid for s in sizes})
    for p, layout in grid:
        say(f"allreduce on {p} nodes, {layout.describe()} ({link}) ...")
        data["bench"] += bench_on_cluster(p, link, sizes, trials, work, layout, op="allreduce", algos=RACK_ALGOS)
        progress(data)


def quarter_rate(link: str) -> str:
    """``link`` at a quarter of its rate, in tc's notation (200mbit -> 50000kbit)."""
    return f"{parse_rate(link) // 4000}kbit"


def measure_pipeline(data: dict, link: str, sizes: tuple[str, str], trials: int, work: Path, say, progress) -> None:
    """LP's broadcast and reduce on the star at every P of ``PIPELINE_NODES`` at a quarter of
    ``link``, into ``data["pipeline"]`` (each row with its rate), ``progress`` called after each P."""
    rate = quarter_rate(link)
    data["pipeline"] = []
    for p in PIPELINE_NODES:
        say(f"LP's broadcast and reduce on {p} nodes at {rate} (a quarter of the rate) ...")
        for op in PIPELINE_OPS:
            rows = bench_on_cluster(p, rate, sizes, trials, work, op=op, algos=("lp",))
            data["pipeline"] += [dict(row, link=rate, link_bytes_per_s=parse_rate(rate) / 8) for row in rows]
        progress(data)


def measure_star(
    data: dict, nodes: list[int], link: str, sizes: tuple[str, str], trials: int, work: Path,
    algos: Sequence[str] | None, ops: Sequence[str] | None, say, progress,
) -> tuple[list[int], str | None]:  # fmt: skip
    """The star at each of ``nodes`` into ``data["bench"]`` (only ``algos``' and ``ops``' rows
    where named), ``progress`` called after each P: returns the node counts and the rows
    measured again (``lp and auto reduce``; None: all) for the part's stamp."""
    keys = {(p, parse_size(s), STAR) for p in nodes for s in sizes}
    data["bench"] = kept_rows(data.get("bench", []), keys, algos, ops)
    bench_ops = ["all"] if not ops or set(ops) >= set(OPS) else list(ops)
    for p in nodes:
        say(f"benchmark on {p} nodes ({link}) ...")
        for op in bench_ops:
            data["bench"] += bench_on_cluster(p, link, sizes, trials, work, op=op, algos=algos)
        progress(data)
    return list(nodes), " ".join(" and ".join(x) for x in (algos, ops) if x) or None


def measure_ddp(data: dict, link: str, ddp_steps: int, work: Path, say, progress) -> None:
    """``DDP_RUNS``, real training with DDP and with the trainer, into ``data["ddp"]``."""
    data["ddp"] = []
    for p, layout, rate in DDP_RUNS:
        say(f"DDP and the trainer on {p} nodes, {layout.describe()}, {rate or link} ...")
        data["ddp"].append(ddp_on_cluster(p, rate or link, layout, ddp_steps, 1, work))
        progress(data)


def measure_auto(data: dict, link: str, work: Path, say) -> None:
    """comm=auto tuned on 4 nodes, then timed beside the fixed algorithms, into ``data["auto"]``."""
    say("comm=auto tuned on 4 nodes, then timed beside the fixed algorithms ...")
    data["auto"] = auto_on_cluster(4, link, work)


def measure_train(data: dict, train_nodes: list[int], link: str, train_steps: int, work: Path, say, progress) -> None:
    """The paper's iteration, each of ``TRAIN_CASES`` at each of ``train_nodes``, into ``data["train"]``."""
    data["train"] = []
    for p in train_nodes:
        for case in TRAIN_CASES:
            say(f"training on {p} nodes: {case.label} ...")
            data["train"].append(train_on_cluster(p, link, case, train_steps, work))
            progress(data)


def measure(
    nodes: list[int],
    link: str,
    sizes: tuple[str, str],
    trials: int,
    train_nodes: list[int],
    train_steps: int,
    only: set[str],
    previous: dict | None,
    say=print,
    save=lambda data: None,
    rack_nodes: tuple[int, ...] = (8,),
    ddp_steps: int = 4,
    algos: Sequence[str] | None = None,
    ops: Sequence[str] | None = None,
) -> dict:
    """Run the parts named in ``only`` (bench: the star; racks: the thin-uplink grid; ddp:
    real training, DDP and the trainer; train: the paper's iteration; auto: comm=auto tuned
    on 4 nodes; rates: the star at P = 8 and 16 at the rate and at half of it; pipeline: LP's
    broadcast and reduce at every P at a quarter of the rate) and keep the others from
    ``previous``. ``algos`` and ``ops`` narrow the star to those rows (an executor's change to
    one algorithm's op): only they are measured again, and the part's stamp says so.

    ``save`` is called with the record each time a part is whole, with its stamp: the record
    never holds a part's first rows under the stamp of an earlier run of it. The rows of the
    part under way are written after each run to ``progress.json`` in the run's log folder, so
    that a failure or an interruption loses no run that finished; the part is then named with
    that file, and the exception goes on."""
    data = dict(previous or {})
    kept = parts_measured(data)
    data["conditions"] = conditions(link) if only else data.get("conditions", conditions(link))
    data["conditions"]["parts"] = kept

    held_star = sorted({r["nodes"] for r in data.get("bench", []) if layout_of(r) == STAR})

    def measured(part: str, measured_nodes: list[int] | None = None, rows: str | None = None) -> None:
        now = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "machine": machine(), "nice": os.nice(0),
               "egress": EGRESS}  # fmt: skip
        stamp_part(kept, part, now, measured_nodes, held_star, rows)
        save(data)

    work = Path(tempfile.mkdtemp(prefix="lptrain-cluster-results-"))  # kept: every node's log
    say(f"logs in {work}")
    progress_file = work / "progress.json"

    def progress(data: dict) -> None:
        write_json(progress_file, data)

    @contextlib.contextmanager
    def part_of(part: str):
        try:
            yield
        except BaseException:
            progress(data)
            say(f"the {part} part was cut short: the record keeps what it held before it; the rows this part "
                f"measured so far are in {progress_file}")  # fmt: skip
            raise

    runs = {  # in the order they run; each returns its stamp's node counts and rows, where it names them
        "bench": lambda: measure_star(data, nodes, link, sizes, trials, work, algos, ops, say, progress),
        "racks": lambda: measure_racks(data, link, sizes, trials, work, rack_nodes, say, progress),
        "ddp": lambda: measure_ddp(data, link, ddp_steps, work, say, progress),
        "rates": lambda: measure_rates(data, link, sizes, trials, work, say, progress),
        "pipeline": lambda: measure_pipeline(data, link, sizes, trials, work, say, progress),
        "auto": lambda: measure_auto(data, link, work, say),
        "train": lambda: measure_train(data, train_nodes, link, train_steps, work, say, progress),
    }
    for part, run in runs.items():
        if part in only:
            with part_of(part):
                named = run() or ()
            measured(part, *named)
    data["conditions"]["load_after"] = os.getloadavg()[0]
    return data
