"""Fixtures for multi-rank tests: one coccl communicator per run, rank-seeded data."""

import dataclasses
import zlib

import numpy as np
import pytest
from mpi4py import MPI

import coccl


@pytest.fixture(scope="session")
def comm():
    c = coccl.init(MPI.COMM_WORLD, backend="mpi")
    yield c
    c.close()


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


STAGING_LIMIT = 1 << 20


def stats_at_staging_limit(comm, collective, algorithm, codec, place=lambda x: x) -> dict:
    """``comm.stats()`` of one float32 collective run with COCCL_STAGING_LIMIT_BYTES at
    ``STAGING_LIMIT``, whose chunks (dozens per shard) keep the pipeline's window full, so
    the limit, not the message, must lower the depth from its default 4. ``place`` puts
    the input where it runs (e.g. on a device)."""
    n = comm.size
    count = n << 18
    x = rank_data(case_seed("limit", collective, algorithm), comm.rank, count, np.float32)
    if collective == "allgather":
        x = x[: count // n]
    chunk = (64 if codec == "identity" else 128) << 10
    saved = comm._settings
    comm._settings = dataclasses.replace(saved, staging_limit_bytes=STAGING_LIMIT)
    try:
        comm.reset_stats()
        getattr(comm, collective)(
            place(x), algorithm=algorithm, compressor=codec, chunk_bytes=chunk
        )
        return comm.stats()
    finally:
        comm._settings = saved
