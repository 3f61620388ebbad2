"""Codecs that shrink collective payloads: identity, int8, int (2-8 bits, optional
Hadamard, seeded stochastic rounding), taco (FP8 + Hadamard), mx (microscaled FP4/FP6:
OCP MX, NVFP4), taco_fp (taco over FP4/FP6 elements) and tah (TAH-Quant-style 4/3-bit
activation tiles).

Importing this package registers every built-in codec.
"""

from .base import (
    ALL_OPS,
    SUM_OPS,
    Compressor,
    available_compressors,
    get_compressor,
    register_compressor,
    require_graph_safe,
)
from .identity import IdentityCompressor
from .int8 import Int8Compressor
from .intq import IntCompressor
from .mx import MxCompressor
from .taco import TacoCompressor
from .taco_fp import TacoFpCompressor
from .tah import TahCompressor

__all__ = [
    "ALL_OPS",
    "SUM_OPS",
    "Compressor",
    "IdentityCompressor",
    "IntCompressor",
    "Int8Compressor",
    "MxCompressor",
    "TacoCompressor",
    "TacoFpCompressor",
    "TahCompressor",
    "available_compressors",
    "get_compressor",
    "register_compressor",
    "require_graph_safe",
]
