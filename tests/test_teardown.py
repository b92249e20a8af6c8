"""lptrain's own process group ends gloo's threads when it is left, whatever was imported
after it was joined: a thread of gloo's still alive when the interpreter finalizes can abort
the process ("terminate called without an active exception"; exit_threads/sitecustomize.py).

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_leaving_the_group_ends_gloos_threads_even_with_torch_distributed_nn_imported_after_joining():
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    run = subprocess.run([sys.executable, "-c", JOIN_AND_LEAVE], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    threads = run.stdout.split()
    assert threads, run.stdout
    assert not [t for t in threads if "gloo" in t], f"gloo's threads alive after leaving the group: {threads}"
