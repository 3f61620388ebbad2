"""Reduction ops: names, the elementwise combine, and ``avg``'s single final division.

Reductions run in the accumulate dtype (``arrays.accumulate_dtype``): float32 for 16-bit
floats, float64 for float64, the integer type itself for integers.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

OPS = ("sum", "avg", "max", "min", "prod")

# the names of mpi4py's and torch's op constants that coccl has
_MPI_NAMES = {"SUM": "sum", "MAX": "max", "MIN": "min", "PROD": "prod"}
_TORCH_NAMES = {"SUM": "sum", "AVG": "avg", "MAX": "max", "MIN": "min", "PRODUCT": "prod"}


def normalize_op(op: Any) -> Any:
    """``op`` as coccl's name when it is one of mpi4py's (``MPI.SUM``, ``MPI.MAX``,
    ``MPI.MIN``, ``MPI.PROD``) or torch's (``ReduceOp.SUM``, ``AVG``, ``MAX``, ``MIN``,
    ``PRODUCT``) constants, else ``op`` unchanged (``check_op`` judges it). Neither
    library is imported here: a constant of one can only exist once it is imported, so
    they are looked up in ``sys.modules``."""
    if isinstance(op, str):
        return op
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and isinstance(op, mpi.Op):
        for name, ours in _MPI_NAMES.items():
            if op == getattr(mpi, name):
                return ours
        return op
    c10d = sys.modules.get("torch.distributed")
    reduce_op = getattr(c10d, "ReduceOp", None)
    if reduce_op is not None and isinstance(op, (reduce_op, reduce_op.RedOpType)):
        for name, ours in _TORCH_NAMES.items():
            if op == getattr(reduce_op, name):
                return ours
    return op


def check_op(op: Any) -> str:
    """coccl's name of ``op`` (a name, or an mpi4py or torch constant: ``normalize_op``);
    ValueError for any other."""
    name = normalize_op(op)
    if not isinstance(name, str) or name not in OPS:
        raise ValueError(
            f"unknown op {op!r}; coccl takes {', '.join(OPS)} (or mpi4py's MPI.SUM, MPI.MAX, "
            "MPI.MIN, MPI.PROD, or torch's ReduceOp.SUM, AVG, MAX, MIN, PRODUCT)"
        )
    return name


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
