"""BE against its one-port model in the executor's event simulator, P = 2 to 16.

Writes the ``be-model`` section of docs/simulator.md: for each op and P, the step-by-step
one-port model (``lptrain.sim.predict``) and what ``lptrain.sim.dataflow`` prices for the
executor that runs BE (its ``steps`` issue order), with every rank in step and with one
rank entering the call late (the worst of a few such ranks, its lateness taken off).
Beside it, the same with receives posted ahead regardless of step (the order before a
step's receives waited for the earlier steps'), and how many messages flowed into a port
another peer was still sending into. Simulated figures, not measurements: the emulator's
own rows are in docs/BENCHMARKS.md.

    python scripts/be_model.py            # writes docs/simulator.md's section
    python scripts/be_model.py --print    # prints it instead
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
from pathlib import Path

from doctools.document import update_sections
from doctools.machine import briefly
from doctools.markdown import table
from lptrain.comm.algorithms import issue_order
from lptrain.comm.program import issue_policy
from lptrain.sim.dataflow import run_dataflow
from lptrain.sim.predict import predict, schedule_for
from lptrain.sim.topology import oneport

DOC = Path(__file__).resolve().parent.parent / "docs" / "simulator.md"
B = 25e6  # 200 Mbit/s ports
NBYTES = 16 << 20
SEGMENT = (256 << 10) // 4  # the executor's automatic segment at 200 Mbit/s, in float32 elements
LATE = 0.05  # seconds


def _worst(schedule, topology, policy, model: float) -> tuple[float, int]:
    """The worst ratio to the model, and the most shared arrivals, over a few late ranks."""
    p = topology.world_size
    worst, shared = 0.0, 0
    for late in sorted({0, p // 2, p - 1}):
        starts = [LATE if r == late else 0.0 for r in range(p)]
        run = run_dataflow(schedule, topology, SEGMENT, order=policy, starts=starts)
        worst, shared = max(worst, (run.seconds - LATE) / model), max(shared, run.shared_arrivals)
    return worst, shared


def rows(sizes: range) -> list[list[str]]:
    out = []
    for op in ("allreduce", "reduce", "broadcast"):
        now = issue_policy(issue_order("be", op))
        ahead = dataclasses.replace(now, posts_after_receives=False)
        for p in sizes:
            topology = oneport(p, bandwidth=B, latency=1e-4, overhead=1e-4, gamma=0.0)
            schedule = schedule_for("be", op, p, NBYTES // 4, 4)
            model = predict("be", op, topology, NBYTES).seconds
            in_step = run_dataflow(schedule, topology, SEGMENT, order=now).seconds / model
            late_now, shared_now = _worst(schedule, topology, now, model)
            late_ahead, shared_ahead = _worst(schedule, topology, ahead, model)
            out.append(
                [
                    op,
                    str(p),
                    f"{model * B / NBYTES:.2f}",
                    f"{in_step:.3f}",
                    f"{late_now:.3f}",
                    str(shared_now),
                    f"{late_ahead:.3f}",
                    str(shared_ahead),
                ]  # fmt: skip
            )
    return out


def section(sizes: range) -> list[str]:
    header = ["op", "P", "model (n/B)", "in step", "a rank late", "shared", "posted ahead: late", "shared"]
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    return [
        "",
        f"`python scripts/be_model.py` ({when}, {briefly()}; simulated, 16 MiB, 200 Mbit/s one-port",
        f"ports, 256 KiB segments, 16 receives posted ahead; a late rank enters {LATE * 1e3:.0f} ms after the others).",
        "Ratios are to the one-port model; *shared* counts messages that flowed into a port another peer",
        "was still sending into.",
        "",
        *table(header, rows(sizes)),
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--print", action="store_true", help="print the section instead of writing it")
    parser.add_argument("--max-p", type=int, default=16, help="the largest P (default 16)")
    args = parser.parse_args()
    body = section(range(2, args.max_p + 1))
    if args.print:
        print("\n".join(body))
    else:
        update_sections(DOC, {"be-model": body}, "sim")
        print(f"wrote the be-model section of {DOC}")


if __name__ == "__main__":
    main()
