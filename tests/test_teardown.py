"""A process group ends gloo's threads when it is left, whatever was imported after it was
joined, for lptrain's own group and for a DDP script that imports lptrain.ddp: a thread of
gloo's still alive when the interpreter finalizes can abort the process ("terminate called
without an active exception"; exit_threads/sitecustomize.py).

The examples' torchrun test checks the examples the same way (tests/test_ddp_examples.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

# One process, a group of one, joined and left as the trainer and lptrain-bench do. Between
# the two it imports torch.distributed.nn, as torch.optim's first optimizer does: that module
# takes group.WORLD as a default argument when first imported, and so held the group (and
# gloo's threads) past destroy_process_group when it came after the group.
JOIN_AND_LEAVE = """
import glob
import torch
from lptrain.train import launch
launch.join_default_group(torch.device("cpu"))
import torch.distributed.nn
launch.finish()
print(" ".join(sorted(open(p).read().strip() for p in glob.glob("/proc/self/task/*/comm"))))
"""

# A user's DDP script that imports lptrain.ddp at its top, as examples/ddp_hook.py does, and
# builds its optimizer (which imports torch.distributed.nn) once the group exists.
DDP_SCRIPT = """
import glob
import torch
import torch.distributed as dist
import lptrain.ddp
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2))
model.register_comm_hook(lptrain.ddp.state(algo="ring"), lptrain.ddp.hook)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.ones(4, 3)).sum().backward()
opt.step()
dist.destroy_process_group()
del model, opt
print(" ".join(sorted(open(p).read().strip() for p in glob.glob("/proc/self/task/*/comm"))))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def threads_left(code: str) -> list[str]:
    """The names of the threads a one-process group's script has once it has left the group."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split(), run.stdout
    return run.stdout.split()


def test_leaving_the_group_ends_gloos_threads_even_with_torch_distributed_nn_imported_after_joining():
    threads = threads_left(JOIN_AND_LEAVE)
    assert not [t for t in threads if "gloo" in t], f"gloo's threads alive after leaving the group: {threads}"


def test_a_ddp_script_that_imports_lptrain_ddp_ends_gloos_threads_with_its_group():
    threads = threads_left(DDP_SCRIPT)
    assert not [t for t in threads if "gloo" in t], f"gloo's threads alive after destroy_process_group: {threads}"
