"""Payload layouts of the microscaled codecs (``mx``, ``taco_fp``): the one place for both.

The codecs, their CPU and GPU kernels and the tests take byte offsets and sizes from here;
FORMAT.md describes the same layouts in prose. Codes are packed little-endian: FP4 two
per byte (element 2j in the low nibble), FP6 four per three bytes (elements 4j..4j+3 in
bits 0-5, 6-11, 12-17, 18-23 of a 24-bit little-endian word). The last block (group) is
stored whole, its padding coded as zeros (mx) or as the rotated coefficients (taco_fp).

* mx: ``[K*B codes][K scale bytes][float32 S (scale="e4m3" only)]``, ``K = ceil(count/B)``.
* taco_fp: ``[K*G codes][K float32 s][K float32 alpha]``, ``K = ceil(count/G)``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from .layout import num_groups

BLOCK_SIZES: tuple[int, ...] = (16, 32)


def code_bytes(elements: int, bits: int) -> int:
    """Bytes holding ``elements`` packed codes of ``bits`` (4 or 6) bits; ``elements`` a
    multiple of 4 (every block and group size is)."""
    return elements * bits // 8


class MxLayout(NamedTuple):
    """Where the parts of an mx payload lie (byte offsets; None for an absent part)."""

    blocks: int  # K = ceil(count / B)
    scale_offset: int  # K one-byte block scales (E8M0 or E4M3)
    tensor_offset: int | None  # the float32 per-payload scale S (scale="e4m3")
    nbytes: int


@lru_cache(maxsize=256)
def mx_layout(count: int, block: int, bits: int, two_level: bool) -> MxLayout:
    """The layout of the mx payload of ``count`` elements in blocks of ``block`` codes of
    ``bits`` bits; ``two_level``: an E4M3 block scale with a float32 per-payload scale."""
    k = num_groups(count, block)
    scale_offset = code_bytes(k * block, bits)
    end = scale_offset + k
    tensor_offset = end if two_level else None
    return MxLayout(k, scale_offset, tensor_offset, end + (4 if two_level else 0))


class TacoFpLayout(NamedTuple):
    """Where the parts of a taco_fp payload lie (byte offsets)."""

    groups: int  # K = ceil(count / G)
    scale_offset: int  # K float32 s
    alpha_offset: int  # K float32 alpha
    nbytes: int


@lru_cache(maxsize=256)
def taco_fp_layout(count: int, group_size: int, bits: int) -> TacoFpLayout:
    """The layout of the taco_fp payload of ``count`` elements in groups of ``group_size``."""
    k = num_groups(count, group_size)
    s = code_bytes(k * group_size, bits)
    return TacoFpLayout(k, s, s + 4 * k, s + 8 * k)
