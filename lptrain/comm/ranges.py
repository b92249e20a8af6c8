"""Labels that torch.profiler shows: each collective and each trainer phase as a
``torch.profiler.record_function`` range.

A range costs a microsecond or two when no profiler is running, so they stay on in every
run; in a trace (``trainer.profile``, or a user's own ``torch.profiler.profile``) they say
which algorithm moved how many bytes of which bucket, and when, beside the autograd
operators of backward that the collectives overlap.
"""

from __future__ import annotations

from torch.profiler import record_function

PREFIX = "lptrain"


def collective_label(op: str, algorithm: str, nbytes: int, bucket: int | None = None) -> str:
    """``lptrain allreduce lp 25690112 B bucket 3``: op, algorithm, bytes and (where there is one) bucket."""
    label = f"{PREFIX} {op} {algorithm} {nbytes} B"
    return label if bucket is None else f"{label} bucket {bucket}"


def collective_range(op: str, algorithm: str, nbytes: int, bucket: int | None = None) -> record_function:
    """A profiler range around one collective (see ``collective_label``)."""
    return record_function(collective_label(op, algorithm, nbytes, bucket))


def phase_range(phase: str) -> record_function:
    """A profiler range around one phase of a training step: ``lptrain phase compute``."""
    return record_function(f"{PREFIX} phase {phase}")
