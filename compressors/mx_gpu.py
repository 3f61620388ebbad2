"""CUDA kernels of the ``mx`` and ``taco_fp`` codecs, for CuPy arrays.

The GPU twin of ``mx_cpu`` and ``taco_fp_cpu``: the same functions with the same keyword
arguments, on flat contiguous CuPy arrays (float32, float16, bfloat16; accumulate into
float32), producing payloads and decoded values bitwise identical to the CPU kernels'.
The CUDA source is :data:`MX_SOURCES`, ``mx_kernels.cu`` (the defines and helpers) then
``mx_encode_kernels.cu``, ``mx_decode_kernels.cu`` (the mx chunk bodies) and
``mx_entry_kernels.cu`` (taco_fp's and the kernels) beside this file; each variant is
compiled on first use through ``gpu_build.compile_function`` and runs on CuPy's current
stream of the arrays' device. ``scale="e4m3"`` encodes in three launches: per CUDA block the largest
finite ``|x|`` into the payload's code area, then from those the per-payload scale ``S``
into the payload's S slot, then the blocks (which overwrite the code area and read ``S``);
an empty payload gets ``S`` by the second launch alone. Everything else is one launch
(none for an empty payload). A lane (thread) owns a chunk of 8 (FP4) or 16 (FP6, and the
E4M3 encode of a 16-bit x) elements of mx, 32 of taco_fp; a block (group) is a few
neighbouring lanes of one warp, which combine by shuffles; the grid is at most
``resident_blocks`` CUDA blocks per SM, grid-stride (``grid_size``; the kernels' layout
is described in ``mx_kernels.cu``).

The kernels allocate nothing per call and never synchronise with the host: every launch
reads ``x`` or the payload and writes only the payload or ``out``, in stream order on the
current stream. So an encode or decode can be captured into a CUDA graph, and calls on
concurrent streams share no memory (as long as their own arrays are distinct).

Importing this module touches neither CuPy nor the GPU.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from . import minifloat
from .gpu_build import (
    check_accumulate,
    check_disjoint,
    check_payload,
    compile_function,
    cupy_module,
    element_type,
    overlap,
    sm_count,
)
from .layout import GROUP_SIZES, num_groups
from .mx_layout import BLOCK_SIZES, mx_layout, taco_fp_layout

__all__ = [
    "MX_SOURCES",
    "chunks_and_unroll",
    "grid_size",
    "last_kernel_attributes",
    "mx_decode",
    "mx_encode",
    "partial_grid",
    "resident_blocks",
    "taco_fp_decode",
    "taco_fp_encode",
]

MX_SOURCES = tuple(
    Path(__file__).with_name(n)
    for n in (
        "mx_kernels.cu",
        "mx_encode_kernels.cu",
        "mx_decode_kernels.cu",
        "mx_entry_kernels.cu",
    )
)
_ELEM = {"e2m1": 0, "e3m2": 1, "e2m3": 2}
_SCALE = {"e8m0": 0, "e4m3": 1}
_OP_MX_ENC, _OP_MX_DEC, _OP_MX_PARTS, _OP_TFP_ENC, _OP_TFP_DEC, _OP_MX_S = 1, 2, 3, 4, 5, 6
_THREADS = 256  # per CUDA block (mx_kernels.cu: a lane per chunk of 8, 16 or 32 elements)
_BLOCKS_PER_SM = 8  # the grid's cap: 2048 resident threads per SM, then grid-stride
_last_kernel: list[Any] = [None]


def mx_encode(x: Any, payload: Any, *, element: str, block: int, scale: str) -> None:
    """Encode flat ``x`` (float32/float16/bfloat16) into ``payload`` (uint8, exact size)."""
    cp = cupy_module()
    defs, count = _mx_variant(cp, x, "x", element, block, scale)
    f = minifloat.get_format(element)
    check_payload(cp, payload, mx_layout(count, block, f.bits, bool(defs["SC"])).nbytes, x)
    if overlap(x, payload):  # the e4m3 partials land in the payload before x is read whole
        raise ValueError("x and payload must not overlap")
    k = num_groups(count, block)
    with cp.cuda.Device(x.data.device_id):
        sms = sm_count(cp)
        if defs["SC"]:  # count 0 too: the payload is S alone (2^-126, no finite block)
            parts = {**defs, "OP": _OP_MX_PARTS}
            grid = partial_grid(parts, k, sms)
            if grid:
                _launch(cp, parts, x, payload, count, k, grid)
            _launch(cp, {**defs, "OP": _OP_MX_S, "UNR": 1}, payload, payload, grid, k, 1)
        if k:
            enc = {**defs, "OP": _OP_MX_ENC}
            _launch(cp, enc, x, payload, count, k, grid_size(enc, k, sms))


def mx_decode(
    payload: Any, out: Any, *, element: str, block: int, scale: str, accumulate: bool
) -> None:
    """Decode ``payload`` into flat ``out``; with ``accumulate`` add into it (float32)."""
    cp = cupy_module()
    defs, count = _mx_variant(cp, out, "out", element, block, scale)
    f = minifloat.get_format(element)
    check_payload(cp, payload, mx_layout(count, block, f.bits, bool(defs["SC"])).nbytes, out)
    check_accumulate(out, accumulate)
    check_disjoint(payload, out)
    if count == 0:
        return
    defs.update(OP=_OP_MX_DEC, ACC=int(bool(accumulate)))
    k = num_groups(count, block)
    with cp.cuda.Device(out.data.device_id):
        _launch(cp, defs, payload, out, count, k, grid_size(defs, k, sm_count(cp)))


def taco_fp_encode(x: Any, payload: Any, *, group_size: int, element: str) -> None:
    """Encode flat ``x`` (float32/float16/bfloat16) into ``payload`` (uint8, exact size)."""
    cp = cupy_module()
    defs, count = _taco_fp_variant(cp, x, "x", group_size, element)
    f = minifloat.get_format(element)
    check_payload(cp, payload, taco_fp_layout(count, group_size, f.bits).nbytes, x)
    if count == 0:
        return
    k = num_groups(count, group_size)
    defs["OP"] = _OP_TFP_ENC
    with cp.cuda.Device(x.data.device_id):
        _launch(cp, defs, x, payload, count, k, grid_size(defs, k, sm_count(cp)))


def taco_fp_decode(
    payload: Any, out: Any, *, group_size: int, element: str, accumulate: bool
) -> None:
    """Decode ``payload`` into flat ``out``; with ``accumulate`` add into it (float32)."""
    cp = cupy_module()
    defs, count = _taco_fp_variant(cp, out, "out", group_size, element)
    f = minifloat.get_format(element)
    check_payload(cp, payload, taco_fp_layout(count, group_size, f.bits).nbytes, out)
    check_accumulate(out, accumulate)
    check_disjoint(payload, out)
    if count == 0:
        return
    defs.update(OP=_OP_TFP_DEC, ACC=int(bool(accumulate)))
    k = num_groups(count, group_size)
    with cp.cuda.Device(out.data.device_id):
        _launch(cp, defs, payload, out, count, k, grid_size(defs, k, sm_count(cp)))


# ------------------------------------------------------------------ validation
def _element(element: Any) -> int:
    if element not in _ELEM:
        raise ValueError(f"element must be 'e2m1', 'e3m2' or 'e2m3', got {element!r}")
    return _ELEM[element]


def _mx_variant(
    cp: Any, data: Any, name: str, element: Any, block: Any, scale: Any
) -> tuple[dict[str, Any], int]:
    if block not in BLOCK_SIZES or isinstance(block, bool):
        raise ValueError(f"block must be 16 or 32, got {block!r}")
    if scale not in _SCALE:
        raise ValueError(f"scale must be 'e8m0' or 'e4m3', got {scale!r}")
    xt = element_type(cp, data, name)
    defs = {"ELEM": _element(element), "BS": int(block), "SC": _SCALE[scale], "XT": xt}
    return defs, int(data.size)


def _taco_fp_variant(
    cp: Any, data: Any, name: str, group_size: Any, element: Any
) -> tuple[dict[str, Any], int]:
    if group_size not in GROUP_SIZES or isinstance(group_size, bool):
        raise ValueError(f"taco_fp group_size must be one of {GROUP_SIZES}, got {group_size!r}")
    xt = element_type(cp, data, name)
    g = int(group_size)
    defs = {"ELEM": _element(element), "BS": g, "XT": xt, "CINV_BITS": _inv_sqrt_bits(g)}
    return defs, int(data.size)


def _inv_sqrt_bits(g: int) -> str:
    # FORMAT.md: (float)(1 / sqrt(G)), computed in double and rounded once.
    return f"{int(np.float32(1.0 / math.sqrt(g)).view(np.uint32)):#010x}u"


# ---------------------------------------------------------------------- launch
def chunks_and_unroll(defs: dict[str, Any]) -> tuple[int, int]:
    """The elements per lane (chunk) of variant ``defs`` (mx_kernels.cu's EPL: 8 or 16
    for mx, 16 for every E4M3 encode of a 16-bit x, 32 for taco_fp) and its chunks per
    lane per loop step (UNR: 2 where a chunk is a single 16-byte load of a 16-bit x, so
    that each lane has 32 bytes in flight)."""
    if defs["OP"] in (_OP_TFP_ENC, _OP_TFP_DEC):
        return 32, 1
    epl = 8 if defs["ELEM"] == _ELEM["e2m1"] else 16
    if _e4m3_encode(defs) and defs["XT"] != 0:
        epl = 16  # the 16-bit E4M3 encode: a lane per NVFP4 block (mx_kernels.cu)
    # A bfloat16 FP4 decode's lane writes one 16-byte piece a chunk: two chunks a step.
    loads = defs["OP"] in (_OP_MX_ENC, _OP_MX_PARTS) or _lean_decode(defs)
    return epl, 2 if loads and epl == 8 and defs["XT"] != 0 else 1


def _e4m3_encode(defs: dict[str, Any]) -> bool:
    return defs["OP"] == _OP_MX_ENC and bool(defs["SC"])


def _lean_decode(defs: dict[str, Any]) -> bool:
    """An mx decode into a float32 or bfloat16 out that overwrites it (mx_decode_kernels.cu's
    FAST): compiled to fit ``resident_blocks`` CUDA blocks per SM."""
    return defs["OP"] == _OP_MX_DEC and not defs.get("ACC") and defs["XT"] != 1


def resident_blocks(defs: dict[str, Any]) -> int:
    """CUDA blocks of ``_THREADS`` per SM that the grid of variant ``defs`` is capped at
    (one wave, grid-stride): ``_BLOCKS_PER_SM``; the E4M3 encode and the lean decodes are
    also compiled to fit them (mx_kernels.cu's RESIDENT, their launch bound): 8 (32
    registers), but 5 (48) for the float32 FP6 encode, whose lanes hold 16 float32
    elements, and 6 (40) for the FP6 decodes."""
    if _e4m3_encode(defs) and defs["XT"] == 0 and defs["ELEM"] != _ELEM["e2m1"]:
        return 5
    if _lean_decode(defs) and defs["ELEM"] != _ELEM["e2m1"]:
        return 6
    return _BLOCKS_PER_SM


def grid_size(defs: dict[str, Any], k: int, sms: int, threads: int = _THREADS) -> int:
    """CUDA blocks of ``threads`` for variant ``defs`` over ``k`` >= 1 blocks (groups) on
    ``sms`` multiprocessors: a lane per chunk, at most ``resident_blocks`` per SM."""
    epl, unr = chunks_and_unroll(defs)
    lanes = k * defs["BS"] // epl
    return max(1, min(-(-lanes // (threads * unr)), sms * resident_blocks(defs)))


def partial_grid(defs: dict[str, Any], k: int, sms: int, threads: int = _THREADS) -> int:
    """The e4m3 partials' CUDA blocks (one partial each; 0 without a block): at most
    ceil(k / 64), so that their 4 bytes each fit in the code area (mx_kernels.cu)."""
    return min(grid_size(defs, k, sms, threads), -(-k // 64)) if k else 0


def _launch(
    cp: Any, defs: dict[str, Any], src: Any, dst: Any, count: int, k: int, blocks: int
) -> None:
    """``coccl_mx(src, dst, count, k)`` of variant ``defs`` on ``blocks`` CUDA blocks of
    ``_THREADS`` threads, on the current stream."""
    unr = defs.get("UNR", chunks_and_unroll(defs)[1])
    defs = {**defs, "THREADS": _THREADS, "UNR": unr}
    if _e4m3_encode(defs) or _lean_decode(defs):
        defs["RESIDENT"] = resident_blocks(defs)
    kern = compile_function(MX_SOURCES, defs, name="coccl_mx")
    kern((blocks,), (_THREADS,), (src, dst, np.int64(count), np.int64(k)))
    _last_kernel[0] = kern


def last_kernel_attributes() -> dict[str, Any]:
    """Registers, local (spill) memory, shared memory and the like of the mx/taco_fp kernel
    this process launched last (CuPy's ``Function.attributes``); empty before the first."""
    kern = _last_kernel[0]
    return {} if kern is None else dict(kern.attributes)
