"""Point-to-point over NCCL on one GPU: a one-rank NCCL communicator sends to itself
inside an NCCL group (batch_p2p, or isend + irecv launched together at the wait).
identity delivers the message exactly; a lossy codec delivers, bitwise, each chunk's
decode(encode(chunk)) as the CPU kernels compute it (so the GPU's payloads decode as the
CPU's), within the codec's bound; exactly the payloads' bytes go on the wire; the
caller's stream orders the input and the output; ends that disagree raise. Skipped
without a GPU."""

import ml_dtypes
import numpy as np
import pytest

from codec_reference import chunked_roundtrip
from gpu import GPU

pytestmark = pytest.mark.skipif(not GPU, reason="needs CuPy and a CUDA GPU")
BF16 = np.dtype(ml_dtypes.bfloat16)
CHUNK = 1 << 20  # bytes: a large message runs several chunks through the pipeline


def fresh_nccl():
    from mpi4py import MPI

    import coccl

    return coccl.init(MPI.COMM_SELF, backend="nccl")


def data(count, dtype, seed=0):
    return np.random.default_rng([seed, count]).standard_normal(count).astype(dtype)


def chunk_elems(codec, dtype, chunk_bytes):
    per = max(1, chunk_bytes // np.dtype(dtype).itemsize)
    return max(codec.alignment, per // codec.alignment * codec.alignment)


def payload_bytes(codec, count, dtype, elems):
    return sum(codec.encoded_nbytes(min(elems, count - a), dtype) for a in range(0, count, elems))


@pytest.mark.parametrize("count", [0, 1, 1001, (1 << 20) + 3])
@pytest.mark.parametrize("dtype", [np.float32, BF16, np.int32], ids=lambda d: np.dtype(d).name)
def test_identity_self_exchange_is_exact(ncomm, dtype, count):
    import cupy as cp

    x = data(count, dtype, 1) if np.dtype(dtype).kind == "f" else np.arange(count, dtype=dtype)
    xd, out = cp.asarray(x), cp.asarray(np.full(count, 7, dtype=dtype))
    ncomm.reset_stats()
    hs, hr = ncomm.batch_p2p([("send", xd, 0), ("recv", out, 0)], chunk_bytes=CHUNK)
    assert hr.wait() is out and hs.wait() is None
    np.testing.assert_array_equal(cp.asnumpy(out).view(np.uint8), x.view(np.uint8))
    assert ncomm.stats()["bytes_sent"] == x.nbytes
    while not (hs.test() and hr.test()):
        pass


@pytest.mark.parametrize("count", [1, 1001, 3 * 4096 + 5, (1 << 20) + 3])
@pytest.mark.parametrize("codec_name", ["taco", {"id": "tah", "row": 4096}, "int8"], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=lambda d: np.dtype(d).name)
def test_lossy_self_exchange_matches_the_cpu_codec(ncomm, codec_name, dtype, count):
    import cupy as cp

    import coccl

    codec = coccl.get_compressor(codec_name)
    x = data(count, dtype, 2)
    out = cp.asarray(np.zeros(count, dtype=dtype))
    ncomm.reset_stats()
    hs = ncomm.isend(cp.asarray(x), 0, compressor=codec_name, chunk_bytes=CHUNK)
    hr = ncomm.irecv(out, 0, compressor=codec_name, chunk_bytes=CHUNK)
    y = cp.asnumpy(hr.wait())  # launches the send and the receive as one group
    hs.wait()
    elems = chunk_elems(codec, dtype, CHUNK)
    expected = chunked_roundtrip(codec, x, elems)
    np.testing.assert_array_equal(y.view(np.uint8), expected.view(np.uint8))
    assert ncomm.stats()["bytes_sent"] == payload_bytes(codec, count, x.dtype, elems)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    err = np.linalg.norm(y64 - x64)
    assert err <= (codec.rel_error_bound + 2.0**-8) * np.linalg.norm(x64) + 1e-30


def test_several_messages_to_one_peer_pair_in_order(ncomm):
    """Two sends of different sizes and their receives, in one group and in two waits:
    each receive gets the message posted in its place."""
    import cupy as cp

    a, b = data(5000, np.float32, 3), data(300, np.float32, 4)
    ra, rb = cp.empty(5000, np.float32), cp.empty(300, np.float32)
    ops = [("send", cp.asarray(a), 0), ("send", cp.asarray(b), 0), ("recv", ra, 0), ("recv", rb, 0)]
    for h in ncomm.batch_p2p(ops, compressor="int8", chunk_bytes=4096):
        h.wait()
    import coccl

    codec = coccl.get_compressor("int8")
    elems = chunk_elems(codec, np.float32, 4096)
    np.testing.assert_array_equal(cp.asnumpy(ra), chunked_roundtrip(codec, a, elems))
    np.testing.assert_array_equal(cp.asnumpy(rb), chunked_roundtrip(codec, b, elems))


def test_the_callers_stream_orders_input_and_output(ncomm):
    """x is produced on a stream of the caller's and read back on it right after wait():
    no synchronisation by hand in between."""
    import cupy as cp

    count = (1 << 22) + 1
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        x = cp.arange(count, dtype=cp.float32)
        x *= 3  # still running when isend is posted, unless the stream is waited for
        out = cp.zeros(count, dtype=cp.float32)
        hs = ncomm.isend(x, 0)
        hr = ncomm.irecv(out, 0)
        y = hr.wait()
        hs.wait()
        total = float(y.sum(dtype=cp.float64))  # on ``stream``, after the transfer
    assert total == 3.0 * count * (count - 1) / 2


def test_host_arrays_still_travel_over_mpi(ncomm):
    x = data(777, np.float32, 5)
    hs = ncomm.isend(x, 0)
    y = ncomm.irecv(src=0, count=777, dtype=np.float32).wait()
    hs.wait()
    np.testing.assert_array_equal(y, x)


def test_bad_arguments_are_refused_before_any_byte_moves(ncomm):
    import cupy as cp

    x = cp.zeros(10, dtype=cp.float32)
    with pytest.raises(ValueError, match="dst"):
        ncomm.isend(x, 1)
    with pytest.raises(ValueError, match="src"):
        ncomm.batch_p2p([("send", x, 0), ("recv", x, 2)])
    with pytest.raises(ValueError, match="itself"):
        ncomm.send(x, 0)
    with pytest.raises(TypeError):
        ncomm.isend(cp.zeros(10, dtype=cp.int32), 0, compressor="taco")
    # nothing was posted: the communicator still works
    out = cp.empty(10, dtype=cp.float32)
    for h in ncomm.batch_p2p([("send", x + 1, 0), ("recv", out, 0)]):
        h.wait()
    assert float(out.sum()) == 10.0


@pytest.mark.parametrize(
    "send_count, recv_count, recv_on_host, text",
    [(10, 11, False, "count"), (10, 10, True, "wire")],
    ids=["count", "host-vs-device"],
)
def test_ends_that_disagree_raise(send_count, recv_count, recv_on_host, text):
    """The last tests: a mismatch leaves the communicator broken (its NCCL aborted)."""
    import cupy as cp

    import coccl

    comm = fresh_nccl()
    try:
        x = cp.ones(send_count, dtype=cp.float32)
        out = np.empty(recv_count, np.float32) if recv_on_host else cp.empty(recv_count, cp.float32)
        # the signatures (over MPI) name what differs, at the irecv's post (both
        # signatures arrive at once on one rank) or at the wait; should NCCL refuse the
        # unmatched group before they are compared, its error names NCCL
        with pytest.raises(coccl.CocclError, match=f"{text}|NCCL"):  # noqa: PT012
            comm.isend(x, 0)
            comm.irecv(out, 0).wait()
        with pytest.raises(coccl.CocclError, match="unusable"):
            comm.isend(x, 0)
    finally:
        comm.close()
