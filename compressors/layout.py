"""Payload layouts and group-size rules of the int8, taco and int codecs: the one place for them.

The codecs (``int8.py``, ``taco.py``), their CPU and GPU kernels and the tests all take
byte offsets and payload sizes from here, and nothing here imports any of them, so the
kernels need not import the codecs. FORMAT.md describes the same layouts in prose.

* int8: ``[count int8 q][K float32 scale]``, ``K = ceil(count / G)``; the scales start at
  byte ``count`` (not 4-aligned in general).
* taco: ``[K*G fp8 codes][K float32 s (if dual_scale)][K float32 alpha (if ash)]``; the
  last group is stored whole (its padded positions hold rotated coefficients that decoding
  needs).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

# Group sizes the codecs accept as an option (the taco kernels take exactly these).
GROUP_SIZES: tuple[int, ...] = (32, 64, 128, 256, 512)


def check_group_size(group_size: Any) -> int:
    """Validate a codec's ``group_size`` option: an int power of two in 32..512.

    Raises:
        TypeError: ``group_size`` is not an int (bools are refused too).
        ValueError: it is not one of :data:`GROUP_SIZES`.
    """
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)):
        raise TypeError(f"group_size must be an int, got {group_size!r}")
    if int(group_size) not in GROUP_SIZES:
        raise ValueError(f"group_size must be a power of two in 32..512, got {group_size!r}")
    return int(group_size)


def num_groups(count: int, group_size: int) -> int:
    """``K = ceil(count / group_size)``: the groups of ``count`` elements."""
    return -(-int(count) // int(group_size))


# ---------------------------------------------------------------------------- int8
class Int8Layout(NamedTuple):
    """Where the parts of an int8 payload lie (byte offsets)."""

    groups: int  # K = ceil(count / G)
    scale_offset: int  # the K float32 scales start here (= count; not 4-aligned in general)
    nbytes: int  # the whole payload


def int8_layout(count: int, group_size: int) -> Int8Layout:
    """The layout of the int8 payload of ``count`` elements in groups of ``group_size``
    (any positive group size: the GPU kernels take more than the codec option does)."""
    groups = num_groups(count, group_size)
    return Int8Layout(groups, int(count), int(count) + 4 * groups)


# ---------------------------------------------------------------------------- taco
class TacoLayout(NamedTuple):
    """Where the parts of a taco payload lie (byte offsets; None for an absent part)."""

    groups: int  # K = ceil(count / G)
    scale_offset: int | None  # K float32 s, when dual_scale
    alpha_offset: int | None  # K float32 alpha, when ash
    nbytes: int  # the whole payload


def taco_layout(
    count: int, group_size: int, *, ash: bool = True, dual_scale: bool = True
) -> TacoLayout:
    """The layout of the taco payload of ``count`` elements.

    The ``K * G`` FP8 codes come first (the last group whole, padding included), then the
    scales ``s`` if ``dual_scale``, then the ``alpha`` if ``ash``.
    """
    groups = num_groups(count, group_size)
    offset = groups * int(group_size)
    scale_offset = alpha_offset = None
    if dual_scale:
        scale_offset, offset = offset, offset + 4 * groups
    if ash:
        alpha_offset, offset = offset, offset + 4 * groups
    return TacoLayout(groups, scale_offset, alpha_offset, offset)


@lru_cache(maxsize=256)
def taco_nbytes(count: int, group_size: int, ash: bool, dual_scale: bool) -> int:
    """``taco_layout(...).nbytes``, cached: every pooled payload of every chunk asks for
    the same few sizes, call after call."""
    return taco_layout(count, group_size, ash=ash, dual_scale=dual_scale).nbytes


# ----------------------------------------------------------------------------- int
class IntLayout(NamedTuple):
    """Where the parts of an ``int`` payload lie (byte offsets)."""

    groups: int  # K = ceil(count / G)
    coded: int  # elements that have codes: count, or count rounded up to the Hadamard block
    scale_offset: int  # the K float32 scales start here (= ceil(coded * bits / 8))
    nbytes: int  # the whole payload


@lru_cache(maxsize=256)
def int_layout(count: int, bits: int, group_size: int, hadamard: int = 0) -> IntLayout:
    """The layout of the ``int`` payload of ``count`` elements: ``ceil(coded * bits / 8)``
    bytes of packed codes, then ``K`` float32 scales. With a Hadamard block ``H`` the last
    block is coded whole (``coded`` = ``count`` rounded up to ``H``): its padded positions
    hold rotated coefficients that decoding needs. With ``bits=8`` and no Hadamard this is
    int8's layout."""
    count = int(count)
    coded = -(-count // hadamard) * hadamard if hadamard else count
    groups = num_groups(count, group_size)
    scale_offset = (coded * int(bits) + 7) // 8
    return IntLayout(groups, coded, scale_offset, scale_offset + 4 * groups)
