"""Codecs that shrink collective payloads: identity, int8, int (2-8 bits) and taco (FP8 +
Hadamard).

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
from .intq import IntCompressor
from .taco import TacoCompressor

__all__ = [
    "ALL_OPS",
    "SUM_OPS",
    "Compressor",
    "IdentityCompressor",
    "IntCompressor",
    "Int8Compressor",
    "TacoCompressor",
    "available_compressors",
    "get_compressor",
    "register_compressor",
]
