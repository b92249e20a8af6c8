"""Whether a communicator follows lptrain.comm.protocol.Communicator: every attribute, and
every method with the protocol's own parameters, kinds and defaults (annotations aside).
Shared by tests/test_protocol.py and the workers it spawns."""

from __future__ import annotations

import inspect

from lptrain.comm.protocol import Communicator
from lptrain.comm.transport import LinkCost

METHODS = ("allreduce", "reduce", "broadcast", "describe", "prepare")


def _parameters(function) -> list[tuple]:
    params = inspect.signature(function).parameters.values()
    return [(p.name, p.kind, p.default) for p in params if p.name != "self"]


def problems(comm) -> list[str]:
    """What in ``comm`` (an instance, or a class for its methods alone) differs from the protocol."""
    found = []
    for method in METHODS:
        want = _parameters(getattr(Communicator, method))
        have = getattr(comm, method, None)
        if not callable(have):
            found.append(f"no method {method}")
        elif _parameters(have) != want:
            found.append(f"{method}{_parameters(have)} is not {method}{want}")
    if not isinstance(comm, type):
        if not isinstance(comm, Communicator):
            found.append("not a lptrain.comm.protocol.Communicator")
        if not isinstance(getattr(comm, "name", None), str) or not isinstance(getattr(comm, "world_size", None), int):
            found.append("name is not a str or world_size not an int")
        if not (getattr(comm, "link", None) is None or isinstance(comm.link, LinkCost)):
            found.append(f"link is a {type(comm.link).__name__}, not a LinkCost or None")
    return found
