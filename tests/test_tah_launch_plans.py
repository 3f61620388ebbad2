"""tah_gpu's launch plans: a call replayed from a cached plan launches what a plan built
afresh for that call launches, whatever came before it (another shape, dtype, option,
payload alignment or switch). Runs without a GPU: a stand-in for CuPy records each launch
(kernel defines, grid, block, arguments); tests/test_codec_gpu_tah.py checks the kernels
themselves on a GPU."""

from __future__ import annotations

import contextlib
import types
from typing import Any

import numpy as np
import pytest

from coccl.compressors import gpu_build, tah_gpu
from coccl.compressors.tah_format import tah_layout
from coccl.core.arrays import BFLOAT16


class _Array:
    """What tah_gpu reads of a CuPy array: dtype, size, flags, data pointer and device."""

    def __init__(self, size: int, dtype: Any, ptr: int) -> None:
        self.size, self.dtype = size, np.dtype(dtype)
        self.nbytes = size * self.dtype.itemsize
        self.flags = types.SimpleNamespace(c_contiguous=True)
        self.data = types.SimpleNamespace(ptr=ptr, device_id=0)


class _Kernel:
    def __init__(self, defines: dict[str, Any], log: list) -> None:
        self.defines, self.log = tuple(sorted(defines.items())), log

    def __call__(self, grid: tuple, block: tuple, args: tuple) -> None:
        named = tuple(a.data.ptr if isinstance(a, _Array) else int(a) for a in args)
        self.log.append((self.defines, grid, block, named))


@pytest.fixture
def launches(monkeypatch) -> list:
    log: list = []
    cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDevice=lambda: 0),
        Device=lambda device_id: contextlib.nullcontext(),
    )
    monkeypatch.setattr(
        gpu_build, "_cupy_module", [types.SimpleNamespace(ndarray=_Array, cuda=cuda)]
    )
    monkeypatch.setattr(tah_gpu, "compile_function", lambda src, defs, name: _Kernel(defs, log))
    monkeypatch.setattr(tah_gpu, "sm_count", lambda cp: 132)
    monkeypatch.setattr(tah_gpu, "_plans", {})
    return log


OPTIONS = dict(row=4096, tile=64, bits_high=4, bits_low=3, low_fraction=0.2, window=0)
# (count, dtype, payload address offset, option changes, switch changes): each differs from
# the one before it in what a plan depends on.
CALLS = [
    (64 << 20, BFLOAT16, 0, {}, {}),
    (64 << 20, BFLOAT16, 4, {}, {}),  # 4-byte aligned: the split scores' scratch moves
    (64 << 20, BFLOAT16, 1, {}, {}),  # unaligned: the one-block selection
    (64 << 20, np.float32, 0, {}, {}),
    ((64 << 20) + 77, np.float16, 0, {}, {}),
    (4 << 20, BFLOAT16, 0, {}, {}),
    (4 << 20, BFLOAT16, 0, {"tile": 32, "bits_high": 5, "bits_low": 2}, {}),
    (4 << 20, BFLOAT16, 0, {"low_fraction": 0.5, "row": 1024}, {}),
    (64 << 20, BFLOAT16, 0, {}, {"_SELECT_MULTI": False}),
    (64 << 20, BFLOAT16, 0, {}, {"_SCORE_SPLIT": False}),
    (64 << 20, BFLOAT16, 0, {}, {"_SCORE_PAIRS": False}),
    (4 << 20, BFLOAT16, 0, {}, {"_EPL": 16, "_TILE_MIN_BLOCKS": 5}),
    (4 << 20, BFLOAT16, 0, {}, {"_DECODE_AHEAD": False}),
    (4 << 20, BFLOAT16, 0, {}, {"_DECODE_PREFIX": False}),
    (4 << 20, BFLOAT16, 0, {}, {"_DECODE_PREFIX": True, "_DECODE_TABLE_TOKENS": 64}),
    # the decodes' grids sized by their tables
    (256 << 20, BFLOAT16, 0, {"row": 64}, {"_DECODE_PREFIX": True}),
    (1000, BFLOAT16, 0, {}, {}),
    (5, np.float32, 0, {}, {}),
    # windows: the selection within windows, its grid by the spans
    (64 << 20, BFLOAT16, 0, {"window": 5}, {}),
    (64 << 20, BFLOAT16, 0, {"window": 6}, {}),
    (1 << 20, BFLOAT16, 0, {"window": 6}, {}),  # 11 spans: fewer blocks
    (64 << 20, np.float32, 0, {"window": 512}, {}),
]


def _call(launches: list, case: tuple, fresh: bool) -> list:
    """The launches of an encode and both decodes of ``case`` (its switches set for the
    call only), from the plans cached so far or (``fresh``) from an empty cache."""
    count, dtype, offset, changes, switches = case
    with pytest.MonkeyPatch.context() as mp:
        for name, value in switches.items():
            table = getattr(tah_gpu, name)
            if isinstance(table, dict):  # per kind: the encode's and both decodes'
                for kind in table:
                    mp.setitem(table, kind, value)
            else:
                mp.setattr(tah_gpu, name, value)
        if fresh:
            tah_gpu._plans.clear()
        options = {**OPTIONS, **changes}
        lay = tah_layout(count, **options)
        x, out = _Array(count, dtype, 1 << 40), _Array(count, dtype, 3 << 40)
        payload = _Array(lay.nbytes, np.uint8, (2 << 40) + offset)
        del launches[:]
        tah_gpu.tah_encode(x, payload, **options, pivot=True, pivot_ratio=2.0)
        for accumulate in (False, True):
            acc = _Array(count, np.float32, 5 << 40) if accumulate else out
            tah_gpu.tah_decode(payload, acc, **options, accumulate=accumulate)
    return list(launches)


@pytest.mark.parametrize("i", range(len(CALLS)))
def test_replayed_plan_launches_what_a_fresh_plan_does(launches, i: int) -> None:
    for case in CALLS[:i]:  # the cache holds the calls before, as a process's would
        _call(launches, case, fresh=False)
    replayed = _call(launches, CALLS[i], fresh=False)
    assert replayed and replayed == _call(launches, CALLS[i], fresh=True)


def test_calls_that_differ_launch_differently(launches) -> None:
    # The property above holds trivially if every call launched alike: the cases differ.
    seen = {str(_call(launches, case, fresh=True)) for case in CALLS}
    assert len(seen) == len(CALLS)


@pytest.mark.parametrize("row, tile", [(64, 64), (32, 32), (128, 128), (4096, 64), (384, 128)])
@pytest.mark.parametrize("count", [1 << 20, 256 << 20, (1 << 30) + 77])
def test_decode_blocks_fit_their_tables(
    monkeypatch, launches, count: int, row: int, tile: int
) -> None:
    # With the places from a table, each decode block's tokens (tah_decode.cu's range: its
    # first tile's token to its last tile's) fit its table of tah_gpu._DECODE_TABLE_TOKENS.
    for kind in tah_gpu._DECODE_PREFIX:
        monkeypatch.setitem(tah_gpu._DECODE_PREFIX, kind, True)
    options = {**OPTIONS, "row": row, "tile": tile}
    lay = tah_layout(count, **options)
    payload = _Array(lay.nbytes, np.uint8, 2 << 40)
    for accumulate in (False, True):
        out = _Array(count, np.float32, 3 << 40)
        del launches[:]
        tah_gpu.tah_decode(payload, out, **options, accumulate=accumulate)
        (defines, (grid,), _, _) = launches[-1]
        defs = dict(defines)
        assert defs["DEC_PRE"] == 1 and defs["NPRE"] == tah_gpu._DECODE_TABLE_TOKENS
        tpw = 32 // (tile // defs["EPL"])
        groups = -(-lay.tiles // tpw)
        per = -(-groups // grid)
        tpr = row // tile
        worst = 0
        for b in range(grid):
            g0, g1 = b * per, min(b * per + per, groups)
            if g0 < g1:
                klast = min(g1 * tpw, lay.tiles) - 1
                worst = max(worst, klast // tpr - g0 * tpw // tpr + 1)
        assert 0 < worst <= tah_gpu._DECODE_TABLE_TOKENS, (grid, worst)


@pytest.mark.parametrize(
    "window, ops", [(0, [1, 6, 5, 5, 5, 4, 2]), (5, [1, 6, 7, 2]), (512, [1, 6, 7, 2])]
)
def test_window_encode_launches(launches, window: int, ops: list) -> None:
    # Windows: the scores, the selection within windows and the tiles; none: the
    # multi-block selection's digits.
    count = 64 << 20
    options = {**OPTIONS, "window": window}
    lay = tah_layout(count, **options)
    x, payload = _Array(count, BFLOAT16, 1 << 40), _Array(lay.nbytes, np.uint8, 2 << 40)
    tah_gpu.tah_encode(x, payload, **options, pivot=True, pivot_ratio=2.0)
    assert [dict(d)["TAH_OP"] for d, *_ in launches] == ops
