"""CUDA kernels of the tah codec, for CuPy arrays: the GPU twin of ``tah_cpu``.

The same two functions with the same signatures, on flat contiguous CuPy arrays, giving
payloads and decoded values bitwise identical to the CPU kernels'. Encoding runs these
kernels on the payload alone: the token scores (each token's score written into the
payload's centre region, scratch until the last kernel; with ``_SCORE_SPLIT``, where the
payload has room, in two launches: one block a token storing its warps' sums in the codes
region, then one thread a token adding them into the score), the choice of the low tokens
(one block's radix select of the nlow-th smallest score, ties to the lower index as the
CPU's sort; with ``_SELECT_MULTI`` and many tokens its three digits first histogrammed by
three launches of many blocks; with the codec's ``window`` option, a block a span of
whole windows choosing each window's low tokens) into the token bitmap, and the tiles;
decoding runs one kernel. Each call's launches (kernels, grids, arguments) are planned
once per shape, options and payload alignment and replayed. The tile kernels give each
block one contiguous range of tiles, whose places it finds by counting the bitmap bytes
before the range once and then those it passes (the decode: from a table of its tokens'
places that it writes into shared memory once, ``_DECODE_PREFIX``). No allocation, no host
synchronisation, no copy from the host per call, so a CUDA graph may capture them
(``TahCompressor.graph_safe``). The CUDA source is ``tah_kernels.cu`` (defines and shared
helpers), ``tah_encode.cu`` and ``tah_decode.cu``, compiled after
``codec_kernels.cu`` and ``codec_tile_helpers.cu`` (whose float32 arithmetic, conversions
and Hadamard it uses), ``tah_tables.cu`` (the score's tables) and ``tah_select.cu`` (the
selection) by ``gpu_build.compile_function``. Everything runs on CuPy's current stream
of the arrays' device. The scores' kernels are ``tah_score.cu``, compiled after those.
Importing this module touches neither CuPy nor the GPU.

Bytes moved per encode of n elements of e bytes (P the payload's bytes): the scores read
the input (n e) (split: and write then read 16 bytes a warp a token, 128 with 8 warps, and
write the NT scores), the selection reads the NT scores three to five times in one block, the
tiles read the input again and write P; a decode reads P and writes n e (twice that with
``accumulate``, which reads the output too). Each block of a tile kernel also reads the
bitmap bytes before its range (NT / 8 bytes at most).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .gpu_build import (
    check_accumulate,
    check_disjoint,
    check_payload,
    compile_function,
    cupy_module,
    element_type,
    note_launch,
    sm_count,
)
from .tah_format import MAX_WINDOW, tah_layout, windows

_SOURCE = tuple(
    Path(__file__).with_name(name)
    for name in (
        "tah_kernels.cu",
        "tah_encode.cu",
        "tah_decode.cu",
        "tah_score.cu",
    )
)
_PRELUDE = (
    Path(__file__).with_name("codec_kernels.cu"),
    Path(__file__).with_name("codec_tile_helpers.cu"),
    Path(__file__).with_name("tah_tables.cu"),
    Path(__file__).with_name("tah_select.cu"),
)
_THREADS = 256
_SELECT_THREADS = 512  # the selection's one block (16 scores a thread in registers)
_OP_SCORE, _OP_ENCODE, _OP_DECODE, _OP_SELECT, _OP_DIGIT, _OP_SCORE_SUMS = 1, 2, 3, 4, 5, 6
_OP_WINDOW_SELECT = 7
# The scores kernel's blocks per SM, by element type (XT: float32, float16, bfloat16; the
# same split or not, below): its __launch_bounds__ minimum and its grid, one wave of them
# (grid-stride over tokens), so that every block takes as many tokens as another, to within
# one. The most that its registers allow without spilling (by ptxas: 48 a thread at 5, 64
# at 4, either way of _SCORE_PAIRS; the table, 33 KB of shared memory a block, would allow
# 6).
_SCORE_BLOCKS_PER_SM = {0: 4, 1: 5, 2: 5}
# The scores in two launches (tah_score.cu's SC_SPLIT): the scores kernel stores each
# warp's two sums in scratch in the payload's codes region, and a kernel of one thread a
# token adds them and computes the score, off the blocks' serial path between tokens.
# False computes them in the scores kernel (as payloads too small for the scratch do).
# Bitwise the same scores; a module constant for a device A/B.
_SCORE_SPLIT = True
_SCORE_SUMS_BLOCKS_PER_SM = 8  # kernel 6's grid cap (one thread a token, grid-stride)
# The 16-bit types' scores on pairs of elements (tah_score.cu's SC_PAIR): the largest |x|
# and the levels computed on the elements' own 16-bit bits, two a 32-bit word, for tokens
# where that is exact (bfloat16: largest |x| >= 2^-111; float16: >= 4, or no zero or
# subnormal in the token; others take the float32 path). False takes every element through
# float32 (as round 1 did). Bitwise the same scores; a module constant for a device A/B.
_SCORE_PAIRS = True
# The low tokens' selection: True runs the multi-block one (tah_select.cu's SEL_MULTI: each
# of the scores' three radix digits a launch of many blocks into a global histogram in the
# payload's step region, then the one block reads the digits off them and writes the bitmap);
# False the one-block radix select alone (its digit passes in one block: serial in the
# token count). Bitwise the same bitmap; a module constant for a device A/B.
_SELECT_MULTI = True
# The multi-block selection only where the one block's scores no longer fit its registers
# (SEL_CHUNK = 16 * 512 full tokens), the payload is 4-byte aligned (word scores, global
# atomics) and the step region holds the histograms (3 * 2048 words; K >= full tokens).
_SELECT_MULTI_MIN_TOKENS = 16 * 512 + 1
_SELECT_DIGITS, _SELECT_BINS = 3, 2048
_DIGIT_TOKENS_PER_BLOCK = 4 * _THREADS  # scores a block of a digit launch histograms
# The tile kernels' variants, (TAH_OP, ACC), which the launch tables below are keyed by.
_ENCODE, _DECODE, _DECODE_ACC = (_OP_ENCODE, 0), (_OP_DECODE, 0), (_OP_DECODE, 1)
# Elements a lane holds in the tile kernels (tah_kernels.cu's EPL): a tile's own work (its
# range, its step's divisions, its place, its loads) is repeated by each of its TILE / EPL
# lanes, so the encode and the decode, whose per-element work is a few instructions, hold
# 32 (the encode at 64 registers, its pivot path's 32 floats included; 16 is the previous
# launch, 48 registers at _TILE_MIN_BLOCKS 5). The accumulating decode, which also reads
# out after its arithmetic and was bound by memory at 16, keeps 16 and its 40 resident
# warps a SM.
_EPL = {_ENCODE: 32, _DECODE: 32, _DECODE_ACC: 16}
# __launch_bounds__ minimum blocks per SM of the tile kernels (sizes their registers: 64,
# 80 and 48 by ptxas, no spill). Their grids are two such waves of blocks, one range a block.
# The accumulating decode at 4 (64 registers): its loop (shared with the plain decode since
# the look-ahead) spills at 48 registers (5 blocks), 24 bytes without the look-ahead.
_TILE_MIN_BLOCKS = {_ENCODE: 4, _DECODE: 3, _DECODE_ACC: 4}
# The decodes' look-ahead (tah_decode.cu's DEC_AHEAD), by kind: each warp issues its next
# tile group's loads (the bitmap byte of its place, then the centres, steps, pivot bytes
# and codes) before this group's arithmetic and stores, 8-16 more registers a thread.
# False loads each group when it decodes it (the accumulating decode: with the look-ahead
# it spills at 64 registers). Bitwise the same output; module constants for a device A/B.
_DECODE_AHEAD = {_DECODE: True, _DECODE_ACC: False}
# The decodes' places from a table (tah_decode.cu's DEC_PRE), by kind: each block writes, once,
# the place and width of each token of its range into shared memory (a scan of the bitmap's
# bits), so that a tile group's place is one shared-memory word and a few integer operations,
# not a walk over the bitmap in global memory and 64-bit arithmetic a step; with them the
# whole-group tests and the staging buffer's flush addresses computed once. False: the previous
# loop. Bitwise the same output (the host emulation and the GPU tests run both). On for the
# decode, which gained at every size and type in the device A/B (most at 16-bit types);
# off for the accumulating decode, which it left mixed, a gain at 16M elements and a loss
# at 256M (bench/NOTES.md has the A/B).
_DECODE_PREFIX = {_DECODE: True, _DECODE_ACC: False}
# Tokens in a block's table (tah_decode.cu's NPRE; 4 bytes each of shared memory): the decode
# grids give each block at most this many tokens (a block of more still decodes, slowly).
_DECODE_TABLE_TOKENS = 2048


def _kernel(defines: dict[str, Any]) -> Any:
    full = {"OP": 0, "THREADS": _THREADS, "MIN_BLOCKS": 4, **defines}
    return compile_function((*_PRELUDE, *_SOURCE), full, "tah_kernel")


class _Launch(NamedTuple):
    """One kernel launch of a plan: its arguments after the call's arrays."""

    kern: Any
    grid: tuple[int]
    block: tuple[int]
    args: tuple
    first: int = 0  # the index of the call's first array it takes (1: the payload alone)


# (device, call's shape and options, the switches above that tests and A/Bs flip) -> the
# launches of one encode or decode; the other module constants are read when a plan is
# built. A chunk of a pipelined message is tens of microseconds of GPU time, so a call's
# host cost matters: with its plan built once, a call checks its arrays and launches.
_plans: dict[tuple, tuple[_Launch, ...]] = {}


def _run(cp: Any, plan: tuple[_Launch, ...], arrays: tuple, device_id: int) -> None:
    """Launch ``plan`` on ``arrays`` (its kernels' first arguments) on the current stream
    of device ``device_id``."""
    if cp.cuda.runtime.getDevice() != device_id:
        with cp.cuda.Device(device_id):
            _run(cp, plan, arrays, device_id)
        return
    for launch in plan:
        launch.kern(launch.grid, launch.block, (*arrays[launch.first :], *launch.args))
    note_launch(plan[-1].kern)


def _tile_launch(
    defs: dict[str, Any], cp: Any, warps: int, args: tuple, per_block: int = 0
) -> _Launch:
    """The launch of tile kernel ``defs`` (encode or decode) over ``warps`` warps' tile
    groups; with ``per_block``, at most that many groups a block."""
    min_blocks = _TILE_MIN_BLOCKS[(defs["TAH_OP"], defs.get("ACC", 0))]
    kern = _kernel({**defs, "MIN_BLOCKS": min_blocks})
    grid = max(1, min(-(-warps // (_THREADS // 32)), sm_count(cp) * 2 * min_blocks))
    if per_block:
        grid = max(grid, -(-warps // per_block))
    return _Launch(kern, (grid,), (_THREADS,), args)


def _decode_groups_per_block(kind: tuple[int, int], row: int, tile: int) -> int:
    """The most tile groups a block of decode ``kind`` may take so that its tokens fit its
    table: g groups of ``32 / (tile / EPL)`` tiles span at most g TPW / (row / tile) + 2
    tokens."""
    tpw = 32 // (tile // _EPL[kind])
    return max(1, (_DECODE_TABLE_TOKENS - 2) * (row // tile) // tpw)


def _ratio_bits(ratio: float) -> str:
    return f"{int(np.float32(ratio).view(np.uint32)):#010x}u"


def _tile_defines(
    kind: tuple[int, int], row: int, tile: int, bits_high: int, bits_low: int
) -> dict[str, Any]:
    return {
        "ROW": int(row),
        "TILE": int(tile),
        "BH": int(bits_high),
        "BL": int(bits_low),
        "EPL": _EPL[kind],
    }


def _tile_warps(kind: tuple[int, int], tiles: int, tile: int) -> int:
    """Warps of tile kernel ``kind`` ((op, ACC)): ``32 / (tile / EPL)`` tiles a warp."""
    return -(-tiles // (32 // (tile // _EPL[kind])))


def _select_scratch(ptr: int, lay: Any, window: int) -> tuple[int, int]:
    """The multi-block selection's histograms: (payload byte offset, u32 words), or (0, 0)
    for the one-block selection (the switch off, few tokens, none low, or a payload at
    address ``ptr`` not 4-byte aligned) and for windows. They lie in the step region
    (bytes [4 K, 8 K)), which the tiles overwrite."""
    words = _SELECT_DIGITS * _SELECT_BINS
    if (
        window
        or not _SELECT_MULTI
        or lay.full_tokens < _SELECT_MULTI_MIN_TOKENS
        or lay.low_tokens == 0
        or ptr % 4
        or lay.tiles < words
    ):
        return 0, 0
    return 4 * lay.tiles, words


def _score_sums(ptr: int, lay: Any, warps: int = _THREADS // 32) -> int:
    """The byte offset of the split scores' sums in the payload at address ``ptr`` (two
    int64 a warp a token, 8-byte aligned, from the codes region's start on: nothing else
    is written there before the tiles kernel, and the selection writes the bitmap only
    after kernel 6 has read the sums), or 0 for scores in one kernel (the switch off or no
    room)."""
    start = 8 * lay.tiles
    start += -(ptr + start) % 8
    if not _SCORE_SPLIT or start + 16 * warps * lay.tokens > lay.nbytes:
        return 0
    return start


def tah_encode(
    x: Any,
    payload: Any,
    *,
    row: int,
    tile: int,
    bits_high: int,
    bits_low: int,
    low_fraction: float,
    window: int,
    pivot: bool,
    pivot_ratio: float,
) -> None:
    """Encode flat ``x`` (float32/float16/bfloat16) into ``payload`` (uint8, exact size)."""
    cp = cupy_module()
    xt = element_type(cp, x, "x")
    count = int(x.size)
    lay = tah_layout(count, row, tile, bits_high, bits_low, low_fraction, window)
    check_payload(cp, payload, lay.nbytes, x)
    if lay.tiles == 0:
        return
    device_id = x.data.device_id
    options = (row, tile, bits_high, bits_low, low_fraction, int(window), bool(pivot))
    options = (*options, float(pivot_ratio))
    switches = (_SCORE_SPLIT, _SCORE_PAIRS, _SELECT_MULTI, _EPL[_ENCODE], _TILE_MIN_BLOCKS[_ENCODE])
    # The scratch offsets depend on the payload's address modulo 8 (_score_sums).
    key = ("encode", device_id, count, xt, options, payload.data.ptr % 8, switches)
    plan = _plans.get(key)
    if plan is None:
        with cp.cuda.Device(device_id):
            plan = _plans[key] = _encode_plan(cp, xt, count, lay, payload.data.ptr, options)
    _run(cp, plan, (x, payload), device_id)


def _encode_plan(
    cp: Any, xt: int, count: int, lay: Any, payload_ptr: int, options: tuple
) -> tuple[_Launch, ...]:
    """The launches of an encode (see the module docstring) of ``count`` elements, layout
    ``lay``, into a payload at an address congruent to ``payload_ptr`` modulo 8."""
    row, tile, bits_high, bits_low, fraction, window, pivot, pivot_ratio = options
    i64 = np.int64
    hist0, hwords = _select_scratch(payload_ptr, lay, window)
    sums = _score_sums(payload_ptr, lay)
    per_sm = _SCORE_BLOCKS_PER_SM[xt]
    score = _kernel(
        {
            "TAH_OP": _OP_SCORE,
            "XT": xt,
            "ROW": int(row),
            "MIN_BLOCKS": per_sm,
            "SC_SPLIT": int(sums > 0),
            "SC_PAIR": int(_SCORE_PAIRS and xt != 0),
        }
    )
    blocks = max(1, min(lay.tokens, sm_count(cp) * per_sm))
    args = (i64(count), i64(row), i64(lay.tokens), i64(hist0), i64(hwords), i64(sums))
    plan = [_Launch(score, (blocks,), (_THREADS,), args)]
    if sums:
        cap = sm_count(cp) * _SCORE_SUMS_BLOCKS_PER_SM
        grid = max(1, min(-(-lay.tokens // _THREADS), cap))
        args = (i64(lay.tokens), i64(sums), i64(_THREADS // 32), i64(0))
        plan.append(_Launch(_kernel({"TAH_OP": _OP_SCORE_SUMS}), (grid,), (_THREADS,), args, 1))
    if hist0:
        digit = _kernel({"TAH_OP": _OP_DIGIT})
        grid = max(1, min(-(-lay.full_tokens // _DIGIT_TOKENS_PER_BLOCK), sm_count(cp) * 4))
        for d in range(_SELECT_DIGITS):
            args = (i64(lay.full_tokens), i64(lay.low_tokens), i64(hist0), i64(d))
            plan.append(_Launch(digit, (grid,), (_THREADS,), args, 1))
    if window:
        plan.append(_window_select(cp, lay, window, fraction))
    else:
        counts = (i64(lay.tokens), i64(lay.full_tokens), i64(lay.low_tokens))
        args = (*counts, i64(lay.bitmap_offset), i64(hist0))
        select = _kernel({"TAH_OP": _OP_SELECT, "THREADS": _SELECT_THREADS, "MIN_BLOCKS": 1})
        plan.append(_Launch(select, (1,), (_SELECT_THREADS,), args, 1))
    defs = {
        "TAH_OP": _OP_ENCODE,
        "XT": xt,
        **_tile_defines(_ENCODE, row, tile, bits_high, bits_low),
        "PIVOT": int(pivot),
        "RATIO_BITS": _ratio_bits(pivot_ratio),
    }
    warps = _tile_warps(_ENCODE, lay.tiles, tile)
    args = (i64(count), i64(row), i64(lay.tiles), i64(lay.pivot_offset))
    plan.append(_tile_launch(defs, cp, warps, (*args, i64(lay.bitmap_offset))))
    return tuple(plan)


def _spans(lay: Any, window: int) -> int:
    """The spans of the selection within windows: runs of lcm(window, 8) tokens, whole
    windows whose bitmap bytes one block writes."""
    return -(-lay.tokens // math.lcm(window, 8))


def _window_lows(lay: Any, window: int, fraction: float) -> int:
    """The low tokens of a whole window and (shifted by 32) of the last, shorter one."""
    w = windows(lay.full_tokens, fraction, window)
    return w.low | w.rest_low << 32


def _window_select(cp: Any, lay: Any, window: int, fraction: float) -> _Launch:
    """The launch of the selection within windows (TAH_OP 7): a block a span."""
    i64 = np.int64
    lows = _window_lows(lay, window, fraction)
    grid = max(1, min(_spans(lay, window), sm_count(cp) * 8))
    args = (i64(lay.tokens), i64(lay.full_tokens), i64(window), i64(lay.bitmap_offset), i64(lows))
    kern = _kernel({"TAH_OP": _OP_WINDOW_SELECT, "WMAX": MAX_WINDOW})
    return _Launch(kern, (grid,), (_THREADS,), args, 1)


def tah_decode(
    payload: Any,
    out: Any,
    *,
    row: int,
    tile: int,
    bits_high: int,
    bits_low: int,
    low_fraction: float,
    window: int,
    accumulate: bool,
) -> None:
    """Decode ``payload`` into flat ``out`` (float32/float16/bfloat16); with
    ``accumulate`` add into ``out`` (float32 only)."""
    cp = cupy_module()
    xt = element_type(cp, out, "out")
    check_accumulate(out, accumulate)
    count = int(out.size)
    lay = tah_layout(count, row, tile, bits_high, bits_low, low_fraction, window)
    check_payload(cp, payload, lay.nbytes, out)
    check_disjoint(payload, out)
    if lay.tiles == 0:
        return
    device_id = out.data.device_id
    kind = _DECODE_ACC if accumulate else _DECODE
    prefix = _DECODE_PREFIX[kind]
    switches = (_EPL[kind], _TILE_MIN_BLOCKS[kind], _DECODE_AHEAD[kind], prefix)
    switches = (*switches, _DECODE_TABLE_TOKENS)
    key = ("decode", device_id, count, xt, kind, row, tile, bits_high, bits_low, low_fraction)
    key = (*key, window)
    key = (*key, switches)
    plan = _plans.get(key)
    if plan is None:
        defs = {
            "TAH_OP": _OP_DECODE,
            "XT": xt,
            **_tile_defines(kind, row, tile, bits_high, bits_low),
            "ACC": int(bool(accumulate)),
            "DEC_AHEAD": int(_DECODE_AHEAD[kind]),
            "DEC_PRE": int(prefix),
            **({"NPRE": _DECODE_TABLE_TOKENS} if prefix else {}),
        }
        warps = _tile_warps(kind, lay.tiles, tile)
        per_block = _decode_groups_per_block(kind, row, tile) if prefix else 0
        i64 = np.int64
        args = (i64(count), i64(row), i64(lay.tiles), i64(lay.pivot_offset))
        with cp.cuda.Device(device_id):
            launch = _tile_launch(defs, cp, warps, (*args, i64(lay.bitmap_offset)), per_block)
        plan = _plans[key] = (launch,)
    _run(cp, plan, (payload, out), device_id)
