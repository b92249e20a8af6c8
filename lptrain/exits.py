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
2      a bad configuration or input (a key, a value, a data file, a checkpoint, a run folder)
3      a collective across processes failed: a peer died, stalled past the timeout, desynced
4      the run's files could not be written (disk full, read-only file system)
5      lptrain-cluster: this host cannot carry the emulated cluster asked for (below fidelity)
130    stopped by Ctrl-C (SIGINT); 143 by SIGTERM: after the checkpoint was written
=====  =====================================================================================

A sweep (``lptrain -m``) runs every job even when some fail, reports each failed job in
one line, and exits with the code of its first failed job.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_USAGE = 2  # a bad configuration or input
EXIT_PEER_FAILED = 3  # a collective across processes failed (a peer died, stalled or desynced)
EXIT_WRITE_FAILED = 4  # the run's files could not be written
EXIT_LOW_FIDELITY = 5  # lptrain-cluster: the host cannot carry the links asked for (its fidelity check)
EXIT_TIMEOUT = 124  # lptrain-cluster: the command ran past --timeout (as timeout(1) says it)
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM
