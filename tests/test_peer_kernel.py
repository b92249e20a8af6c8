"""The one-pass peer reduction: its choice logic, its refusals, and its kernel source.

No GPU here, so the kernel's CUDA C is compiled by the host C++ compiler with the CUDA
built-ins it uses stubbed out (threads become loop iterations), and run on CPU tensors
against torch's own add: the vectorised body, the scalar tail, the unaligned path and
the float32 accumulation of half types are the ones the GPU compiles. The launch through
CuPy runs in the ``cuda`` tests and in scripts/gpu_check.sh.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest
import torch

from lptrain.comm.errors import BackendUnavailableError, CollectiveInputError
from lptrain.comm.peer_kernel import (
    _TYPES,
    REDUCE_KERNELS,
    choose_kernel,
    cupy_available,
    grid_size,
    kernel_name,
    kernel_source,
)
from lptrain.communicators import build_communicator

# Host stand-ins for what the kernel takes from CUDA. _Float16 is GCC's IEEE half.
HOST_PRELUDE = r"""
#include <cstring>
struct uint4 { unsigned int x, y, z, w; };
struct Dim { unsigned int x; };
static Dim blockIdx, threadIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
static inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline float half_to_float(unsigned short h) { _Float16 x; std::memcpy(&x, &h, 2); return (float)x; }
static inline unsigned short float_to_half(float f) {
    _Float16 x = (_Float16)f; unsigned short h; std::memcpy(&h, &x, 2); return h;
}
"""

# Every block and thread of a launch, one after another (the kernel's elements are independent).
LAUNCHER = r"""
extern "C" void launch_{name}(const void* a, const void* b, void* out, long long n, int vec, int blocks, int threads) {{
    gridDim.x = blocks; blockDim.x = threads;
    for (unsigned int bi = 0; bi < (unsigned int)blocks; ++bi)
        for (unsigned int ti = 0; ti < (unsigned int)threads; ++ti) {{
            blockIdx.x = bi; threadIdx.x = ti;
            peer_add_{name}(({t}*)a, ({t}*)b, ({t}*)out, n, vec);
        }}
}}
"""


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory):
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no host C++ compiler (g++) to build the kernel source on the CPU")
    body = kernel_source(half_conversions="")
    launchers = "".join(LAUNCHER.format(name=str(d).removeprefix("torch."), t=t) for d, (t, *_rest) in _TYPES.items())
    folder = tmp_path_factory.mktemp("kernel")
    source = folder / "peer_add.cpp"
    source.write_text(HOST_PRELUDE + body + launchers)
    library = folder / "peer_add.so"
    result = subprocess.run(
        [compiler, "-O1", "-std=c++17", "-shared", "-fPIC", "-Wno-unknown-pragmas", str(source), "-o", str(library)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0 and "_Float16" in result.stderr:
        pytest.skip("this g++ has no _Float16 for the host stand-in of the half conversions")
    assert result.returncode == 0, result.stderr
    return ctypes.CDLL(str(library))


def _run(lib, out, a, b, blocks, threads, vec):
    fn = getattr(lib, "launch_" + kernel_name(out.dtype).removeprefix("peer_add_"))
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_longlong, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    fn(a.data_ptr(), b.data_ptr(), out.data_ptr(), out.numel(), vec, blocks, threads)


def _inputs(dtype, n, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g) * 10).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, (n,), generator=g, dtype=torch.int64).to(dtype)


def _expected(a, b):
    if a.dtype in (torch.float16, torch.bfloat16):
        return (a.float() + b.float()).to(a.dtype)  # one rounding, after a float32 add
    return a + b  # integers wrap as torch's do


@pytest.mark.parametrize("dtype", list(_TYPES), ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("n", [0, 1, 7, 8, 33, 1000])
def test_the_kernel_source_adds_like_torch(host_kernels, dtype, n):
    a, b = _inputs(dtype, n, 1), _inputs(dtype, n, 2)
    expected = _expected(a, b)
    for blocks, threads in ((1, 1), (3, 4), (2, 64)):
        for vec in (0, 1):
            out = torch.full_like(a, 7) if n else a.clone()
            _run(host_kernels, out, a, b, blocks, threads, vec)
            assert torch.equal(out.view(torch.uint8), expected.view(torch.uint8)), (blocks, threads, vec)
            inplace = a.clone()  # the ADD instruction: out is a
            _run(host_kernels, inplace, inplace, b, blocks, threads, vec)
            assert torch.equal(inplace.view(torch.uint8), expected.view(torch.uint8))


def test_bfloat16_rounds_to_nearest_even_and_keeps_nan_and_inf(host_kernels):
    a = torch.tensor([1.0, 1.0, float("nan"), float("inf"), -float("inf"), 3.0e38, 0.0], dtype=torch.bfloat16)
    b = torch.tensor([2**-8, 3 * 2**-8, 1.0, 1.0, -1.0, 3.0e38, -0.0], dtype=torch.bfloat16)
    out = torch.empty_like(a)
    _run(host_kernels, out, a, b, 1, 2, 0)
    expected = (a.float() + b.float()).to(torch.bfloat16)
    assert torch.equal(out[:2], expected[:2])  # ties to even: 1 + 2^-8 -> 1, 1 + 3*2^-8 -> 1 + 2^-6
    assert torch.isnan(out[2]) and torch.equal(out[3:], expected[3:])


def test_a_misaligned_view_takes_the_scalar_path_and_is_still_right(host_kernels):
    base_a, base_b = _inputs(torch.float32, 40, 3), _inputs(torch.float32, 40, 4)
    a, b = base_a[1:38], base_b[1:38]  # 4 bytes past a 16-byte boundary
    out = torch.zeros(37)
    _run(host_kernels, out, a, b, 2, 8, 0)
    assert torch.equal(out, a + b)


def test_grid_covers_the_work_and_stays_bounded():
    assert grid_size(1, torch.float32, True, 132) == 1
    assert grid_size(256 * 4, torch.float32, True, 132) == 1
    assert grid_size(256 * 4 + 1, torch.float32, True, 132) == 2
    assert grid_size(256 * 4, torch.float32, False, 132) == 4
    assert grid_size(1 << 30, torch.float16, True, 132) == 8 * 132


# -- choosing the path ------------------------------------------------------------------------
def test_auto_takes_the_measured_faster_path_and_says_so():
    fast_peer = choose_kernel("auto", cuda=True, have_cupy=True, peer_access=True, timings_ms={"peer": 1, "staged": 2})
    assert fast_peer.kernel == "peer" and "1.000 ms (peer) vs 2.000 ms (staged)" in fast_peer.reason
    slow_peer = choose_kernel("auto", cuda=True, have_cupy=True, peer_access=True, timings_ms={"peer": 3, "staged": 2})
    assert slow_peer.kernel == "staged"


@pytest.mark.parametrize(
    "found, reason",
    [
        ({"cuda": False, "have_cupy": True, "peer_access": True}, "CPU devices"),
        ({"cuda": True, "have_cupy": False, "peer_access": True}, "CuPy is not installed"),
        ({"cuda": True, "have_cupy": True, "peer_access": False}, "no peer access"),
    ],
)
def test_auto_keeps_the_staged_path_where_the_peer_kernel_cannot_run(found, reason):
    choice = choose_kernel("auto", **found)
    assert choice.kernel == "staged" and reason in choice.reason


@pytest.mark.parametrize(
    "found, message",
    [
        ({"cuda": False, "have_cupy": True, "peer_access": True}, "needs CUDA devices"),
        ({"cuda": True, "have_cupy": False, "peer_access": True}, r"needs CuPy \(the gpu extra"),
        ({"cuda": True, "have_cupy": True, "peer_access": False}, "no peer access"),
    ],
)
def test_peer_is_refused_clearly_where_it_cannot_run(found, message):
    with pytest.raises(BackendUnavailableError, match=message):
        choose_kernel("peer", pair="cuda:0 -> cuda:1", **found)


def test_staged_is_always_possible_and_bad_names_are_refused():
    assert choose_kernel("staged", cuda=True, have_cupy=False, peer_access=False).kernel == "staged"
    bad = "reduce_kernel='fast' is not valid; valid choices: auto, peer, staged"
    with pytest.raises(CollectiveInputError, match=bad):
        choose_kernel("fast", cuda=True, have_cupy=True, peer_access=True)
    assert REDUCE_KERNELS == ("auto", "peer", "staged")


@pytest.mark.parametrize("algo", ["lp", "mst", "be", "ring"])
def test_the_communicators_take_the_option_and_refuse_peer_on_the_cpu(algo):
    comm = build_communicator(algo, ["cpu"] * 3, reduce_kernel="staged")
    tensors = [torch.full((5,), float(r)) for r in range(3)]
    comm.allreduce(tensors)
    assert all(torch.equal(t, torch.full((5,), 3.0)) for t in tensors)
    with pytest.raises(BackendUnavailableError, match="reduce_kernel=peer needs CUDA devices"):
        build_communicator(algo, ["cpu"] * 3, reduce_kernel="peer")
    with pytest.raises(CollectiveInputError, match="reduce_kernel='x' is not valid"):
        build_communicator(algo, ["cpu"] * 3, reduce_kernel="x")


@pytest.mark.skipif(cupy_available(), reason="checks the answer without CuPy")
def test_without_cupy_the_kernel_itself_says_what_to_install():
    from lptrain.comm.peer_kernel import PeerReducer

    with pytest.raises(BackendUnavailableError, match=r"pip install 'lptrain\[gpu\]'"):
        PeerReducer()


# -- CUDA graph replay: the choice ------------------------------------------------------------------
def test_a_graph_is_replayed_only_where_it_measured_faster_or_was_asked_for():
    from lptrain.comm.cuda_graph import prefer_graph

    assert prefer_graph("auto", eager_s=2e-4, replay_s=5e-5)
    assert not prefer_graph("auto", eager_s=5e-5, replay_s=2e-4)
    assert prefer_graph("on", None, None) and not prefer_graph("off", 1.0, 0.0)


def test_cuda_graph_option_is_checked_and_the_cpu_runs_eagerly():
    from lptrain.comm.cuda_graph import GraphReplay

    with pytest.raises(CollectiveInputError, match="cuda_graph='yes' is not valid; valid choices: auto, on, off"):
        build_communicator("ring", ["cpu"] * 2, cuda_graph="yes")
    calls = []
    GraphReplay("on", [torch.device("cpu")] * 2).run((1,), "x", [], lambda: calls.append(1))
    assert calls == [1]


class _Current:
    """Stands in for torch.cuda.device: which GPU is current (0 unless a context says)."""

    index = 0

    def __init__(self, device):
        self.device = device

    def __enter__(self):
        self.before, _Current.index = _Current.index, self.device.index
        return self

    def __exit__(self, *exc):
        _Current.index = self.before
        return False


class _FakeGraph:
    """Stands in for torch.cuda.CUDAGraph: capture records the call, replay repeats it."""

    captures = 0

    def __init__(self):
        self.recorded = None

    def replay(self):
        self.recorded()


class _FakeCapture:
    """Stands in for torch.cuda.graph: what runs inside is recorded, not run (its effect
    on the watched tensor is undone on exit)."""

    pending = None  # the call the next capture records
    watched: torch.Tensor | None = None

    def __init__(self, graph, stream=None, capture_error_mode="global"):
        self.graph = graph

    def __enter__(self):
        _FakeGraph.captures += 1
        self.graph.recorded = _FakeCapture.pending
        self.before = _FakeCapture.watched.clone()
        return self

    def __exit__(self, *exc):
        _FakeCapture.watched.copy_(self.before)
        return False


@pytest.mark.parametrize("mode, replay_faster", [("auto", True), ("auto", False), ("on", True)])
def test_graph_bookkeeping_runs_each_call_once_and_measures_once_per_plan(monkeypatch, mode, replay_faster):
    """The replay logic, with a stand-in graph whose replay repeats the eager call: each
    call's collective takes effect exactly once (the trials restore the inputs), a plan
    is timed once, and new memory for a plan measured faster is captured without timing."""
    from lptrain.comm import cuda_graph

    monkeypatch.setattr(cuda_graph.torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(cuda_graph.torch.cuda, "graph", _FakeCapture)
    monkeypatch.setattr(cuda_graph.torch.cuda, "synchronize", lambda device=None: None)
    timings = {"replay": 1.0 if replay_faster else 3.0, "run": 2.0}
    monkeypatch.setattr(cuda_graph, "_time", lambda fn, restore, device: timings[fn.__name__])
    monkeypatch.setattr(cuda_graph.torch.cuda, "device", _Current)
    monkeypatch.setattr(cuda_graph, "stream_for", lambda key, device: None)
    _FakeGraph.captures = 0
    replay = cuda_graph.GraphReplay(mode, [torch.device("cuda", 0)] * 2)  # replicas sharing a GPU

    def call(t: torch.Tensor) -> None:
        def run():
            t.add_(1)

        _FakeCapture.pending, _FakeCapture.watched = run, t
        replay.run(7, "allreduce of 4 x float32", [t], run)

    a, b = torch.zeros(4), torch.zeros(4)
    for n in range(1, 4):
        call(a)
        assert torch.equal(a, torch.full((4,), float(n)))  # once per call: the trials were undone
    call(b)
    assert torch.equal(b, torch.ones(4))
    line = replay.decisions["allreduce of 4 x float32"]
    assert (
        line == "graph (asked for)"
        if mode == "on"
        else line.startswith("graph (measured" if replay_faster else "eager (measured")
    )
    # a: one capture to decide; b (new memory): captured again only where replaying pays
    assert _FakeGraph.captures == (2 if replay_faster else 1)


class _DeviceGraph(_FakeGraph):
    """A graph bound to the GPU its capture ran on, as torch.cuda.graph binds it to the current one."""

    def replay(self):
        assert _Current.index == self.captured_on, "replayed with another GPU current than it was captured on"
        super().replay()


class _CaptureStream:
    def __init__(self, index: int):
        self.device = torch.device("cuda", index)


class _DeviceCapture(_FakeCapture):
    """Captures on its stream (without one, on a process-wide default made on GPU 0, as
    torch.cuda.graph's is where GPU 0 was current first), bound to the current GPU: unless
    both are the GPU of the plan's streams nothing is recorded and, as PyTorch does, it
    only warns that the graph is empty."""

    target = 1  # the GPU the plan's streams are on

    def __init__(self, graph, stream=None, capture_error_mode="global"):
        super().__init__(graph, stream, capture_error_mode)
        self.stream = stream or _CaptureStream(0)

    def __enter__(self):
        super().__enter__()
        self.graph.captured_on = _Current.index
        return self

    def __exit__(self, *exc):
        if not _Current.index == self.stream.device.index == _DeviceCapture.target:
            self.graph.recorded = lambda: None
            import warnings

            warnings.warn(
                "The CUDA Graph is empty. This usually means that the graph was attempted to be captured "
                "on wrong device or stream.",
                UserWarning,
                stacklevel=1,
            )
        return super().__exit__(*exc)


@pytest.mark.parametrize("mode", ["on", "auto"])
def test_a_plan_on_a_gpu_other_than_the_current_one_is_captured_and_replayed_there(monkeypatch, mode):
    """Replicas on cuda:1 while cuda:0 is current: the capture and every replay run with
    cuda:1 current (else the capture records nothing and every later call would do nothing)."""
    from lptrain.comm import cuda_graph

    monkeypatch.setattr(cuda_graph.torch.cuda, "CUDAGraph", _DeviceGraph)
    monkeypatch.setattr(cuda_graph.torch.cuda, "graph", _DeviceCapture)
    monkeypatch.setattr(cuda_graph, "stream_for", lambda key, device: _CaptureStream(device.index))
    monkeypatch.setattr(cuda_graph.torch.cuda, "device", _Current)
    monkeypatch.setattr(cuda_graph.torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(cuda_graph, "_time", lambda fn, restore, device: {"replay": 1.0, "run": 2.0}[fn.__name__])
    _Current.index = 0
    replay = cuda_graph.GraphReplay(mode, [torch.device("cuda", 1)] * 2)
    t = torch.zeros(4)

    def run():
        t.add_(1)

    _FakeCapture.pending, _FakeCapture.watched = run, t
    for n in range(1, 4):
        replay.run(7, "allreduce of 4 x float32", [t], run)
        assert torch.equal(t, torch.full((4,), float(n)))
    assert replay.decisions["allreduce of 4 x float32"].startswith("graph")
    assert _Current.index == 0  # the caller's current GPU is left as it was


def test_a_capture_that_records_nothing_runs_the_plan_eagerly(monkeypatch):
    from lptrain.comm import cuda_graph

    monkeypatch.setattr(cuda_graph.torch.cuda, "CUDAGraph", _DeviceGraph)
    monkeypatch.setattr(cuda_graph.torch.cuda, "graph", _DeviceCapture)
    monkeypatch.setattr(cuda_graph, "stream_for", lambda key, device: _CaptureStream(device.index))
    monkeypatch.setattr(cuda_graph.torch.cuda, "device", lambda device: _Current(torch.device("cuda", 0)))
    monkeypatch.setattr(cuda_graph.torch.cuda, "synchronize", lambda device=None: None)
    replay = cuda_graph.GraphReplay("on", [torch.device("cuda", 1)] * 2)
    t = torch.zeros(4)

    def run():
        t.add_(1)

    _FakeCapture.pending, _FakeCapture.watched = run, t
    for n in range(1, 3):
        replay.run(7, "allreduce of 4 x float32", [t], run)
        assert torch.equal(t, torch.full((4,), float(n)))
    assert replay.decisions["allreduce of 4 x float32"] == "eager (the capture recorded nothing)"


def test_a_trainers_buckets_are_captured_once_each_however_many(monkeypatch):
    """One plan per gradient bucket, called in turn every step: each captured once, not
    again every step once the buckets outnumber the graphs kept."""
    from lptrain.comm import cuda_graph

    monkeypatch.setattr(cuda_graph.torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(cuda_graph.torch.cuda, "graph", _FakeCapture)
    monkeypatch.setattr(cuda_graph.torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(cuda_graph.torch.cuda, "device", _Current)
    monkeypatch.setattr(cuda_graph, "stream_for", lambda key, device: None)
    _FakeGraph.captures = 0
    replay = cuda_graph.GraphReplay("on", [torch.device("cuda", 0)] * 2)
    buckets = [torch.zeros(4) for _ in range(21)]  # VGG-16's gradient in 25 MiB buckets
    for _step in range(3):
        for k, t in enumerate(buckets):

            def run(t=t):
                t.add_(1)

            _FakeCapture.pending, _FakeCapture.watched = run, t
            replay.run(k, f"allreduce of bucket {k}", [t], run)
    assert all(torch.equal(t, torch.full((4,), 3.0)) for t in buckets)
    assert _FakeGraph.captures == len(buckets)
