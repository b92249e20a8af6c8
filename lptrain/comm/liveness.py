"""Which peer stopped answering: a heartbeat per rank in the process group's store.

When a collective across processes fails, a rank's own socket only tells it about the
peer it was talking to, and often not even that: a rank blocked on a live neighbour (which
is itself stuck behind the dead one) sees a timeout or a reset from the neighbour, not
from the rank that died. So every process writes a heartbeat, its wall-clock time, into
the key-value store the group was built on (torchrun's TCPStore, which its agent holds,
or a file store) once a second, from a daemon thread. A rank whose collective failed
marks itself as *failing* (it is alive and about to report), then watches the others'
heartbeats for a few seconds: a rank whose heartbeat does not move, and that has not
marked itself failing, is dead or stopped (SIGKILL, SIGSTOP, a pulled cable). Every
survivor reaches the same answer, whichever peer its own socket complained about.

It costs one small store write per process per second, and a few seconds of watching
only after a failure. The store is used from two threads: c10d's stores serialise their
operations, and this module's own accesses go through one lock besides.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from dataclasses import dataclass

import torch.distributed as dist

HEARTBEAT_S = 1.0  # one store write a second per process
STALE_S = 4.0  # a heartbeat unchanged this long (four beats missed) is a rank that stopped


@dataclass(frozen=True)
class Silent:
    """A rank whose heartbeat stopped; ``age_s`` since its last one (None: never seen)."""

    rank: int
    age_s: float | None

    def describe(self) -> str:
        if self.age_s is None:
            return f"rank {self.rank} stopped answering (no heartbeat seen)"
        return f"rank {self.rank} stopped answering (last heartbeat {self.age_s:.0f} s ago)"


def _prefix() -> str:
    # A torchrun restart builds a new group on the same agent store: start from clean keys.
    return f"lptrain/liveness/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"


class Heartbeat:
    """This process's heartbeat in ``store`` (``rank`` of ``world``), and the watch after a failure."""

    def __init__(self, store, rank: int, world: int, interval_s: float = HEARTBEAT_S) -> None:
        self.store, self.rank, self.world, self.interval_s = store, rank, world, interval_s
        self.prefix = _prefix()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _key(self, kind: str, rank: int) -> str:
        return f"{self.prefix}{kind}/{rank}"

    def _beat(self) -> bool:
        try:
            with self._lock:
                self.store.set(self._key("beat", self.rank), f"{time.time():.3f}")
            return True
        except Exception:  # the store is gone (its host died): nothing left to tell
            return False

    def start(self) -> None:
        if self._thread is not None:
            return
        self._beat()  # the first one now: a peer that fails early still finds it
        self._thread = threading.Thread(target=self._loop, name="lptrain-heartbeat", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self._beat():
                return

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _read(self, kind: str, ranks: list[int]) -> dict[int, str]:
        keys = [self._key(kind, r) for r in ranks]
        found = {}
        with self._lock:
            for r, key in zip(ranks, keys):
                if self.store.check([key]):
                    found[r] = self.store.get(key).decode()
        return found

    def silent_peers(self, watch_s: float = STALE_S, reason: str = "") -> list[Silent]:
        """After a failure: mark this rank failing, then watch the others' heartbeats for up
        to ``watch_s``; those that did not move and did not mark themselves failing. Empty
        when the store cannot be read (then nobody can be named)."""
        others = [r for r in range(self.world) if r != self.rank]
        try:
            with self._lock:
                self.store.set(self._key("failing", self.rank), reason or "failing")
            first = self._read("beat", others)
            began = time.monotonic()
            moved: set[int] = set()
            while True:
                failing = set(self._read("failing", others))
                now = self._read("beat", others)
                moved |= {r for r in others if r in now and now[r] != first.get(r)}
                undecided = [r for r in others if r not in moved and r not in failing]
                # A survivor that watched longer already said who stopped: take its word for
                # the ranks that have not moved here either (every survivor then ends sooner).
                said = {int(r) for text in self._read("silent", others).values() for r in text.split(",") if r}
                if not undecided or set(undecided) <= said or time.monotonic() - began >= watch_s:
                    break
                time.sleep(min(self.interval_s / 2, 0.5))
            if undecided:
                with self._lock:
                    self.store.set(self._key("silent", self.rank), ",".join(map(str, undecided)))
        except Exception:
            return []
        wall = time.time()
        return [Silent(r, max(0.0, wall - float(now[r])) if r in now else None) for r in undecided]


_current: Heartbeat | None = None
_guard = threading.Lock()


def default_store():
    """The store the default process group was built on, or None."""
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None


def start() -> Heartbeat | None:
    """This process's heartbeat in the default group's store (once; None without a group)."""
    global _current
    with _guard:
        if _current is not None and _current.running:
            return _current
        if not dist.is_initialized() or dist.get_world_size() < 2:
            return None
        store = default_store()
        if store is None:
            return None
        _current = Heartbeat(store, dist.get_rank(), dist.get_world_size())
        _current.start()
        return _current


def stop() -> None:
    """End the heartbeat (before the group is destroyed, and at exit): no thread left behind."""
    global _current
    with _guard:
        heartbeat, _current = _current, None
    if heartbeat is not None:
        heartbeat.stop()


def diagnose(reason: str = "") -> str:
    """After a failed collective: which ranks stopped answering, as one phrase ("" when none
    could be named). Waits up to ``STALE_S`` while watching."""
    heartbeat = _current
    if heartbeat is None:
        return ""
    silent = heartbeat.silent_peers(reason=reason)
    return "; ".join(s.describe() for s in silent)


atexit.register(stop)
