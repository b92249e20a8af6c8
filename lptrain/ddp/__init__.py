"""lptrain's algorithms inside an existing PyTorch DDP script.

Two ways in, either one line:

* a DDP communication hook:
  ``model.register_comm_hook(lptrain.ddp.state(algo="lp"), lptrain.ddp.hook)``
* a torch.distributed backend: ``dist.init_process_group("cpu:lptrain_lp,cuda:lptrain_lp")``
  (importing this package registers ``lptrain``, ``lptrain_lp``, ``lptrain_mst``,
  ``lptrain_be`` and ``lptrain_ring``).
"""

# Imported with lptrain.ddp, so before a script that imports it at its top joins a group:
# torch.distributed.nn's functions take group.WORLD as a default argument, read once when the
# module is first imported (torch.optim's first optimizer imports it). Imported after the group
# exists, they would hold it past destroy_process_group(), and gloo's threads with it, into the
# interpreter's exit, where such a thread can abort the process (CPython gh-87135,
# pybind11#2215; tests/test_teardown.py).
import torch.distributed.nn  # noqa: F401

from lptrain.ddp.backend import LPProcessGroup, backend_names, register_backends
from lptrain.ddp.hook import LPHookState, hook, state

register_backends()

__all__ = ["LPHookState", "LPProcessGroup", "backend_names", "hook", "register_backends", "state"]
