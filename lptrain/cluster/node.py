"""One node of an emulated cluster: torchrun's own launcher, quiet about itself.

``python -m lptrain.cluster.node TORCHRUN-ARGUMENTS`` runs exactly what ``torchrun``
runs (``torch.distributed.run.run``: the elastic agent, the static rendezvous, the
workers), with three differences that keep a cluster's output readable: the agent's own
log lines below ERROR are not printed; when a worker fails the node exits with that
worker's exit code (128 + the signal for a killed one) instead of printing torchrun's
traceback, since the worker has already said why it failed; and when the node is stopped
by a signal (which torchrun passes on to its workers, waiting for them), it exits with
128 + that signal, as the workers do, without a traceback. A node whose lptrain-cluster
is killed (SIGKILL, which it cannot pass on) gets SIGTERM from the kernel, and stops its
workers as on a SIGTERM.
"""

from __future__ import annotations

import logging
import os
import sys

from lptrain.train.parent import stop_with_launcher


def exit_code_of(failures: dict) -> int:
    """The first failed worker's exit code, in the shell's convention (128 + N for signal N)."""
    for failure in failures.values():
        code = getattr(failure, "exitcode", 1)
        if code:
            return 128 - code if code < 0 else code
    return 1


def main(argv: list[str] | None = None) -> None:
    stop_with_launcher()  # lptrain-cluster killed (SIGKILL): stop the workers as on its SIGTERM
    os.environ.setdefault("LOGLEVEL", "ERROR")  # torch.distributed.elastic's loggers read it
    logging.getLogger("torch.distributed.elastic").setLevel(logging.ERROR)
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(sys.argv[1:] if argv is None else argv))
    except ChildFailedError as err:
        sys.exit(exit_code_of(err.failures))
    except SignalException as err:  # the workers have been stopped (and waited for) already
        sys.exit(128 + int(err.sigval))


if __name__ == "__main__":
    main()
