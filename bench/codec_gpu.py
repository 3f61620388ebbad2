"""``coccl-bench codec --device gpu``: CuPy buffers, CUDA-event timing, and the parts only
a GPU has: the kernels' register and memory use, the launch configurations of the encode
kernel, the host's launch cost, and the hardware FP8 conversion checked against the
software one.

Timing: each timed call is queued behind a spin kernel (about 1 ms of one thread), so
that its two CUDA events bracket the call's GPU work only, as in a pipeline where the
host launches ahead of the GPU. Without it (``--launch-cost``) the GPU is idle when the
start event is recorded and the time also holds the host's cost of launching the call
(bench/NOTES.md compares the two).

Only public API: the codecs' ``encode``/``decode``/``encode_into``/``decode_into`` and
``encoded_nbytes``, ``coccl.compressors.gpu_kernels.tuning(**changes)`` (a context
manager that changes the kernels' launch tuning and restores it) and
``gpu_kernels.last_kernel_attributes()``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from coccl.compressors import Compressor, TacoCompressor

from .table import cpu_name

Call = Callable[[], Any]
GPU_COPY_BYTES = 1 << 30
SPIN_CYCLES = 2_000_000  # of the spin kernel: about 1 ms at 2 GHz
FP8_CHUNK = 1 << 28  # float32 bit patterns per step of the FP8 conversion check
FP8_SAMPLE = 1 << 22  # random bit patterns also encoded on the host

# Launch configurations of the taco encode kernel (--tuning), as gpu_kernels.tuning()
# takes them. encode_epl: elements per lane (0: the 32-per-lane kernel, with threads);
# epl_threads, epl_resident: block size and resident threads per SM of the others;
# blocks_per_sm: the grid (16: several waves; the occupancy limit: one persistent wave).
ENCODE_CONFIGS: tuple[dict[str, int], ...] = (
    {"encode_epl": 0, "threads": 256, "blocks_per_sm": 16},
    {"encode_epl": 128, "epl_threads": 64, "epl_resident": 384, "blocks_per_sm": 16},
    {"encode_epl": 128, "epl_threads": 64, "epl_resident": 384, "blocks_per_sm": 6},
    {"encode_epl": 128, "epl_threads": 64, "epl_resident": 320, "blocks_per_sm": 16},
    {"encode_epl": 64, "epl_threads": 128, "epl_resident": 512, "blocks_per_sm": 16},
    {"encode_epl": 64, "epl_threads": 128, "epl_resident": 640, "blocks_per_sm": 16},
    {"encode_epl": 64, "epl_threads": 64, "epl_resident": 512, "blocks_per_sm": 16},
    {"encode_epl": 64, "epl_threads": 128, "epl_resident": 512, "blocks_per_sm": 4},
    {"encode_epl": 32, "epl_threads": 128, "epl_resident": 1024, "blocks_per_sm": 16},
    {"encode_epl": 32, "epl_threads": 128, "epl_resident": 768, "blocks_per_sm": 16},
    {"encode_epl": 32, "epl_threads": 256, "epl_resident": 1024, "blocks_per_sm": 16},
)

_SPIN_SOURCE = r"""
extern "C" __global__ void coccl_bench_spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}
"""


def config_label(config: dict[str, Any]) -> str:
    """``encode_epl=64 epl_threads=128 ...``: a tuning row's ``config``."""
    return " ".join(f"{key}={value}" for key, value in config.items())


class CudaDevice:
    """CuPy buffers on the current GPU, timed with CUDA events.

    Args:
        cp: the ``cupy`` module (the caller has checked that a GPU is visible).

    Attributes:
        hide_launch: queue each timed call behind a spin kernel (see the module docstring).
    """

    name = "gpu"

    def __init__(self, cp: Any) -> None:
        from coccl.compressors import gpu_kernels, mx_gpu  # noqa: PLC0415

        self.xp = cp
        self.kernels = gpu_kernels
        self.mx_kernels = mx_gpu  # the mx and taco_fp codecs' own launcher
        self.hide_launch = True
        self._spin = cp.RawKernel(_SPIN_SOURCE, "coccl_bench_spin")

    def describe(self) -> dict[str, Any]:
        cp = self.xp
        device = cp.cuda.Device()
        props = cp.cuda.runtime.getDeviceProperties(device.id)
        name = props["name"]
        return {
            "cpu": cpu_name(),
            "gpu": name.decode() if isinstance(name, bytes) else str(name),
            "compute_capability": f"{props['major']}{props['minor']}",
            "sm_count": props["multiProcessorCount"],
            "cupy": cp.__version__,
            "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
            "driver": cp.cuda.runtime.driverGetVersion(),
        }

    def random(self, count: int, dtype: np.dtype, seed: int) -> Any:
        """``count`` normal values times 3 (never zeros) of ``dtype`` on the GPU."""
        cp = self.xp
        rs = cp.random.RandomState(seed)
        if dtype == np.float64:
            return rs.standard_normal(count) * 3.0
        x = rs.standard_normal(count, dtype=cp.float32)
        x *= 3.0
        if dtype == np.float32:
            return x
        if dtype == np.float16:
            return x.astype(cp.float16)
        # bfloat16 (CuPy has no arithmetic for it): round to nearest even on the bits
        bits = x.view(cp.uint32)
        rounded = (bits + cp.uint32(0x7FFF) + ((bits >> 16) & cp.uint32(1))) >> 16
        return rounded.astype(cp.uint16).view(dtype)

    def empty(self, count: int, dtype: np.dtype) -> Any:
        return self.xp.empty(count * dtype.itemsize, dtype=np.uint8).view(dtype)

    def to_host(self, a: Any) -> np.ndarray:
        """A host copy of device array ``a`` (through bytes: any dtype, bfloat16 too)."""
        return self.xp.asnumpy(a.view(self.xp.uint8)).view(np.dtype(a.dtype))

    def median_seconds(self, calls: list[Call], iters: int, warmup: int) -> float:
        """Median over ``iters`` calls, rotating over ``calls``, of one call's device time
        (CUDA events), after ``warmup`` (at least one per call) untimed calls."""
        cp = self.xp
        for i in range(max(warmup, len(calls))):
            calls[i % len(calls)]()
        cp.cuda.get_current_stream().synchronize()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        times = []
        for i in range(iters):
            if self.hide_launch:
                self._spin((1,), (1,), (cp.int64(SPIN_CYCLES),))
            start.record()
            calls[i % len(calls)]()
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
        times.sort()
        return times[len(times) // 2]

    def copy_gbps(self, iters: int) -> dict[str, float]:
        """Device-to-device copies of ``GPU_COPY_BYTES``, bytes read + written, in GB/s:
        ``copy_GBps`` by memcpy (the reference of ``fraction``), ``copy_kernel_GBps`` by
        a CuPy copy kernel."""
        cp = self.xp
        src = cp.full(GPU_COPY_BYTES, 7, dtype=cp.uint8)
        dst = cp.empty_like(src)
        stream = cp.cuda.get_current_stream()

        def memcpy() -> None:
            dst.data.copy_from_device_async(src.data, src.nbytes, stream)

        def kernel() -> None:
            cp.copyto(dst.view(cp.float32), src.view(cp.float32))

        return {
            "copy_GBps": 2 * GPU_COPY_BYTES / self.median_seconds([memcpy], iters, 1) / 1e9,
            "copy_kernel_GBps": 2 * GPU_COPY_BYTES / self.median_seconds([kernel], iters, 1) / 1e9,
        }

    def copy_calls(self, nbytes: int, sets: int) -> list[Call]:
        """``sets`` device-to-device memcpys of ``nbytes`` bytes (as ``copy_GBps``'s),
        each between buffers of its own, on the current stream."""
        cp = self.xp
        stream = cp.cuda.get_current_stream()
        calls = []
        for _ in range(sets):
            src, dst = cp.ones(nbytes, cp.uint8), cp.empty(nbytes, cp.uint8)
            copy = dst.data.copy_from_device_async
            calls.append(functools.partial(copy, src.data, nbytes, stream))
        return calls

    def kernel_attributes(self, codec: Compressor) -> dict[str, Any] | None:
        """Registers, local (spill) and shared memory of the kernel the last call ran.
        None for lossless codecs: their operations are copies, not coccl kernels."""
        if codec.lossless:
            return None
        mx = codec.codec_id in ("mx", "taco_fp")
        attributes = (self.mx_kernels if mx else self.kernels).last_kernel_attributes()
        return {
            "regs": attributes.get("num_regs"),
            "local_bytes": attributes.get("local_size_bytes"),
            "smem_bytes": attributes.get("shared_size_bytes"),
        }

    def tuning(self, config: dict[str, Any]) -> Any:
        """A context in which the kernels launch with ``config``."""
        return self.kernels.tuning(**config)

    def release(self) -> None:
        self.xp.get_default_memory_pool().free_all_blocks()


@dataclass
class Fp8Check:
    """The hardware FP8 conversion against the software one (``sw_cvt``), in the taco
    encode kernel without scales (``ash=False, dual_scale=False``: the codes are the
    conversion of the input), over float32 bit patterns.

    Attributes:
        fp8_format: ``e4m3`` or ``e5m2``.
        patterns: how many consecutive bit patterns from 0 were encoded both ways
            (2^32: every float32; groups holding an Inf or NaN pattern are all-NaN codes).
        mismatches: payload bytes that differ.
        sample: random bit patterns also encoded by the host's kernels.
        sample_mismatches: payload bytes of the GPU's encoding of those that differ.
        ok: no mismatch at all.
        seconds: how long it took.
    """

    fp8_format: str
    patterns: int
    mismatches: int
    sample: int
    sample_mismatches: int
    ok: bool
    seconds: float


def fp8_conversion_check(device: CudaDevice, fp8_format: str, patterns: int) -> Fp8Check:
    """Encode the first ``patterns`` float32 bit patterns (rounded up to whole chunks of
    ``FP8_CHUNK``) with the hardware and the software conversion; and ``FP8_SAMPLE``
    random patterns on the GPU and the host."""
    cp = device.xp
    codec = TacoCompressor(group_size=32, fp8_format=fp8_format, ash=False, dual_scale=False)
    started = time.perf_counter()
    nbytes = codec.encoded_nbytes(FP8_CHUNK, np.float32)
    hardware, software = cp.empty(nbytes, cp.uint8), cp.empty(nbytes, cp.uint8)
    mismatches, chunks = 0, -(-patterns // FP8_CHUNK)
    for c in range(chunks):
        bits = cp.arange(c * FP8_CHUNK, (c + 1) * FP8_CHUNK, dtype=cp.uint64).astype(cp.uint32)
        x = bits.view(cp.float32)
        codec.encode(x, out=hardware)
        with device.tuning({"sw_cvt": 1}):
            codec.encode(x, out=software)
        mismatches += int((hardware != software).sum())
        del bits, x
    rng = np.random.default_rng(1)
    sample = rng.integers(0, 1 << 32, FP8_SAMPLE, dtype=np.uint64).astype(np.uint32)
    host = codec.encode(sample.view(np.float32))
    gpu = device.to_host(codec.encode(cp.asarray(sample).view(cp.float32)))
    sample_mismatches = int((gpu != host).sum())
    device.release()
    return Fp8Check(
        fp8_format=fp8_format,
        patterns=chunks * FP8_CHUNK,
        mismatches=mismatches,
        sample=FP8_SAMPLE,
        sample_mismatches=sample_mismatches,
        ok=mismatches == 0 and sample_mismatches == 0,
        seconds=time.perf_counter() - started,
    )
