"""Codecs that shrink collective payloads: identity, int8 and taco (FP8 + Hadamard).

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

__all__ = [
    "ALL_OPS",
    "SUM_OPS",
    "Compressor",
    "IdentityCompressor",
    "Int8Compressor",
    "TacoCompressor",
    "available_compressors",
    "get_compressor",
    "register_compressor",
]
