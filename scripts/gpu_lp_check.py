"""LP against memcpy on one GPU shared by four replicas, at 64 MiB: the check's lp_memcpy step.

LP moves the same bytes as the ring, BE and MST, so on one GPU it should reach the same
share of the GPU's memcpy bandwidth (the goal: at least 0.8x). This runs the benchmark
for lp and ring at 64 MiB with both reduction kernels, and counts what one LP allreduce
issues on the device (blocks launched, events recorded, stream waits), wrapping CUDA's
own calls so that the counts are of the real path. It prints one JSON line and exits 1,
naming the shortfall in one line, where LP stays below 0.8x memcpy.

    python scripts/gpu_lp_check.py --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

GOAL = 0.8
DEVICES = "cuda:0,cuda:0,cuda:0,cuda:0"
NBYTES = 64 << 20


def bench(kernels: str) -> list[dict]:
    """The benchmark's 64 MiB allreduce rows for lp and ring (memcpy's row beside them)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        command = [sys.executable, "-m", "lptrain.bench", "--devices", DEVICES, "--algo", "lp,ring",
                   "--reduce-kernel", kernels, "-b", "64M", "-e", "64M", "--trials", "3", "--target-time", "0.05",
                   "--json", str(out), "--quiet"]  # fmt: skip
        subprocess.run(command, check=True)
        return json.loads(out.read_text())


def count_one_call() -> dict:
    """Blocks, events and waits of one LP allreduce of 64 MiB over four replicas, counted by
    wrapping torch's own CUDA calls (eager: cuda_graph=off, so each is issued)."""
    import torch

    import lptrain.comm.executor as executor
    from lptrain.communicators import build_communicator

    counts: Counter = Counter()
    record, wait = torch.cuda.Event.record, torch.cuda.Stream.wait_event

    def counted_record(self, stream=None):
        counts["events"] += 1
        return record(self, stream)

    def counted_wait(self, event):
        counts["waits"] += 1
        return wait(self, event)

    comm = build_communicator("lp", devices=DEVICES.split(","), cuda_graph="off")
    tensors = [torch.ones(NBYTES // 4, device="cuda:0") for _ in range(4)]
    comm.allreduce(tensors)  # compiles the plan, decides the kernel
    torch.cuda.synchronize()
    plan = comm.plan("allreduce", NBYTES // 4, None, torch.float32, False)  # the plan this message uses
    torch.cuda.Event.record, torch.cuda.Stream.wait_event = counted_record, counted_wait
    try:
        comm.allreduce(tensors)
        torch.cuda.synchronize()
    finally:
        torch.cuda.Event.record, torch.cuda.Stream.wait_event = record, wait
    syncs = executor.sync_plan(plan, [torch.device("cuda", 0)] * 4)
    return {"blocks": len(plan.instrs), "events": counts["events"], "waits": counts["waits"],
            "planned_events": sum(s.record for s in syncs), "exact": bool((tensors[0] == 16).all())}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument("--reduce-kernel", default="peer,staged", help="the kernels to benchmark (default peer,staged)")
    args = parser.parse_args()
    rows = [r for r in bench(args.reduce_kernel) if r["op"] == "allreduce" and r["size"] == NBYTES]
    result = {"rows": rows, "one_call": count_one_call(), "goal": GOAL}
    text = json.dumps(result)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    lp = [r for r in rows if r["algo"].startswith("lp")]
    best = max((r["vs_memcpy"] or 0.0 for r in lp), default=0.0)
    if best < GOAL:
        print(f"gpu_lp_check: LP reached {best:.2f}x memcpy's bandwidth at 64 MiB, below the goal of {GOAL}x")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
