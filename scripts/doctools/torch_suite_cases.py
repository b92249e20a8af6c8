"""PyTorch's DistributedTest run in this process for one backend: the child side of
doctools.torch_suite, started as ``python -m doctools.torch_suite_cases PATTERN`` with
``LPTRAIN_SUITE_BACKEND`` (the backend under test) and ``WORLD_SIZE`` set.

PyTorch's harness (``test/distributed/test_distributed_spawn.py`` in its repository) reads
the backend from ``BACKEND`` when it is imported, accepts only gloo, nccl and ucc, and both
chooses tests by that name (``skip_if(BACKEND != "gloo")``) and branches on it inside them.
So the harness is imported with ``BACKEND=gloo``: every backend runs exactly the tests,
and the test bodies, that gloo runs, and only ``_run`` differs from the harness's own:
each rank joins ``init_process_group(LPTRAIN_SUITE_BACKEND)``. Ranks are forked rather than
spawned (torch is imported once, not once per rank and test: a second a test instead of
half a minute on a loaded 2-core machine). One JSON line per test on stdout: its name, its
outcome (pass, fail, error, skip) and the last line of its message.
"""

from __future__ import annotations

import json
import os
import re
import sys
import unittest
from datetime import timedelta

import torch.distributed as dist
import torch.multiprocessing as mp

import lptrain.ddp  # registers the lptrain backends

TARGET = os.environ["LPTRAIN_SUITE_BACKEND"]
os.environ["BACKEND"] = "gloo"  # the harness's choice of tests and branches: gloo's
os.environ.setdefault("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "120")  # a hung test fails in 2 min, not 5

from torch.testing._internal.distributed import distributed_test  # noqa: E402 - reads BACKEND
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


class Case(TestDistBackend, DistributedTest._DistTestBase):
    """One of PyTorch's distributed tests, its ranks forked, each joining ``TARGET``."""

    def setUp(self) -> None:
        super().setUp()
        self._start_processes(mp.get_context("fork").Process)

    @classmethod
    def _run(cls, rank: int, test_name: str, file_name: str, pipe, **kwargs) -> None:
        self = cls(test_name)
        self.rank, self.file_name = rank, file_name
        seconds = distributed_test.CUSTOM_PG_TIMEOUT.get(test_name, distributed_test.default_pg_timeout)
        dist.init_process_group(
            init_method=self.init_method,
            backend=TARGET,
            world_size=int(self.world_size),
            rank=rank,
            timeout=timedelta(seconds=seconds),
        )
        joined = dist.distributed_c10d._get_default_group()
        if isinstance(joined, lptrain.ddp.LPProcessGroup) != TARGET.startswith("lptrain"):
            sys.exit(f"torch_suite_cases: rank {rank} asked for {TARGET} and joined {joined!r}")
        self._barrier()
        self.run_test(test_name, pipe)
        self._barrier()
        dist.destroy_process_group()
        sys.exit(0)


def selected(pattern: str) -> list[str]:
    """The harness's test names that ``pattern`` matches (re.search), in name order."""
    return sorted(n for n in dir(Case) if n.startswith("test_") and re.search(pattern, n))


def outcome(result: unittest.TestResult) -> tuple[str, str]:
    for kind, entries in (("fail", result.failures), ("error", result.errors), ("skip", result.skipped)):
        if entries:
            lines = [line for line in str(entries[0][1]).splitlines() if line.strip()]
            causes = [line for line in lines if re.match(r"\w+(\.\w+)*(Error|Exception)\b", line)]
            return kind, (causes or lines or [""])[-1].strip()[:300]
    return "pass", ""


def main() -> None:
    for name in selected(sys.argv[1]):
        result = unittest.TestResult()
        Case(name).run(result)
        kind, why = outcome(result)
        print(json.dumps({"test": name, "outcome": kind, "why": why}), flush=True)


if __name__ == "__main__":
    main()
