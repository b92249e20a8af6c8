"""Bad input gets a clear error before anything is touched."""

from __future__ import annotations

import pytest
import torch

from lptrain.communicators import (
    NAMES,
    BackendUnavailableError,
    CollectiveInputError,
    available,
    build_communicator,
    options_of,
)

NO_CUDA = not torch.cuda.is_available()


def _inputs(p=3, n=10, dtype=torch.float32):
    return [torch.arange(n, dtype=dtype) + r for r in range(p)]


def _assert_unchanged(before, after):
    for a, b in zip(before, after):
        if a.device.type != "meta":  # meta tensors have no values to compare
            assert torch.equal(a, b), "a failed call changed its inputs"


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(CollectiveInputError, match="unknown communicator 'tree'; valid names: lp, mst, be, ring, nccl"):
        build_communicator("tree", ["cpu"] * 2)


def test_unknown_option_lists_the_valid_ones():
    with pytest.raises(CollectiveInputError, match="'blocksize' for lp; valid options: accumulate_fp32, block_size"):
        build_communicator("lp", ["cpu"] * 2, blocksize=4)
    with pytest.raises(CollectiveInputError, match="for mst; valid options: accumulate_fp32"):
        build_communicator("mst", ["cpu"] * 2, block_size=4)
    assert options_of("lp") == ["accumulate_fp32", "block_size", "allreduce", "order", "reduce_kernel", "cuda_graph"]
    assert options_of("ring") == ["accumulate_fp32", "order", "reduce_kernel", "cuda_graph"]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"block_size": 0}, "at least 1 byte"),
        ({"block_size": "lots"}, "number of bytes such as"),
        ({"order": [0, 0, 1]}, "permutation of 0..2"),
        ({"allreduce": "tree"}, "valid modes: overlapped, reduce_broadcast"),
    ],
)
def test_bad_lp_options(options, message):
    with pytest.raises(ValueError, match=message):
        build_communicator("lp", ["cpu"] * 3, **options)


def test_lp_block_size_accepts_human_sizes():
    comm = build_communicator("lp", ["cpu"] * 3, block_size="1K")
    assert comm.schedule("broadcast", 1000, 0, torch.float32).algorithm == "lp(block=256)"


@pytest.mark.parametrize(
    "devices, message",
    [
        ([], "devices is empty"),
        ("cpu", "must be a list"),
        (["cpu", "gpu"], "'gpu' is not a device"),
        (["cpu", "meta"], "valid types: cpu, cuda"),
    ],
)
def test_bad_devices(devices, message):
    with pytest.raises(CollectiveInputError, match=message):
        build_communicator("ring", devices)


@pytest.mark.skipif(not NO_CUDA, reason="checks the error raised on machines without CUDA")
def test_cuda_devices_without_cuda_fail_clearly():
    for name in ("lp", "mst", "be", "ring"):
        with pytest.raises(BackendUnavailableError, match="needs CUDA, but torch.cuda.is_available\\(\\) is False"):
            build_communicator(name, ["cuda:0", "cuda:1"])
    with pytest.raises(BackendUnavailableError, match="nccl communicator needs CUDA"):
        build_communicator("nccl", ["cpu"] * 2)


@pytest.mark.skipif(not NO_CUDA, reason="checks what this machine lacks")
def test_available_lists_what_runs_here():
    assert available() == ["lp", "mst", "be", "ring", "auto"]
    assert set(available()) <= set(NAMES)


@pytest.mark.parametrize("name", ["lp", "mst", "be", "ring"])
def test_bad_calls_fail_before_touching_the_inputs(name):
    comm = build_communicator(name, ["cpu"] * 3)
    good = _inputs()

    def attempt(tensors, message, call="allreduce", **kw):
        before = [t.clone() for t in tensors if isinstance(t, torch.Tensor)]
        with pytest.raises(CollectiveInputError, match=message):
            getattr(comm, call)(tensors, **kw)
        _assert_unchanged(before, [t for t in tensors if isinstance(t, torch.Tensor)])

    attempt(good[:2], r"expected 3 tensors, one per device \['cpu', 'cpu', 'cpu'\], got 2")
    attempt(good[0], "expected a list of 3 tensors")
    attempt([good[0], good[1], [1, 2]], r"tensors\[2\] is a list")
    attempt([good[0], good[1], torch.zeros(11)], r"tensors\[2\] has shape \(11,\) but tensors\[0\] has \(10,\)")
    attempt([good[0], good[1], torch.zeros(10, dtype=torch.float64)], r"tensors\[2\] has dtype torch.float64")
    attempt([good[0], good[1], torch.zeros(20)[::2]], r"tensors\[2\] is not contiguous")
    attempt([torch.zeros(10, dtype=torch.bool) for _ in range(3)], "dtype torch.bool is not supported; valid dtypes")
    attempt([good[0], good[1], good[0]], r"tensors\[0\] and tensors\[2\] share memory")
    attempt(good, "unknown op 'max'; valid ops: sum, avg", op="max")
    attempt(_inputs(dtype=torch.int32), "op='avg' needs a floating-point dtype", op="avg")
    attempt(good, r"root must be a rank in 0..2, got 3", call="reduce", root=3)
    attempt(good, r"root must be a rank in 0..2, got -1", call="broadcast", root=-1)
    attempt([good[0], good[1], good[2].to("meta")], r"tensors\[2\] is on meta but this communicator's device 2 is cpu")


def test_schedule_lookup_rejects_unknown_ops():
    comm = build_communicator("be", ["cpu"] * 2)
    with pytest.raises(CollectiveInputError, match="valid ops: broadcast, reduce, allreduce"):
        comm.schedule("scatter", 10)
