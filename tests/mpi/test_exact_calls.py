"""The rooted collectives (broadcast, reduce, gather, scatter) against exact references
built from every rank's deterministic data, on every root; mpi4py's and torch's op
constants; the checks that refuse a call on every rank before any byte moves."""

import numpy as np
import pytest
import torch
import torch.distributed as dist
from mpi4py import MPI

import coccl

from conftest import case_seed, rank_data

COUNTS = [0, 1, 3, 1000]  # 3: fewer than four ranks, not a multiple of the group size
DTYPES = [np.float32, np.float64, np.int32]
SIZE = MPI.COMM_WORLD.Get_size()


def _reference(op, parts, dtype):
    """Rank order, in float64 for floats (coccl combines in the accumulate dtype: for
    float32 that is float32, so float32 cases compare at its rounding)."""
    acc = parts[0].astype(np.float64 if np.dtype(dtype).kind == "f" else dtype)
    for part in parts[1:]:
        acc = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum,
               "prod": np.multiply}[op](acc, part)  # fmt: skip
    if op == "avg":
        acc = acc / len(parts) if acc.dtype.kind == "f" else np.trunc(acc / len(parts))
    return acc.astype(dtype)


@pytest.mark.parametrize("root", range(SIZE))
@pytest.mark.parametrize("count", COUNTS)
def test_broadcast(comm, count, root):
    seed = case_seed("broadcast", count, root)
    x = rank_data(seed, comm.rank, count, np.float32)
    assert comm.broadcast(x, root=root) is x
    np.testing.assert_array_equal(x, rank_data(seed, root, count, np.float32))


@pytest.mark.parametrize("op", ["sum", "avg", "max", "prod"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", COUNTS)
def test_reduce(comm, count, dtype, op):
    root = SIZE - 1
    seed = case_seed("reduce", count, np.dtype(dtype).name, op)
    parts = [rank_data(seed, r, count, dtype) for r in range(SIZE)]
    result = comm.reduce(parts[comm.rank].copy(), root=root, op=op)
    if comm.rank != root:
        assert result is None
        return
    want = _reference(op, parts, dtype)
    if np.dtype(dtype) == np.float32:
        np.testing.assert_allclose(result, want, rtol=1e-5, atol=1e-6)
    else:
        np.testing.assert_array_equal(result, want)


@pytest.mark.parametrize("root", range(SIZE))
@pytest.mark.parametrize("count", COUNTS)
def test_gather(comm, count, root):
    seed = case_seed("gather", count, root)
    x = rank_data(seed, comm.rank, count, np.int32).reshape(count, 1)
    result = comm.gather(x, root=root)
    if comm.rank != root:
        assert result is None
        return
    assert result.shape == (SIZE * count, 1)
    want = np.concatenate([rank_data(seed, r, count, np.int32) for r in range(SIZE)])
    np.testing.assert_array_equal(result.reshape(-1), want)


@pytest.mark.parametrize("root", range(SIZE))
@pytest.mark.parametrize("count", COUNTS)
def test_scatter(comm, count, root):
    seed = case_seed("scatter", count, root)
    full = rank_data(seed, root, SIZE * count, np.float64)
    if comm.rank == root:
        result = comm.scatter(full, root=root)
    else:  # the other ranks' input is never read: they may pass only out
        result = comm.scatter(None, np.empty(count), root=root)
    np.testing.assert_array_equal(result, full[comm.rank * count : (comm.rank + 1) * count])


def test_torch_tensors_and_out(comm):
    x = torch.arange(6, dtype=torch.float32) + comm.rank
    out = torch.empty(6 * SIZE)
    result = comm.gather(x, out, root=0)
    if comm.rank == 0:
        assert result is out
        want = torch.cat([torch.arange(6, dtype=torch.float32) + r for r in range(SIZE)])
        assert torch.equal(out, want)
    assert torch.equal(comm.broadcast(x, root=0), torch.arange(6, dtype=torch.float32))


OP_CONSTANTS = [
    (MPI.SUM, "sum"), (MPI.MAX, "max"), (MPI.MIN, "min"), (MPI.PROD, "prod"),
    (dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "avg"), (dist.ReduceOp.MAX, "max"),
    (dist.ReduceOp.PRODUCT, "prod"),
]  # fmt: skip


@pytest.mark.parametrize("constant, name", OP_CONSTANTS, ids=lambda v: str(v))
def test_op_constants(comm, constant, name):
    x = rank_data(case_seed("constants"), comm.rank, 7 * SIZE, np.int64)
    assert np.array_equal(comm.allreduce(x, op=constant), comm.allreduce(x, op=name))
    assert np.array_equal(
        comm.reduce_scatter(x, op=constant, algorithm="ring"),
        comm.reduce_scatter(x, op=name, algorithm="ring"),
    )
    result = comm.reduce(x, root=0, op=constant)
    if comm.rank == 0:
        assert np.array_equal(result, comm_reference(name, x))


def comm_reference(name, x):
    parts = [rank_data(case_seed("constants"), r, x.size, np.int64) for r in range(SIZE)]
    return _reference(name, parts, np.int64)


BAD_CALLS = [
    (lambda c: c.broadcast(np.ones(4), root=SIZE), ValueError, "not a rank"),
    (lambda c: c.broadcast(np.ones(4), root="0"), TypeError, "root must be an int"),
    (lambda c: c.reduce(np.ones(4), root=0, op="xor"), ValueError, "unknown op"),
    (lambda c: c.reduce(np.ones(4), np.ones(5), root=0), ValueError, "out has 5 elements"),
    (lambda c: c.gather(np.ones(4), np.ones(4 * SIZE, np.float32)), TypeError, "dtype"),
    (lambda c: c.gather(np.ones((4, 4))[:, 0]), ValueError, "contiguous"),
]
if SIZE > 1:  # every count is a multiple of one rank
    BAD_CALLS.append(
        (lambda c: c.scatter(np.ones(4 * SIZE + 1)), ValueError, "multiple of the rank count")
    )


@pytest.mark.parametrize("call, error, text", BAD_CALLS)
def test_refused_everywhere(comm, call, error, text):
    with pytest.raises((error, coccl.CocclError), match=text):
        call(comm)
    assert comm.reduce(np.ones(3), root=0) is None or comm.rank == 0  # still usable


def test_one_rank_refusing_is_raised_on_every_rank(comm):
    if SIZE < 2:
        pytest.skip("one rank cannot disagree with itself")
    count = 5 if comm.rank == 0 else 6
    with pytest.raises(coccl.CocclError, match="count: rank 0 5, rank 1 6"):
        comm.broadcast(np.ones(count), root=0)
    with pytest.raises((coccl.CocclError, ValueError), match="not a rank"):
        comm.gather(np.ones(2), root=0 if comm.rank else SIZE)


def test_rooted_outputs_overlapping_x_are_refused_at_the_root(comm):
    """At the root, ``out`` may overlap ``x`` only in MPI_IN_PLACE's forms (reduce: out is
    x; gather: x is the root's block of out; scatter: out is the root's block of x)."""
    n, root, N = 7, 0, comm.size  # a count no other case uses: new signatures
    buf = np.arange(n * N + 1, dtype=np.float32)
    for call in (comm.reduce, comm.gather, comm.scatter):
        count = {comm.reduce: n * N, comm.gather: n, comm.scatter: n * N}[call]
        out_count = {comm.reduce: n * N, comm.gather: n * N, comm.scatter: n}[call]
        if comm.rank == root:
            with pytest.raises(ValueError, match="out overlaps x"):
                call(buf[:count], buf[1 : 1 + out_count], root=root)
        else:
            with pytest.raises(coccl.CocclError, match="rank 0 refused"):
                call(buf[:count].copy(), np.empty(out_count, np.float32), root=root)
    x = np.full(n * N, comm.rank + 1, np.float32)
    y = comm.reduce(x, x, root=root)  # in place at the root
    if comm.rank == root:
        np.testing.assert_array_equal(y, np.full(n * N, N * (N + 1) / 2, np.float32))
    out = np.zeros(n * N, np.float32)
    mine = out[root * n : (root + 1) * n] if comm.rank == root else np.empty(n, np.float32)
    mine[...] = comm.rank + 1
    got = comm.gather(mine, out if comm.rank == root else None, root=root)
    if comm.rank == root:
        np.testing.assert_array_equal(got, np.repeat(np.arange(1, N + 1, dtype=np.float32), n))
