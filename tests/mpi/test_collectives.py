"""Identity collectives on every algorithm against exact references (run on 1-4 ranks)."""

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

from conftest import all_equal_across_ranks, case_seed, rank_data

BF16 = np.dtype(ml_dtypes.bfloat16)
FLOATS = [np.float32, np.float64, np.float16, BF16]
INTS = [np.int8, np.uint8, np.int32, np.int64, np.uint64]
ALGORITHMS = ["ring", "two_shot", "native", "auto"]
OPS = ["sum", "avg", "max", "min", "prod"]


def counts(size: int) -> list[int]:
    """0, 1, fewer than ranks, not a multiple of ranks (nor of 128), several chunks (each
    once: on 1 and 2 ranks "fewer than ranks" is 0 or 1)."""
    return sorted({0, 1, size - 1, size + 1, 1000, 4099})


SIZE = MPI.COMM_WORLD.Get_size()
COUNTS = counts(SIZE)


def op_cases() -> list:
    """(dtype, op) of test_allreduce: all of them on 2 and 3 ranks (an even and an odd
    count), each at every count. On 1 and 4 ranks every dtype with sum, avg and prod (which
    wrap, round and divide by the rank count), and max and min (exact in any dtype on any
    count of ranks) with a float, bfloat16 and the narrowest and widest integers."""
    every = SIZE in (2, 3)
    keep = [np.float32, BF16, np.int8, np.uint64]
    return [
        pytest.param(dtype, op, id=f"{np.dtype(dtype).name}-{op}")
        for dtype in FLOATS + INTS
        for op in OPS
        if every or op not in ("max", "min") or dtype in keep
    ]


def eps(dtype) -> float:
    return float(ml_dtypes.finfo(dtype).eps)


def reference(op: str, parts: list[np.ndarray], dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        stack = np.stack(parts)  # integer arithmetic wraps, as MPI and NCCL do
        if op in ("sum", "avg"):
            total = stack.sum(axis=0, dtype=dtype)
            if op == "avg":
                q = (
                    np.abs(total.astype(np.int64)) // len(parts)
                    if dtype.kind == "i"
                    else total // len(parts)
                )
                total = (np.where(total < 0, -q, q) if dtype.kind == "i" else q).astype(dtype)
            return total
        return {
            "max": np.max,
            "min": np.min,
            "prod": lambda s, axis: s.prod(axis=axis, dtype=dtype),
        }[op](stack, axis=0)
    stack = np.stack([p.astype(np.float64) for p in parts])
    if op == "sum":
        return stack.sum(axis=0)
    if op == "avg":
        return stack.sum(axis=0) / len(parts)
    if op == "prod":
        return stack.prod(axis=0)
    return getattr(np, op)(stack, axis=0)


def check(op, result, parts, dtype, ref):
    dtype = np.dtype(dtype)
    assert result.dtype == dtype
    if dtype.kind in "iu" or op in ("max", "min"):
        np.testing.assert_array_equal(result, ref.astype(dtype))
        return
    n = len(parts)
    magnitude = (
        np.sum([np.abs(p.astype(np.float64)) for p in parts], axis=0) if parts[0].size else 0
    )
    if op == "prod":
        magnitude = np.prod([np.abs(p.astype(np.float64)) for p in parts], axis=0) * n
    if op == "avg":
        magnitude = magnitude / n
    # relative rounding of every step, plus absolute rounding in the subnormal range
    tol = (n + 2) * eps(dtype) * magnitude + n * float(ml_dtypes.finfo(dtype).smallest_subnormal)
    err = np.abs(result.astype(np.float64) - ref)
    assert np.all(err <= tol), f"max err {err.max()} tol {tol.max() if np.size(tol) else tol}"


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("dtype, op", op_cases())
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_allreduce(comm, algorithm, dtype, op, count):
    seed = case_seed((algorithm, np.dtype(dtype).name, op, count))
    parts = [rank_data(seed, r, count, dtype) for r in range(comm.size)]
    x = parts[comm.rank].copy()
    result = comm.allreduce(x, op=op, algorithm=algorithm, chunk_bytes=1024)
    check(op, result, parts, dtype, reference(op, parts, dtype))
    np.testing.assert_array_equal(x, parts[comm.rank])  # input untouched
    assert all_equal_across_ranks(result)


@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("op", ["sum", "avg", "max"])
@pytest.mark.parametrize("dtype", [np.float32, BF16, np.int32], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_reduce_scatter(comm, algorithm, dtype, op, n):
    seed = case_seed(("rs", algorithm, np.dtype(dtype).name, op, n))
    parts = [rank_data(seed, r, n * comm.size, dtype) for r in range(comm.size)]
    result = comm.reduce_scatter(
        parts[comm.rank].copy(), op=op, algorithm=algorithm, chunk_bytes=1024
    )
    ref = reference(op, parts, dtype)[comm.rank * n : (comm.rank + 1) * n]
    assert result.shape == (n,)
    check(op, result, [p[comm.rank * n : (comm.rank + 1) * n] for p in parts], dtype, ref)


@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize(
    "dtype", [np.float32, BF16, np.float16, np.int64, np.uint8], ids=lambda d: np.dtype(d).name
)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_allgather(comm, algorithm, dtype, n):
    seed = case_seed(("ag", algorithm, np.dtype(dtype).name, n))
    parts = [rank_data(seed, r, n, dtype) for r in range(comm.size)]
    result = comm.allgather(parts[comm.rank].copy(), algorithm=algorithm, chunk_bytes=1024)
    np.testing.assert_array_equal(result.view(np.uint8), np.concatenate(parts).view(np.uint8))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_shapes_out_and_in_place(comm, algorithm):
    n = comm.size
    parts = [rank_data(7, r, 6 * n * 5, np.float32).reshape(6 * n, 5) for r in range(n)]
    ref = reference("sum", parts, np.float32)
    x = parts[comm.rank].copy()
    y = comm.allreduce(x, algorithm=algorithm)
    assert y.shape == x.shape and y is not x
    out = np.full_like(x, np.nan)
    assert comm.allreduce(x, out, algorithm=algorithm) is out
    np.testing.assert_array_equal(out, y)
    z = comm.allreduce(x, x, algorithm=algorithm)  # in place
    assert z is x
    np.testing.assert_array_equal(x, y)
    check("sum", y, parts, np.float32, ref)
    rs = comm.reduce_scatter(parts[comm.rank].copy(), algorithm=algorithm)
    assert rs.shape == (6, 5)
    ag = comm.allgather(parts[comm.rank][:2].copy(), algorithm=algorithm)
    assert ag.shape == (2 * n, 5)
    np.testing.assert_array_equal(ag, np.concatenate([p[:2] for p in parts]))
    scalar = comm.allreduce(np.array(2.5, dtype=np.float32), algorithm=algorithm)
    assert scalar.shape == () and float(scalar) == 2.5 * n


@pytest.mark.parametrize("chunk_bytes", [64, 1000, 1 << 22])
@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
def test_chunking_does_not_change_result(comm, algorithm, chunk_bytes):
    parts = [rank_data(11, r, 10007, np.float32) for r in range(comm.size)]
    x = parts[comm.rank]
    base = comm.allreduce(x, algorithm=algorithm, chunk_bytes=1 << 30)
    y = comm.allreduce(x, algorithm=algorithm, chunk_bytes=chunk_bytes)
    np.testing.assert_array_equal(base.view(np.uint32), y.view(np.uint32))


def test_same_result_run_after_run(comm):
    parts = [rank_data(13, r, 5000, np.float32) for r in range(comm.size)]
    first = comm.allreduce(parts[comm.rank], algorithm="ring")
    for _ in range(3):
        again = comm.allreduce(parts[comm.rank], algorithm="ring")
        np.testing.assert_array_equal(first.view(np.uint32), again.view(np.uint32))
