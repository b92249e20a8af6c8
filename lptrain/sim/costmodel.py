"""The closed forms of ../shared/PAPER.md (alpha-beta-gamma model, private links).

``n`` is the message in bytes, ``b`` the LP block in bytes (``k = n / b`` blocks). They
hold exactly when P is a power of two and n divides evenly; they are what the simulator
must reproduce on the ``private`` topology.
"""

from __future__ import annotations

import math


def lp(op: str, p: int, n: float, b: float, alpha: float, beta: float, gamma: float, mode: str = "overlapped") -> float:
    k = math.ceil(n / b)
    fill = p - 2 + k
    if op == "broadcast":
        return fill * (alpha + b * beta)
    if op == "reduce":
        return fill * (alpha + b * beta + b * gamma)
    if mode == "overlapped":
        return (2 * p - 3 + k) * (alpha + b * beta) + fill * b * gamma
    return fill * (alpha + b * beta + b * gamma) + fill * (alpha + b * beta)


def mst(op: str, p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    rounds = math.ceil(math.log2(p))
    bcast = rounds * (alpha + n * beta)
    reduce = rounds * (alpha + n * beta + n * gamma)
    return {"broadcast": bcast, "reduce": reduce, "allreduce": bcast + reduce}[op]


def be(op: str, p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    rounds = math.log2(p)
    frac = (p - 1) / p
    reduce_scatter = rounds * alpha + frac * n * (beta + gamma)
    allgather = rounds * alpha + frac * n * beta
    return {"broadcast": allgather * 2, "reduce": reduce_scatter + allgather, "allreduce": reduce_scatter + allgather}[
        op
    ]


def ring(op: str, p: int, n: float, alpha: float, beta: float, gamma: float) -> float:
    chunk = n / p
    reduce_scatter = (p - 1) * (alpha + chunk * (beta + gamma))
    allgather = (p - 1) * (alpha + chunk * beta)
    scatter = math.log2(p) * alpha + (p - 1) / p * n * beta
    gather = alpha + chunk * beta  # every rank sends its chunk to the root at once
    return {
        "broadcast": scatter + allgather,
        "reduce": reduce_scatter + gather,
        "allreduce": reduce_scatter + allgather,
    }[op]
