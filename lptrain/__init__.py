"""lptrain: data-parallel BSP-SGD training built on collective algorithms for large messages.

``lptrain.comm`` holds the collectives (LP, MST, BE, ring as schedules; NCCL as the
vendor baseline) and their executors; ``lptrain.bench`` is the ``lptrain-bench`` tool.
"""

__version__ = "0.1.0"
