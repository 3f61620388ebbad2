"""Ranks that disagree: a call that differs on any rank (count, dtype, op, codec
configuration, schedule, collective, chunk size) is a CocclError on every rank, naming
what differs, before any byte moves, and the communicator works normally afterwards;
settings that shape the schedule must agree when the communicator is created."""

import numpy as np
import pytest

import coccl

from conftest import communicator, rank_data

pytestmark = pytest.mark.skipif(
    __import__("mpi4py.MPI", fromlist=["MPI"]).COMM_WORLD.Get_size() < 2,
    reason="one rank cannot disagree with itself",
)


def _x(count=1000, dtype=np.float32):
    return np.ones(count, dtype=dtype)


# (name, what rank 0 calls, what the other ranks call, text naming the difference)
DISAGREEMENTS = [
    (
        "count",
        lambda c: c.allreduce(_x(1000), algorithm="two_shot", compressor="taco"),
        lambda c: c.allreduce(_x(1001), algorithm="two_shot", compressor="taco"),
        "count: rank 0 1000, rank 1 1001",
    ),
    (
        "dtype of the same size",
        lambda c: c.allreduce(_x(), algorithm="ring"),
        lambda c: c.allreduce(_x(dtype=np.int32), algorithm="ring"),
        "dtype: rank 0 'float32', rank 1 'int32'",
    ),
    (
        "codec configuration",
        lambda c: c.allreduce(_x(), algorithm="ring", compressor={"id": "taco"}),
        lambda c: c.allreduce(
            _x(), algorithm="ring", compressor={"id": "taco", "fp8_format": "e5m2"}
        ),
        "e5m2",
    ),
    (
        "op",
        lambda c: c.allreduce(_x(), algorithm="two_shot", op="sum"),
        lambda c: c.allreduce(_x(), algorithm="two_shot", op="avg"),
        "op: rank 0 'sum', rank 1 'avg'",
    ),
    (
        "algorithm",
        lambda c: c.allreduce(_x(), algorithm="native"),
        lambda c: c.allreduce(_x(), algorithm="ring"),
        "algorithm asked: rank 0 'native', rank 1 'ring'",
    ),
    (
        "collective",
        lambda c: c.allreduce(_x(1000 * c.size)),
        lambda c: c.reduce_scatter(_x(1000 * c.size)),
        "the same allreduce call",
    ),
    (
        "barrier against a collective",
        lambda c: c.barrier(),
        lambda c: c.allreduce(_x(), algorithm="ring"),
        "collective: rank 0 'barrier', rank 1 'allreduce'",
    ),
    (
        "rooted calls of two kinds",
        lambda c: c.reduce(_x(), root=0),
        lambda c: c.gather(_x(), root=0),
        "collective: rank 0 'reduce', rank 1 'gather'",
    ),
    (
        "chunk size",
        lambda c: c.allreduce(_x(), algorithm="ring", chunk_bytes=1024),
        lambda c: c.allreduce(_x(), algorithm="ring", chunk_bytes=2048),
        "chunk elements",
    ),
]


@pytest.mark.parametrize(
    "name, first, other, says", DISAGREEMENTS, ids=[d[0] for d in DISAGREEMENTS]
)
def test_disagreeing_call_fails_on_every_rank(comm, name, first, other, says):
    call = first if comm.rank == 0 else other
    with pytest.raises(coccl.CocclError, match="do not make the same") as info:
        call(comm)
    if name != "collective":
        assert says in str(info.value)
    # nothing moved: the next matching call pairs up normally
    x = rank_data(5, comm.rank, 777, np.float32)
    y = comm.allreduce(x, algorithm="ring")
    ref = np.sum([rank_data(5, r, 777, np.float32).astype(np.float64) for r in range(comm.size)], 0)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_a_call_refused_on_one_rank_fails_on_every_rank(comm):
    """Bad input on one rank only: that rank raises its own error, the others a
    CocclError naming the rank and its error; nothing is left waiting."""
    x = _x()
    if comm.rank == 0:
        with pytest.raises(ValueError, match="unknown op"):
            comm.allreduce(x, op="mean", algorithm="ring")
    else:
        with pytest.raises(coccl.CocclError, match="rank 0 refused this allreduce.*unknown op"):
            comm.allreduce(x, op="sum", algorithm="ring")
    np.testing.assert_array_equal(comm.allreduce(x, algorithm="ring"), x * comm.size)


@pytest.mark.parametrize(
    "count, bad_out",
    [
        (333, lambda x: np.empty(x.size, np.float64)),
        (334, lambda x: np.empty(x.size + 1, np.float32)),
    ],
    ids=["dtype", "size"],
)
def test_an_out_refused_on_one_rank_fails_on_every_rank(comm, count, bad_out):
    """A bad ``out`` on one rank, at a signature's first call (a count of its own): every
    rank raises (the others CocclError naming it), none waits for the timeout."""
    x = _x(count)
    if comm.rank == 0:
        with pytest.raises((TypeError, ValueError), match="out has"):
            comm.allreduce(x, bad_out(x), algorithm="ring")
    else:
        with pytest.raises(coccl.CocclError, match="rank 0 refused this allreduce.*out has"):
            comm.allreduce(x, np.empty_like(x), algorithm="ring")
    np.testing.assert_array_equal(comm.allreduce(x, algorithm="ring"), x * comm.size)


@pytest.mark.parametrize(
    "variable, values",
    [
        ("COCCL_PIPELINE_DEPTH", ("4", "1")),
        ("COCCL_STAGING_LIMIT_BYTES", ("268435456", "1048576")),
        ("COCCL_CHUNK_BYTES", ("4194304", "65536")),
    ],
)
def test_schedule_settings_must_agree(comm, variable, values):
    value = values[0] if comm.rank == 0 else values[1]
    with pytest.raises(coccl.CocclError, match=f"{variable} differs between ranks"):
        with communicator(**{variable: value}):
            pass


def test_codec_threads_may_differ(comm):
    """COCCL_CPU_THREADS only sizes this rank's numba pool: ranks with different core
    counts make identical calls work (the host chunking is decided alike on all)."""
    threads = "1" if comm.rank == 0 else "4"
    with communicator(COCCL_CPU_THREADS=threads) as c:
        x = rank_data(6, c.rank, 300_000, np.float32)
        for algorithm in ("ring", "two_shot"):
            y = c.allreduce(x, algorithm=algorithm, compressor="int8")
            assert np.isfinite(y).all()


def test_every_call_checked_on_request(comm):
    """With COCCL_CHECK_CALLS=1 a disagreement is caught even when both ranks reuse
    plans they built earlier (without it, such a call would pair the wrong messages)."""
    with communicator(COCCL_CHECK_CALLS=1) as c:
        a, b = _x(1000), _x(2000)
        c.allreduce(a, algorithm="ring")
        c.allreduce(b, algorithm="ring")
        with pytest.raises(coccl.CocclError, match="count"):
            c.allreduce(a if c.rank == 0 else b, algorithm="ring")
