"""CUDA kernels of the tah codec, for CuPy arrays: the GPU twin of ``tah_cpu``.

The same two functions with the same signatures, on flat contiguous CuPy arrays, giving
payloads and decoded values bitwise identical to the CPU kernels'. Encoding runs the
token-score kernel, chooses the low tokens with CuPy (a sort of distinct int64 keys, so
deterministic, then a prefix sum), and runs the tile kernel; decoding rebuilds the prefix
from the payload's token bitmap and runs the decode kernel. The CUDA source is
``tah_kernels.cu``, compiled after ``codec_kernels.cu`` (whose float32 arithmetic and
conversions it uses) by ``gpu_build.compile_function``. Everything runs on CuPy's current
stream of the arrays' device. Importing this module touches neither CuPy nor the GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .gpu_build import (
    check_accumulate,
    check_disjoint,
    check_payload,
    compile_function,
    cupy_module,
    element_type,
    sm_count,
)
from .tah_format import SCORE_W, SCORE_WL, tah_layout

_SOURCE = Path(__file__).with_name("tah_kernels.cu")
_PRELUDE = (Path(__file__).with_name("codec_kernels.cu"),)
_THREADS = 256
_BLOCKS_PER_SM = 16
_OP_SCORE, _OP_ENCODE, _OP_DECODE = 1, 2, 3
_tables: dict[int, Any] = {}


def _kernel(defines: dict[str, Any]) -> Any:
    full = {"OP": 0, "THREADS": _THREADS, "MIN_BLOCKS": 4, **defines}
    return compile_function((*_PRELUDE, _SOURCE), full, "tah_kernel")


def _score_tables(cp: Any) -> Any:
    # The score's integer tables, the CPU kernels' own, once per device.
    dev = cp.cuda.Device().id
    t = _tables.get(dev)
    if t is None:
        t = _tables[dev] = cp.asarray(np.concatenate([SCORE_W, SCORE_WL]).astype(np.int64))
    return t


def _grid(cp: Any, warps: int) -> int:
    per_block = _THREADS // 32
    return max(1, min(-(-warps // per_block), sm_count(cp) * _BLOCKS_PER_SM))


def _ratio_bits(ratio: float) -> str:
    return f"{int(np.float32(ratio).view(np.uint32)):#010x}u"


def _tile_defines(tile: int, bits_high: int, bits_low: int) -> dict[str, Any]:
    return {"TILE": int(tile), "BH": int(bits_high), "BL": int(bits_low)}


def tah_encode(
    x: Any,
    payload: Any,
    *,
    row: int,
    tile: int,
    bits_high: int,
    bits_low: int,
    low_fraction: float,
    pivot: bool,
    pivot_ratio: float,
) -> None:
    """Encode flat ``x`` (float32/float16/bfloat16) into ``payload`` (uint8, exact size)."""
    cp = cupy_module()
    xt = element_type(cp, x, "x")
    count = int(x.size)
    lay = tah_layout(count, row, tile, bits_high, bits_low, low_fraction)
    check_payload(cp, payload, lay.nbytes, x)
    if lay.tiles == 0:
        return
    with cp.cuda.Device(x.data.device_id):
        keys = cp.empty(lay.tokens, dtype=cp.int64)
        score = _kernel({"TAH_OP": _OP_SCORE, "XT": xt})
        blocks = max(1, min(lay.tokens, sm_count(cp) * _BLOCKS_PER_SM))
        args = (x, keys, _score_tables(cp), np.int64(count), np.int64(row), np.int64(lay.tokens))
        score((blocks,), (_THREADS,), args)
        flags = cp.zeros(lay.tokens, dtype=cp.int64)
        if lay.low_tokens:
            chosen = cp.sort(keys[: lay.full_tokens])[: lay.low_tokens] & 0xFFFFFFFF
            flags[chosen] = 1
        lb = cp.concatenate([cp.zeros(1, dtype=cp.int64), cp.cumsum(flags)])
        padded = cp.zeros(-(-lay.tokens // 8) * 8, dtype=cp.uint8)
        padded[: lay.tokens] = flags
        weights = cp.asarray(np.uint8(1) << np.arange(8, dtype=np.uint8))
        payload[lay.bitmap_offset :] = (padded.reshape(-1, 8) * weights).sum(axis=1, dtype=cp.uint8)
        defs = {
            "TAH_OP": _OP_ENCODE,
            "XT": xt,
            **_tile_defines(tile, bits_high, bits_low),
            "PIVOT": int(bool(pivot)),
            "RATIO_BITS": _ratio_bits(pivot_ratio),
        }
        warps = -(-lay.tiles // (32 // (tile // 8)))
        args = (x, payload, lb, np.int64(count), np.int64(row), np.int64(lay.tiles))
        _kernel(defs)((_grid(cp, warps),), (_THREADS,), (*args, np.int64(lay.pivot_offset)))


def tah_decode(
    payload: Any,
    out: Any,
    *,
    row: int,
    tile: int,
    bits_high: int,
    bits_low: int,
    low_fraction: float,
    accumulate: bool,
) -> None:
    """Decode ``payload`` into flat ``out`` (float32/float16/bfloat16); with
    ``accumulate`` add into ``out`` (float32 only)."""
    cp = cupy_module()
    xt = element_type(cp, out, "out")
    check_accumulate(out, accumulate)
    count = int(out.size)
    lay = tah_layout(count, row, tile, bits_high, bits_low, low_fraction)
    check_payload(cp, payload, lay.nbytes, out)
    check_disjoint(payload, out)
    if lay.tiles == 0:
        return
    with cp.cuda.Device(out.data.device_id):
        shifts = cp.arange(8, dtype=cp.uint8)
        bits = (payload[lay.bitmap_offset :, None] >> shifts) & cp.uint8(1)
        flags = bits.reshape(-1)[: lay.tokens].astype(cp.int64)
        lb = cp.concatenate([cp.zeros(1, dtype=cp.int64), cp.cumsum(flags)])
        defs = {
            "TAH_OP": _OP_DECODE,
            "XT": xt,
            **_tile_defines(tile, bits_high, bits_low),
            "ACC": int(bool(accumulate)),
        }
        warps = -(-lay.tiles // (32 // (tile // 8)))
        args = (payload, out, lb, np.int64(count), np.int64(row), np.int64(lay.tiles))
        _kernel(defs)((_grid(cp, warps),), (_THREADS,), (*args, np.int64(lay.pivot_offset)))
