"""One communicator protocol, one factory, the argument checks written once, and every
algorithm's schedules built the same way (LP's block an option like any other)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from types import SimpleNamespace

import distributed_workers as workers
import protocol_check
import pytest
import torch
import torch.multiprocessing as mp

from lptrain.auto import AutoCommunicator, Choice
from lptrain.bench.variants import algo_variants
from lptrain.comm.algorithms import (
    MODULES,
    OPS,
    SCHEDULES,
    WITH_VARIANTS,
    option_names,
    resolve,
    schedule_builders,
    variant_of,
)
from lptrain.comm.algorithms.options import HOST, AlgorithmOptions, Sizing
from lptrain.comm.communicator import ScheduleCommunicator
from lptrain.comm.distributed import DistributedCommunicator
from lptrain.comm.errors import CollectiveInputError
from lptrain.comm.hierarchical import HierarchicalCommunicator
from lptrain.comm.nccl import NcclCommunicator
from lptrain.comm.verify import verify
from lptrain.communicators import NAMES, build_communicator, options_of
from lptrain.sim.predict import schedule_for

# -- one protocol -------------------------------------------------------------------------------
KINDS = [ScheduleCommunicator, NcclCommunicator, DistributedCommunicator, HierarchicalCommunicator, AutoCommunicator]


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_of_communicator_has_the_protocols_methods(kind):
    assert protocol_check.problems(kind) == []


@pytest.mark.parametrize("name", [*SCHEDULES, "auto"])
def test_every_communicator_built_in_one_process_follows_the_protocol(name):
    comm = build_communicator(name, ["cpu"] * 3)
    assert protocol_check.problems(comm) == []
    assert (comm.name, comm.world_size, comm.link) == (name, 3, None)


def test_the_check_finds_a_communicator_that_does_not_follow_it():
    class Stray:
        name, world_size, link = "stray", 1, None

        def allreduce(self, tensor, op="sum"): ...

        def reduce(self, tensors, root=0): ...

        def broadcast(self, tensors, root=0): ...

        def describe(self, topic=None): ...

    found = protocol_check.problems(Stray())
    assert any(p.startswith("allreduce") for p in found) and any(p.startswith("reduce") for p in found)
    assert "no method prepare" in found and "not a lptrain.comm.protocol.Communicator" in found


def _tuning(path: Path, world: int) -> str:
    rows = [
        {"op": "allreduce", "bytes": n, "algo": algo, "options": {}, "time_us": t}
        for algo, times in (("ring", (10, 20, 40)), ("mst", (12, 30, 90)))
        for n, t in zip((1024, 4096, 16384), times)
    ]
    data = {"lptrain_tuning": 1, "executor": "distributed", "device_type": "cpu", "world_size": world}
    path.write_text(json.dumps({**data, "dtype": "float32", "rows": rows}))
    return str(path)


def test_across_processes_and_as_a_hierarchy_every_kind_follows_the_protocol(tmp_path):
    """Under a 2-process gloo group: the distributed kinds and the factory's hierarchy
    (devices and a group) follow the protocol, sum right and refuse alike."""
    tuning = _tuning(tmp_path / "tuning.json", 2)
    mp.spawn(workers.protocol_and_hierarchy, args=(2, str(tmp_path / "store"), tuning), nprocs=2)


def test_describe_refuses_an_unknown_topic_and_one_process_on_cpus_has_nothing_to_say():
    comm = build_communicator("lp", ["cpu"] * 2)
    assert comm.describe() == comm.describe("execution") == comm.describe("choice") == []
    comm.prepare("allreduce", 1 << 20)  # nothing to get ready
    with pytest.raises(CollectiveInputError, match="unknown topic 'kernels'; valid topics: choice, execution"):
        comm.describe("kernels")
    auto = build_communicator("auto", ["cpu"] * 2)
    auto.prepare("broadcast", 1 << 20)
    (line,) = auto.describe("choice")
    assert line.startswith("broadcast of 1M: ") and auto.describe("execution") == [] and auto.describe() == [line]
    assert auto.chosen("broadcast", 1 << 20) is auto.chosen("broadcast", 1 << 20)


# -- the checks, written once ------------------------------------------------------------------------
@pytest.mark.parametrize("name", [*SCHEDULES, "auto"])
def test_every_in_process_executor_refuses_bad_arguments_with_the_same_sentence(name):
    comm = build_communicator(name, ["cpu"] * 3)
    said = workers.refusals(comm, lambda dtype: [torch.zeros(10, dtype=dtype) for _ in range(3)])
    assert said == workers.expected_refusals(3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none on this machine)")
def test_nccl_in_one_process_refuses_bad_arguments_with_the_same_sentence():
    comm = build_communicator("nccl", ["cuda:0"])
    assert protocol_check.problems(comm) == []
    said = workers.refusals(comm, lambda dtype: [torch.zeros(10, dtype=dtype, device="cuda:0")])
    assert said == workers.expected_refusals(1)


def test_auto_refuses_before_it_chooses():
    auto = build_communicator("auto", ["cpu"] * 2)
    with pytest.raises(CollectiveInputError, match="root must be a rank in 0..1, got 2"):
        auto.broadcast([torch.zeros(4), torch.zeros(4)], root=2)
    with pytest.raises(CollectiveInputError, match="expected this process's tensors"):
        auto.allreduce([])
    assert auto.decisions == []


# -- one factory -------------------------------------------------------------------------------------
def test_the_factory_knows_every_name_and_refuses_in_one_line():
    assert (*SCHEDULES, "nccl", "auto") == NAMES
    with pytest.raises(CollectiveInputError, match=r"^unknown communicator 'tree'; valid names: lp, mst, be, ring"):
        build_communicator("tree", ["cpu"] * 2)
    with pytest.raises(CollectiveInputError, match="needs devices=\\[...\\], process_group=... or both"):
        build_communicator("ring")
    with pytest.raises(
        CollectiveInputError, match="'tunning' for auto; valid options: accumulate_fp32, tuning, topology$"
    ):
        build_communicator("auto", ["cpu"] * 2, tunning="x.json")
    with pytest.raises(CollectiveInputError, match="unknown option\\(s\\) 'block' for distributed lp"):
        build_communicator("lp", ["cpu"] * 2, process_group=object(), block=4)  # checked before the group


# -- every algorithm built the same way ----------------------------------------------------------------
@pytest.mark.parametrize("name", SCHEDULES)
def test_every_algorithm_module_has_one_shape(name):
    module = MODULES[name]
    assert name == module.NAME and isinstance(module.OPTIONS, AlgorithmOptions)
    assert set(module.ISSUE_ORDER) == set(OPS)
    for op in OPS:
        positional = [
            p.name
            for p in inspect.signature(getattr(module, op)).parameters.values()
            if p.kind is p.POSITIONAL_OR_KEYWORD
        ]
        assert positional == (["world_size", "count"] if op == "allreduce" else ["world_size", "count", "root"])
    assert option_names(name) == [*module.OPTIONS.defaults, "order"]  # every algorithm takes an order
    assert options_of(name) == ["accumulate_fp32", *option_names(name), "reduce_kernel", "cuda_graph"]


@pytest.mark.parametrize("name", WITH_VARIANTS)
@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
def test_every_algorithm_is_built_by_the_one_adapter_from_its_defaults(name, p):
    for sizing in (HOST, Sizing(1e-3, 1e-9, min_block=lambda nbytes: nbytes // 2)):
        builders, settled = schedule_builders(name, p, sizing=sizing)
        assert set(builders) == set(OPS) and set(settled) == set(option_names(name))
        for count in (0, 1, 37, 1000):
            verify(builders["allreduce"](p, count, None, 4))
            for root in {0, p - 1}:
                verify(builders["broadcast"](p, count, root, 4))
                verify(builders["reduce"](p, count, root, 2))


def test_lps_block_order_and_allreduce_are_options_like_any_other():
    builders, settled = schedule_builders("lp", 4, {"block_size": "1K", "order": (3, 2, 1, 0)})
    assert settled == {"block_size": "1K", "order": [3, 2, 1, 0], "allreduce": "overlapped"}
    assert builders["broadcast"](4, 1000, 0, 4).algorithm == "lp(block=256) order=3-2-1-0"
    assert builders["allreduce"](4, 1000, None, 4).algorithm == "lp(block=256, overlapped) order=3-2-1-0"
    with pytest.raises(CollectiveInputError, match="'block_size' for mst's schedules; valid options: order"):
        schedule_builders("mst", 4, {"block_size": "1K"})
    with pytest.raises(CollectiveInputError, match="lp: order must be a permutation of 0..3, the ranks"):
        schedule_builders("lp", 4, {"order": [0, 0, 1, 2]})


def test_the_lp_rb_variant_is_resolved_in_one_place_and_everyone_uses_it():
    assert resolve("lp-rb") == ("lp", {"allreduce": "reduce_broadcast"}) and resolve("ring") == ("ring", {})
    assert variant_of("lp", {"allreduce": "reduce_broadcast", "block_size": "1M"}) == "lp-rb"
    assert variant_of("lp", {"allreduce": "overlapped"}) == variant_of("lp", {}) == "lp"
    variant, _ = schedule_builders("lp-rb", 4, {"block_size": 64})
    spelled, _ = schedule_builders("lp", 4, {"block_size": 64, "allreduce": "reduce_broadcast"})
    assert variant["allreduce"](4, 100, None, 4).transfers == spelled["allreduce"](4, 100, None, 4).transfers
    # the simulator builds with the same adapter
    for algo in WITH_VARIANTS:
        for op in OPS:
            root = None if op == "allreduce" else 1
            built = schedule_builders(algo, 4, sizing=HOST)[0][op](4, 5000, root, 4)
            assert schedule_for(algo, op, 4, 5000, 4, root=1, sizing=HOST).transfers == built.transfers
    # the bench and the tuning file's labels
    args = SimpleNamespace(lp_block="1M", lp_allreduce="overlapped", tuning=None, reduce_kernel=None)
    assert algo_variants(["lp-rb"], args) == {"lp-rb": ("lp", {"block_size": "1M", "allreduce": "reduce_broadcast"})}
    assert Choice("lp", {"allreduce": "reduce_broadcast"}, "measured", "").label == "lp-rb"
