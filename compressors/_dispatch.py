"""Routing of the int8/taco codecs' encode and decode to the CPU or GPU kernels.

``cpu_kernels`` and ``gpu_kernels`` expose the same functions with the same keyword
arguments. The CPU ones take every float dtype in and out; the GPU ones take float32,
float16 and bfloat16 and accumulate only into float32. This module bridges that gap
with CuPy array operations, with the same arithmetic as the CPU path (float64 data is
converted to float32 once on the way in, accumulated in float64 on the way out;
float16/bfloat16 accumulators are added to in float32 and rounded once), so both
devices give the same bits.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from coccl.core.arrays import BFLOAT16


def _kernels(a: Any) -> ModuleType:
    # Lazy imports: numba (CPU) and CuPy (GPU) are only loaded when first needed.
    if isinstance(a, np.ndarray):
        from . import cpu_kernels  # noqa: PLC0415

        return cpu_kernels
    from . import gpu_kernels  # noqa: PLC0415

    return gpu_kernels


def encode(name: str, x: Any, payload: Any, **options: Any) -> None:
    """Call ``<name>`` (e.g. ``taco_encode``) of the kernels for ``x``'s device."""
    kernels = _kernels(x)
    if not isinstance(x, np.ndarray) and x.dtype == np.float64:
        x = x.astype(np.float32)  # RNE; beyond float32 -> ±Inf, as on the CPU
    getattr(kernels, name)(x, payload, **options)


def decode(name: str, payload: Any, out: Any, accumulate: bool, **options: Any) -> None:
    """Call ``<name>`` (e.g. ``taco_decode``) of the kernels for ``payload``'s device."""
    kernels = _kernels(payload)
    fn = getattr(kernels, name)
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
