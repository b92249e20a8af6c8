"""The closed forms of ../shared/PAPER.md (alpha-beta-gamma model), for two machine models.

``n`` is the message in bytes, ``b`` the LP block in bytes (``k = n / b`` blocks). They
hold exactly when P is a power of two and n divides evenly; they are what the simulator
must reproduce on the ``private`` topology (``ports="multi"``: a link per pair, so a
device may send to several peers at once at full bandwidth) and on the ``oneport``
topology (``ports="one"``: one send and one receive port per device). Only two forms
differ between them (derived here from the schedules, not taken from the paper): LP's
overlapped allreduce, whose middle devices send a reduce block one way and a broadcast
block the other way in the same step (k - 1 of its steps carry two blocks through one
port when k >= 3, so it costs about 2 n beta, no better than BE), and the ring's reduce,
whose final gather brings P - 1 chunks into the root's one port.
"""

from __future__ import annotations

import math

PORTS = ("multi", "one")


def lp(
    op: str,
    p: int,
    n: float,
    b: float,
    alpha: float,
    beta: float,
    gamma: float,
    mode: str = "overlapped",
    ports: str = "multi",
) -> float:
    k = math.ceil(n / b)
    fill = p - 2 + k
    if op == "broadcast":
        return fill * (alpha + b * beta)
    if op == "reduce":
        return fill * (alpha + b * beta + b * gamma)
    if mode == "overlapped":
        doubled = k - 1 if ports == "one" and p > 2 and k >= 3 else 0  # steps sending two blocks through one port
        return (2 * p - 3 + k) * (alpha + b * beta) + doubled * b * beta + fill * b * gamma
    return fill * (alpha + b * beta + b * gamma) + fill * (alpha + b * beta)


def mst(op: str, p: int, n: float, alpha: float, beta: float, gamma: float, ports: str = "multi") -> float:
    rounds = math.ceil(math.log2(p))
    bcast = rounds * (alpha + n * beta)
    reduce = rounds * (alpha + n * beta + n * gamma)
    return {"broadcast": bcast, "reduce": reduce, "allreduce": bcast + reduce}[op]


def be(op: str, p: int, n: float, alpha: float, beta: float, gamma: float, ports: str = "multi") -> float:
    rounds = math.log2(p)
    frac = (p - 1) / p
    reduce_scatter = rounds * alpha + frac * n * (beta + gamma)
    allgather = rounds * alpha + frac * n * beta
    return {"broadcast": allgather * 2, "reduce": reduce_scatter + allgather, "allreduce": reduce_scatter + allgather}[
        op
    ]


def ring(op: str, p: int, n: float, alpha: float, beta: float, gamma: float, ports: str = "multi") -> float:
    chunk = n / p
    reduce_scatter = (p - 1) * (alpha + chunk * (beta + gamma))
    allgather = (p - 1) * (alpha + chunk * beta)
    scatter = math.log2(p) * alpha + (p - 1) / p * n * beta
    # Every rank sends its chunk to the root at once: through private links in parallel,
    # through the root's one receive port one after the other.
    gather = alpha + (p - 1 if ports == "one" else 1) * chunk * beta
    return {
        "broadcast": scatter + allgather,
        "reduce": reduce_scatter + gather,
        "allreduce": reduce_scatter + allgather,
    }[op]
