"""The GPU path's logic, checked on the CPU: which GPU each torchrun process takes, what NCCL
can move, how messages are waited for on NCCL, the replicas' dropout seeds, checkpoints
without GPU generator states, the step's timeline, and the staged add's pieces.

What needs a GPU to run (streams, events, the CuPy kernel, NCCL) is in test_cuda.py and
scripts/gpu_check.sh; here the decisions those paths take are pure functions or are
observed through stand-ins.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from lptrain.comm.communicator import NCCL_DTYPES, SUPPORTED_DTYPES, backend_dtypes, check_dtype
from lptrain.comm.distributed import DistributedCommunicator, wait_timeout
from lptrain.comm.errors import CollectiveInputError
from lptrain.comm.executor import staged_add
from lptrain.settings.errors import ConfigError
from lptrain.settings.locations import compose_config
from lptrain.train import launch
from lptrain.train.devices import share_of_node
from lptrain.train.seeding import replica_seed, reseeds_per_step, seed_device
from lptrain.train.timing import slowest_timeline

# -- each torchrun process its own GPUs ---------------------------------------------------------


def test_a_count_is_per_process_and_each_process_takes_the_next_gpus():
    two = ["cuda:0", "cuda:1"]
    assert [share_of_node(two, True, rank, 4, 8) for rank in range(4)] == [
        ["cuda:0", "cuda:1"],
        ["cuda:2", "cuda:3"],
        ["cuda:4", "cuda:5"],
        ["cuda:6", "cuda:7"],
    ]
    with pytest.raises(ConfigError, match=r"asks for 2 GPU\(s\) per process, 8 for the 4 processes .* it has 4"):
        share_of_node(two, True, 0, 4, 4, spec=2)


def test_a_list_names_the_nodes_gpus_and_each_process_gets_an_equal_share():
    listed = ["cuda:0", "cuda:2", "cuda:4", "cuda:6"]
    assert share_of_node(listed, False, 0, 2, 8) == ["cuda:0", "cuda:2"]
    assert share_of_node(listed, False, 1, 2, 8) == ["cuda:4", "cuda:6"]
    assert share_of_node(listed, False, 3, 4, 8) == ["cuda:6"]
    with pytest.raises(ConfigError, match="lists 4 GPU\\(s\\) for the 3 processes on this node: give a multiple of 3"):
        share_of_node(listed, False, 0, 3, 8)


def test_one_process_per_node_and_cpu_replicas_are_left_as_they_are():
    assert share_of_node(["cuda:0", "cuda:1"], True, 0, 1, 2) == ["cuda:0", "cuda:1"]
    assert share_of_node(["cpu"] * 4, True, 1, 2, 0) == ["cpu"] * 4


def test_a_torchrun_process_sets_its_gpu_before_joining_nccl_and_names_it(monkeypatch):
    calls = []
    monkeypatch.setattr(launch, "launched_by_torchrun", lambda: True)
    monkeypatch.setattr(launch.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(launch.dist, "get_rank", lambda: 3)
    monkeypatch.setattr(launch.dist, "get_world_size", lambda: 4)
    monkeypatch.setattr(launch.torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    monkeypatch.setattr(
        launch.dist, "init_process_group", lambda backend, **kw: calls.append(("init", backend, kw["device_id"]))
    )
    gpu = torch.device("cuda", 3)
    assert launch.init_from_environment([gpu], 60) == (3, 4)
    assert calls == [("set_device", gpu), ("init", "nccl", gpu)]  # the device first, then the group


def test_the_benchmark_under_torchrun_takes_the_gpu_of_its_local_rank(monkeypatch):
    from lptrain import bench_dist

    calls = []
    monkeypatch.setenv("LOCAL_RANK", "5")
    monkeypatch.setattr(bench_dist.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench_dist.torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(bench_dist.torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    monkeypatch.setattr(
        bench_dist.dist, "init_process_group", lambda backend, **kw: calls.append(("init", backend, kw["device_id"]))
    )
    bench_dist.join_process_group()
    assert calls == [("set_device", torch.device("cuda", 1)), ("init", "nccl", torch.device("cuda", 1))]


# -- what NCCL can move, and how it is waited for -------------------------------------------------


def test_nccl_has_no_int16_and_says_so_with_the_valid_dtypes():
    assert torch.int16 in SUPPORTED_DTYPES and torch.int16 not in NCCL_DTYPES
    assert backend_dtypes("gloo") == SUPPORTED_DTYPES and backend_dtypes("nccl") == NCCL_DTYPES
    with pytest.raises(CollectiveInputError, match="dtype torch.int16 is not supported by nccl; valid dtypes: float32"):
        check_dtype(torch.int16, NCCL_DTYPES, " by nccl")


class _Work:
    def __init__(self):
        self.args = None

    def wait(self, *args):
        self.args = args


def _bare_communicator(backend: str, builders) -> DistributedCommunicator:
    """A DistributedCommunicator's checks and waits without a process group."""
    comm = DistributedCommunicator.__new__(DistributedCommunicator)
    comm.backend, comm._builders, comm.world_size, comm.rank, comm.name = backend, builders, 2, 0, "x"
    comm.timeout = datetime.timedelta(seconds=7)
    return comm


def test_the_backends_own_collective_refuses_int16_on_nccl_but_the_schedules_move_bytes():
    native = _bare_communicator("nccl", None)
    with pytest.raises(CollectiveInputError, match="not supported by the nccl backend's own allreduce"):
        native._check("allreduce", torch.zeros(3, dtype=torch.int16), None, "sum")
    _bare_communicator("nccl", {})._check("allreduce", torch.zeros(3, dtype=torch.int16), None, "sum")
    _bare_communicator("gloo", None)._check("allreduce", torch.zeros(3, dtype=torch.int16), None, "sum")


def test_nccl_messages_are_waited_for_without_host_polling_and_gloo_keeps_its_timeout():
    timeout = datetime.timedelta(seconds=7)
    assert wait_timeout("nccl", timeout) is None
    assert wait_timeout("gloo", timeout) == timeout
    for backend, expected in (("nccl", ()), ("gloo", (timeout,))):
        work = _Work()
        _bare_communicator(backend, {})._wait(work, "step 1", {"op": "allreduce", "seq": 0})
        assert work.args == expected


# -- dropout: each replica its own masks, the same after a resume ---------------------------------


def test_replica_seeds_differ_by_replica_and_step_and_repeat_exactly():
    seeds = {replica_seed(0, step, r) for step in range(50) for r in range(16)}
    assert len(seeds) == 50 * 16 and all(0 <= s < 2**63 for s in seeds)
    assert replica_seed(0, 3, 1) == replica_seed(0, 3, 1) != replica_seed(1, 3, 1)


def test_generators_are_reseeded_per_step_wherever_there_is_more_than_one():
    assert not reseeds_per_step([torch.device("cpu")] * 4, 1)  # one CPU generator, saved in checkpoints
    assert reseeds_per_step([torch.device("cpu")] * 4, 2)  # one per process
    assert reseeds_per_step([torch.device("cuda", 0)] * 2, 1)  # one per GPU


def test_reseeded_replicas_draw_different_masks_and_the_same_ones_again():
    def mask(replica: int, step: int) -> torch.Tensor:
        seed_device(torch.device("cpu"), replica_seed(0, step, replica))
        return nn.functional.dropout(torch.ones(1000), 0.5)

    assert not torch.equal(mask(0, 1), mask(1, 1))
    assert not torch.equal(mask(0, 1), mask(0, 2))
    assert torch.equal(mask(1, 7), mask(1, 7))


class _DropoutNet(nn.Module):
    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.ReLU(), nn.Dropout(0.5))
        self.head = nn.Linear(64, num_classes)

    def forward(self, x):
        return self.head(self.body(x))


def _train(tmp_path: Path, monkeypatch, *overrides: str):
    from lptrain.train import trainer as trainer_module

    monkeypatch.setattr(trainer_module, "build_model", lambda name, classes, size, init: _DropoutNet(classes))
    monkeypatch.setattr(trainer_module, "reseeds_per_step", lambda devices, processes: True)  # as on GPUs
    quiet = ["trainer.progress=false", "trainer.tensorboard=false", "trainer.eval_every=0", "trainer.log_every=1"]
    cfg = compose_config([*quiet, "trainer.devices=cpu*2", "trainer.steps=8", "trainer.batch_per_device=8", *overrides])
    run = trainer_module.Trainer(cfg, tmp_path)
    run.fit()
    return run, [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def test_with_per_step_seeds_a_resumed_run_repeats_the_uninterrupted_one(tmp_path, monkeypatch):
    full, log = _train(tmp_path / "full", monkeypatch, "trainer.checkpoint_every=3", "trainer.keep_checkpoints=true")
    state = torch.load(tmp_path / "full" / "checkpoints" / "step_00000003.pt", weights_only=True)
    assert "rng_cuda" not in state  # no GPU generator is read, so none is needed to resume
    middle = tmp_path / "full" / "checkpoints" / "step_00000003.pt"
    # As a process other than rank 0, or on GPUs, would: no generator state is restored.
    monkeypatch.setattr(torch, "set_rng_state", lambda state: None)
    torch.manual_seed(12345)
    resumed, later = _train(tmp_path / "again", monkeypatch, "trainer.checkpoint_every=0", f"trainer.resume={middle}")
    assert [m["loss"] for m in later] == [m["loss"] for m in log[3:]]
    assert torch.equal(resumed.replicas.params[0], full.replicas.params[0])


# -- the step's timeline ------------------------------------------------------------------------


def test_waiting_for_the_slowest_replica_counts_once():
    # Two GPUs: compute takes 10 and 20 ms; the collective then takes 5 ms on both, and the
    # fast one waits 10 ms for the slow one inside it; the update takes 1 ms.
    fast = [0.0, 10.0, 10.0, 25.0, 25.0, 26.0]
    slow = [0.0, 20.0, 20.0, 25.0, 25.0, 26.0]
    compute, comm, update = slowest_timeline([fast, slow])
    assert (compute, comm, update) == (20.0, 5.0, 1.0)
    assert compute + comm + update == 26.0  # the step's length, not 20 + 15 + 1


def test_one_device_timeline_is_its_own_phases():
    assert slowest_timeline([[0.0, 3.0, 3.5, 4.0]]) == [3.0, 0.5]
    assert slowest_timeline([]) == []


# -- the staged add, piece by piece ----------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 15, 16, 17, 100])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
def test_the_staged_add_goes_through_two_small_halves_and_adds_everything(n, dtype):
    base = torch.arange(n).to(dtype)
    src = (torch.arange(n) * 3).to(dtype)
    out = torch.zeros(n, dtype=dtype)
    stage = torch.empty(64, dtype=torch.uint8)  # halves of 32 bytes: 4 to 16 elements a piece
    staged_add(out, base, src, stage)
    assert torch.equal(out, base + src)
    inplace = base.clone()
    staged_add(inplace, inplace, src, stage)
    assert torch.equal(inplace, base + src)


# -- the prepared device check ----------------------------------------------------------------------


def test_the_device_check_is_valid_bash_and_stops_clearly_without_a_gpu(tmp_path):
    import shutil
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.sh"
    bash = shutil.which("bash")
    assert subprocess.run([bash, "-n", str(script)]).returncode == 0
    if torch.cuda.is_available():
        pytest.skip("on a GPU machine the check would run for real")
    run = subprocess.run(
        [bash, str(script), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env={"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "PYTHON": sys.executable},
        timeout=120,
    )
    assert run.returncode == 2
    assert "needs a CUDA GPU, and torch.cuda.is_available() is False" in run.stderr
