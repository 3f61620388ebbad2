"""CUDA kernels of the ``int`` codec, for CuPy arrays: the GPU twin of ``intq_cpu``.

The same two functions with the same keyword arguments, on flat contiguous CuPy arrays
(float32, float16 or bfloat16; decode-accumulate into float32 only: ``_dispatch`` bridges
the rest as for the other codecs), producing payloads and decoded values bitwise
identical to the CPU kernels' (FORMAT.md's ``## int``). The CUDA source is
``intq_kernels.cu`` (defines and shared helpers), ``intq_encode.cu`` and ``intq_decode.cu``
appended to ``codec_kernels.cu`` and ``codec_tile_helpers.cu`` compiled with ``OP=0``
(their helpers, none of the codec kernels); each variant (operation, bits, group size,
block, dtype, rounding) is compiled on first use through ``gpu_build.compile_function``.
Kernels run on CuPy's current stream of the arrays' device. Importing this module touches
neither CuPy nor the GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .gpu_build import (
    as_int,
    check_accumulate,
    check_disjoint,
    check_payload,
    compile_function,
    cupy_module,
    element_type,
    note_launch,
    sm_count,
)
from .layout import int_layout

__all__ = ["int_decode", "int_encode"]

_HERE = Path(__file__).parent
_SOURCES = tuple(
    _HERE / name
    for name in (
        "codec_kernels.cu",
        "codec_tile_helpers.cu",
        "intq_kernels.cu",
        "intq_encode.cu",
        "intq_decode.cu",
    )
)
_BLOCKS_PER_SM = 16  # the grid is at most this many blocks per SM (grid-stride loops)
# Resident threads per SM that __launch_bounds__ sizes the registers for, per kind, at 32
# elements a lane: 1024 (64 registers) keeps four blocks of 256 threads on an SM for the
# decode (its next tile's codes held in registers) and the 16-bit staged encode, whose
# 4M-element tiles then fit one wave; the float32 staged encode's 128-thread blocks are
# held to six an SM by their shared memory, so it keeps 768; so do 6 and 7 bits (codes
# that straddle words: 64 registers spill in some of their variants). 64 elements a lane:
# at most 768 (as 32 elements at 384: twice the registers a thread).
_RESIDENT = {"encode": 1024, "decode": 1024, "accumulate": 512}
_RESIDENT_768 = 768
# The encode of 32 elements per lane copies whole tiles into shared memory ahead (ISTAGE,
# cp.async): lane-strided loads straight from memory held float32 well under the copy
# bandwidth. Its two buffers a warp (2 x 32 lanes x 32 elements) fit 48 KiB in 256
# threads of 16-bit elements or 128 of float32.
_ENCODE_STAGE = 1
# The staged encode's grid: one wave of the blocks an SM holds (MIN_BLOCKS: the registers
# are sized for them and their shared memory fits), grid-stride, so that a warp encodes
# several tiles with the next one's copy in flight while it computes this one. At
# _BLOCKS_PER_SM a warp gets one tile up to 16M elements, and cp.async nothing to overlap.
# False: _BLOCKS_PER_SM, as the other kernels.
_ENCODE_ONE_WAVE = True
# The same for the decodes (their next tile's codes loaded one tile ahead): off, not yet
# measured against _BLOCKS_PER_SM.
_DECODE_ONE_WAVE = False

# (device, kind, defines) -> (kernel, threads, warps per block, largest grid, elements per lane)
_launches: dict[tuple, tuple[Any, int, int, int, int]] = {}


def int_encode(
    x: Any,
    payload: Any,
    *,
    bits: int,
    group_size: int,
    hadamard: int,
    stochastic: bool,
    key: int,
) -> None:
    """Encode flat ``x`` (float32/float16/bfloat16) into ``payload`` (uint8, exact size);
    ``key`` is the stochastic rounding's stream key (ignored when rounding to nearest)."""
    cp = cupy_module()
    bits, G, H = _options(bits, group_size, hadamard)
    xt = element_type(cp, x, "x")
    count = int(x.size)
    layout = int_layout(count, bits, G, H)
    check_payload(cp, payload, layout.nbytes, x)
    key = as_int(key, "key")
    if not 0 <= key < 1 << 64:
        raise ValueError(f"key must be in 0..2^64-1, got {key}")
    if count == 0:
        return
    defs = {"IOP": 1, "BITS": bits, "GS": G, "HAD": H, "XT": xt, "STOCH": int(bool(stochastic))}
    _launch(cp, defs, "encode", (x, payload), count, layout.groups, layout.coded, key)


def int_decode(
    payload: Any, out: Any, *, bits: int, group_size: int, hadamard: int, accumulate: bool
) -> None:
    """Decode ``payload`` into flat ``out`` (float32/float16/bfloat16); with
    ``accumulate`` add into ``out`` (float32 only)."""
    cp = cupy_module()
    bits, G, H = _options(bits, group_size, hadamard)
    xt = element_type(cp, out, "out")
    check_accumulate(out, accumulate)
    count = int(out.size)
    layout = int_layout(count, bits, G, H)
    check_payload(cp, payload, layout.nbytes, out)
    check_disjoint(payload, out)
    if count == 0:
        return
    defs = {"IOP": 2, "BITS": bits, "GS": G, "HAD": H, "XT": xt, "ACC": int(bool(accumulate))}
    kind = "accumulate" if accumulate else "decode"
    _launch(cp, defs, kind, (payload, out), count, layout.groups, layout.coded, 0)


def _options(bits: Any, group_size: Any, hadamard: Any) -> tuple[int, int, int]:
    """The kernels' options, checked (the codec checks them for users first)."""
    b, G, H = as_int(bits, "bits"), as_int(group_size, "group_size"), as_int(hadamard, "hadamard")
    if not 2 <= b <= 8:
        raise ValueError(f"bits must be in 2..8, got {b}")
    if G < 32 or G > 2048 or G & (G - 1):
        raise ValueError(f"group_size must be a power of two in 32..2048, got {G}")
    if H and (H < 8 or H > G or H & (H - 1)):
        raise ValueError(f"hadamard must be 0 or a power of two in 8..group_size, got {H}")
    return b, G, H


def _launch(
    cp: Any,
    defs: dict[str, Any],
    kind: str,
    arrays: tuple,
    count: int,
    K: int,
    coded: int,
    key: int,
) -> None:
    device_id = arrays[0].data.device_id
    with cp.cuda.Device(device_id):
        key_t = (device_id, kind, *sorted(defs.items()))
        cached = _launches.get(key_t)
        if cached is None:
            npl = 64 if defs["GS"] > 1024 else 32  # a group lies in at most 32 lanes
            threads = 128 if npl == 64 else 256  # the staging buffers fit 48 KiB
            stage = int(kind == "encode" and npl == 32 and _ENCODE_STAGE)
            resident = _RESIDENT[kind]
            if stage and defs["XT"] == 0:
                threads = 128
            if npl == 64 or defs["BITS"] in (6, 7) or (stage and defs["XT"] == 0):
                resident = min(resident, _RESIDENT_768)
            full = {
                **defs,
                "OP": 0,
                "NPL": npl,
                "ISTAGE": stage,
                "THREADS": threads,
                # 64 elements per lane need twice the registers: half the threads.
                "MIN_BLOCKS": max(1, resident * 32 // npl // threads),
            }
            kern = compile_function(_SOURCES, full, "coccl_int")
            one_wave = _ENCODE_ONE_WAVE if kind == "encode" else _DECODE_ONE_WAVE
            per_sm = (
                full["MIN_BLOCKS"] if one_wave and (stage or kind != "encode") else _BLOCKS_PER_SM
            )
            cached = (kern, threads, threads // 32, sm_count(cp) * per_sm, npl)
            _launches[key_t] = cached
        kern, threads, per_block, grid_cap, npl = cached
        warps = -(-coded // (32 * npl))
        blocks = max(1, min(-(-warps // per_block), grid_cap))
        kern((blocks,), (threads,), (*arrays, np.int64(count), np.int64(K), np.uint64(key)))
        note_launch(kern)
