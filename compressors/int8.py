"""The int8 codec: per-group absmax scaling to 8-bit integers.

Per group of ``G`` elements, ``scale = absmax / 127`` (float32) and
``q = round_half_even(x / scale)`` clamped to ±127; the payload is
``[count int8 q][K float32 scale]`` with ``K = ceil(count / G)`` (FORMAT.md pins the
float32 arithmetic). A group holding NaN or ±Inf decodes to NaN as a whole.

Range: every finite float32 group round-trips within the error bound. Where ``1/scale``
would overflow (absmax below about 3.7e-37) the codes are ``x / scale`` with a scale
rounded up just enough that no code clamps; where ``127 * scale`` would overflow (absmax
within a rounding of ``FLT_MAX``) the scale is rounded down one step, so that no decoded
value does. The payload format is the same for both.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import _dispatch, gpu_kernels
from .base import LOSSY_ABS_ERROR_FLOOR, Compressor, register_compressor
from .layout import check_group_size, int8_layout


@register_compressor
class Int8Compressor(Compressor):
    """INT8 with one float32 absmax scale per group of ``group_size`` elements.

    About 1.03 bytes per element at ``group_size=128``. Not lossless; sums and averages.
    Every group of finite float32 or bfloat16 values, from the smallest subnormal to
    ``FLT_MAX``, round-trips within ``rel_error_bound`` (plus ``abs_error_floor`` per
    element, which only subnormal groups notice). float64 data is rounded to float32
    first: a value of magnitude ``2^128 - 2^103`` (about 3.4e38) or more becomes ±Inf and
    its whole group decodes to NaN, visibly. A decoded float16 value beyond 65504 (only
    within the codec's error of it) rounds to ±Inf.

    Args:
        group_size: elements per scale, a power of two from 32 to 512.

    Example:
        >>> import numpy as np
        >>> from coccl.compressors import Int8Compressor
        >>> c = Int8Compressor(group_size=32)
        >>> x = np.linspace(-1, 1, 100, dtype=np.float32)
        >>> payload = c.encode(x)  # 100 int8 codes, then 4 float32 scales
        >>> payload.size == c.encoded_nbytes(100, np.float32) == 100 + 4 * 4
        True
        >>> y = c.decode(payload, count=100, dtype=np.float32)
        >>> bool(np.abs(y - x).max() <= 1 / 254)  # half a step of the largest group
        True
    """

    codec_id = "int8"
    abs_error_floor = LOSSY_ABS_ERROR_FLOOR

    def __init__(self, *, group_size: int = 128) -> None:
        self.group_size = check_group_size(group_size)

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "group_size": self.group_size}

    @property
    def alignment(self) -> int:
        return self.group_size

    @property
    def rel_error_bound(self) -> float:  # type: ignore[override]
        """Worst-case relative L2 error of one group (with ``abs_error_floor``: any group).

        Each element is off by at most half a step, ``scale / 2 = amax / 254``, so a group's
        error norm is at most ``sqrt(G) * amax / 254`` while its norm is at least ``amax``.
        The factor covers the float32 roundings of ``x * (1/scale)``, ``scale``, the decode
        product and float64 input (each ~2^-24 relative); where the scale is subnormal, its
        rounding and the decoded value's add at most 2^-148 per element
        (``abs_error_floor``).
        """
        return math.sqrt(self.group_size) / 254.0 * (1.0 + 1e-4)

    @property
    def rel_error_typical(self) -> float:  # type: ignore[override]
        """Relative L2 roundtrip error on Gaussian data (measured, 2^22 samples)."""
        return _TYPICAL[self.group_size]

    def encoded_nbytes(self, count: int, dtype: Any) -> int:
        count, _ = self.size_args(count, dtype)
        return int8_layout(count, self.group_size).nbytes

    def reduce_encode_kernel(self, like: Any, dtype: np.dtype) -> Any:
        return gpu_kernels.ring_hop(
            like, dtype, gpu_kernels.int8_reduce_encode, group_size=self.group_size
        )

    def encode_into(self, x: Any, payload: Any, dtype: np.dtype) -> None:
        _dispatch.encode("int8_encode", x, payload, group_size=self.group_size)

    def decode_into(self, payload: Any, out: Any, dtype: np.dtype, accumulate: bool) -> None:
        _dispatch.decode("int8_decode", payload, out, accumulate, group_size=self.group_size)


# Relative L2 error of one roundtrip on Gaussian N(0, 1) data, 2^22 elements, seed 0, per
# group size (int8's error grows with a group's expected absmax).
_TYPICAL = {32: 0.0053, 64: 0.0059, 128: 0.0065, 256: 0.0070, 512: 0.0074}
