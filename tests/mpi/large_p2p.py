"""A point-to-point message beyond 2**31 bytes over MPI, on 2 ranks (launched by
tests/test_p2p_large.py; not one of test_mpi.py's files, which run at 1-4 ranks): an odd
float32 count whose bytes pass 2**31, exact;
a lossy codec's message of the same size arrives as decode(encode(chunk)) of every chunk.
Each rank holds the message once; checks run block by block (no second copy)."""

import numpy as np
import pytest
from mpi4py import MPI

import coccl

from conftest import communicator

RANK = MPI.COMM_WORLD.Get_rank()
COUNT = (1 << 29) + 1027  # float32: 2**31 + 4108 bytes, odd
BLOCK = 1 << 20  # the message repeats one random block (the receiver rebuilds it)
CHUNK = 64 << 20


def block() -> np.ndarray:
    return np.random.default_rng(31).standard_normal(BLOCK).astype(np.float32)


def message() -> np.ndarray:
    return np.resize(block(), COUNT)


def check(y: np.ndarray, expected_block: np.ndarray) -> None:
    assert y.shape == (COUNT,) and y.dtype == np.float32
    for a in range(0, COUNT, BLOCK):
        part = y[a : a + BLOCK]
        np.testing.assert_array_equal(part, expected_block[: part.size], err_msg=f"at {a}")


@pytest.fixture(scope="module")
def comm():
    assert MPI.COMM_WORLD.Get_size() == 2, "this file runs on 2 ranks"
    with communicator() as c:
        yield c


def test_identity_beyond_2_31_bytes(comm):
    if RANK == 0:
        comm.send(message(), 1, chunk_bytes=CHUNK)
    else:
        check(comm.recv(src=0, count=COUNT, dtype=np.float32, chunk_bytes=CHUNK), block())


def test_lossy_beyond_2_31_bytes(comm):
    codec = coccl.get_compressor("int8")
    if RANK == 0:
        comm.send(message(), 1, compressor="int8", chunk_bytes=CHUNK)
        return
    out = np.empty(COUNT, dtype=np.float32)
    comm.recv(out, 0, compressor="int8", chunk_bytes=CHUNK)
    # CHUNK is a multiple of BLOCK: every chunk but the last is the same blocks
    elems = CHUNK // 4
    whole = np.resize(block(), elems)
    expected = codec.decode(codec.encode(whole), count=elems, dtype=np.float32)
    for a in range(0, COUNT, elems):
        part = out[a : a + elems]
        if part.size == elems:
            np.testing.assert_array_equal(part, expected, err_msg=f"chunk at {a}")
        else:
            tail = whole[: part.size]
            last = codec.decode(codec.encode(tail), count=part.size, dtype=np.float32)
            np.testing.assert_array_equal(part, last)
