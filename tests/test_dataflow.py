"""The dataflow executor (lptrain.comm.dataflow) against lock-step execution of the same schedule.

Each rank runs in a thread over an in-memory transport that matches sends and receives
per pair in posting order and reads a send's buffer only when the receive is there (as
gloo does), so a rank that wrote into elements still being sent, or applied receives out
of order, gives a different result. Every algorithm, op, root, odd sizes, segments down
to one element and windows down to one receive: the result must be bitwise the lock-step
one, and that one the plain sum.
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque

import pytest
import torch

from lptrain.comm.algorithms import MODULES, SCHEDULES, WITH_VARIANTS, be, issue_order, issue_orders, lp, mst, ring
from lptrain.comm.dataflow import Profile, StagingPool, rank_program, run_program
from lptrain.comm.schedule import Kind, Schedule


class Message:
    """One send matched (or to be matched) with one receive; the bytes move in ``finish``."""

    def __init__(self) -> None:
        self.source: torch.Tensor | None = None
        self.target: torch.Tensor | None = None
        self.matched = threading.Event()
        self.lock = threading.Lock()
        self.moved = False

    def finish(self, what: str) -> None:
        if not self.matched.wait(10):
            raise TimeoutError(f"deadlock: {what}")
        with self.lock:
            if not self.moved:
                self.target.copy_(self.source)
                self.moved = True


class Loopback:
    """Point-to-point messages between threads, matched per pair in posting order.

    ``eager``: the bytes move the moment a send meets its receive (a send's buffer is read
    then, not when it was posted). ``lazy``: only when one side waits, as a transport may
    do: a send is complete only once waited for, so writing into its elements before that
    corrupts it.
    """

    def __init__(self, lazy: bool) -> None:
        self.lazy = lazy
        self.lock = threading.Lock()
        self.queues: dict[tuple[int, int], deque] = defaultdict(deque)  # unmatched messages of a pair

    def _post(self, src: int, dst: int, buf: torch.Tensor, sending: bool) -> Message:
        with self.lock:
            queue = self.queues[(src, dst)]
            if queue and (queue[0].source is None) == sending:  # the other side is waiting
                message = queue.popleft()
            else:
                message = Message()
                queue.append(message)
            if sending:
                message.source = buf
            else:
                message.target = buf
            if message.source is not None and message.target is not None:
                message.matched.set()
                if not self.lazy:
                    message.finish("")
        return message

    def isend(self, src: int, buf: torch.Tensor, dst: int) -> Message:
        return self._post(src, dst, buf, True)

    def irecv(self, dst: int, buf: torch.Tensor, src: int) -> Message:
        return self._post(src, dst, buf, False)


def wait(handle: Message, what: str) -> None:
    handle.finish(what)


def run_dataflow(
    schedule: Schedule,
    inputs: list[torch.Tensor],
    segment: int,
    window: int,
    lazy: bool = False,
    profiles: list[Profile] | None = None,
    order: str = "eager",
    stage_ahead: bool = True,
) -> list[torch.Tensor]:
    net = Loopback(lazy)
    work = [x.clone() for x in inputs]
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            run_program(
                rank_program(schedule, r, segment),
                work[r],
                isend=lambda buf, peer: net.isend(r, buf, peer),
                irecv=lambda buf, peer: net.irecv(r, buf, peer),
                wait=wait,
                pool=StagingPool(),
                segment_bytes=segment * work[r].element_size(),
                window=window,
                num_steps=schedule.num_steps,
                profile=profiles[r] if profiles else None,
                order=order,
                stage_ahead=stage_ahead,
            )
        except BaseException as err:  # reported by the test thread
            errors.append(err)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(schedule.world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors[0]
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return work


def lockstep(schedule: Schedule, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """The reference: a step's transfers read the values from before it, then apply in order."""
    work = [x.clone() for x in inputs]
    for step in schedule.steps:
        moved = [(t, work[t.src][t.start : t.stop].clone()) for t in step]
        for t, data in moved:
            if t.kind is Kind.COPY:
                work[t.dst][t.start : t.stop] = data
            else:
                work[t.dst][t.start : t.stop] += data
    return work


def build(algo: str, op: str, p: int, count: int, root: int) -> Schedule:
    if algo == "lp":
        return lp.allreduce(p, count, block=5) if op == "allreduce" else getattr(lp, op)(p, count, root, block=5)
    if algo == "lp-rb":
        return lp.allreduce(p, count, block=5, mode="reduce_broadcast")
    module = MODULES[algo]
    return module.allreduce(p, count) if op == "allreduce" else getattr(module, op)(p, count, root)


CASES = [(a, "allreduce") for a in WITH_VARIANTS] + [(a, op) for a in SCHEDULES for op in ("broadcast", "reduce")]


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("segment, window", [(1, 1), (3, 2), (4, 16), (1000, 4)])
@pytest.mark.parametrize("p", [2, 3, 5, 8])
@pytest.mark.parametrize("algo, op", CASES)
def test_dataflow_equals_lockstep_bitwise(algo, op, p, segment, window, lazy):
    for count in (1, 7, 61):
        root = (count + p) % p if op != "allreduce" else None
        schedule = build(algo, op, p, count, root)
        g = torch.Generator().manual_seed(count * 31 + p)
        inputs = [torch.randn(count, generator=g, dtype=torch.float64).float() for _ in range(p)]
        want = lockstep(schedule, inputs)
        got = run_dataflow(schedule, inputs, segment, window, lazy)
        for r in range(p):
            assert torch.equal(got[r], want[r]), f"{algo} {op} P={p} count={count} rank {r}"
        total = torch.stack([x.double() for x in inputs]).sum(0)
        holders = range(p) if op == "allreduce" else [root]
        for r in holders if op != "broadcast" else range(p):
            expected = inputs[root].double() if op == "broadcast" else total
            assert torch.allclose(got[r].double(), expected, atol=1e-4), f"{algo} {op}: not the plain result"


def _case(algo: str, op: str, p: int, count: int, seed: int) -> tuple[Schedule, list[torch.Tensor], list[torch.Tensor]]:
    """A schedule (its root from the count), random inputs and the lock-step result."""
    root = (count + p) % p if op != "allreduce" else None
    schedule = build(algo, op, p, count, root)
    g = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(count, generator=g, dtype=torch.float64).float() for _ in range(p)]
    return schedule, inputs, lockstep(schedule, inputs)


@pytest.mark.parametrize("order", ["ports", "steps", "phases"])
@pytest.mark.parametrize("p", [3, 4, 8])
@pytest.mark.parametrize("algo, op", CASES)
def test_every_issue_order_gives_the_lockstep_result_bitwise(algo, op, p, order):
    """Waiting for earlier steps (ports, steps) changes when messages go, never what is added."""
    for count, segment, window in ((7, 1, 2), (61, 3, 16), (61, 1000, 4)):
        schedule, inputs, want = _case(algo, op, p, count, seed=count * 17 + p)
        for lazy in (False, True):
            got = run_dataflow(schedule, inputs, segment, window, lazy, order=order)
            assert all(torch.equal(a, b) for a, b in zip(got, want)), f"{algo} {op} P={p} {order} count={count}"


@pytest.mark.parametrize("p", [3, 4, 8])
@pytest.mark.parametrize("algo, op", CASES)
def test_without_staging_ahead_copies_land_in_place_and_the_result_is_the_lockstep_one(algo, op, p):
    """On a fast link (``stage_ahead=False``) a copying receive that cannot land in place yet is
    posted in place when its turn comes instead of ahead into a staging slot: on loopback
    with 4 processes on 2 cores, the ring's copy out of the slot was 3 of its 18 4 MiB
    memory passes per rank at 16 MiB and cost 10 to 15% more CPU than gloo's allreduce.
    What is added and in what order is unchanged, under the algorithm's own issue order;
    only the copies that the schedule itself cannot land in place (a send of the same step
    reads their elements) are staged."""
    order = issue_order(algo, op)
    for count, segment, window in ((7, 1, 2), (61, 3, 16), (61, 1000, 4)):
        schedule, inputs, want = _case(algo, op, p, count, seed=count * 13 + p)
        for lazy in (False, True):
            profiles = [Profile() for _ in range(p)]
            got = run_dataflow(schedule, inputs, segment, window, lazy, profiles, order=order, stage_ahead=False)
            assert all(torch.equal(a, b) for a, b in zip(got, want)), f"{algo} {op} P={p} count={count}"
            for r in range(p):
                clashing = sum(1 for a in rank_program(schedule, r, segment)
                               if not a.send and a.kind is Kind.COPY and not a.in_place)  # fmt: skip
                assert profiles[r].staged_copies == clashing, f"{algo} {op} P={p} count={count} rank {r}"


def test_staging_ahead_is_what_stages_the_rings_allgather():
    """The counterpart: with receives staged ahead (slow links), the ring's allgather copies
    go through staging slots, so the count above is not zero by construction."""
    p, count = 4, 64
    schedule = ring.allreduce(p, count)
    inputs = [torch.full((count,), float(r)) for r in range(p)]
    staged = {}
    for ahead in (True, False):
        profiles = [Profile() for _ in range(p)]
        run_dataflow(schedule, inputs, count // p, 16, False, profiles, stage_ahead=ahead)
        staged[ahead] = [prof.staged_copies for prof in profiles]
    assert staged[False] == [0] * p and all(n > 0 for n in staged[True]), staged


def test_the_algorithms_choose_an_issue_order_the_executor_knows():
    from lptrain.comm.dataflow import ISSUE_ORDERS
    from lptrain.comm.schedule import OPS

    for m in (lp, mst, be, ring):
        assert set(m.ISSUE_ORDER) == set(OPS) and set(m.ISSUE_ORDER.values()) <= set(ISSUE_ORDERS), m.NAME
    for algo in WITH_VARIANTS:  # a variant's order too (lp-rb: phases)
        assert set(issue_orders(algo)) == set(OPS) and set(issue_orders(algo).values()) <= set(ISSUE_ORDERS), algo
    with pytest.raises(ValueError, match="unknown issue order"):
        run_program((), torch.zeros(1), isend=None, irecv=None, wait=None, pool=StagingPool(), segment_bytes=4,
                    window=1, num_steps=0, order="sideways")  # fmt: skip


def hand_made(p: int, steps: list[list[tuple[int, int, int, int, Kind]]], count: int = 8) -> Schedule:
    from lptrain.comm.schedule import Transfer

    return Schedule("broadcast", "hand-made", p, count, 0, tuple(tuple(Transfer(*t) for t in s) for s in steps))


C, R = Kind.COPY, Kind.REDUCE
HAZARDS = {
    # rank 0 sends [0,4) at step 1, then receives new values into it at step 2: a receive posted
    # ahead in place would overwrite them before the send reads them
    "copy over a range still to be sent": [[(2, 0, 4, 8, R)], [(0, 1, 0, 4, C)], [(2, 0, 0, 4, C)]],
    # rank 0 sends [0,4) and then adds into it: the add must wait until the send is done
    "add into a range still being sent": [[(0, 1, 0, 4, C)], [(2, 0, 0, 4, R)], [(1, 2, 0, 4, C)]],
    # a send and a receive of the same elements in one step: the send carries the old values
    "send and receive one range in a step": [[(0, 1, 0, 4, C), (1, 0, 0, 4, R)], [(1, 2, 0, 8, C)]],
    # two ranks swap a range in one step: received in place, each would wait for the other
    "swap a range in a step": [[(0, 1, 0, 4, C), (1, 0, 0, 4, C)], [(0, 2, 0, 8, C)]],
    # two adds into one range in one step: applied in the schedule's order
    "two adds in a step": [[(1, 0, 0, 8, R), (2, 0, 0, 8, R)], [(0, 1, 0, 8, C)]],
}


@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
@pytest.mark.parametrize("window", [1, 16])
@pytest.mark.parametrize("hazard", list(HAZARDS))
def test_the_order_hazards_of_hand_made_schedules(hazard, window, lazy):
    schedule = hand_made(3, HAZARDS[hazard])
    inputs = [torch.arange(8, dtype=torch.float32) * (10**r) + 0.25 * r for r in range(3)]
    for segment in (1, 3, 8):
        got = run_dataflow(schedule, inputs, segment, window, lazy)
        want = lockstep(schedule, inputs)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), f"{hazard}, segment {segment}"


def test_a_program_cuts_transfers_into_segments_with_sends_first():
    schedule = ring.allreduce(3, 10)
    program = rank_program(schedule, 1, 2)
    for step in range(schedule.num_steps):
        mine = [a for a in program if a.step == step]
        kinds = [a.send for a in mine]
        assert kinds == sorted(kinds, reverse=True), "sends come before receives within a step"
        assert all(a.stop - a.start <= 2 for a in mine)
    sent = sorted((a.start, a.stop) for a in program if a.send and a.step == 0)
    whole = [(t.start, t.stop) for t in schedule.steps[0] if t.src == 1]
    assert sent[0][0] == whole[0][0] and sent[-1][1] == whole[0][1]
    with pytest.raises(ValueError, match="at least 1 element"):
        rank_program(schedule, 0, 0)


def test_staging_buffers_are_reused_from_call_to_call():
    pool = StagingPool()
    first = pool.take(torch.device("cpu"), 64)
    pool.give(torch.device("cpu"), first)
    assert pool.take(torch.device("cpu"), 64) is first
    assert pool.take(torch.device("cpu"), 64) is not first
    pool.give(torch.device("cpu"), first)
    assert pool.take(torch.device("cpu"), 16) is first  # a larger buffer serves a smaller segment
    pool.give(torch.device("cpu"), first)
    bigger = pool.take(torch.device("cpu"), 128)  # too small: dropped, not kept beside the new one
    assert bigger.numel() == 128 and pool._free[torch.device("cpu")] == []


def test_the_profile_accounts_for_every_call_and_message():
    schedule = ring.allreduce(3, 300)
    profiles = [Profile() for _ in range(3)]
    inputs = [torch.ones(300) for _ in range(3)]
    run_dataflow(schedule, inputs, 7, 4, profiles=profiles)
    run_dataflow(schedule, inputs, 7, 4, profiles=profiles)
    for r, prof in enumerate(profiles):
        assert prof.calls == 2 and prof.messages == 2 * len(rank_program(schedule, r, 7))
        assert prof.waits == prof.messages and prof.paced == 0  # each handle waited for once; nothing paced
        assert 0 <= prof.wait_s + prof.post_s + prof.apply_s <= prof.total_s
        assert "ms per call" in prof.describe()
    assert Profile().describe() == "no calls"


def _sends_with_too_few_receives_ahead(program: tuple, count: int, segment: int, window: int, steps: int) -> list[str]:
    """Run ``program`` over a recording transport; at each send, how far the receives were posted."""
    receives = sum(not a.send for a in program)
    events: list[str] = []
    short: list[str] = []

    def isend(buf, peer):
        outstanding = events.count("recv") - events.count("done")
        posted = events.count("recv")
        if not (outstanding >= window or posted == receives):
            short.append(f"a send with {outstanding} receives posted ahead ({posted} of {receives}, window {window})")
        events.append("send")
        return ("send",)

    def irecv(buf, peer):
        events.append("recv")
        return ("recv",)

    def done(handle, what):
        if handle[0] == "recv":
            events.append("done")

    run_program(
        program,
        torch.zeros(count),
        isend=isend,
        irecv=irecv,
        wait=done,
        pool=StagingPool(),
        segment_bytes=segment * 4,
        window=window,
        num_steps=steps,
    )
    assert events.count("recv") == receives
    return short


@pytest.mark.parametrize("window", [2, 16])
@pytest.mark.parametrize("algo, op", CASES)
def test_the_window_of_receives_is_full_whenever_a_send_is_issued(algo, op, window):
    """Gloo moves a message only after the receiver's notice that its receive is posted, and
    the notice queues behind the receiver's own outgoing bytes: a receive posted after a send
    reaches the peer a whole message late, and the link's two directions take turns. So at
    every send, the receives are posted ahead as far as the window allows (staged if landing
    in place would have to wait), from the very first send of a call."""
    p, count, segment = 4, 61, 4
    schedule = build(algo, op, p, count, 1 if op != "allreduce" else None)
    for r in range(p):
        program = rank_program(schedule, r, segment)
        short = _sends_with_too_few_receives_ahead(program, count, segment, window, schedule.num_steps)
        assert not short, f"{algo} {op} rank {r}: {short[0]}"


@pytest.mark.parametrize(
    "algo, op",
    [("be", "allreduce"), ("be", "broadcast"), ("ring", "broadcast"), ("mst", "broadcast"), ("lp-rb", "allreduce")],
)
@pytest.mark.parametrize("order", ["ports", "steps", "phases"])
def test_an_issue_order_holds_back_the_sends_it_should(algo, op, order):
    """ports: a send waits until this rank's earlier-step sends to other peers are done;
    steps: also until every earlier-step receive is in; phases: only the latter."""
    schedule = build(algo, op, 8, 61, 0 if op != "allreduce" else None)
    for r in range(8):
        program = rank_program(schedule, r, 4)
        sends = iter([a for a in program if a.send])
        recvs = iter([a for a in program if not a.send])
        pending: dict[int, tuple[str, object]] = {}  # id(handle) -> (kind, action)
        broken: list[str] = []

        def isend(buf, peer, sends=sends, pending=pending, broken=broken):
            a = next(sends)
            for kind, b in pending.values():
                if order != "phases" and kind == "send" and b.step < a.step and b.peer != a.peer:
                    broken.append(f"step {a.step} sent to {a.peer} before step {b.step}'s send to {b.peer} was done")
                if order in ("steps", "phases") and kind == "recv" and b.step < a.step:
                    broken.append(f"step {a.step} sent before step {b.step}'s receive was in")
            handle = object()
            pending[id(handle)] = ("send", a)
            return handle

        def irecv(buf, peer, recvs=recvs, pending=pending):
            handle = object()
            pending[id(handle)] = ("recv", next(recvs))
            return handle

        def done(handle, what, pending=pending):
            pending.pop(id(handle), None)

        run_program(program, torch.zeros(61), isend=isend, irecv=irecv, wait=done, pool=StagingPool(),
                    segment_bytes=16, window=16, num_steps=schedule.num_steps, order=order)  # fmt: skip
        assert not broken, f"{algo} {op} rank {r}: {broken[0]}"


class _FakeTime:
    """A clock that moves only when the executor sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


PACED = [("be", "broadcast"), ("be", "allreduce"), ("ring", "broadcast"), ("mst", "reduce")]


@pytest.mark.parametrize("algo, op", PACED)
def test_a_later_step_waits_until_the_link_has_carried_the_earlier_steps(monkeypatch, algo, op):
    """A send completes once the kernel has its bytes, long before they cross a slow link;
    with ``drain_bytes_per_s`` a step to another peer starts only when the earlier steps'
    bytes would have left the port at that rate, so the steps do not split the port."""
    import lptrain.comm.dataflow as dataflow

    fake = _FakeTime()
    monkeypatch.setattr(dataflow, "time", fake)
    rate = 1000.0
    schedule = build(algo, op, 4, 64, 0 if op != "allreduce" else None)
    order = {"be": "steps", "ring": "steps", "mst": "ports"}[algo]
    for r in range(4):
        program = rank_program(schedule, r, 4)
        sends = iter([a for a in program if a.send])
        issued: list[tuple[float, object]] = []

        def isend(buf, peer, sends=sends, issued=issued):
            issued.append((fake.now, next(sends), buf.numel() * buf.element_size()))
            return object()

        run_program(program, torch.zeros(64), isend=isend, irecv=lambda buf, peer: object(), wait=lambda h, w: None,
                    pool=StagingPool(), segment_bytes=16, window=16, num_steps=schedule.num_steps, order=order,
                    drain_bytes_per_s=rate)  # fmt: skip
        for t, a, _ in issued:
            for step in {b.step for _, b, _ in issued if b.step < a.step and b.peer != a.peer}:
                first = min(u for u, b, _ in issued if b.step == step)
                carried = sum(n for _, b, n in issued if b.step == step)
                assert t >= first + carried / rate - 1e-9, f"{algo} {op} rank {r}: step {a.step} before {step} drained"
