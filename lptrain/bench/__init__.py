"""lptrain.bench: the ``lptrain-bench`` command, which times the collectives the way
nccl-tests does (``python -m lptrain.bench`` runs it too, under torchrun as well).

``cli``
    the options and ``main``, the console script's entry; it picks one of the two below
``inprocess``
    every replica a device of this process, beside a ``memcpy`` row of the same bytes
``distributed``
    one process a rank (torchrun or mpirun), beside the backend's own collective
``table``
    the rows: the printed table and ``--json``
``variants``
    what both measure: the dtypes, the check's inputs, the algorithms' labelled
    communicators, and the tuning file ``--save-tuning`` writes from the rows

The two measurements do not import each other. What the simulator shares with them (the
collectives by name, their bus factors, the message sizes) lives below, in
``lptrain.comm.measure`` and ``lptrain.comm.sizes``.
"""
