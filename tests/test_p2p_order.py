"""The point-to-point patterns lptrain issues, against a stand-in of NCCL's eager mode.

NCCL initialised eagerly (``init_process_group(device_id=...)``, as the trainer does)
runs every point-to-point operation posted on its own one after the other, on one
stream per rank; a batch (``batch_isend_irecv``) runs its operations together. A message
larger than NCCL's buffers moves only while both its send and its receive are running,
so an operation waits at the head of its rank's stream until its partner reaches the
head of the peer's. ``eager_nccl_deadlock`` plays that out on the sequences each rank
posts, recorded from lptrain's own code, and says where it would hang.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from test_dataflow import CASES, build  # tests/ is on the path: pyproject's pytest pythonpath

from lptrain.comm import transport
from lptrain.comm.dataflow import StagingPool, rank_program, run_batched_steps, run_program

Op = tuple[int, bool, int, int]  # (rank, send?, peer, n-th message of this direction)


def eager_nccl_deadlock(posted: dict[int, list[list[tuple[bool, int]]]]) -> str | None:
    """``posted[rank]``: that rank's entries in posting order, each a list of (send?, peer)
    (one operation, or a batch). None when every operation completes, else where it hangs."""
    entries: dict[int, list[list[Op]]] = {}
    for rank, seq in posted.items():
        seen: Counter = Counter()
        entries[rank] = []
        for entry in seq:
            ops = []
            for send, peer in entry:
                key = (send, peer)
                ops.append((rank, send, peer, seen[key]))
                seen[key] += 1
            entries[rank].append(ops)
    head = dict.fromkeys(entries, 0)
    done: set[Op] = set()

    def active(rank: int) -> list[Op]:
        return entries[rank][head[rank]] if head[rank] < len(entries[rank]) else []

    while True:
        moved = False
        for rank in entries:
            for op in active(rank):
                _, send, peer, n = op
                partner = (peer, not send, rank, n)
                if op not in done and partner in active(peer):
                    done.update((op, partner))
                    moved = True
        for rank in entries:
            if active(rank) and all(op in done for op in active(rank)):
                head[rank] += 1
                moved = True
        if all(head[r] == len(entries[r]) for r in entries):
            return None
        if not moved:
            stuck = {r: active(r) for r in entries if active(r)}
            return f"hangs with rank heads {stuck}"


def test_the_stand_in_catches_the_pattern_that_hangs_and_passes_the_batched_one():
    ring = {r: [[(False, (r - 1) % 3)], [(True, (r + 1) % 3)]] for r in range(3)}  # receive, then send
    assert eager_nccl_deadlock(ring) is not None
    batched = {r: [[(False, (r - 1) % 3), (True, (r + 1) % 3)]] for r in range(3)}
    assert eager_nccl_deadlock(batched) is None
    in_turn = {0: [[(True, 1)], [(False, 1)]], 1: [[(False, 0)], [(True, 0)]]}  # matched order
    assert eager_nccl_deadlock(in_turn) is None


def _recorded(schedule, batched: bool, segment: int = 4, window: int = 16) -> dict[int, list]:
    posted: dict[int, list] = {}
    for rank in range(schedule.world_size):
        seq: list = []
        common = {
            "wait": lambda handle, what: None,
            "pool": StagingPool(),
            "segment_bytes": segment * 4,
            "num_steps": schedule.num_steps,
        }
        program = rank_program(schedule, rank, segment)
        work = torch.zeros(schedule.count)
        if batched:

            def batch(ops, seq=seq):
                seq.append([(send, peer) for send, _, peer in ops])
                return [None] * len(ops)

            run_batched_steps(program, work, batch=batch, **common)
        else:

            def post(send: bool, seq=seq):
                return lambda buf, peer: seq.append([(send, peer)])

            run_program(program, work, isend=post(True), irecv=post(False), window=window, **common)
        posted[rank] = seq
    return posted


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("algo, op", CASES)
def test_each_step_as_one_batch_never_hangs_under_eager_nccl(algo, op, p):
    for count in (1, 7, 61):
        schedule = build(algo, op, p, count, (count + 1) % p)
        assert eager_nccl_deadlock(_recorded(schedule, batched=True)) is None, f"{algo} {op} P={p} n={count}"


def test_the_dataflow_posted_unbatched_would_hang_under_eager_nccl():
    """Why NCCL gets the batched steps: the dataflow posts receives ahead of its sends."""
    schedule = build("ring", "allreduce", 2, 61, None)
    assert eager_nccl_deadlock(_recorded(schedule, batched=False)) is not None


def _probe_posts(monkeypatch, world: int) -> dict[int, list]:
    """What transport._exchange posts on every rank of a ring of ``world``, recorded."""
    posted: dict[int, list] = {r: [] for r in range(world)}
    current = {"rank": 0}

    def fake_isend(*args, **kwargs):  # stands for dist.isend inside a P2POp
        raise AssertionError("a send posted on its own")

    def fake_irecv(*args, **kwargs):
        raise AssertionError("a receive posted on its own")

    class P2POp:
        def __init__(self, op, tensor, peer, group=None):
            self.send, self.peer = op is fake_isend, peer

    class Done:
        def wait(self, *timeout):
            return None

    def batch_isend_irecv(ops):
        posted[current["rank"]].append([(op.send, op.peer) for op in ops])
        return [Done() for _ in ops]

    monkeypatch.setattr(transport.dist, "P2POp", P2POp)
    monkeypatch.setattr(transport.dist, "isend", fake_isend)
    monkeypatch.setattr(transport.dist, "irecv", fake_irecv)
    monkeypatch.setattr(transport.dist, "batch_isend_irecv", batch_isend_irecv)
    monkeypatch.setattr(transport.dist, "get_global_rank", lambda group, r: r)
    for rank in range(world):
        current["rank"] = rank
        buf = torch.zeros(8, dtype=torch.uint8)
        transport._exchange(buf, torch.empty_like(buf), rank, world, None, None)
    return posted


@pytest.mark.parametrize("world", [2, 3, 5])
def test_the_link_probe_posts_each_exchange_as_one_batch(monkeypatch, world):
    """transport.measure_link's exchange, recorded on every rank of a ring."""
    posted = _probe_posts(monkeypatch, world)
    assert all(len(seq) == 1 for seq in posted.values())
    assert eager_nccl_deadlock(posted) is None
