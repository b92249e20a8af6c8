"""A communication thread that is slow to take each bucket, and a torchrun worker that trains with it.

The trainer's overlap hands every ready bucket to a communication thread and waits for
that thread's result. Waking the thread and taking its result back cost time (on a busy
machine, milliseconds: the operating system's scheduling, Python's GIL) during which no
collective runs. ``slow_handoff(delay_s)`` makes that cost large and certain: the thread
sleeps ``delay_s`` each time it has found a bucket ready, before running the collective.
A step then waits at least ``delay_s`` for a thread that runs nothing, and the figures
must show it as the hand-off, not as communication.

Under torchrun (tests/test_comm_times.py):

    torchrun --standalone --nproc-per-node 2 tests/handoff_worker.py RUN_ROOT DELAY_S

trains the small network for a few steps four times (overlap off and on, one bucket and
several), each run writing RUN_ROOT/<name>/steps.jsonl from rank 0.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from lptrain.train import overlap

# (name, overrides): overlap off and on, one bucket (the CPU's default) and several.
RUNS = {
    "serial-one": ["trainer.overlap=false"],
    "serial-several": ["trainer.overlap=false", "trainer.bucket_mb=0.05"],
    "overlap-one": ["trainer.overlap=true"],
    "overlap-several": ["trainer.overlap=true", "trainer.bucket_mb=0.05"],
}
QUIET = ["trainer.progress=false", "trainer.tensorboard=false", "trainer.checkpoint_every=0", "trainer.eval_every=0"]


class _SlowCondition(threading.Condition):
    """A condition whose ``wait_for`` returns ``delay_s`` late on the communication thread."""

    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.delay_s = delay_s

    def wait_for(self, predicate, timeout=None):
        result = super().wait_for(predicate, timeout)
        if threading.current_thread().name == "lptrain-comm":
            self.release()  # the hooks of backward still take the lock meanwhile
            try:
                time.sleep(self.delay_s)
            finally:
                self.acquire()
        return result


@contextlib.contextmanager
def slow_handoff(delay_s: float) -> Iterator[None]:
    """Every ``OverlappedReduction`` built inside takes each ready bucket ``delay_s`` late."""
    original = overlap.OverlappedReduction.__init__

    def init(self, *args, **kwargs) -> None:
        original(self, *args, **kwargs)
        self._cond = _SlowCondition(delay_s)

    overlap.OverlappedReduction.__init__ = init
    try:
        yield
    finally:
        overlap.OverlappedReduction.__init__ = original


def main(root: Path, delay_s: float) -> None:
    from lptrain.settings.locations import compose_config
    from lptrain.train.launch import finish
    from lptrain.train.trainer import Trainer

    small = ["trainer.devices=cpu*1", "trainer.steps=4", "trainer.batch_per_device=8", *QUIET]
    with slow_handoff(delay_s):
        for name, overrides in RUNS.items():
            Trainer(compose_config([*small, *overrides]), root / name).fit()
    finish()


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]))
