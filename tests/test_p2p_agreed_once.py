"""One whole point-to-point agreement per new (peer, direction, signature), in one process
(a communicator over MPI's COMM_SELF, messages to this rank itself): repeated messages of
an agreed signature exchange digests only and still arrive exactly; ends whose
signatures were both agreed before, or one of them, and differ now still raise on both
ends naming what differs."""

import numpy as np
import pytest
from mpi4py import MPI

import coccl

from codec_reference import chunked_roundtrip


@pytest.fixture
def comm():
    c = coccl.init(MPI.COMM_SELF, backend="mpi")
    yield c
    c.close()


def exchange(comm, x, out, **kw):
    """``x`` sent to this rank itself into ``out``; what the receive returned."""
    hs = comm.isend(x, 0, **kw)
    hr = comm.irecv(out, 0, **kw)
    hs.wait()
    return hr.wait()


@pytest.mark.parametrize("codec", ["identity", "int8"])
def test_one_agreement_per_new_signature(comm, codec):
    rng = np.random.default_rng()  # fresh data: any message must arrive as sent
    c = coccl.get_compressor(codec)
    assert comm.stats()["p2p_agreements"] == 0
    for _ in range(4):  # both channels (send to 0, recv from 0) agree once
        x = rng.standard_normal(1001).astype(np.float32)
        got = exchange(comm, x, np.empty_like(x), compressor=codec, chunk_bytes=1024)
        np.testing.assert_array_equal(got, chunked_roundtrip(c, x, 1024 // 4))
        assert comm.stats()["p2p_agreements"] == 2
    x = rng.standard_normal(7).astype(np.float32)  # a new count: a new agreement
    np.testing.assert_array_equal(exchange(comm, x, np.empty_like(x)), x)
    assert comm.stats()["p2p_agreements"] == 4


def test_a_batch_of_one_signature_agrees_once_and_arrives_in_order(comm):
    xs = [np.full(100, float(i), np.float32) for i in range(6)]
    outs = [np.empty_like(x) for x in xs]
    ops = [("send", x, 0) for x in xs] + [("recv", o, 0) for o in outs]
    for h in comm.batch_p2p(ops):
        h.wait()
    for x, o in zip(xs, outs, strict=True):
        np.testing.assert_array_equal(o, x)
    assert comm.stats()["p2p_agreements"] == 2


def agree(comm, *counts):
    for n in counts:
        x = np.ones(n, np.float32)
        exchange(comm, x, np.empty_like(x))


@pytest.mark.parametrize(
    "earlier", [(10, 11), (10,)], ids=["both-agreed-before", "the-sender's-agreed-before"]
)
def test_agreed_signatures_that_differ_now_raise_on_both_ends(comm, earlier):
    agree(comm, *earlier)
    hs = comm.isend(np.ones(10, np.float32), 0)
    with pytest.raises(coccl.CocclError, match="count: sender 10, receiver 11"):
        comm.irecv(np.zeros(11, np.float32), 0).wait()  # found at the post or the wait
    with pytest.raises(coccl.CocclError, match="count: sender 10, receiver 11"):
        hs.wait()  # given up with it
    with pytest.raises(coccl.CocclError, match="unusable"):
        comm.isend(np.ones(1, np.float32), 0)
