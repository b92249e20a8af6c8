"""The threads a process still has when the interpreter starts to finalize, written down.

Python imports ``sitecustomize`` at start-up from its path, so a test puts this folder on
PYTHONPATH to watch a command it runs unchanged. With LPTRAIN_EXIT_THREADS set to a folder,
each process registers an atexit handler here, before the command registers any, so it runs
last of them: right before the interpreter finalizes. It writes the names of the process's
threads (``/proc/self/task/*/comm``, one a line) to ``RANK-PID.txt`` in that folder (``-``
for a process that torchrun did not start).

A thread of gloo's (``gloo_tcp_loop``, ``pt_gloo_runloop``) alive at that point can take the
GIL while the interpreter finalizes; on Python 3.11 such a thread is ended with pthread_exit,
whose unwinding through C++ aborts the process ("terminate called without an active
exception": CPython gh-87135, pybind11#2215). The abort is rare and the threads are there on
every run, so tests check the threads."""

import atexit
import glob
import os


def _threads() -> list[str]:
    names = []
    for comm in glob.glob("/proc/self/task/*/comm"):
        try:
            with open(comm) as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended while it was being listed
            pass
    return sorted(names)


def _write() -> None:
    folder = os.environ["LPTRAIN_EXIT_THREADS"]
    name = f"{os.environ.get('RANK', '-')}-{os.getpid()}.txt"
    with open(os.path.join(folder, name), "w") as f:
        f.write("".join(f"{thread}\n" for thread in _threads()))


if os.environ.get("LPTRAIN_EXIT_THREADS"):
    atexit.register(_write)
