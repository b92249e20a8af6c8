"""Imported before a process group exists, so that destroying the group ends gloo's threads.

torch.distributed.nn's functions take ``group.WORLD`` as a default argument, read once when
the module is first imported (torch.optim's first optimizer imports it). Imported after the
group exists, they would hold it past ``destroy_process_group()``, and gloo's threads with it,
into the interpreter's exit, where such a thread can abort the process ("terminate called
without an active exception": CPython gh-87135, pybind11#2215; tests/test_teardown.py).
Importing this module first (``lptrain.train.launch``, ``lptrain.ddp``) makes the default the
placeholder it is before any group is joined.
"""

import torch.distributed.nn  # noqa: F401
