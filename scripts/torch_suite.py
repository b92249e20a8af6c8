#!/usr/bin/env python3
"""PyTorch's own distributed tests on gloo and on lptrain's torch.distributed backends, side
by side (the table in docs/distributed.md):

    python scripts/torch_suite.py
    python scripts/torch_suite.py --backends gloo,lptrain_mst --world-sizes 3 --select '^test_all_gather'

It needs PyTorch's test harness, which the torch wheel ships, and its one extra package,
expecttest (in lptrain's ``dev`` extra). The selection (doctools.torch_suite.SELECTION) is a
pattern on the tests' names; each backend runs exactly the tests gloo runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

from doctools import torch_suite
from doctools.machine import briefly


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default=",".join(torch_suite.BACKENDS))
    parser.add_argument("--world-sizes", default=",".join(map(str, torch_suite.WORLD_SIZES)))
    parser.add_argument("--select", default=torch_suite.SELECTION, help="a pattern on the tests' names (re.search)")
    parser.add_argument("--json", type=Path, help="write every test's outcome here")
    parser.add_argument("--logs", type=Path, help="a folder for each run's own output")
    args = parser.parse_args()
    try:
        import expecttest  # noqa: F401 - PyTorch's harness imports it
    except ImportError:
        sys.exit("torch_suite.py: error: PyTorch's test harness needs expecttest: pip install -e '.[dev]'")
    found = {}
    start = time.monotonic()
    for w in (int(x) for x in args.world_sizes.split(",")):
        for backend in args.backends.split(","):
            log = args.logs / f"{backend}-{w}.log" if args.logs else None
            if log:
                log.parent.mkdir(parents=True, exist_ok=True)
            found[backend, w] = torch_suite.run(backend, w, args.select, log=log)
            print(f"# {backend} at {w} processes: {torch_suite.counts(found[backend, w])}", file=sys.stderr)
    today = datetime.date.today().isoformat()
    print(f"# {today}, {briefly()}, {time.monotonic() - start:.0f} s; selection: {args.select}")
    print("\n".join(torch_suite.render(found)))
    if args.json:
        rows = [
            {"backend": b, "world_size": w, "test": t, "outcome": o, "why": y}
            for (b, w), r in found.items()
            for t, (o, y) in r.items()
        ]
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
