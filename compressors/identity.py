"""The identity codec: the payload is the raw little-endian bytes of the data.

It is the lossless baseline every compressed schedule is compared with, and the only
codec that carries integer data and the max/min/prod reductions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from coccl.core.arrays import ALL_DTYPES

from .base import ALL_OPS, Compressor, register_compressor


@register_compressor
class IdentityCompressor(Compressor):
    """Raw bytes of the data in the dtype it stands for; ``encoded_nbytes = count * itemsize``.

    Example:
        >>> import numpy as np
        >>> from coccl.compressors import IdentityCompressor
        >>> c = IdentityCompressor()
        >>> x = np.arange(4, dtype=np.int32)
        >>> payload = c.encode(x)  # the 16 bytes of x
        >>> c.decode(payload, count=4, dtype=np.int32)
        array([0, 1, 2, 3], dtype=int32)
    """

    codec_id = "identity"
    dtypes = ALL_DTYPES
    ops = ALL_OPS
    lossless = True

    def __init__(self) -> None:
        pass

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id}

    def encoded_nbytes(self, count: int, dtype: Any) -> int:
        count, dtype = self.size_args(count, dtype)
        return count * dtype.itemsize

    def encode_into(self, x: Any, payload: Any, dtype: np.dtype) -> None:
        # A float32 accumulator standing for bfloat16 data is rounded once here (RNE).
        dst = payload.view(dtype)
        if x.dtype == dtype:
            dst[...] = x
        else:
            dst[...] = x.astype(dtype)

    def decode_into(self, payload: Any, out: Any, dtype: np.dtype, accumulate: bool) -> None:
        values = payload.view(dtype)
        if values.dtype != out.dtype:
            values = values.astype(out.dtype)
        if accumulate:
            out += values
        else:
            out[...] = values
