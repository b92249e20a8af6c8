"""One-pass peer reduction on CUDA: ``out = a + b`` where ``b`` lives on another GPU.

The staged path of the in-process executor moves a block in two passes: a peer copy
into a staging buffer on the receiver, then an add from it. Where the receiver can
read the sender's memory directly (peer access over NVLink), one kernel launched on the
receiving GPU's link stream reads ``b`` across the link and adds it into ``out`` in one
pass: half the memory traffic on the receiver, no staging buffer. Over PCIe peer reads
are often slower than the copy engine's writes, so ``reduce_kernel=auto`` measures both
once per device pair and keeps the faster (``choose_kernel``).

The kernel is CuPy's (the ``gpu`` extra): compiled by NVRTC on first use, one
vectorised variant per dtype (16-byte loads when all three pointers are aligned, a
scalar tail), float16 and bfloat16 widened to float32 for the add. It also runs with
``a``, ``b`` and ``out`` on one GPU, so a single-GPU machine (several replicas sharing
it) checks it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from lptrain.comm.errors import BackendUnavailableError, CollectiveInputError

REDUCE_KERNELS = ("auto", "peer", "staged")

# C type, widening to the accumulation type, narrowing back. Half types go through PTX's
# conversions (no header needed); bfloat16 is float32's upper half, rounded to nearest even.
_TYPES: dict[torch.dtype, tuple[str, str, str, str]] = {
    torch.float32: ("float", "float", "(x)", "(x)"),
    torch.float64: ("double", "double", "(x)", "(x)"),
    torch.float16: ("unsigned short", "float", "half_to_float(x)", "float_to_half(x)"),
    torch.bfloat16: ("unsigned short", "float", "bf16_to_float(x)", "float_to_bf16(x)"),
    torch.int8: ("signed char", "int", "(int)(x)", "(signed char)(x)"),
    torch.uint8: ("unsigned char", "unsigned int", "(unsigned int)(x)", "(unsigned char)(x)"),
    torch.int16: ("short", "int", "(int)(x)", "(short)(x)"),
    torch.int32: ("int", "int", "(x)", "(x)"),
    torch.int64: ("long long", "long long", "(x)", "(x)"),
}

# Half conversions through PTX (no header needed); a test swaps in host versions.
HALF_PTX = r"""
__device__ __forceinline__ float half_to_float(unsigned short h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ unsigned short float_to_half(float f) {
    unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
"""

_BF16 = r"""
__device__ __forceinline__ float bf16_to_float(unsigned short b) {
    return __uint_as_float(((unsigned int)b) << 16);
}
__device__ __forceinline__ unsigned short float_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
"""

_KERNEL = r"""
extern "C" __global__ void peer_add_{name}(const {t}* a, const {t}* __restrict__ b, {t}* out,
                                          long long n, int vectorised) {{
    const int V = 16 / sizeof({t});
    const long long nvec = vectorised ? n / V : 0;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long v = first; v < nvec; v += stride) {{
        uint4 xa = reinterpret_cast<const uint4*>(a)[v];
        uint4 xb = reinterpret_cast<const uint4*>(b)[v];
        uint4 xo;
        const {t}* pa = reinterpret_cast<const {t}*>(&xa);
        const {t}* pb = reinterpret_cast<const {t}*>(&xb);
        {t}* po = reinterpret_cast<{t}*>(&xo);
        #pragma unroll
        for (int k = 0; k < V; ++k) {{
            {t} x = pa[k]; {acc} sa = {widen};
            x = pb[k]; {acc} sb = {widen};
            {acc} x2 = sa + sb;
            {{ {acc} x = x2; po[k] = {narrow}; }}
        }}
        reinterpret_cast<uint4*>(out)[v] = xo;
    }}
    for (long long i = nvec * V + first; i < n; i += stride) {{
        {t} x = a[i]; {acc} sa = {widen};
        x = b[i]; {acc} sb = {widen};
        {acc} x2 = sa + sb;
        {{ {acc} x = x2; out[i] = {narrow}; }}
    }}
}}
"""


def kernel_name(dtype: torch.dtype) -> str:
    return "peer_add_" + str(dtype).removeprefix("torch.")


def kernel_source(half_conversions: str = HALF_PTX) -> str:
    """The CUDA C of every dtype's kernel (one module, compiled once)."""
    parts = [half_conversions, _BF16]
    for dtype, (t, acc, widen, narrow) in _TYPES.items():
        name = str(dtype).removeprefix("torch.")
        parts.append(_KERNEL.format(name=name, t=t, acc=acc, widen=widen, narrow=narrow))
    return "\n".join(parts)


def cupy_available() -> bool:
    return importlib.util.find_spec("cupy") is not None


def check_reduce_kernel(value: object) -> str:
    if value not in REDUCE_KERNELS:
        raise CollectiveInputError(f"reduce_kernel={value!r} is not valid; valid choices: {', '.join(REDUCE_KERNELS)}")
    return str(value)


@dataclass(frozen=True)
class KernelChoice:
    """What one (sender, receiver) device pair uses, and why."""

    kernel: str  # "peer" or "staged"
    reason: str


def choose_kernel(
    mode: str,
    *,
    cuda: bool,
    have_cupy: bool,
    peer_access: bool,
    timings_ms: dict[str, float] | None = None,
    pair: str = "",
) -> KernelChoice:
    """The reduction path for one device pair, as a pure function of what was found.

    ``peer`` without CuPy or without peer access is an error (never a silent fallback);
    ``auto`` takes the peer kernel only where it can run and measured faster
    (``timings_ms``: the two paths' times on the same block), the staged path otherwise.
    """
    check_reduce_kernel(mode)
    where = f" for {pair}" if pair else ""
    if not cuda:
        if mode == "peer":
            raise BackendUnavailableError("reduce_kernel=peer needs CUDA devices; on the CPU use auto or staged")
        return KernelChoice("staged", "CPU devices: the add reads the other device's memory directly")
    if mode == "staged":
        return KernelChoice("staged", "asked for")
    if not have_cupy:
        if mode == "peer":
            raise BackendUnavailableError(
                "reduce_kernel=peer needs CuPy (the gpu extra: pip install 'lptrain[gpu]'); "
                "use reduce_kernel=staged or auto"
            )
        return KernelChoice("staged", "CuPy is not installed")
    if not peer_access:
        if mode == "peer":
            raise BackendUnavailableError(
                f"reduce_kernel=peer{where}: these GPUs have no peer access to each other "
                "(torch.cuda.can_device_access_peer is False); use reduce_kernel=staged or auto"
            )
        return KernelChoice("staged", "no peer access")
    if mode == "peer":
        return KernelChoice("peer", "asked for")
    if not timings_ms or "peer" not in timings_ms or "staged" not in timings_ms:
        raise ValueError("reduce_kernel=auto needs both paths measured")
    peer, staged = timings_ms["peer"], timings_ms["staged"]
    faster = "peer" if peer < staged else "staged"
    return KernelChoice(faster, f"measured {peer:.3f} ms (peer) vs {staged:.3f} ms (staged)")


def grid_size(n: int, dtype: torch.dtype, aligned: bool, sm_count: int, threads: int = 256) -> int:
    """Blocks to launch: enough to cover the work once, at most 8 per multiprocessor
    (the kernel strides over the rest)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    units = n // (16 // itemsize) + n % (16 // itemsize) if aligned else n
    return max(1, min((units + threads - 1) // threads, 8 * sm_count))


class PeerReducer:
    """Launches the kernel on a torch CUDA stream; one compiled module per process."""

    THREADS = 256

    def __init__(self) -> None:
        if not cupy_available():
            raise BackendUnavailableError(
                "the peer reduction kernel needs CuPy (the gpu extra: pip install 'lptrain[gpu]')"
            )
        import cupy

        self._cupy = cupy
        self._module = None
        self._peers_enabled: set[tuple[int, int]] = set()

    def _function(self, dtype: torch.dtype):
        if dtype not in _TYPES:
            raise CollectiveInputError(f"the peer kernel has no variant for {dtype}")
        if self._module is None:
            self._module = self._cupy.RawModule(code=kernel_source(), options=("--std=c++14",))
        return self._module.get_function(kernel_name(dtype))

    def enable_peer_access(self, reader: int, owner: int) -> None:
        """Let GPU ``reader`` read GPU ``owner``'s memory (once per pair)."""
        if reader == owner or (reader, owner) in self._peers_enabled:
            return
        runtime = self._cupy.cuda.runtime
        with self._cupy.cuda.Device(reader):
            try:
                runtime.deviceEnablePeerAccess(owner)
            except runtime.CUDARuntimeError as err:
                if "PeerAccessAlreadyEnabled" not in str(err):  # torch's own copies may have enabled it
                    raise
        self._peers_enabled.add((reader, owner))

    def add(self, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, stream: torch.cuda.Stream) -> None:
        """Queue ``out = a + b`` on ``stream`` (on ``out``'s GPU); ``b`` may be on another GPU."""
        n = out.numel()
        if not (a.numel() == b.numel() == n and a.dtype == b.dtype == out.dtype):
            raise CollectiveInputError("peer add: a, b and out must have the same length and dtype")
        if n == 0:
            return
        device = out.device.index
        self.enable_peer_access(device, b.device.index)
        pointers = (a.data_ptr(), b.data_ptr(), out.data_ptr())
        aligned = all(p % 16 == 0 for p in pointers)
        sm_count = torch.cuda.get_device_properties(device).multi_processor_count
        blocks = grid_size(n, out.dtype, aligned, sm_count, self.THREADS)
        import numpy as np

        args = (*(np.uint64(p) for p in pointers), np.int64(n), np.int32(1 if aligned else 0))
        function = self._function(out.dtype)
        with self._cupy.cuda.Device(device), self._cupy.cuda.ExternalStream(stream.cuda_stream, device):
            function((blocks,), (self.THREADS,), args)
