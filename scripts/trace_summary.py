"""Where a DDP step's time went, from a Chrome trace of ``scripts/ddp_recipe.py --profile``.

    python scripts/trace_summary.py native.json hook_lp.json backend_lp.json

Per profiled step (a step ends where the optimizer's step ends): the step's length, the
backward pass (first to last autograd operator on the main thread), the bucket
collectives (lptrain's ``lptrain allreduce ...`` ranges, or gloo's own ``gloo:all_reduce``
of a bucket, over 1 ms, for DDP native), how much of them ran after backward had finished,
and the wait between the end of backward and the optimizer's step (the exposed
communication). Means over the profiled steps, in ms.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

BACKWARD = "autograd::engine::evaluate_function: "


def summarise(path: Path) -> dict[str, float]:
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    steps = sorted((e for e in events if e["name"].startswith("Optimizer.step")), key=lambda e: e["ts"])
    main = steps[0]["tid"]
    collectives = [
        e
        for e in events
        if e["name"].startswith("lptrain allreduce")
        or (e["name"] == "gloo:all_reduce" and e["tid"] != main and e["dur"] > 1000)
    ]
    lptrain = any(e["name"].startswith("lptrain") for e in collectives)
    if lptrain:  # gloo's own allreduce there is the desync check's, not a bucket
        collectives = [e for e in collectives if e["name"].startswith("lptrain")]
    begin = min(e["ts"] for e in events if e["tid"] == main)
    rows = []
    for step in steps:
        end = step["ts"] + step["dur"]
        backward = [e for e in events if e["tid"] == main and e["name"].startswith(BACKWARD) and begin <= e["ts"] < end]
        mine = [e for e in collectives if begin <= e["ts"] < end]
        if not backward:
            begin = end
            continue
        back_start, back_end = min(e["ts"] for e in backward), max(e["ts"] + e["dur"] for e in backward)
        after = sum(max(0, e["ts"] + e["dur"] - max(e["ts"], back_end)) for e in mine)
        rows.append(
            {
                "step": end - begin,
                "backward": back_end - back_start,
                "collectives": sum(e["dur"] for e in mine),
                "buckets": len(mine),
                "after_backward": after,
                "exposed": step["ts"] - back_end,
                "optimizer": step["dur"],
            }
        )
        begin = end
    return {k: sum(r[k] for r in rows) / len(rows) / (1 if k == "buckets" else 1e3) for k in rows[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", nargs="+", type=Path)
    args = p.parse_args()
    cols = ["step", "backward", "collectives", "after_backward", "exposed", "optimizer"]
    print(f"{'trace':<24} {'buckets':>7} " + " ".join(f"{c:>14}" for c in cols))
    for path in args.traces:
        s = summarise(path)
        print(f"{path.stem:<24} {s['buckets']:7.0f} " + " ".join(f"{s[c]:14.0f}" for c in cols))


if __name__ == "__main__":
    main()
