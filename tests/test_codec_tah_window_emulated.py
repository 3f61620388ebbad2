"""The tah codec's ``window`` option on the GPU's kernels, run on the CPU through the CUDA
host emulation (tests/cuda_emulation/), against the numba kernels, bit for bit: the
selection within windows (tah_select.cu's TAH_OP 7) from given scores, and whole encodes
through tah_gpu's launches for windows (the scores, the selection within windows, the
tiles). tests/test_codec_gpu_tah.py checks the same on a GPU. Skips without a C++20
compiler.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_codec_tah_emulated import (  # the kernels' sources and launches as tah_gpu's
    ARGTYPES,
    BF16,
    SOURCES,
    XT,
    XT32,
    _variant,
    data,
    emulated_scores,
    launch,
    score_data,
    tile_grid,
)

from coccl.compressors import TahCompressor
from coccl.compressors.tah_cpu import low_prefix
from coccl.compressors.tah_format import MAX_WINDOW, tah_layout
from coccl.compressors.tah_gpu import _ENCODE, _EPL, _window_lows

from emulation import CXX, builder

if CXX is None:
    pytest.skip("needs g++ for the CUDA host emulation", allow_module_level=True)


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    return builder(tmp_path_factory.mktemp("tah_window"), SOURCES, ARGTYPES, {"OP": 0})


def window_select(build, payload: np.ndarray, lay, window: int, fraction: float) -> None:
    """tah_gpu._window_select's launch, on two blocks of 32 threads (a block a span,
    grid-stride over the spans)."""
    lows = _window_lows(lay, window, fraction)
    lib = build({"TAH_OP": 7, "THREADS": 32})
    lib.emu_set_grid(2)
    lib.emu_launch(
        payload.ctypes.data, None, lay.tokens, lay.full_tokens, window, lay.bitmap_offset, lows
    )


@pytest.mark.parametrize("tokens", [1, 5, 8, 9, 63, 700])
@pytest.mark.parametrize("window", [1, 2, 5, 8, 13, 64, 1024])
@pytest.mark.parametrize("fraction", [0.0, 0.2, 0.5, 1.0])
def test_window_selection_is_the_cpus(build, tokens: int, window: int, fraction: float) -> None:
    # Scores with many ties (the token index decides), the last token short (never low)
    # for odd counts; windows shorter and longer than the payload, a short last window.
    row, rng = 32, np.random.default_rng(tokens * window)
    count = tokens * row - (tokens % 2) * 5
    lay = tah_layout(count, row, 32, 4, 3, fraction, window)
    scores = (rng.integers(0, 4, lay.tokens) << int(rng.integers(0, 28))).astype(np.uint32)
    payload = np.full(lay.nbytes, 0xAB, np.uint8)
    payload[: 4 * lay.tokens] = scores.view(np.uint8)
    window_select(build, payload, lay, window, fraction)
    keys = (scores.astype(np.int64) << 32) | np.arange(lay.tokens)
    lb = low_prefix(keys, lay.full_tokens, fraction, window)
    assert lb[-1] == lay.low_tokens
    want = np.packbits((lb[1:] - lb[:-1]).astype(np.uint8), bitorder="little")
    np.testing.assert_array_equal(payload[lay.bitmap_offset :], want)


def window_encode(build, c: TahCompressor, x: np.ndarray) -> np.ndarray:
    """tah_gpu's launches for windows: the scores (split), the selection within windows,
    the tiles kernel."""
    lay = tah_layout(x.size, c.row, c.tile, c.bits_high, c.bits_low, c.low_fraction, c.window)
    payload = np.full(lay.nbytes, 0xAB, np.uint8)
    emulated_scores(build, x, payload, c.row, lay, split=True)
    window_select(build, payload, lay, c.window, c.low_fraction)
    ratio = f"{int(np.float32(c.pivot_ratio).view(np.uint32)):#010x}u"
    defs = {"TAH_OP": 2, "XT": XT[x.dtype], "PIVOT": int(c.pivot == "auto"), "RATIO_BITS": ratio}
    epl = _EPL[_ENCODE]
    launch(
        build({**defs, **_variant(c, epl)}), tile_grid(lay, c.tile, epl), x.ctypes.data,
        payload.ctypes.data, x.size, c.row, lay.tiles, lay.pivot_offset, lay.bitmap_offset,
    )  # fmt: skip
    return payload


WINDOW_CASES = [
    ({"row": 256, "window": 5}, XT32),
    ({"row": 256, "window": 3}, BF16),
    ({"row": 128, "tile": 32, "bits_high": 5, "bits_low": 2, "low_fraction": 0.5, "window": 8},
     np.float16),
    ({"row": 384, "tile": 128, "bits_high": 8, "bits_low": 4, "pivot_ratio": 4.0, "window": 2},
     XT32),
    ({"row": 64, "window": 13, "low_fraction": 0.3}, BF16),
]  # fmt: skip


@pytest.mark.parametrize("cfg, dtype", WINDOW_CASES, ids=lambda v: str(v))
def test_window_encodes_are_the_cpus(build, cfg: dict, dtype) -> None:
    # The encode for windows against the numba encode: one token, short tokens, a short
    # last window, spans that wrap in the grid (several a block), a NaN tile, outlier
    # tiles that pivot.
    dtype = np.dtype(dtype)
    c = TahCompressor(**cfg)
    rng = np.random.default_rng(c.row + c.window)
    for n in (1, c.row - 1, c.row, 7 * c.row + 100, 29 * c.row, 41 * c.row + 3):
        x = data(rng, n, c.row, dtype)
        np.testing.assert_array_equal(window_encode(build, c, x), c.encode(x), err_msg=f"n={n}")


@pytest.mark.parametrize("dtype", [XT32, BF16], ids=str)
def test_window_encodes_of_large_windows(build, dtype) -> None:
    # Windows of more tokens than the selection's threads, tokens that are not live
    # (zeros, NaN, infinity: score 0) and ties between them; the largest window.
    dtype = np.dtype(dtype)
    x = score_data(np.random.default_rng(7), 75, 64, dtype)
    for window in (40, 75, MAX_WINDOW):
        c = TahCompressor(row=64, window=window, low_fraction=0.4)
        np.testing.assert_array_equal(window_encode(build, c, x), c.encode(x), err_msg=f"{window=}")
