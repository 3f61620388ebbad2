"""The tah codec: pipeline-parallel activations after TAH-Quant (arXiv 2506.01352).

A flat array is read as tokens of ``row`` channels, each cut into tiles of ``tile``
channels. Per tile, an asymmetric (centre, step) pair of float32 and ``bits``-bit codes;
the ``floor(low_fraction * full tokens)`` full tokens of lowest entropy (of the payload, or
of each ``window`` of consecutive tokens) take ``bits_low`` bits, the others
``bits_high``; a tile whose largest magnitude is at least ``pivot_ratio`` times its second
largest swaps that value to the front and is quantized after a Walsh-Hadamard transform
(the value becomes an offset shared by every coefficient, which the asymmetric centre
absorbs). FORMAT.md (section ``tah``) pins the arithmetic and the payload, and says where
this differs from TAH-Quant (notably: the token entropy is an integer fixed-point proxy,
so that CPU and GPU choose the same tokens bit for bit).

TAH-Quant's backward recipe (symmetric 6-bit tiles of 32 for the activation gradients) is
not a mode of this codec: it is the ``int`` codec with ``bits=6, group_size=32``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import _dispatch
from .base import LOSSY_ABS_ERROR_FLOOR, Compressor, register_compressor
from .tah_format import MAX_ROW, MAX_WINDOW, TILES, tah_layout

_PIVOTS = ("auto", "off")


def _int_option(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    return int(value)


def _float_option(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    return float(value)


@register_compressor
class TahCompressor(Compressor):
    """TAH-Quant-style activation compression: asymmetric 4/3-bit tiles along each token.

    About ``0.8 * 4 + 0.2 * 3 = 3.8`` bits per element plus 9 bytes per tile (its float32
    centre and step and a pivot byte) and a bit per token: 0.6 bytes per element at the
    defaults. Not lossless; sums and averages. Every tile of finite float32 or bfloat16
    values, from the smallest subnormal to ``FLT_MAX``, round-trips within
    ``rel_error_bound`` (the ``bits_low`` width being the worst case) plus
    ``abs_error_floor`` per element; a tile holding NaN or ±Inf decodes to NaN as a whole.
    float64 data is rounded to float32 first (beyond float32: ±Inf, a NaN tile).

    The activation gradients of TAH-Quant's backward pass (symmetric 6-bit, tiles of 32)
    are the ``int`` codec's ``bits=6, group_size=32``, not an option of this one.

    Args:
        row: elements (channels) of one token, a multiple of ``tile`` up to 2^20; chunks
            of a message never split a token (``alignment``). Set it to the model's hidden
            size; a message whose size is not a multiple ends with a short token.
        tile: channels per tile: 32, 64 or 128.
        bits_high: bits per code of most tokens (2..8).
        bits_low: bits per code of the lowest-entropy tokens (2..``bits_high``).
        low_fraction: the share of full tokens at ``bits_low``, in [0, 1].
        window: 0 (the default) chooses the low tokens among all full tokens of a payload
            (a chunk of a message); n > 0 (up to 1024) within each run of n consecutive
            full tokens, ``floor(low_fraction * n)`` of each (TAH-Quant chooses per
            sequence: n = the sequence length). Chunks then never split a window
            (``alignment`` is ``row * window``), so the choice does not depend on the
            chunk size; on the GPU a window is one block's work, whose encode reads each
            token once from memory where the window is small (a few tokens).
        pivot: ``"auto"`` (TAH-Quant's pivot swap and Hadamard transform for tiles with
            one dominant value) or ``"off"``.
        pivot_ratio: a tile pivots when its largest |x| is at least this many times its
            second largest (TAH-Quant: 2), a number >= 1.

    Example:
        >>> import numpy as np
        >>> from coccl.compressors import TahCompressor
        >>> c = TahCompressor(row=256)
        >>> x = np.random.default_rng(0).standard_normal(10 * 256).astype(np.float32)
        >>> payload = c.encode(x)  # 40 tiles; 10 tokens, 2 of them at 3 bits
        >>> payload.size == c.encoded_nbytes(x.size, np.float32) == 40 * 9 + 1216 + 2
        True
        >>> y = c.decode(payload, count=x.size, dtype=np.float32)
        >>> bool(np.linalg.norm(y - x) <= c.rel_error_bound * np.linalg.norm(x))
        True
    """

    codec_id = "tah"
    abs_error_floor = LOSSY_ABS_ERROR_FLOOR

    def __init__(
        self,
        *,
        row: int = 4096,
        tile: int = 64,
        bits_high: int = 4,
        bits_low: int = 3,
        low_fraction: float = 0.2,
        window: int = 0,
        pivot: str = "auto",
        pivot_ratio: float = 2.0,
    ) -> None:
        self.tile = _int_option("tile", tile)
        if self.tile not in TILES:
            raise ValueError(f"tile must be one of {TILES}, got {tile!r}")
        self.row = _int_option("row", row)
        if not 0 < self.row <= MAX_ROW or self.row % self.tile:
            raise ValueError(
                f"row must be a positive multiple of tile={self.tile} up to {MAX_ROW}, got {row!r}"
            )
        self.bits_high = _int_option("bits_high", bits_high)
        self.bits_low = _int_option("bits_low", bits_low)
        if not 2 <= self.bits_high <= 8:
            raise ValueError(f"bits_high must be in 2..8, got {bits_high!r}")
        if not 2 <= self.bits_low <= self.bits_high:
            raise ValueError(f"bits_low must be in 2..bits_high={self.bits_high}, got {bits_low!r}")
        self.low_fraction = _float_option("low_fraction", low_fraction)
        if not 0.0 <= self.low_fraction <= 1.0:
            raise ValueError(f"low_fraction must be in [0, 1], got {low_fraction!r}")
        self.window = _int_option("window", window)
        if not 0 <= self.window <= MAX_WINDOW:
            raise ValueError(f"window must be in 0..{MAX_WINDOW} tokens, got {window!r}")
        if not isinstance(pivot, str):
            raise TypeError(f"pivot must be a string, got {pivot!r}")
        if pivot not in _PIVOTS:
            raise ValueError(f"pivot must be 'auto' or 'off', got {pivot!r}")
        self.pivot = pivot
        self.pivot_ratio = _float_option("pivot_ratio", pivot_ratio)
        if not (self.pivot_ratio >= 1.0 and math.isfinite(self.pivot_ratio)):
            raise ValueError(f"pivot_ratio must be a finite number >= 1, got {pivot_ratio!r}")

    def get_config(self) -> dict[str, Any]:
        return {
            "id": self.codec_id,
            "row": self.row,
            "tile": self.tile,
            "bits_high": self.bits_high,
            "bits_low": self.bits_low,
            "low_fraction": self.low_fraction,
            "window": self.window,
            "pivot": self.pivot,
            "pivot_ratio": self.pivot_ratio,
        }

    @property
    def alignment(self) -> int:
        return self.row * max(1, self.window)

    @property
    def payload_scoped(self) -> bool:  # type: ignore[override]
        """With ``window`` 0 the low tokens are a share of the whole payload's full tokens,
        ranked within it: where payloads are cut changes them. With a window they are
        chosen per window of ``alignment`` elements, from its own tokens alone."""
        return self.window == 0

    @property
    def rel_error_bound(self) -> float:  # type: ignore[override]
        """Worst-case relative L2 error of one tile (and so of any token or chunk).

        A tile of ``n`` values spanning ``[lo, hi]`` is coded with steps of
        ``(hi - lo) / Q``, ``Q = 2^bits_low - 1`` at worst, so each value errs by at most
        ``(hi - lo) / (2 Q)`` while the tile's norm is at least
        ``sqrt(lo^2 + hi^2) >= (hi - lo) / sqrt(2)``: ``sqrt(n / 2) / Q`` with
        ``n = tile``. The pivot path quantizes an orthogonal transform of the tile, which
        keeps both norms. The factor covers the float32 roundings (centre, step, the
        transform and the decoded sum, each a few 2^-24 of the tile's norm).
        """
        return math.sqrt(self.tile / 2.0) / (2**self.bits_low - 1) * (1.0 + 1e-4)

    @property
    def rel_error_typical(self) -> float:  # type: ignore[override]
        """Relative L2 roundtrip error on Gaussian N(0, 1) data: measured for the
        defaults' widths, else the uniform-noise estimate ``step / sqrt(12)`` mixed over
        the two widths (the expected range of a Gaussian tile taken as ``2 sqrt(2 ln n)``)."""
        key = (self.tile, self.bits_high, self.bits_low)
        measured = _TYPICAL.get(key)
        if measured is not None and self.low_fraction == 0.2:
            return measured
        spread = 2.0 * math.sqrt(2.0 * math.log(self.tile))
        high = (spread / (2**self.bits_high - 1)) ** 2 / 12.0
        low = (spread / (2**self.bits_low - 1)) ** 2 / 12.0
        return math.sqrt((1.0 - self.low_fraction) * high + self.low_fraction * low)

    def _options(self) -> dict[str, Any]:
        return {
            "row": self.row,
            "tile": self.tile,
            "bits_high": self.bits_high,
            "bits_low": self.bits_low,
            "low_fraction": self.low_fraction,
            "window": self.window,
        }

    def encoded_nbytes(self, count: int, dtype: Any) -> int:
        count, _ = self.size_args(count, dtype)
        return tah_layout(count, **self._options()).nbytes

    def encode_into(self, x: Any, payload: Any, dtype: np.dtype) -> None:
        _dispatch.encode_with(
            _kernels(x).tah_encode,
            x,
            payload,
            **self._options(),
            pivot=self.pivot == "auto",
            pivot_ratio=self.pivot_ratio,
        )

    def decode_into(self, payload: Any, out: Any, dtype: np.dtype, accumulate: bool) -> None:
        _dispatch.decode_with(
            _kernels(payload).tah_decode, payload, out, accumulate, **self._options()
        )


def _kernels(a: Any) -> Any:
    # Lazy imports: numba (CPU) and CuPy (GPU) are only loaded when first needed.
    if isinstance(a, np.ndarray):
        from . import tah_cpu  # noqa: PLC0415

        return tah_cpu
    from . import tah_gpu  # noqa: PLC0415

    return tah_gpu


# Relative L2 error of one roundtrip on Gaussian N(0, 1) data (2^22 elements, row 4096,
# seed 0), keyed by (tile, bits_high, bits_low), low_fraction 0.2.
_TYPICAL = {(32, 4, 3): 0.1025, (64, 4, 3): 0.1178, (128, 4, 3): 0.1312}
