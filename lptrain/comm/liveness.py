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

It costs one small store write and one read of the others' heartbeats per process per
second, and a few seconds of watching only after a failure. The store is used from two
threads: c10d's stores serialise their operations, and this module's own accesses go
through one lock besides.

The store itself lives in one process: rank 0's when the ranks were started by hand from
the environment (``MASTER_ADDR``/``MASTER_PORT``, RANK, WORLD_SIZE), torchrun's agent under
torchrun. When that process is gone the store stops answering, which names its host: rank 0
(``store_host``). The heartbeats use their own connection to the store with a short timeout
(``STORE_TIMEOUT_S``), so a stopped host costs seconds, not the group's timeout; and PyTorch's
store client, which writes a warning with a C++ stack for every failed call, is kept quiet
during them (``quiet_cpp_warnings``): the failure is reported once, in the caller's line.
"""

from __future__ import annotations

import atexit
import datetime
import os
import threading
import time
from dataclasses import dataclass

import torch.distributed as dist

from lptrain.comm.cpp_log import quiet_cpp_warnings

HEARTBEAT_S = 1.0  # one store write a second per process
STALE_S = 4.0  # a heartbeat unchanged this long (four beats missed) is a rank that stopped
STORE_TIMEOUT_S = 5.0  # a store call of the heartbeats' unanswered this long: its host stopped
STORE_HOST = "the store's host"


@dataclass(frozen=True)
class Silent:
    """A rank whose heartbeat stopped; ``age_s`` since its last one (None: never seen)."""

    rank: int
    age_s: float | None
    role: str = ""  # STORE_HOST: named because the store it hosts stopped answering

    def describe(self) -> str:
        who = f"rank {self.rank} ({self.role})" if self.role else f"rank {self.rank}"
        if self.age_s is None:
            return f"{who} stopped answering (no heartbeat seen)"
        return f"{who} stopped answering (last heartbeat {self.age_s:.0f} s ago)"


def _underlying(store):
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store


def store_host(store) -> int | None:
    """The rank whose process hosts ``store``: rank 0 for a TCPStore made from the environment
    or a ``tcp://`` address (its server runs in rank 0); None under torchrun, whose agent hosts
    it, and for a file store, which no process hosts."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        return None
    return 0 if isinstance(_underlying(store), dist.TCPStore) else None


def own_connection(store):
    """A connection of the heartbeats' own to ``store``, whose calls give up after
    ``STORE_TIMEOUT_S`` (the group's own connection keeps the group's timeout); ``store``
    itself where it cannot be cloned."""
    try:
        clone = store.clone()
        clone.set_timeout(datetime.timedelta(seconds=STORE_TIMEOUT_S))
        return clone
    except Exception:  # noqa: BLE001 - a store without clone: the group's own connection
        return store


def _prefix() -> str:
    # A torchrun restart builds a new group on the same agent store: start from clean keys.
    return f"lptrain/liveness/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"


class Heartbeat:
    """This process's heartbeat in ``store`` (``rank`` of ``world``), and the watch after a failure."""

    def __init__(self, store, rank: int, world: int, interval_s: float = HEARTBEAT_S, host: int | None = None) -> None:
        self.store, self.rank, self.world, self.interval_s = store, rank, world, interval_s
        self.host = host  # the rank whose process hosts the store (store_host), if one does
        self.prefix = _prefix()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen_lock = threading.Lock()
        self._seen: dict[int, str] = {}  # each peer's last heartbeat value seen ...
        self._changed: dict[int, float] = {}  # ... and when it changed (this process's monotonic clock)
        self._observed: float | None = None  # the last successful look
        self._all_seen = False

    def _key(self, kind: str, rank: int) -> str:
        return f"{self.prefix}{kind}/{rank}"

    def _beat(self) -> bool:
        try:
            with self._lock, quiet_cpp_warnings():
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
            try:
                self._observe()
            except Exception:
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
        found = {}
        with self._lock, quiet_cpp_warnings():
            for r in ranks:
                key = self._key(kind, r)
                if self.store.check([key]):
                    found[r] = self.store.get(key).decode()
        return found

    def _observe(self) -> None:
        """Read every peer's heartbeat (one round trip once all exist) and note, on this
        process's clock, when each last changed. Kept between failures, it answers even when
        the store's host is gone by the time this rank looks (another node's agent may end
        as soon as its worker does)."""
        others = [r for r in range(self.world) if r != self.rank]
        keys = [self._key("beat", r) for r in others]
        with self._lock, quiet_cpp_warnings():
            if not self._all_seen and not self.store.check(keys):
                values = None
            else:
                self._all_seen = True
                values = [v.decode() for v in self.store.multi_get(keys)]
        if values is None:
            self._note(self._read("beat", others))
        else:
            self._note(dict(zip(others, values)))

    def _note(self, beats: dict[int, str]) -> None:
        now = time.monotonic()
        with self._seen_lock:
            for r, value in beats.items():
                if self._seen.get(r) != value:
                    self._seen[r], self._changed[r] = value, now
            self._observed = now

    def silent_peers(self, watch_s: float = STALE_S, reason: str = "") -> list[Silent]:
        """After a failure: mark this rank failing, then watch the others' heartbeats for up
        to ``watch_s``: the ranks whose heartbeat has not changed for ``watch_s`` and that did
        not mark themselves failing. When the store stops answering, what was observed so far
        decides."""
        others = [r for r in range(self.world) if r != self.rank]
        began = time.monotonic()
        failing: set[int] = set()
        said: set[int] = set()
        try:
            with self._lock, quiet_cpp_warnings():
                self.store.set(self._key("failing", self.rank), reason or "failing")
            self._observe()  # what the store holds now: a dead rank's last beat is among it
            with self._seen_lock:
                at_failure = dict(self._seen)
            while True:
                failing |= set(self._read("failing", others))
                self._observe()
                now = time.monotonic()
                stale = {r for r in others if now - self._changed.get(r, began) >= watch_s}
                fresh = {r for r in others if self._seen.get(r) != at_failure.get(r)}  # beat since the failure
                undecided = [r for r in others if r not in stale | fresh | failing]
                # A survivor that watched longer already said who stopped: take its word for the
                # ranks that have not beaten here since the failure either (all end sooner).
                said |= {int(r) for text in self._read("silent", others).values() for r in text.split(",") if r}
                if not undecided or set(undecided) <= said or now - began >= watch_s:
                    break
                time.sleep(min(self.interval_s / 2, 0.5))
            silent = sorted((stale | set(undecided)) - fresh - failing)
            if silent:
                with self._lock, quiet_cpp_warnings():
                    self.store.set(self._key("silent", self.rank), ",".join(map(str, silent)))
        except Exception:  # the store went away: its host stopped, or decide on what was seen until then
            if self.host is not None and self.host != self.rank:
                return [self._silent(self.host, STORE_HOST)]
            seen_until = self._observed if self._observed is not None else began
            silent = sorted(
                r for r in others
                if r in self._changed and r not in failing and seen_until - self._changed[r] >= watch_s
            )  # fmt: skip
        return [self._silent(r) for r in silent]

    def _silent(self, rank: int, role: str = "") -> Silent:
        seen = self._seen.get(rank)
        return Silent(rank, max(0.0, time.time() - float(seen)) if seen is not None else None, role)


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
        _current = Heartbeat(own_connection(store), dist.get_rank(), dist.get_world_size(), host=store_host(store))
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
