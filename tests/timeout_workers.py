"""Run by tests/test_timeouts.py, one process per rank, started by hand from the environment
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE; no torchrun), as a user's own launcher would.

    RANK=0 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 python tests/timeout_workers.py hook DIR

``hook``: a DDP model with lptrain's hook (``timeout_s`` 5) trains until rank 1 stops itself
(SIGSTOP) before step ``STOP_AT``: the others are then waiting in that step's desync check.
Each rank writes its pid to DIR/pid<rank>; a survivor prints the error its backward raised as
a user's script would (its type and first line) and exits 3 by a normal exit, so that a
thread left waiting would keep the process alive and show as a hang.

``helpers``: two ranks on a group whose own timeout is 600 s, the trainer's helpers bounded
at 3 s (``bound_collectives``, as ``trainer.comm_timeout_s`` does); rank 1 stops itself, and
rank 0 runs the stop agreement, the end-of-run comparison of the replicas and the barrier
before leaving, printing for each the seconds it took and its error.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import lptrain.ddp
from lptrain.comm import liveness
from lptrain.comm.distributed import CollectiveError
from lptrain.train.launch import any_across, bound_collectives, finish, same_everywhere

HOOK_TIMEOUT_S = 5
HELPERS_TIMEOUT_S = 3
STOP_AT = 3


def hook(out: Path) -> None:
    # The group's own timeout is long on purpose: only the hook's timeout_s may end the wait.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    (out / f"pid{rank}").write_text(str(os.getpid()))
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10))
    model = DistributedDataParallel(net, bucket_cap_mb=0.01)  # several buckets
    model.register_comm_hook(lptrain.ddp.state(algo="lp", timeout_s=HOOK_TIMEOUT_S), lptrain.ddp.hook)
    try:
        for step in range(1000):
            if rank == 1 and step == STOP_AT:
                os.kill(os.getpid(), signal.SIGSTOP)  # stalled: the test continues and ends it
            model(torch.randn(8, 32)).sum().backward()
    except Exception as err:  # noqa: BLE001 - what the user's script would print
        sys.stderr.write(f"{type(err).__name__}: {str(err).splitlines()[0]}\n")
        sys.exit(3)


def helpers(out: Path) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    bound_collectives(datetime.timedelta(seconds=HELPERS_TIMEOUT_S))
    rank = dist.get_rank()
    (out / f"pid{rank}").write_text(str(os.getpid()))
    liveness.start()  # as the trainer's communicator does
    any_across(False, torch.device("cpu"), "the stop check of step 1")  # both ranks are in
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    cpu = torch.device("cpu")
    for name, call in (
        ("stop", lambda: any_across(False, cpu, "the stop check of step 2")),
        ("end", lambda: same_everywhere(torch.ones(3))),
        ("leave", finish),
    ):
        began = time.monotonic()
        try:
            call()
            print(f"{name}: no error", flush=True)
        except CollectiveError as err:
            print(f"{name}: {time.monotonic() - began:.1f} s: {err}", flush=True)
    os._exit(0)  # the group is broken: nothing to leave cleanly


def main() -> None:
    faulthandler.dump_traceback_later(150, exit=True)  # a hang past the test's own bound ends with the stacks
    mode, out = sys.argv[1], Path(sys.argv[2])
    {"hook": hook, "helpers": helpers}[mode](out)


if __name__ == "__main__":
    main()
