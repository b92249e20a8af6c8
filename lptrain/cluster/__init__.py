"""``lptrain-cluster``: an emulated multi-node cluster on one machine.

Network namespaces joined by a bridge, each node's port shaped with ``tc``'s token bucket
(``plan``), made and removed (``netns``), one torchrun node per namespace (``launch``,
``node``), and the command line (``cli``). It measures the collectives where the links,
not the CPU, set the time.
"""
