"""The CUDA paths: streams and events of the in-process executor, and nccl.

Skipped with a reason on machines without a GPU. With one GPU, several replicas share
it, which still runs every link on its own stream with events between dependent blocks.

The tests of the eager executor build their communicators with ``cuda_graph=off``: under
the default ``auto`` a plan may be replayed as a graph (then a patched Python call is not
made) and its first call synchronises the device while it times both ways (then ordering
is not tested). Graph replay has tests of its own at the end.
"""

from __future__ import annotations

import pytest
import torch
from conftest import ALGORITHMS, DTYPES, assert_close_to_sum, make_comm, make_inputs, needs_cuda

from lptrain.comm.checks import NCCL_DTYPES, SUPPORTED_DTYPES
from lptrain.communicators import build_communicator

pytestmark = [pytest.mark.cuda, needs_cuda]


def _placed(inputs: list[torch.Tensor], devices: list[str]) -> list[torch.Tensor]:
    """A fresh copy of each rank's input on that rank's device."""
    return [t.to(d) for t, d in zip(inputs, devices)]


def _after(comm, op: str, inputs: list[torch.Tensor], devices: list[str], **kwargs) -> list[torch.Tensor]:
    """Fresh copies of the inputs on their devices, after ``comm.<op>`` ran on them."""
    tensors = _placed(inputs, devices)
    getattr(comm, op)(tensors, **kwargs)
    return tensors


def _device_lists() -> list[list[str]]:
    if not torch.cuda.is_available():
        return []
    n = torch.cuda.device_count()
    lists = [["cuda:0"] * 4, ["cuda:0"] * 3]
    if n >= 2:
        lists.append([f"cuda:{i}" for i in range(n)])
        lists.append([f"cuda:{i % n}" for i in range(2 * n)])
    return lists


# LP with blocks of a few bytes: every block is a few launches from Python, so a count of
# a million would be millions of them (hours); a few hundred elements already make a
# hundred blocks and a short last one.
SMALL_BLOCKS = {key for key, (_, options) in ALGORITHMS.items() if options.get("block_size", 1 << 20) < 64}


def _counts(key: str) -> tuple[int, ...]:
    return (0, 1, 7, 97, 301) if key in SMALL_BLOCKS else (0, 1, 7, 97, 4099, 1_000_003)


@pytest.mark.parametrize("devices", _device_lists(), ids=lambda d: ",".join(d))
@pytest.mark.parametrize("key", ALGORITHMS)
def test_cuda_collectives_match_the_reference(key, devices):
    p = len(devices)
    comm = make_comm(key, devices, cuda_graph="off")
    for dtype in DTYPES:
        for count in _counts(key):
            inputs = make_inputs(p, count, dtype, device="cpu")
            tensors = _after(comm, "allreduce", inputs, devices)
            for t in tensors:
                assert_close_to_sum(t, inputs, what=f"{key} cuda allreduce {dtype} {count}")
                assert torch.equal(t.cpu(), tensors[0].cpu())
            for root in range(p):
                tensors = _after(comm, "reduce", inputs, devices, root=root)
                assert_close_to_sum(tensors[root], inputs, what=f"{key} cuda reduce {dtype} {count}")
                assert all(torch.equal(tensors[r].cpu(), inputs[r]) for r in range(p) if r != root)
                tensors = _after(comm, "broadcast", inputs, devices, root=root)
                assert all(torch.equal(t.cpu(), inputs[root]) for t in tensors)


def test_cuda_executor_runs_links_on_separate_streams():
    comm = build_communicator("lp", ["cuda:0"] * 4, block_size="64K", cuda_graph="off")
    tensors = [torch.ones(1 << 20, device="cuda:0") for _ in range(4)]
    comm.allreduce(tensors)
    torch.cuda.synchronize()
    assert len(comm._links.all_streams()) >= 6  # 3 forward and 3 reverse link directions
    assert all(torch.equal(t, torch.full_like(t, 4.0)) for t in tensors)


@pytest.mark.parametrize("mode", ["off", "on"])
def test_cuda_results_are_ordered_with_later_work_on_the_current_stream(mode):
    """No explicit synchronize: work queued after the collective must see its result. The
    first call (with ``on``: the warm-up and the capture) is not the one checked."""
    comm = build_communicator("ring", ["cuda:0"] * 4, cuda_graph=mode)
    tensors = [torch.zeros(1 << 22, device="cuda:0") for r in range(4)]
    comm.allreduce(tensors)
    torch.cuda.synchronize()
    for r, t in enumerate(tensors):
        t.fill_(float(r))  # queued on the current stream, after which the collective must start
    comm.allreduce(tensors)
    total = torch.stack([t.sum() for t in tensors])  # on the current stream
    assert torch.allclose(total.cpu(), torch.full((4,), 6.0 * (1 << 22)))


def _distinct_gpus() -> list[str]:
    return [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


@pytest.mark.skipif(len(_distinct_gpus()) < 2, reason="needs two GPUs: at world size 1 a collective moves nothing")
def test_nccl_matches_the_reference():
    devices = _distinct_gpus()
    comm = build_communicator("nccl", devices)
    p = len(devices)
    for dtype in (torch.float32, torch.float16, torch.int64):
        inputs = make_inputs(p, 10_007, dtype)
        tensors = _after(comm, "allreduce", inputs, devices)
        for t in tensors:
            assert_close_to_sum(t, inputs, what=f"nccl {dtype}")
        tensors = _after(comm, "broadcast", inputs, devices, root=p - 1)
        assert all(torch.equal(t.cpu(), inputs[p - 1]) for t in tensors)
        tensors = _after(comm, "reduce", inputs, devices, root=0)
        assert_close_to_sum(tensors[0], inputs, what=f"nccl reduce {dtype}")


def test_nccl_refuses_a_shared_gpu():
    with pytest.raises(ValueError, match="distinct GPUs"):
        build_communicator("nccl", ["cuda:0", "cuda:0"])


# -- the reduction paths (issue 13) ---------------------------------------------------------------
def _has_cupy() -> bool:
    from lptrain.comm.peer_kernel import cupy_available

    return cupy_available()


@pytest.mark.skipif(not _has_cupy(), reason="needs CuPy (the gpu extra)")
@pytest.mark.parametrize("kernel", ["peer", "staged"])
@pytest.mark.parametrize("key", ["lp", "mst", "be", "ring"])
def test_both_reduction_paths_match_the_reference(key, kernel):
    """With replicas sharing one GPU the peer kernel reads "across" within the GPU: the
    same kernel, launched on the receiver's link stream."""
    devices = _device_lists()[0]
    p = len(devices)
    comm = build_communicator(key, devices, reduce_kernel=kernel, cuda_graph="off")
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64):
        for count in (1, 7, 4099, 1_000_003):
            inputs = make_inputs(p, count, dtype)
            tensors = _after(comm, "allreduce", inputs, devices)
            for t in tensors:
                assert_close_to_sum(t, inputs, what=f"{key} {kernel} {dtype} {count}")
            tensors = _after(comm, "reduce", inputs, devices, root=p - 1)
            assert_close_to_sum(tensors[p - 1], inputs, what=f"{key} {kernel} reduce {dtype} {count}")
    if kernel == "peer":
        assert any("peer" in line for line in comm.describe("execution"))


def test_auto_says_what_each_gpu_pair_uses():
    comm = build_communicator("lp", _device_lists()[0])
    lines = comm.describe("execution")
    assert lines and all(line.startswith("reduce_kernel cuda:") for line in lines)


@pytest.mark.skipif(torch.cuda.device_count() < 2 if torch.cuda.is_available() else True, reason="needs two GPUs")
def test_auto_measures_distinct_gpus_with_peer_access():
    comm = build_communicator("ring", _distinct_gpus()[:2])
    lines = comm.describe("execution")
    assert any("cuda:0 -> cuda:1" in line for line in lines)


def test_the_staged_path_keeps_one_buffer_per_link_across_calls():
    if torch.cuda.device_count() < 2:
        pytest.skip("staging happens between distinct GPUs")
    comm = build_communicator("mst", _distinct_gpus(), reduce_kernel="staged")
    tensors = [torch.ones(1 << 24, device=d) for d in _distinct_gpus()]
    comm.reduce(tensors, root=0)
    buffers = dict(comm._links._staging)
    comm.reduce(tensors, root=0)
    torch.cuda.synchronize()
    assert comm._links._staging.keys() == buffers.keys()
    assert all(comm._links._staging[k] is buffers[k] for k in buffers)  # reused, not reallocated
    from lptrain.comm.executor import STAGE_BYTES

    assert all(b.numel() <= STAGE_BYTES for b in buffers.values())


def test_a_failure_mid_plan_still_orders_the_callers_streams_after_the_queued_work(monkeypatch):
    comm = build_communicator("ring", ["cuda:0"] * 4, cuda_graph="off")
    tensors = [torch.ones(1 << 22, device="cuda:0") for _ in range(4)]
    comm.allreduce(tensors)  # links built
    calls = {"n": 0}
    real = comm._links.kernel

    def failing(src, dst):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("out of memory (simulated)")
        return real(src, dst)

    monkeypatch.setattr(comm._links, "kernel", failing)
    with pytest.raises(RuntimeError, match="simulated"):
        comm.allreduce(tensors)
    marker = torch.cuda.Event()
    marker.record(torch.cuda.current_stream())
    marker.synchronize()
    assert all(s.query() for s in comm._links.all_streams())  # the current stream waited for them all


def test_nccl_refuses_int16_clearly():
    from lptrain.comm.errors import CollectiveInputError

    comm = build_communicator("nccl", _distinct_gpus()[:1])
    with pytest.raises(CollectiveInputError, match="int16 is not supported by nccl"):
        comm.allreduce([torch.zeros(4, dtype=torch.int16, device="cuda:0")])


def test_replicas_sharing_a_gpu_draw_different_dropout_masks():
    from lptrain.train.seeding import replica_seed, seed_device

    masks = []
    for replica in range(2):
        seed_device(torch.device("cuda:0"), replica_seed(0, 1, replica))
        masks.append(torch.nn.functional.dropout(torch.ones(4096, device="cuda:0"), 0.5))
    assert not torch.equal(masks[0], masks[1])


@pytest.mark.parametrize("mode", ["on", "auto"])
def test_a_replayed_graph_sums_each_calls_new_data(mode):
    comm = build_communicator("lp", ["cuda:0"] * 4, block_size="64K", cuda_graph=mode)
    tensors = [torch.empty(300_001, device="cuda:0") for _ in range(4)]
    for call in range(4):  # the same memory every call, as a training loop's buffers
        for r, t in enumerate(tensors):
            t.fill_(float(r + call))
        comm.allreduce(tensors)
        expected = float(sum(r + call for r in range(4)))
        assert all(torch.equal(t, torch.full_like(t, expected)) for t in tensors), call
    assert any(line.startswith("cuda_graph allreduce of 300001 x float32:") for line in comm.describe("execution"))


@pytest.mark.skipif(len(_distinct_gpus()) < 2, reason="needs two GPUs: one current, the replicas on the other")
@pytest.mark.parametrize("mode", ["on", "auto"])
def test_a_graph_on_a_gpu_other_than_the_current_one_sums_each_calls_new_data(mode):
    """torch.cuda.graph captures on the current GPU's stream: with the replicas on cuda:1 and
    cuda:0 current, a capture without cuda:1 made current would record nothing."""
    comm = build_communicator("lp", ["cuda:1"] * 4, block_size="64K", cuda_graph=mode)
    tensors = [torch.empty(300_001, device="cuda:1") for _ in range(4)]
    with torch.cuda.device(0):
        for call in range(4):
            for r, t in enumerate(tensors):
                t.fill_(float(r + call))
            comm.allreduce(tensors)
            expected = float(sum(r + call for r in range(4)))
            assert all(torch.equal(t, torch.full_like(t, expected)) for t in tensors), call
    lines = [line for line in comm.describe("execution") if line.startswith("cuda_graph allreduce")]
    assert lines and "recorded nothing" not in lines[0]
    if mode == "on":
        assert "graph (asked for)" in lines[0]


# -- every dtype the peer kernel claims, and NCCL itself on one GPU ---------------------------------
def _small_values(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Values whose sum of two fits the dtype (int8: -60..60, uint8: 0..120)."""
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g, dtype=torch.float64) * 4).to(dtype)
    low, high = {torch.int8: (-60, 61), torch.uint8: (0, 121)}.get(dtype, (-1000, 1001))
    return torch.randint(low, high, (n,), generator=g).to(dtype)


@pytest.mark.skipif(not _has_cupy(), reason="needs CuPy (the gpu extra)")
@pytest.mark.parametrize("dtype", [str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES])
def test_the_peer_kernel_adds_every_dtype_it_claims_as_torch_does(dtype):
    """Bitwise like torch's add (half types widened to float32 and rounded once, as torch
    does): vectorised where all three pointers are 16-byte aligned, element-wise where an
    offset view breaks the alignment, in place and out of place."""
    from lptrain.comm.peer_kernel import _TYPES, PeerReducer

    assert set(_TYPES) == set(SUPPORTED_DTYPES)
    dtype = getattr(torch, dtype)
    reducer, stream = PeerReducer(), torch.cuda.Stream()
    for n, offset in ((1, 0), (7, 0), (4099, 0), (4099, 1), (1_000_003, 0), (1_000_003, 3)):
        a = _small_values(n + offset, dtype, 1).cuda()[offset:]
        b = _small_values(n + offset, dtype, 2).cuda()[offset:]
        expected = a + b
        out = torch.empty_like(a)
        stream.wait_stream(torch.cuda.current_stream())
        reducer.add(out, a, b, stream)
        reducer.add(a, a, b, stream)  # in place, as a reduce into the receiver's buffer
        torch.cuda.current_stream().wait_stream(stream)
        assert torch.equal(out, expected), f"{dtype} n={n} offset={offset}"
        assert torch.equal(a, expected), f"{dtype} n={n} offset={offset} in place"


def test_nccl_itself_takes_every_dtype_on_one_gpu():
    """At world size 1 the public calls return before NCCL (one tensor is its own sum), so
    this hands the one GPU's tensor to NCCL directly: the call must succeed and change nothing."""
    comm = build_communicator("nccl", ["cuda:0"])
    for dtype in NCCL_DTYPES:
        t = _small_values(4099, dtype, 3).cuda()
        before = t.clone()
        comm._run("allreduce", [t], None, inputs_are_scratch=False)
        comm._run("broadcast", [t], 0, inputs_are_scratch=False)
        comm._run("reduce", [t], 0, inputs_are_scratch=False)
        torch.cuda.synchronize()
        assert torch.equal(t, before), dtype


@pytest.mark.skipif(not _has_cupy(), reason="needs CuPy (the gpu extra)")
def test_measuring_the_reduction_paths_waits_for_the_buffers_fills():
    """The fills are queued behind a long kernel on the current stream: the timed streams
    must wait for them (the measurement checks the sum every trial left)."""
    from lptrain.comm.executor import CudaLinks, measure_paths

    gpu = torch.device("cuda", 0)
    links = CudaLinks([gpu, gpu], "auto")
    torch.cuda._sleep(100_000_000)  # some 50 ms of GPU time ahead of the fills
    times = measure_paths(links, gpu, gpu, nbytes=4 << 20)
    assert set(times) == {"staged", "peer"} and all(t > 0 for t in times.values())
