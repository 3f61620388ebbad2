"""The tah codec's payload layout, its token-entropy score tables and its constants.

One place for what the codec (``tah.py``), its CPU kernels (``tah_cpu.py``), its GPU
launcher (``tah_gpu.py``) and the tests share; nothing here imports any of them.
FORMAT.md (section ``tah``) describes the same in prose.

Payload of ``count`` elements in tokens of ``row`` elements, tiles of ``tile``:
``[K float32 c][K float32 step][codes][K pivot bytes][ceil(NT / 8) token bitmap bytes]``,
``K = ceil(count / tile)`` tiles, ``NT = ceil(count / row)`` tokens. A full token's codes
take ``row * bits / 8`` bytes (``bits_low`` for the low tokens, ``bits_high`` for the
others), in token order; the short last token (if any) is always high and takes
``ceil(rem * bits_high / 8)`` bytes. The low tokens are chosen among the payload's full
tokens (``window`` 0) or within each window of ``window`` consecutive full tokens.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

import numpy as np

TILES: tuple[int, ...] = (32, 64, 128)  # a pivot byte holds an index below 128
MAX_ROW = 1 << 20  # keeps the score's fixed-point sums inside int64
MAX_WINDOW = 1024  # tokens of a selection window (the GPU ranks a window's scores in a block)
PIVOT_FLAG = 0x80  # a pivot byte: 0x80 | index of the tile's largest |x|, or 0
# Tiles pivot only with absmax in [2^-64, 2^64): the unnormalised transform then neither
# overflows nor rounds into subnormals (FORMAT.md).
PIVOT_MIN_BITS = 63 << 23
PIVOT_MAX_BITS = 191 << 23
SCORE_LEVELS = 256  # 1/16-octave levels over 16 octaves; level 256 weighs nothing
SCORE_FRAC = 20  # fractional bits of the score


class TahLayout(NamedTuple):
    """Where the parts of a tah payload lie (byte offsets) and its token counts."""

    tiles: int  # K = ceil(count / tile)
    tokens: int  # NT = ceil(count / row)
    full_tokens: int  # NF = count // row
    low_tokens: int  # the low tokens of the payload (low_token_count)
    step_offset: int  # K float32 steps (the K float32 centres start at 0)
    codes_offset: int
    pivot_offset: int
    bitmap_offset: int
    nbytes: int


def window_low_count(tokens: int, low_fraction: float) -> int:
    """``floor(low_fraction * tokens)`` (in double precision): the low tokens of a window
    (or of a whole payload) of that many full tokens."""
    return int(math.floor(float(low_fraction) * int(tokens)))


class Windows(NamedTuple):
    """How a payload's full tokens fall into windows (FORMAT.md's step 2): ``whole``
    windows of ``size`` tokens, ``low`` low tokens each, then the last ``rest`` tokens
    (fewer than ``size``: a shorter window) with ``rest_low``."""

    size: int
    whole: int
    low: int
    rest: int
    rest_low: int


def windows(full_tokens: int, low_fraction: float, window: int = 0) -> Windows:
    """The windows of ``full_tokens`` full tokens: of ``window`` tokens, or with ``window``
    0 one window of them all."""
    full = int(full_tokens)
    size = int(window) if window > 0 else full
    whole, rest = divmod(full, size) if size else (0, 0)
    f = low_fraction
    return Windows(size, whole, window_low_count(size, f), rest, window_low_count(rest, f))


def low_token_count(full_tokens: int, low_fraction: float, window: int = 0) -> int:
    """The low-bit tokens of a payload of ``full_tokens`` full tokens: the windows' counts
    summed (``window`` 0: one window of them all)."""
    w = windows(full_tokens, low_fraction, window)
    return w.whole * w.low + w.rest_low


@lru_cache(maxsize=256)
def tah_layout(
    count: int,
    row: int,
    tile: int,
    bits_high: int,
    bits_low: int,
    low_fraction: float,
    window: int = 0,
) -> TahLayout:
    """The layout of the tah payload of ``count`` elements (see the module docstring)."""
    count = int(count)
    tiles = -(-count // tile)
    tokens = -(-count // row)
    full = count // row
    rem = count - full * row
    low = low_token_count(full, low_fraction, window)
    code_bytes = ((full - low) * bits_high + low * bits_low) * row // 8
    code_bytes += -(-rem * bits_high // 8)
    codes = 8 * tiles
    pivot = codes + code_bytes
    bitmap = pivot + tiles
    return TahLayout(
        tiles, tokens, full, low, 4 * tiles, codes, pivot, bitmap, bitmap + -(-tokens // 8)
    )


def _score_tables() -> tuple[np.ndarray, np.ndarray]:
    # Level l (1/16 octave below the token's largest |x|) stands for u = 2^(-l/16); the
    # tables hold round(2^16 u) and round(2^16 u log2(1/u)), the terms of the token's
    # magnitude sum and of its entropy sum, as integers (the same on CPU and GPU).
    levels = np.arange(SCORE_LEVELS + 1, dtype=np.float64)
    u = 2.0 ** (-levels / 16.0)
    w = np.rint(65536.0 * u).astype(np.int64)
    wl = np.rint(65536.0 * u * levels / 16.0).astype(np.int64)
    w[SCORE_LEVELS] = wl[SCORE_LEVELS] = 0
    w.setflags(write=False)
    wl.setflags(write=False)
    return w, wl


SCORE_W, SCORE_WL = _score_tables()
