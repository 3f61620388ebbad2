"""The ``int`` codec family: symmetric per-group integers of 2 to 8 bits, optionally after
a Walsh-Hadamard rotation, rounded to nearest or stochastically from an explicit seed.

Per group of ``G`` elements, ``scale = absmax / qmax`` (float32, ``qmax = 2^(bits-1) - 1``)
and ``q = round(x / scale)`` clamped to ±qmax, packed little-endian at ``bits`` bits per
element; the payload is ``[packed codes][K float32 scales]`` (FORMAT.md's ``## int``
pins every float32 operation). With ``bits=8`` and no rotation this is exactly int8's
arithmetic and payload, byte for byte, and it runs int8's kernels.

Stochastic rounding is a pure function of the data, the ``seed`` option and the ``salt``
of the encode call: element ``i`` rounds up when ``u_i < frac``, ``u_i`` the top 24 bits
of splitmix64's output ``i + 1`` from the state ``key = mix64(mix64(seed + gamma) ^
salt)``. The same seed, salt and data give the same bytes on the CPU and the GPU; since
``mix64`` is a bijection, two encodes with the same seed and different salts (or the same
salt and different seeds) draw from different keys. The rule for callers: give every
encode whose stream must be independent (each rank, call, chunk and step) its own salt,
e.g. :func:`stream_salt`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import _dispatch, gpu_kernels
from .base import LOSSY_ABS_ERROR_FLOOR, Compressor, register_compressor
from .layout import int_layout

BITS = tuple(range(2, 9))
GROUP_SIZES = (32, 64, 128, 256, 512, 1024, 2048)
ROUNDINGS = ("nearest", "stochastic")
_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15


def mix64(z: int) -> int:
    """splitmix64's finalizer on a 64-bit integer (a bijection; FORMAT.md)."""
    z &= _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def stream_key(seed: int, salt: int) -> int:
    """The stochastic rounding's key: ``mix64(mix64(seed + gamma) ^ salt)`` (FORMAT.md)."""
    return mix64(mix64(seed + _GAMMA) ^ salt)


STREAM_RANK_BITS = 16  # stream_salt's rank field: the random streams a call can number
STREAM_CALL_BITS = 28  # stream_salt's call field


def stream_salt(*, rank: int, call: int, chunk: int = 0, step: int = 0) -> int:
    """A salt that differs for every (rank, call, chunk, step): the four packed into 64
    bits, ``call`` in bits 36-63, ``rank`` in 20-35, ``chunk`` in 10-19, ``step`` in 0-9
    (so distinct tuples give distinct salts, by construction).

    Raises:
        TypeError: a field that is not an int.
        ValueError: a field that is negative or does not fit its bits.
    """
    fields = (
        ("call", call, STREAM_CALL_BITS),
        ("rank", rank, STREAM_RANK_BITS),
        ("chunk", chunk, 10),
        ("step", step, 10),
    )
    salt = 0
    for name, value, width in fields:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {value!r}")
        if not 0 <= int(value) < (1 << width):
            raise ValueError(f"{name} must be in 0..{(1 << width) - 1}, got {value!r}")
        salt = (salt << width) | int(value)
    return salt


def _check_u64(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if not 0 <= int(value) <= _MASK64:
        raise ValueError(f"{name} must be in 0..2^64-1, got {value!r}")
    return int(value)


def _check_choice(value: Any, name: str, choices: tuple) -> Any:
    kind = str if isinstance(choices[0], str) else int
    if isinstance(value, bool) or not isinstance(value, kind if kind is str else (int, np.integer)):
        raise TypeError(f"{name} must be {'a str' if kind is str else 'an int'}, got {value!r}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return kind(value)


@register_compressor
class IntCompressor(Compressor):
    """Symmetric ``bits``-bit integers with one float32 absmax scale per group.

    About ``bits / 8 + 4 / group_size`` bytes per element (0.53 at 4 bits, G = 128). Not
    lossless; sums and averages. Every group of finite values, from the smallest
    subnormal to ``FLT_MAX``, round-trips within ``rel_error_bound`` (plus
    ``abs_error_floor`` per element, which only groups below about 1e-36 notice); float64
    input is rounded to float32 first (beyond float32 a group decodes to NaN, visibly), as
    for int8.

    Args:
        bits: bits per code, 2 to 8 (default 4: the family exists for the widths below
            int8, and 4 is SDP4Bit's and ZeRO++'s inter-node width).
        group_size: elements per scale, a power of two from 32 to 2048.
        hadamard: 0 (off), or a power-of-two block from 8 to ``group_size``: each block
            is rotated by the orthonormal Walsh-Hadamard transform before quantizing
            (spreading outliers), and back after decoding. A partial last block is coded
            whole: its padded positions hold rotated coefficients that decoding needs.
        rounding: ``"nearest"`` (half to even) or ``"stochastic"`` (unbiased: the
            expected decoded value is the input, within the float32 rounding of the
            scaled value).
        seed: the stochastic rounding's seed, 0 to 2^64 - 1 (ignored when rounding to
            nearest). Each encode also takes a ``salt`` (see the module docstring).

    Example:
        >>> import numpy as np
        >>> from coccl.compressors import get_compressor
        >>> c = get_compressor("int", bits=4, group_size=32)
        >>> x = np.linspace(-1, 1, 100, dtype=np.float32)
        >>> payload = c.encode(x)  # 50 bytes of 4-bit codes, then 4 float32 scales
        >>> payload.size == c.encoded_nbytes(100, np.float32) == 50 + 4 * 4
        True
        >>> y = c.decode(payload, count=100, dtype=np.float32)
        >>> bool(np.abs(y - x).max() <= 1 / 14)  # half a step of the largest group
        True
        >>> s = get_compressor("int", bits=4, rounding="stochastic", seed=7)
        >>> bool((s.encode(x, salt=1) == s.encode(x, salt=1)).all())
        True
    """

    codec_id = "int"
    stochastic = False  # per instance: True with rounding="stochastic"
    payload_scoped = False  # per instance: as stochastic

    def __init__(
        self,
        *,
        bits: int = 4,
        group_size: int = 128,
        hadamard: int = 0,
        rounding: str = "nearest",
        seed: int = 0,
    ) -> None:
        self.bits = _check_choice(bits, "bits", BITS)
        self.group_size = _check_choice(group_size, "group_size", GROUP_SIZES)
        if isinstance(hadamard, bool) or not isinstance(hadamard, (int, np.integer)):
            raise TypeError(f"hadamard must be an int, got {hadamard!r}")
        h = int(hadamard)
        if h != 0 and (h < 8 or h > self.group_size or h & (h - 1)):
            raise ValueError(
                f"hadamard must be 0 or a power of two from 8 to group_size "
                f"({self.group_size}), got {hadamard!r}"
            )
        self.hadamard = h
        self.rounding = _check_choice(rounding, "rounding", ROUNDINGS)
        self.seed = _check_u64(seed, "seed")
        self.stochastic = self.rounding == "stochastic"  # type: ignore[misc]
        # the random stream is indexed by the element's position in the payload
        self.payload_scoped = self.stochastic  # type: ignore[misc]
        # bits=8 without rotation or randomness is int8: its kernels, its bytes.
        self._int8 = self.bits == 8 and not h and not self.stochastic

    def get_config(self) -> dict[str, Any]:
        return {
            "id": self.codec_id,
            "bits": self.bits,
            "group_size": self.group_size,
            "hadamard": self.hadamard,
            "rounding": self.rounding,
            "seed": self.seed,
        }

    @property
    def alignment(self) -> int:
        return self.group_size

    @property
    def qmax(self) -> int:
        """The largest code magnitude, ``2^(bits-1) - 1``."""
        return (1 << (self.bits - 1)) - 1

    @property
    def rel_error_bound(self) -> float:  # type: ignore[override]
        """Worst-case relative L2 error of one group (with ``abs_error_floor``: any group).

        A code is off by at most half a step (nearest) or one step (stochastic), the step
        being ``amax / qmax`` of the (rotated) group, so a group's error norm is at most
        ``sqrt(G) * amax / (2 qmax)`` (or ``/ qmax``) while its norm is at least ``amax``.
        The rotation is orthonormal: it maps the codes' errors to an error of the same
        norm, and a rotated block's largest coefficient is at most its norm. The factor
        covers the float32 roundings of the scale, the products and the transform's
        ``log2(hadamard)`` stages (each ~2^-24 relative).
        """
        steps = 0.5 if self.rounding == "nearest" else 1.0
        slack = 1e-3 if self.hadamard else 1e-4
        return math.sqrt(self.group_size) * steps / self.qmax * (1.0 + slack)

    @property
    def abs_error_floor(self) -> float:  # type: ignore[override]
        """Per element, for groups whose scale is subnormal (absmax below about 1e-36):
        int8's ``2^-148``, and with a rotation of block H ``(sqrt(H) + 2) * 2^-149``, since
        the scale's subnormal rounding (at most 2^-149) is spread over H coefficients."""
        if not self.hadamard:
            return LOSSY_ABS_ERROR_FLOOR
        return (math.sqrt(self.hadamard) + 2.0) * 2.0**-149

    @property
    def rel_error_typical(self) -> float:  # type: ignore[override]
        """Relative L2 roundtrip error on Gaussian data (measured, 2^20 samples; the same
        with a rotation, which maps Gaussian data to Gaussian data)."""
        row = _TYPICAL[self.rounding][self.bits]
        return row[GROUP_SIZES.index(self.group_size)]

    def encoded_nbytes(self, count: int, dtype: Any) -> int:
        count, _ = self.size_args(count, dtype)
        return int_layout(count, self.bits, self.group_size, self.hadamard).nbytes

    def reduce_encode_kernel(self, like: Any, dtype: np.dtype) -> Any:
        if self._int8 and self.group_size <= 1024:
            return gpu_kernels.ring_hop(
                like, dtype, gpu_kernels.int8_reduce_encode, group_size=self.group_size
            )
        return None

    def encode_into(self, x: Any, payload: Any, dtype: np.dtype, salt: int = 0) -> None:
        if self._int8:
            _dispatch.encode("int8_encode", x, payload, group_size=self.group_size)
            return
        key = stream_key(self.seed, salt) if self.stochastic else 0
        _dispatch.encode(
            "int:int_encode",
            x,
            payload,
            bits=self.bits,
            group_size=self.group_size,
            hadamard=self.hadamard,
            stochastic=self.stochastic,
            key=key,
        )

    def decode_into(self, payload: Any, out: Any, dtype: np.dtype, accumulate: bool) -> None:
        if self._int8:
            _dispatch.decode("int8_decode", payload, out, accumulate, group_size=self.group_size)
            return
        _dispatch.decode(
            "int:int_decode",
            payload,
            out,
            accumulate,
            bits=self.bits,
            group_size=self.group_size,
            hadamard=self.hadamard,
        )


# Relative L2 error of one roundtrip on Gaussian N(0, 1) data, 2^20 elements, seed 0, per
# rounding and bits, over GROUP_SIZES (filled in by tests/scripts/int_typical.py).
_TYPICAL: dict[str, dict[int, tuple[float, ...]]] = {
    "nearest": {
        2: (0.6578, 0.718, 0.7671, 0.8074, 0.8406, 0.8681, 0.8897),
        3: (0.2264, 0.2514, 0.274, 0.2948, 0.3142, 0.3327, 0.3497),
        4: (0.09699, 0.1077, 0.1174, 0.1264, 0.1347, 0.1427, 0.1499),
        5: (0.04527, 0.05027, 0.0548, 0.05894, 0.06283, 0.06659, 0.07),
        6: (0.02191, 0.02433, 0.0265, 0.02852, 0.03043, 0.03221, 0.03386),
        7: (0.01078, 0.01197, 0.01305, 0.01404, 0.01497, 0.01585, 0.01665),
        8: (0.00535, 0.00594, 0.006474, 0.006968, 0.007432, 0.007867, 0.008264),
    },
    "stochastic": {
        2: (0.945, 1.041, 1.124, 1.197, 1.263, 1.322, 1.375),
        3: (0.3199, 0.3553, 0.3873, 0.4169, 0.4444, 0.4706, 0.4947),
        4: (0.1372, 0.1523, 0.1661, 0.1788, 0.1905, 0.2018, 0.2123),
        5: (0.06408, 0.07109, 0.07746, 0.08338, 0.08894, 0.09409, 0.099),
        6: (0.03098, 0.0344, 0.03747, 0.04031, 0.04303, 0.04552, 0.04789),
        7: (0.01524, 0.01692, 0.01844, 0.01985, 0.02116, 0.0224, 0.02356),
        8: (0.007569, 0.008404, 0.009158, 0.009855, 0.01051, 0.01112, 0.01169),
    },
}
