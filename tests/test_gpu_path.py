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

from lptrain.comm.checks import NCCL_DTYPES, SUPPORTED_DTYPES, backend_dtypes, check_dtype
from lptrain.comm.distributed import DistributedCommunicator, wait_timeout
from lptrain.comm.errors import CollectiveInputError
from lptrain.comm.executor import staged_add
from lptrain.errors import ConfigError
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
    from lptrain.bench import distributed

    calls = []
    monkeypatch.setenv("LOCAL_RANK", "5")
    monkeypatch.setattr(distributed.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(distributed.torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(distributed.torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    monkeypatch.setattr(
        distributed.dist,
        "init_process_group",
        lambda backend, **kw: calls.append(("init", backend, kw["device_id"], kw["timeout"].total_seconds())),
    )
    distributed.join_process_group(timeout_s=60)
    assert calls == [("set_device", torch.device("cuda", 1)), ("init", "nccl", torch.device("cuda", 1), 60.0)]


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


# -- the staged add overlaps each piece's copy with the previous piece's add ------------------------


class _Op:
    def __init__(self, name: str, deps: set):
        self.name, self.deps = name, deps


class _Stream:
    """A stand-in CUDA stream: each operation depends on the one before it on the stream and
    on whatever the stream was told to wait for since."""

    def __init__(self, name: str):
        self.name, self.last, self.pending = name, None, set()

    def push(self, name: str, extra=()) -> _Op:
        deps = {*self.pending, *extra} | ({self.last} if self.last else set())
        self.last, self.pending = _Op(name, deps), set()
        return self.last

    def wait_event(self, event):
        if event is not None:
            self.pending.add(event)

    def wait_stream(self, other):
        if other.last is not None:
            self.pending.add(other.last)


class _Streams:
    """The receiver's current stream and the sender's, and PyTorch's copy between GPUs: it runs
    on the sender's current stream after the receiver's current stream's work so far, and the
    receiver's current stream then waits for it."""

    def __init__(self):
        self.adder, self.sender = _Stream("adder"), _Stream("sender")
        self.current, self.ops = self.adder, []

    def on(self, stream):
        import contextlib

        @contextlib.contextmanager
        def swap():
            before, self.current = self.current, stream
            try:
                yield
            finally:
                self.current = before

        return swap()

    def copy(self, buf, src):
        buf.copy_(src)
        ready = self.current.push("receiver ready")  # an event recorded on the receiver's current stream
        op = self.sender.push(f"copy{sum(o.name.startswith('copy') for o in self.ops)}", {ready})
        self.current.pending.add(op)
        self.ops.append(op)

    def add(self, out, base, staged, in_place):
        out.add_(staged) if in_place else torch.add(base, staged, out=out)
        self.ops.append(self.current.push(f"add{sum(o.name.startswith('add') for o in self.ops)}"))


def _waits_for(op: _Op):
    """The names of every operation ``op`` waits for, directly or not."""
    seen, todo = set(), list(op.deps)
    while todo:
        d = todo.pop()
        if id(d) not in seen:
            seen.add(id(d))
            todo.extend(d.deps)
            yield d.name


def test_the_staged_add_copies_the_next_piece_while_it_adds_this_one(monkeypatch):
    from lptrain.comm import executor

    streams = _Streams()
    landing = _Stream("landing")
    monkeypatch.setattr(executor, "_current_stream", lambda device: streams.adder)
    monkeypatch.setattr(executor, "_on_stream", streams.on)
    monkeypatch.setattr(executor, "_record", lambda stream: stream.push(f"event on {stream.name}"))
    monkeypatch.setattr(executor, "_copy_between", streams.copy)
    monkeypatch.setattr(executor, "_add_into", streams.add)
    out, src = torch.arange(40.0), torch.arange(40.0) * 3
    staged_add(out, out, src, torch.empty(64, dtype=torch.uint8), landing=landing)  # 5 pieces of 8
    assert torch.equal(out, torch.arange(40.0) * 4)
    op = {o.name: o for o in streams.ops}
    for k in range(5):
        assert f"copy{k}" in set(_waits_for(op[f"add{k}"]))  # an add waits for its piece ...
        if k + 1 < 5:
            assert f"copy{k + 1}" not in set(_waits_for(op[f"add{k}"]))  # ... not for the next one
            assert f"add{k}" not in set(_waits_for(op[f"copy{k + 1}"]))  # which is copied meanwhile
        if k + 2 < 5:
            assert f"add{k}" in set(_waits_for(op[f"copy{k + 2}"]))  # a half is refilled after its add


def test_without_a_landing_stream_each_add_would_wait_for_the_next_copy(monkeypatch):
    """What the landing stream is for: PyTorch's copy ties itself to the receiver's current
    stream, so copies issued with the adds' stream current serialise copy and add."""
    from lptrain.comm import executor

    streams = _Streams()
    monkeypatch.setattr(executor, "_copy_between", streams.copy)
    monkeypatch.setattr(executor, "_add_into", streams.add)
    out, src = torch.arange(40.0), torch.arange(40.0) * 3
    staged_add(out, out, src, torch.empty(64, dtype=torch.uint8))
    op = {o.name: o for o in streams.ops}
    assert "copy1" in set(_waits_for(op["add0"]))


# -- link streams: one per link in the process, not one per communicator ---------------------------


def test_communicators_share_their_links_streams_and_past_the_pool_it_is_said(monkeypatch):
    """torch.cuda.Stream() hands out a pool of 32 per GPU round robin: streams asked for per
    communicator ran past it (the bench builds eight), and links then shared streams unseen."""
    from lptrain.comm import streams
    from lptrain.comm.executor import CudaLinks

    made = []

    class FakeStream:
        def __init__(self, device):
            made.append(device)

    monkeypatch.setattr(streams.torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(streams, "_streams", {})
    monkeypatch.setattr(streams, "_taken", streams.Counter())
    monkeypatch.setattr(streams, "_warned", set())
    gpu = torch.device("cuda", 5)
    first, second = CudaLinks([gpu] * 4, "staged"), CudaLinks([gpu] * 4, "staged")
    for src, dst in ((0, 1), (1, 2), (2, 3), (3, 0)):
        assert first.stream(src, dst, gpu) is second.stream(src, dst, gpu)
    assert first.stream(0, 1, gpu, "landing") is not first.stream(0, 1, gpu)
    assert streams.taken(5) == len(made) == 5
    with pytest.warns(RuntimeWarning, match="more than 32 CUDA streams on cuda:5"):
        for k in range(40):
            streams.link_stream(k + 10, k + 11, gpu)
    assert streams.taken(5) == 45
