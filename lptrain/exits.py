"""Exit codes of lptrain's commands, stated once so that scripts and sweeps can tell causes apart.

Every error a user can cause, or that a peer's death causes, ends the process with one
line on stderr naming the cause (the file, the key, the peer and the operation) and one
of these codes. Nothing lptrain did not create is deleted, and nothing half-written is
left behind (checkpoints are written to a temporary file and renamed).

=====  =====================================================================================
code   meaning
=====  =====================================================================================
0      done, or nothing to do (a finished run resumed)
1      a bug: an unexpected exception, with its traceback
2      a bad configuration or input (a key, a value, a data file, a checkpoint, a run folder,
       a batch or message larger than the memory)
3      a collective across processes failed: a peer died, stalled past the timeout, desynced
4      the run's files could not be written (disk full, read-only file system); the line
       names the file
5      lptrain-cluster: this host cannot carry the emulated cluster asked for (below fidelity)
6      the training diverged: a step's loss or averaged gradient is not finite (the last finite
       checkpoint is kept; none of non-finite weights is written)
130    stopped by Ctrl-C (SIGINT); 143 by SIGTERM: after the checkpoint was written (a second
       Ctrl-C stops at once, unsaved: 130). lptrain-cluster passes the first on to every
       worker and exits so once they have saved, or its --stop-grace has run out
141    the reader of stdout (or stderr) closed it, as ``| head`` does: stopped quietly, with
       the code a program killed by SIGPIPE has, so ``set -o pipefail`` reads it the same
=====  =====================================================================================

A sweep (``lptrain -m``) runs every job even when some fail, reports each failed job in
one line, and exits with the code of its first failed job.
"""

from __future__ import annotations

import functools
import os
import select
import sys
from collections.abc import Callable
from typing import TypeVar

EXIT_OK = 0
EXIT_BUG = 1  # an unexpected exception: its traceback is printed
EXIT_USAGE = 2  # a bad configuration or input
EXIT_PEER_FAILED = 3  # a collective across processes failed (a peer died, stalled or desynced)
EXIT_WRITE_FAILED = 4  # the run's files could not be written
EXIT_LOW_FIDELITY = 5  # lptrain-cluster: the host cannot carry the links asked for (its fidelity check)
# The configuration was valid and the machine worked, but the numbers did not: a sweep over
# learning rates tells a diverged job from a bad key (2) or a bug (1) by this code.
EXIT_DIVERGED = 6
EXIT_TIMEOUT = 124  # lptrain-cluster: the command ran past --timeout (as timeout(1) says it)
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM
EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE: the reader of stdout closed it (`lptrain-sim predict | head`)

Main = TypeVar("Main", bound=Callable)


def reader_gone(fd: int) -> bool:
    """Whether ``fd`` is the writing end of a pipe (or socket) whose reader has closed it:
    poll reports an error there, and nothing else written to it can arrive."""
    try:
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError):
        return False


def end_if_reader_gone(err: BrokenPipeError) -> None:
    """End the process quietly with EXIT_PIPE_CLOSED when ``err`` came from stdout or stderr,
    whose reader has gone (``| head`` has what it wanted); return when it did not (a pipe of
    the program's own: a peer, a child; the caller raises it again).

    The closed streams are pointed at /dev/null first, so that nothing written later
    fails again, the interpreter's own flush of stdout at exit included (which would print
    "Exception ignored ... BrokenPipeError" and exit with 120)."""
    gone = [s for s in (sys.__stdout__, sys.__stderr__) if s is not None and reader_gone(_fileno(s))]
    if not gone:
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in gone:
        os.dup2(devnull, _fileno(stream))
    os.close(devnull)
    raise SystemExit(EXIT_PIPE_CLOSED) from err


def _fileno(stream) -> int:
    try:
        return stream.fileno()
    except (OSError, ValueError):
        return -1


def quiet_on_closed_pipe(main: Main) -> Main:
    """Every console script's ``main``, made to end quietly on a closed pipe: what it
    printed is flushed before it returns (or exits), and a BrokenPipeError from its stdout
    or stderr ends it with EXIT_PIPE_CLOSED and no traceback. Python ignores SIGPIPE, so
    without this ``| head`` ends in a traceback and exit code 1 (a bug, by the table above);
    restoring SIGPIPE instead would also kill a process on a peer's closed socket, which
    the failure policy reports as exit code 3."""

    @functools.wraps(main)
    def command(*args, **kwargs):
        try:
            try:
                result = main(*args, **kwargs)
            except SystemExit:
                sys.stdout.flush()
                raise
            sys.stdout.flush()
            return result
        except BrokenPipeError as err:
            end_if_reader_gone(err)
            raise

    return command  # type: ignore[return-value]
