"""What the in-process schedule tests share: per-rank plans, data, the codec roundtrip
that a lossy schedule's result is made of, and the error bound of a reduction that
quantizes each element ``q`` times (as ``coccl.bench.bounds`` states it for ring and
two-shot)."""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numba
import numpy as np
import pytest

from coccl.algorithms import ScheduleArgs
from coccl.compressors import Compressor, get_compressor
from coccl.core.pool import host_pool

BF16 = np.dtype(ml_dtypes.bfloat16)
F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
CODECS = ("identity", "int8", "taco")
DTYPES = (F32, BF16, F64)


@pytest.fixture(autouse=True)
def one_numba_thread():
    """The codec kernels on one thread: many tiny chunks, on a machine whose cores the
    other test processes share, run much faster without a thread pool's wake-ups."""
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(threads)


def plans(
    size: int,
    codec: str,
    dtype: Any,
    *,
    op: str = "sum",
    chunk_elems: int = 256,
    cls=ScheduleArgs,
    **extra,
) -> list[Any]:
    """One plan per rank, each with its own pool and tag counter (as on real ranks)."""
    return [
        cls(
            rank=r,
            size=size,
            codec=get_compressor(codec),
            dtype=np.dtype(dtype),
            op=op,
            chunk_elems=chunk_elems,
            pool=host_pool(),
            label="t",
            **extra,
        )  # fmt: skip
        for r in range(size)
    ]


def no_leaks(rank_plans: list[Any]) -> bool:
    """Every pool block went back to its pool."""
    return all(p.pool.in_use_bytes == 0 for p in rank_plans)


def integer_data(rng: np.random.Generator, count: int, dtype: Any) -> np.ndarray:
    """Small integers: every sum, product and average of a few ranks' values is exact in
    every float type, whatever the order, so identity results compare bitwise."""
    return rng.integers(-4, 5, count).astype(dtype)


def normal_data(rng: np.random.Generator, count: int, dtype: Any) -> np.ndarray:
    return rng.standard_normal(count).astype(dtype)


def roundtrip(codec: Compressor, x: np.ndarray) -> np.ndarray:
    """``decode(encode(x))`` through the codec's public API, in ``x``'s dtype."""
    if x.size == 0:
        return x.copy()
    return codec.decode(codec.encode(x), count=x.size, dtype=x.dtype)


def unit_roundoff(dtype: Any) -> float:
    return float(ml_dtypes.finfo(np.dtype(dtype)).eps) / 2


def reduction_bound(codec: Compressor, dtype: Any, nranks: int, q: int) -> float:
    """The largest ``||y - s|| / E`` (``E`` the contributions' energy) of a sum over
    ``nranks`` that quantizes each element ``q`` times: the summation's rounding, ``q``
    roundtrips adding in quadrature with the earlier errors they carry, and ``q`` more
    roundings to the data type between phases."""
    u = unit_roundoff(dtype)
    k = max(nranks - 1, 0)
    rounding = k * u / (1 - k * u) * math.sqrt(nranks)
    b = 0.0 if codec.lossless else codec.rel_error_bound
    return rounding + (b * (1 + b) ** q + 2 * u) * math.sqrt(max(q, 1)) + u


def rel_error(y: np.ndarray, exact: np.ndarray, energy: float) -> float:
    """``||y - exact|| / E`` in float64."""
    if energy == 0:
        return 0.0 if not np.any(y.astype(F64)) else math.inf
    return float(np.linalg.norm(y.astype(F64) - exact) / energy)
