"""Routing of the codecs' encode and decode to the CPU or GPU kernels.

``cpu_kernels`` and ``gpu_kernels`` (int8, taco) expose the same functions with the same
keyword arguments; a codec with kernel modules of its own (tah) hands its kernel to
``encode_with``/``decode_with``. The CPU ones take every float dtype in and out; the GPU
ones take float32, float16 and bfloat16 and accumulate only into float32. This module
bridges that gap with CuPy array operations, with the same arithmetic as the CPU path
(float64 data is converted to float32 once on the way in, accumulated in float64 on the
way out; float16/bfloat16 accumulators are added to in float32 and rounded once), so
both devices give the same bits.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any

import numpy as np

from coccl.core.arrays import BFLOAT16

# Kernel families: a function name's prefix up to ":" picks the (CPU, GPU) modules of
# another codec family; a name without one is int8/taco's (``cpu_kernels``/``gpu_kernels``).
_FAMILIES = {
    "": ("cpu_kernels", "gpu_kernels"),
    "mx": ("mx_cpu", "mx_gpu"),
    "taco_fp": ("taco_fp_cpu", "mx_gpu"),
    "int": ("intq_cpu", "intq_gpu"),
}


@functools.cache
def _module(family: str, host: bool) -> ModuleType:
    # Lazy imports: numba (CPU) and CuPy (GPU) are only loaded when first needed.
    cpu, gpu = _FAMILIES[family]
    return importlib.import_module(f".{cpu if host else gpu}", __package__)


def _kernel(name: str, a: Any) -> Any:
    family, _, fn = name.rpartition(":")
    return getattr(_module(family, isinstance(a, np.ndarray)), fn)


def encode(name: str, x: Any, payload: Any, **options: Any) -> None:
    """Call ``<name>`` (e.g. ``taco_encode``, or ``mx:mx_encode`` of another family's
    kernel modules) of the kernels for ``x``'s device."""
    encode_with(_kernel(name, x), x, payload, **options)


def encode_with(fn: Any, x: Any, payload: Any, **options: Any) -> None:
    """Call the encode kernel ``fn`` (of ``x``'s device) with float64 device data
    converted to float32 first."""
    if not isinstance(x, np.ndarray) and x.dtype == np.float64:
        x = x.astype(np.float32)  # RNE; beyond float32 -> ±Inf, as on the CPU
    fn(x, payload, **options)


def decode(name: str, payload: Any, out: Any, accumulate: bool, **options: Any) -> None:
    """Call ``<name>`` (e.g. ``taco_decode``) of the kernels for ``payload``'s device."""
    decode_with(_kernel(name, payload), payload, out, accumulate, **options)


def decode_with(fn: Any, payload: Any, out: Any, accumulate: bool, **options: Any) -> None:
    """Call the decode kernel ``fn`` (of ``payload``'s device), bridging the output dtypes
    and accumulators the GPU kernels do not take (see the module docstring)."""
    if isinstance(payload, np.ndarray) or out.dtype == np.float32:
        fn(payload, out, accumulate=accumulate, **options)
        return
    xp = _array_module(out)
    if out.dtype == np.float64:
        tmp = xp.empty(out.size, dtype=np.float32)
        fn(payload, tmp, accumulate=False, **options)
        if accumulate:
            out += tmp  # float64 addition of the exact float64 value of each float32
        else:
            out[...] = tmp
    elif accumulate:  # float16 / bfloat16: add in float32, round once
        tmp = widen_to_f32(out, xp)
        fn(payload, tmp, accumulate=True, **options)
        narrow_from_f32(tmp, out, xp)
    else:
        fn(payload, out, accumulate=False, **options)  # the GPU kernels round themselves


def _array_module(a: Any) -> ModuleType:
    import cupy  # noqa: PLC0415

    return cupy.get_array_module(a)


def widen_to_f32(a: Any, xp: ModuleType) -> Any:
    """float16/bfloat16 ``a`` as a new float32 array (exact). bfloat16 goes through its
    bits, since not every CuPy version knows ml_dtypes' bfloat16 arithmetic."""
    if a.dtype == BFLOAT16:
        return (a.view(xp.uint16).astype(xp.uint32) << 16).view(xp.float32)
    return a.astype(xp.float32)


def narrow_from_f32(a32: Any, out: Any, xp: ModuleType) -> None:
    """Store float32 ``a32`` into float16/bfloat16 ``out``, rounded to nearest even."""
    if out.dtype != BFLOAT16:
        out[...] = a32.astype(out.dtype)
        return
    bits = a32.view(xp.uint32)
    rounded = (bits + xp.uint32(0x7FFF) + ((bits >> 16) & xp.uint32(1))) >> 16
    quiet_nan = (bits >> 16) | xp.uint32(0x40)  # keep the sign, set the quiet bit
    out.view(xp.uint16)[...] = xp.where(xp.isnan(a32), quiet_nan, rounded).astype(xp.uint16)
