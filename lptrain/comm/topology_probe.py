"""Which ranks share which links, measured across the processes at start, in seconds.

On racks joined by an uplink thinner than a port, the order of the ranks decides what
crosses the uplink (``lptrain.comm.algorithms.order``), so ``comm.options.topology=probe``
measures the racks instead of asking for them. Every rank takes part in a round robin of
disjoint pairs (``pair_rounds``: P - 1 rounds of P/2 pairs, the circle method), each pair
exchanging ``nbytes`` both ways while the other pairs do the same. Pairs inside a rack
each have their ports to themselves and run at a port's rate; pairs across racks share
the uplink that the other cross pairs of their round take, and run slower. ``group_racks``
turns the pairs' rates into racks: the ranks joined by fast pairs, kept only where the
rates split cleanly (every pair inside a group fast, every pair across groups slow), and
the uplink's rate estimated as the sum of the cross pairs' rates of one round through one
rack's uplink. Grouping is plain arithmetic on a matrix, tested on synthetic figures;
choosing what to run on the racks is ``lptrain.auto``'s (measuring lives here, choosing
above).

The exchange of a pair is timed from the moment both are posted until both directions are
in (the slower end's time), the fastest of ``reps`` tries: on a busy host a process
waiting for a core only ever adds time.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lptrain.comm import bounded
from lptrain.comm.transport import timed_exchange

PROBE_BYTES = 1 << 20
FAST = 0.6  # a pair at this fraction of the fastest pair's rate or more runs at a port's rate


def pair_rounds(world: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs in which every pair of ``world`` ranks meets once (with an
    odd number, one rank sits each round out)."""
    ranks: list[int | None] = [*range(world), *([None] if world % 2 else [])]
    n = len(ranks)
    rounds = []
    for _ in range(n - 1):
        pairs = [(ranks[i], ranks[n - 1 - i]) for i in range(n // 2)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None])
        ranks = [ranks[0], ranks[-1], *ranks[1:-1]]
    return rounds


@dataclass(frozen=True)
class Racks:
    """What the probe found: the racks (one group: a single switch), the port's and the
    uplink's rates in bytes per second (uplink None with one group), and why so."""

    groups: tuple[tuple[int, ...], ...]
    port_bps: float
    uplink_bps: float | None
    reason: str

    def placement(self) -> tuple[int, ...]:
        """The rack of every rank."""
        rack_of = {r: i for i, g in enumerate(self.groups) for r in g}
        return tuple(rack_of[r] for r in range(len(rack_of)))

    def describe(self) -> str:
        racks = " ".join("[" + " ".join(map(str, g)) + "]" for g in self.groups)
        rates = f"port {self.port_bps / 1e6:.1f} MB/s"
        if self.uplink_bps is not None:
            rates += f", uplink {self.uplink_bps / 1e6:.1f} MB/s ({self.uplink_bps / self.port_bps:.2f} of a port)"
        return f"{len(self.groups)} rack{'s' if len(self.groups) > 1 else ''} {racks}, {rates}: {self.reason}"


def _components(world: int, fast: list[list[bool]]) -> list[list[int]]:
    seen: set[int] = set()
    groups = []
    for start in range(world):
        if start in seen:
            continue
        group, todo = [], [start]
        seen.add(start)
        while todo:
            a = todo.pop()
            group.append(a)
            for b in range(world):
                if b not in seen and fast[a][b]:
                    seen.add(b)
                    todo.append(b)
        groups.append(sorted(group))
    return groups


def _uplink(rates: list[list[float]], rounds: list[list[tuple[int, int]]], rack_of: dict[int, int]) -> float:
    """The uplink's rate: in each round, the cross pairs touching one rack all take its
    uplink, so their rates add up to it; the least such sum over racks (a hub rack's pairs
    may take several uplinks) and the most over rounds (a round with one cross pair may not
    fill it)."""
    best = 0.0
    for pairs in rounds:
        through: dict[int, float] = {}
        for a, b in pairs:
            if rack_of[a] != rack_of[b]:
                for rack in (rack_of[a], rack_of[b]):
                    through[rack] = through.get(rack, 0.0) + rates[a][b]
        if through:
            best = max(best, min(through.values()))
    return best


def group_racks(rates: list[list[float]], rounds: list[list[tuple[int, int]]], fast: float = FAST) -> Racks:
    """Racks from the pairs' rates (``rates[a][b]``, bytes per second each way, measured in
    ``rounds``): the groups of ranks joined by pairs at ``fast`` times the fastest pair's
    rate or more, where every pair splits cleanly; else one group, saying why."""
    world = len(rates)
    port = max((rates[a][b] for a in range(world) for b in range(world) if a != b), default=0.0)
    everyone = (tuple(range(world)),)
    if world < 3:
        return Racks(everyone, port, None, "two ranks or fewer: every pair crosses the same links")
    is_fast = [[a != b and rates[a][b] >= fast * port for b in range(world)] for a in range(world)]
    groups = _components(world, is_fast)
    slow = sum(1 for a in range(world) for b in range(a + 1, world) if not is_fast[a][b])
    if len(groups) == 1 and not slow:
        return Racks(everyone, port, None, f"every rank reaches every other at {fast:g} of a port's rate or more")
    rack_of = {r: i for i, g in enumerate(groups) for r in g}
    mixed = [(a, b) for a in range(world) for b in range(a + 1, world) if is_fast[a][b] != (rack_of[a] == rack_of[b])]
    if mixed:
        a, b = mixed[0]
        return Racks(
            everyone,
            port,
            None,
            f"the rates do not split into racks ({len(mixed)} pairs disagree, e.g. {a}-{b} at "
            f"{rates[a][b] / port:.2f} of a port)",
        )
    uplink = _uplink(rates, rounds, rack_of)
    return Racks(tuple(tuple(g) for g in groups), port, uplink, "pairs across racks share a slower link")


def pair_rates(
    group, device: torch.device, nbytes: int = PROBE_BYTES, reps: int = 2, timeout: datetime.timedelta | None = None
) -> list[list[float]]:
    """Every rank together: the round robin of pairs, each exchanging ``nbytes`` both ways at
    once with the rest of its round; the same matrix of rates (bytes per second) on every rank."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    out = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    into = torch.empty_like(out)
    tiny, tiny_in = out[:8], torch.empty(8, dtype=torch.uint8, device=device)
    took = torch.zeros(world, world, dtype=torch.float64)
    for pairs in pair_rounds(world):
        peer = next((b if a == rank else a for a, b in pairs if rank in (a, b)), None)
        if peer is not None:
            timed_exchange(tiny, tiny_in, peer, peer, group, timeout)  # a first message pays for the connection
        best = float("inf")
        for _ in range(reps):
            bounded.barrier(group, timeout)  # the round's pairs start together
            if peer is not None:
                best = min(best, timed_exchange(out, into, peer, peer, group, timeout))
        if peer is not None:
            took[rank, peer] = best
    shared = took.to(device)
    bounded.all_reduce(shared, group, timeout)  # each entry was set by one rank
    took = shared.cpu()
    return [
        [nbytes / max(float(took[a, b]), float(took[b, a]), 1e-9) if a != b else 0.0 for b in range(world)]
        for a in range(world)
    ]


def probe_racks(
    group, device: torch.device, nbytes: int = PROBE_BYTES, reps: int = 2, timeout: datetime.timedelta | None = None
) -> Racks:
    """Every rank together: the racks of ``group`` as its pairs' rates show them (each wait
    ending at ``timeout``; None: the group's own)."""
    world = dist.get_world_size(group)
    return group_racks(pair_rates(group, device, nbytes, reps, timeout), pair_rounds(world))
