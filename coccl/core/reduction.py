"""Reduction ops: names, the elementwise combine, and ``avg``'s single final division.

Reductions run in the accumulate dtype (``arrays.accumulate_dtype``): float32 for 16-bit
floats, float64 for float64, the integer type itself for integers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

OPS = ("sum", "avg", "max", "min", "prod")


def check_op(op: Any) -> str:
    if not isinstance(op, str) or op not in OPS:
        raise ValueError(f"unknown op {op!r}; coccl takes {', '.join(OPS)}")
    return op


def _xp(a: Any) -> Any:
    return np if isinstance(a, np.ndarray) else __import__("cupy")


def combine(acc: Any, values: Any, op: str) -> None:
    """``acc = acc (op) values`` in place; ``values`` is cast to ``acc``'s dtype first."""
    xp = _xp(acc)
    if values.dtype != acc.dtype:
        values = values.astype(acc.dtype)
    if op in ("sum", "avg"):
        xp.add(acc, values, out=acc)
    elif op == "max":
        xp.maximum(acc, values, out=acc)
    elif op == "min":
        xp.minimum(acc, values, out=acc)
    elif op == "prod":
        xp.multiply(acc, values, out=acc)
    else:  # check_op ran before any byte moved
        raise ValueError(f"unknown op {op!r}")


def finalize(acc: Any, op: str, size: int) -> None:
    """Apply ``avg``'s one division by the rank count, in place (other ops: nothing).

    Floats divide in the accumulate dtype; integers divide truncating toward zero, as
    NCCL's ncclAvg does.
    """
    if op != "avg":
        return
    dtype = np.dtype(acc.dtype)
    if dtype.kind == "f":
        acc /= dtype.type(size)
    elif dtype.kind == "u":
        acc //= dtype.type(size)
    else:
        xp = _xp(acc)
        quotient = xp.abs(acc) // dtype.type(size)
        acc[...] = xp.where(acc < 0, -quotient, quotient)
