"""The collective algorithms, one per module, each a pure schedule builder.

Every module exposes ``broadcast(world_size, count, root, **options)``,
``reduce(world_size, count, root, **options)`` and ``allreduce(world_size, count,
**options)``, each returning a :class:`lptrain.comm.schedule.Schedule`.
"""
