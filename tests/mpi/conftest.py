"""Fixtures for multi-rank tests: one coccl communicator per run, rank-seeded data."""

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
