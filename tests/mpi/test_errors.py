"""Bad input is refused on every rank alike, before any byte moves, and the communicator
works normally afterwards (run on 1-4 ranks)."""

import numpy as np
import pytest

import coccl

from conftest import rank_data

BAD_CALLS = [
    ("unknown op", lambda c, x: c.allreduce(x, op="mean"), ValueError),
    ("unknown algorithm", lambda c, x: c.allreduce(x, algorithm="tree"), ValueError),
    ("unknown compressor", lambda c, x: c.allreduce(x, compressor="zstd"), ValueError),
    ("taco int32", lambda c, x: c.allreduce(x.astype(np.int32), compressor="taco"), TypeError),
    ("int8 max", lambda c, x: c.allreduce(x, op="max", compressor="int8"), ValueError),
    ("native taco", lambda c, x: c.allreduce(x, algorithm="native", compressor="taco"), ValueError),
    ("out size", lambda c, x: c.allreduce(x, np.empty(x.size + 1, x.dtype)), ValueError),
    ("out dtype", lambda c, x: c.allreduce(x, np.empty(x.size, np.float64)), TypeError),
    ("strided", lambda c, x: c.allreduce(np.repeat(x, 2)[::2]), ValueError),
    ("complex", lambda c, x: c.allgather(x.astype(np.complex64)), TypeError),
    (
        "allgather out",
        lambda c, x: c.allgather(x, np.empty(x.size * c.size + 1, x.dtype)),
        ValueError,
    ),
    # out overlapping x other than in place: the call would read what it overwrote
    ("allreduce overlap", lambda c, x: _shifted(c.allreduce, x, x.size, x.size), ValueError),
    (
        "allgather overlap",
        lambda c, x: _shifted(c.allgather, x, x.size, x.size * c.size, "two_shot"),
        ValueError,
    ),
    (
        "reduce_scatter overlap",
        lambda c, x: _shifted(c.reduce_scatter, x, x.size, x.size // c.size, "ring"),
        ValueError,
    ),
    ("alltoall overlap", lambda c, x: _shifted(c.alltoall, x, x.size, x.size, None), ValueError),
]


def _shifted(call, x, count, out_count, algorithm="ring"):
    """``call`` with ``out`` one element past ``x``'s start in one buffer."""
    buf = np.zeros(max(count, out_count) + 1, x.dtype)
    buf[:count] = x
    if algorithm is None:
        return call(buf[:count], buf[1 : 1 + out_count])
    return call(buf[:count], buf[1 : 1 + out_count], algorithm=algorithm)


@pytest.mark.parametrize("name, call, error", BAD_CALLS, ids=[b[0] for b in BAD_CALLS])
def test_refused_everywhere_then_working(comm, name, call, error):
    x = rank_data(1, comm.rank, 256, np.float32)
    with pytest.raises(error):
        call(comm, x)
    # every rank refused without sending: the next collective pairs up normally
    y = comm.allreduce(x, algorithm="ring", compressor="identity")
    ref = np.sum([rank_data(1, r, 256, np.float32).astype(np.float64) for r in range(comm.size)], 0)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("algorithm", ["ring", "two_shot", "native"])
def test_reduce_scatter_needs_a_multiple_of_ranks(comm, algorithm):
    if comm.size == 1:
        pytest.skip("every count divides by one rank")
    x = np.ones(comm.size * 3 + 1, np.float32)
    with pytest.raises(ValueError, match="multiple of the rank count"):
        comm.reduce_scatter(x, algorithm=algorithm)
    y = comm.reduce_scatter(np.ones(comm.size * 3, np.float32), algorithm=algorithm)
    np.testing.assert_array_equal(y, np.full(3, comm.size, np.float32))


def test_refusals_do_not_leak_pool_memory(comm):
    x = rank_data(2, comm.rank, 4096, np.float32)
    comm.allreduce(x, algorithm="two_shot", compressor="taco")
    before = comm.stats()["pool_allocated_bytes"]
    for _ in range(20):
        with pytest.raises(ValueError):
            comm.allreduce(x, algorithm="two_shot", compressor="taco", op="max")
    comm.allreduce(x, algorithm="two_shot", compressor="taco")
    assert comm.stats()["pool_allocated_bytes"] == before


def test_codec_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown compressor 'zstd'"):
        coccl.get_compressor("zstd")


@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
@pytest.mark.parametrize("compressor", ["identity", "int8"])
def test_nccls_in_place_forms_run(comm, algorithm, compressor):
    """In place as NCCL defines it (AllGather: x is this rank's block of out;
    ReduceScatter: out is this rank's block of x) gives what separate buffers give."""
    n, r = 96, comm.rank
    x = rank_data(3, r, n * comm.size, np.float32)
    kw = {"algorithm": algorithm, "compressor": compressor}
    want = comm.reduce_scatter(x, **kw)
    inside = x.copy()
    got = comm.reduce_scatter(inside, inside[r * n : (r + 1) * n], **kw)
    np.testing.assert_array_equal(got, want)
    mine = x[:n]
    want = comm.allgather(mine, **kw)
    out = np.zeros(n * comm.size, np.float32)
    out[r * n : (r + 1) * n] = mine
    np.testing.assert_array_equal(comm.allgather(out[r * n : (r + 1) * n], out, **kw), want)
