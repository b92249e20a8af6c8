"""lptrain's algorithms inside an existing PyTorch DDP script.

Two ways in, either one line:

* a DDP communication hook:
  ``model.register_comm_hook(lptrain.ddp.state(algo="lp"), lptrain.ddp.hook)``
* a torch.distributed backend: ``dist.init_process_group("cpu:lptrain_lp,cuda:lptrain_lp")``
  (importing this package registers ``lptrain``, ``lptrain_lp``, ``lptrain_mst``,
  ``lptrain_be`` and ``lptrain_ring``).
"""

import lptrain.comm.group_teardown  # noqa: F401 (before a script that imports lptrain.ddp joins its group)
from lptrain.ddp.backend import LPProcessGroup, backend_names, register_backends
from lptrain.ddp.hook import LPHookState, hook, state

register_backends()

__all__ = ["LPHookState", "LPProcessGroup", "backend_names", "hook", "register_backends", "state"]
