"""A launched process stops when its launcher dies, as it does when its launcher is stopped:
a torchrun worker when torchrun dies, a cluster's node when lptrain-cluster dies.

Kept apart from ``launch.py`` (and from torch) so that it is cheap to import and to test.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent dies


def stop_with_launcher() -> None:
    """Have the kernel send this process SIGTERM when its parent (torchrun, for a worker;
    lptrain-cluster, for a node's torchrun) dies.

    torchrun starts each worker in a session of its own and passes a Ctrl-C or SIGTERM on
    to it, but a torchrun killed with SIGKILL passes nothing on: its workers would train
    on, orphaned, to the end of the run. With this a worker gets SIGTERM then, and stops as
    on a SIGTERM to torchrun: it finishes its step, rank 0 saves, and it exits with 143.
    Linux only; elsewhere nothing changes."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl to call: as before
        return
    if os.getppid() != parent:  # the launcher died before the request was made
        os.kill(os.getpid(), signal.SIGTERM)
