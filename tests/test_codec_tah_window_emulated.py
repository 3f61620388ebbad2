"""The tah codec's ``window`` option on the GPU's kernels, run on the CPU through the CUDA
host emulation (tests/cuda_emulation/), against the numba kernels, bit for bit: the
selection within windows (tah_select.cu's TAH_OP 7) from given scores, and whole encodes
through tah_gpu's launches for windows (scores, the window selection, the tiles).
tests/test_codec_gpu_tah.py checks the same on a GPU. Skips without a C++20 compiler.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from coccl.compressors.tah_cpu import low_prefix
from coccl.compressors.tah_format import tah_layout, window_low_count

from emulation import CXX, EMULATION, KERNELS, builder

if CXX is None:
    pytest.skip("needs g++ for the CUDA host emulation", allow_module_level=True)

SOURCES = [
    EMULATION / "emu.h",
    KERNELS / "codec_kernels.cu",
    KERNELS / "codec_tile_helpers.cu",
    KERNELS / "tah_tables.cu",
    KERNELS / "tah_select.cu",
    KERNELS / "tah_kernels.cu",
    KERNELS / "tah_encode.cu",
    KERNELS / "tah_decode.cu",
    KERNELS / "tah_score.cu",
    EMULATION / "launch.cpp",
]


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    argtypes = {
        "emu_launch": [ctypes.c_void_p] * 2 + [ctypes.c_longlong] * 5,
        "emu_launch8": [ctypes.c_void_p] * 2 + [ctypes.c_longlong] * 6,
        "emu_set_grid": [ctypes.c_int],
    }
    return builder(tmp_path_factory.mktemp("tah_window"), SOURCES, argtypes, {"OP": 0})


def window_select(build, payload: np.ndarray, lay, window: int, fraction: float) -> None:
    """tah_gpu._window_select's launch, on two blocks of 32 threads (a thread a bitmap
    byte, grid-stride past 64 bytes)."""
    lows = window_low_count(window, fraction)
    lows |= window_low_count(lay.full_tokens % window, fraction) << 32
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
