"""Run a script as ``__main__`` (``python threads_at_exit.py SCRIPT ARGS...``, under torchrun),
then print the communication threads of torch.distributed still alive when it has returned.

Why: a gloo worker thread still releasing a finished collective when the interpreter shuts
down takes the GIL after finalization began; Python then ends that thread with
pthread_exit, whose unwinding through C++ noexcept frames calls std::terminate
("terminate called without an active exception", exit -6). Whether it happens is a race
lost now and then; whether such a thread is alive when the script returns is not. A script
whose process group is destroyed (freed, its threads joined) before it returns leaves none,
and cannot abort that way."""

from __future__ import annotations

import os
import runpy
import sys

# The threads' names (torch and gloo name them): ProcessGroupGloo's workers, gloo's TCP
# event loop, and the TCPStore client's.
COMMUNICATION = ("pt_gloo_runloop", "gloo_tcp_loop", "pt_tcpstore")


def communication_threads() -> list[str]:
    names = []
    for tid in sorted(os.listdir("/proc/self/task")):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:  # a thread that ended meanwhile
            continue
        if name.startswith(COMMUNICATION):
            names.append(name)
    return names


if __name__ == "__main__":
    script, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
    print(f"rank {os.environ.get('RANK', '0')}: communication threads at exit: {communication_threads()}", flush=True)
