"""Fixtures for multi-rank tests: one coccl communicator per test file, rank-seeded data."""

import contextlib
import os
import zlib

import numpy as np
import pytest
from mpi4py import MPI

import coccl


@pytest.fixture(scope="module")  # a launch may run several files (tests/test_mpi.py)
def comm():
    c = coccl.init(MPI.COMM_WORLD, backend="mpi")
    yield c
    c.close()


def gpu_per_rank():
    """A mark that skips a test module unless every rank can have a GPU of its own (a
    module whose tests all skip still reports them, so every rank runs the same tests)."""
    try:
        import cupy

        ndev = cupy.cuda.runtime.getDeviceCount()
    except Exception:
        ndev = 0
    n = MPI.COMM_WORLD.Get_size()
    return pytest.mark.skipif(ndev < n, reason=f"needs a GPU per rank ({ndev} for {n} ranks)")


def case_seed(*parts) -> int:
    """A seed from a test case's parameters, the same on every rank (unlike ``hash``,
    which Python randomises per process)."""
    return zlib.crc32(repr(parts).encode())


def rank_data(seed: int, rank: int, count: int, dtype) -> np.ndarray:
    """Deterministic data of ``rank`` for case ``seed``: every rank can build every
    other rank's contribution, so references need no communication."""
    rng = np.random.default_rng([seed, rank, count])
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        lo = 0 if dtype.kind == "u" else -9
        return rng.integers(lo, 10, size=count).astype(dtype)
    return rng.standard_normal(count).astype(dtype)


def all_equal_across_ranks(a: np.ndarray) -> bool:
    """Whether every rank holds bitwise the same array."""
    mine = np.ascontiguousarray(a).view(np.uint8).tobytes()
    return len(set(MPI.COMM_WORLD.allgather(mine))) == 1


@contextlib.contextmanager
def communicator(backend="mpi", **env):
    """A new communicator created with the given ``COCCL_*`` variables set (the same on
    every rank: collective), closed afterwards."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update({name: str(value) for name, value in env.items()})
    try:
        c = coccl.init(MPI.COMM_WORLD, backend=backend)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    try:
        yield c
    finally:
        c.close()


STAGING_LIMIT = 1 << 20


def stats_at_staging_limit(collective, algorithm, codec, backend="mpi", place=lambda x: x):
    """``stats()`` of one float32 collective on a communicator whose
    COCCL_STAGING_LIMIT_BYTES is ``STAGING_LIMIT``, with chunks (dozens per shard) that keep
    the pipeline's window full, so the limit, not the message, must lower the depth from
    its default 4. ``place`` puts the input where it runs (e.g. on a device)."""
    with communicator(backend, COCCL_STAGING_LIMIT_BYTES=STAGING_LIMIT) as comm:
        n = comm.size
        count = n << 18
        x = rank_data(case_seed("limit", collective, algorithm), comm.rank, count, np.float32)
        if collective == "allgather":
            x = x[: count // n]
        chunk = (64 if codec == "identity" else 128) << 10
        comm.reset_stats()
        getattr(comm, collective)(
            place(x), algorithm=algorithm, compressor=codec, chunk_bytes=chunk
        )
        return comm.stats()
