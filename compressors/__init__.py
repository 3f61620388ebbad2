"""Codecs that shrink collective payloads: identity, int8, taco (FP8 + Hadamard) and tah
(TAH-Quant-style 4/3-bit activation tiles).

Importing this package registers every built-in codec.
"""

from .base import (
    ALL_OPS,
    SUM_OPS,
    Compressor,
    available_compressors,
    get_compressor,
    register_compressor,
)
from .identity import IdentityCompressor
from .int8 import Int8Compressor
from .taco import TacoCompressor
from .tah import TahCompressor

__all__ = [
    "ALL_OPS",
    "SUM_OPS",
    "Compressor",
    "IdentityCompressor",
    "Int8Compressor",
    "TacoCompressor",
    "TahCompressor",
    "available_compressors",
    "get_compressor",
    "register_compressor",
]
