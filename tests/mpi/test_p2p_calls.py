"""Point-to-point on the Communicator (coccl/communicator/p2p_calls.py): send/recv,
isend/irecv and batch_p2p over MPI. The identity codec delivers the message exactly;
a lossy codec delivers decode(encode(chunk)) of every chunk, bitwise; nonblocking
messages in both directions at once and rings of grouped exchanges complete; ends that
disagree raise on both sides naming what differs, also once their signatures were
agreed on earlier messages, and what such a failure leaves unmatched never reaches a later
communicator; bad arguments are refused before any byte moves."""

import contextlib
import threading
import time

import numpy as np
import pytest
from mpi4py import MPI

import coccl
import coccl.config
from coccl.core.pool import size_class

from codec_reference import chunked_roundtrip
from conftest import case_seed, communicator, rank_data

N = MPI.COMM_WORLD.Get_size()
RANK = MPI.COMM_WORLD.Get_rank()
two_ranks = pytest.mark.skipif(N < 2, reason="needs two ranks")


@contextlib.contextmanager
def meeting_at_the_end():
    """Every rank meets at the block's end, also one whose block raised (a rank that
    skipped the meeting would leave the others waiting in it until the job's limit)."""
    try:
        yield
    finally:
        MPI.COMM_WORLD.Barrier()


@pytest.mark.parametrize(
    "codec, dtype, count, chunk_bytes",
    [
        ("identity", np.float32, 0, None),
        ("identity", np.float32, 1, None),
        ("identity", np.int32, 1001, 256),  # odd, several chunks
        ("int8", np.float32, 1001, 1024),
        ("taco", np.float32, 700, 1024),
        ("tah", np.float32, 5000, 1 << 14),
        # windows of 3 tokens of 64: chunks of 5 windows, the last 3 tokens and a short one
        pytest.param(
            {"id": "tah", "row": 64, "window": 3},
            np.float32,
            5000,
            1 << 12,
            id="tah_window3-float32-5000-4096",
        ),
    ],
)
def test_isend_irecv_around_a_ring(comm, codec, dtype, count, chunk_bytes):
    """Every rank isends to its right and irecvs from its left at once (on one rank: to
    itself), then tests its send until done."""
    seed = case_seed(codec, count)
    right, left = (RANK + 1) % N, (RANK - 1) % N
    x = rank_data(seed, RANK, count, dtype)
    comm.reset_stats()
    hs = comm.isend(x, right, compressor=codec, chunk_bytes=chunk_bytes)
    hr = comm.irecv(src=left, count=count, dtype=dtype, compressor=codec, chunk_bytes=chunk_bytes)
    y = hr.wait()
    while not hs.test():
        pass
    sent = rank_data(seed, left, count, dtype)
    c = coccl.get_compressor(codec)
    elems = max(c.alignment, ((chunk_bytes or 1 << 20) // 4) // c.alignment * c.alignment)
    if codec == "identity":
        np.testing.assert_array_equal(y, sent)
    else:
        np.testing.assert_array_equal(y, chunked_roundtrip(c, sent, elems))
    # the payloads of every chunk, and nothing else, counted as sent
    chunks = [min(elems, count - a) for a in range(0, count, elems)]
    assert comm.stats()["bytes_sent"] == sum(c.encoded_nbytes(n, x.dtype) for n in chunks)
    assert hs.wait() is None and hr.test()


@pytest.mark.parametrize("codec", ["identity", "int8"])
def test_batch_p2p_both_ways_around_a_ring(comm, codec):
    """Each rank sends to both neighbours and receives from both in one batch, with
    different counts each way; on two ranks (and one) both neighbours are one rank, and
    both ends list the message going right first."""
    seed = case_seed("batch", codec)
    right, left = (RANK + 1) % N, (RANK - 1) % N
    rc = [100 * r + 300 for r in range(N)]  # rank r's message to r + 1
    lc = [50 * r + 1 for r in range(N)]  # rank r's message to r - 1
    to_right, to_left = (
        rank_data(seed, RANK, rc[RANK], np.float32),
        -rank_data(seed, RANK, lc[RANK], np.float32),
    )
    from_left, from_right = np.empty(rc[left], np.float32), np.empty(lc[right], np.float32)
    hs = comm.batch_p2p(
        [("send", to_right, right), coccl.P2POp("send", to_left, left),
         ("recv", from_left, left), ("recv", from_right, right)],
        compressor=codec, chunk_bytes=512,
    )  # fmt: skip
    results = [h.wait() for h in hs]
    assert results[2] is from_left and results[3] is from_right
    c = coccl.get_compressor(codec)
    expect_left = rank_data(seed, left, rc[left], np.float32)
    expect_right = -rank_data(seed, right, lc[right], np.float32)
    np.testing.assert_array_equal(from_left, chunked_roundtrip(c, expect_left, 128))
    np.testing.assert_array_equal(from_right, chunked_roundtrip(c, expect_right, 128))


@two_ranks
def test_blocking_send_recv_with_a_shape(comm):
    x = np.arange(12, dtype=np.float64).reshape(3, 4)
    if RANK == 0:
        comm.send(x, 1, tag=7)
        assert comm.recv(np.empty(12, np.float64), 1, tag=8)[5] == 5.0
    elif RANK == 1:
        y = comm.recv(src=0, dtype=np.float64, shape=(4, 3), tag=7)
        assert y.shape == (4, 3)
        np.testing.assert_array_equal(y.ravel(), x.ravel())
        comm.send(y, 0, tag=8)


@two_ranks
def test_stochastic_sends_draw_a_new_stream_each(comm):
    """A stochastic codec's every send draws its own random streams (a salt's call field
    counts this rank's sends): the same data sent twice arrives rounded differently,
    each within the codec's bound."""
    codec = {"id": "int", "bits": 4, "rounding": "stochastic", "seed": 3}
    x = rank_data(case_seed("stochastic sends"), 0, 4096, np.float32)
    if RANK == 0:
        for _ in range(2):
            comm.send(x, 1, compressor=codec)
    elif RANK == 1:
        got = [comm.recv(np.empty_like(x), 0, compressor=codec) for _ in range(2)]
        assert not np.array_equal(got[0], got[1])
        c = coccl.get_compressor(codec)
        for y in got:
            for g in range(0, x.size, c.group_size):
                err = np.linalg.norm(y[g : g + c.group_size] - x[g : g + c.group_size])
                norm = np.linalg.norm(x[g : g + c.group_size])
                assert err <= c.rel_error_bound * norm * (1 + 1e-6) + 1e-30


# (name, rank 0's send, rank 1's recv, text naming the difference)
MISMATCHES = [
    ("count", {}, {"count": 999}, "count: sender 1000, receiver 999"),
    ("dtype", {}, {"dtype": np.int32}, "dtype: sender 'float32', receiver 'int32'"),
    ("codec", {"compressor": "int8"}, {}, "receiver {'id': 'identity'}"),
    ("tag", {"tag": 1}, {"tag": 2}, "tag: sender 1, receiver 2"),
]


@two_ranks
@pytest.mark.parametrize(
    "name, sending, receiving, text", MISMATCHES, ids=[m[0] for m in MISMATCHES]
)
def test_ends_that_disagree_raise_on_both(name, sending, receiving, text):
    with communicator() as c, meeting_at_the_end():
        if RANK == 0:
            with pytest.raises(coccl.CocclError, match="do not agree") as err:
                c.send(np.ones(1000, np.float32), 1, **sending)
        elif RANK == 1:
            args = {"count": 1000, "dtype": np.float32, **receiving}
            with pytest.raises(coccl.CocclError, match="do not agree") as err:
                c.recv(src=0, **args)
        if RANK < 2:
            assert text in str(err.value)
            with pytest.raises(coccl.CocclError, match="unusable"):
                c.send(np.ones(1, np.float32), 1 - RANK)


@two_ranks
@pytest.mark.parametrize("earlier", [(1000, 999), (1000,)], ids=["both", "the-sender's"])
def test_signatures_agreed_before_that_differ_now_raise_on_both(earlier):
    """After a signature is agreed, its messages carry its digest only: one that meets a
    different signature still raises on both ends, naming the difference."""
    with communicator() as c, meeting_at_the_end():
        for n in earlier:  # agreed: one whole exchange each, none for the repeat
            for _ in range(2):
                if RANK == 0:
                    c.send(np.ones(n, np.float32), 1)
                elif RANK == 1:
                    c.recv(src=0, count=n, dtype=np.float32)
        if RANK < 2:
            assert c.stats()["p2p_agreements"] == len(earlier)
            with pytest.raises(coccl.CocclError, match="count: sender 1000, receiver 999"):
                if RANK == 0:
                    c.send(np.ones(1000, np.float32), 1)
                else:
                    c.recv(src=0, count=999, dtype=np.float32)


@two_ranks
def test_a_peer_that_never_posts_is_a_timeout_naming_it():
    with communicator(COCCL_TIMEOUT_S=0.5) as c, meeting_at_the_end():
        if RANK == 0:
            with pytest.raises(coccl.CocclError, match="rank 1 has not posted the matching recv"):
                c.send(np.ones(10, np.float32), 1)


@two_ranks
def test_a_loop_of_tests_times_out_as_a_wait_does():
    """``test()`` polled in a loop against a peer that never posts ends in the same
    timeout naming the peer, instead of spinning for ever."""
    with communicator(COCCL_TIMEOUT_S=0.5) as c, meeting_at_the_end():
        if RANK == 0:
            handle = c.irecv(np.empty(10, np.float32), 1)
            with pytest.raises(coccl.CocclError, match="rank 1 has not posted the matching send"):
                while not handle.test():
                    time.sleep(0.01)


@two_ranks
@pytest.mark.parametrize(
    "count, chunk_bytes", [(1 << 18, None), (5000, 1024)], ids=["rendezvous", "past_the_depth"]
)
def test_messages_progress_while_their_rank_is_in_a_collective(count, chunk_bytes):
    """A posted message that nobody waits for still moves while its rank is elsewhere,
    as MPI's and Gloo's do: rank 1's receive (one chunk above MPI's eager size, or more
    chunks than the pipeline's depth) completes rank 0's blocking send while rank 1
    sits in a barrier that waits for rank 0. Rank 0 sends only once rank 1 has posted,
    so that rank 1's post cannot already find rank 0's header."""
    with communicator(COCCL_TIMEOUT_S=10) as c, meeting_at_the_end():
        x = np.arange(count, dtype=np.float32)
        if RANK == 1:
            handle = c.irecv(np.empty(count, np.float32), 0, chunk_bytes=chunk_bytes)
        MPI.COMM_WORLD.Barrier()
        if RANK == 0:
            c.send(x, 1, chunk_bytes=chunk_bytes)
        c.barrier()
        c.allreduce(np.ones(3, np.float32))
        if RANK == 1:
            np.testing.assert_array_equal(handle.wait(), x)


@two_ranks
def test_a_thread_posts_while_another_waits():
    """Rank 0: one thread waits in a receive from rank 1 while another sends to rank 1,
    which receives before it sends back (legal with MPI_THREAD_MULTIPLE): a wait holds
    the engine one poll at a time, so the send gets in."""
    with communicator(COCCL_TIMEOUT_S=10) as c, meeting_at_the_end():
        x = np.arange(1000, dtype=np.float32)
        if RANK == 0:
            posted, got = threading.Event(), {}

            def receive():
                handle = c.irecv(np.empty(1000, np.float32), 1)
                posted.set()
                got["y"] = handle.wait()

            waiter = threading.Thread(target=receive)
            waiter.start()
            posted.wait()
            c.send(x, 1)
            waiter.join()
            np.testing.assert_array_equal(got["y"], 2 * x)
        elif RANK == 1:
            c.send(2 * c.recv(np.empty(1000, np.float32), 0), 0)


def test_closing_ends_a_wait_on_another_thread():
    """A wait on another thread for a message that will never come ends when the
    communicator is closed, raising that it was closed (not COCCL_TIMEOUT_S later)."""
    c = coccl.init(MPI.COMM_SELF, backend="mpi")
    handle = c.irecv(np.empty(10, np.float32), 0)  # its sender is never posted
    raised = {}

    def receive():
        try:
            handle.wait()
        except coccl.CocclError as exc:
            raised["error"] = str(exc)

    waiter = threading.Thread(target=receive)
    waiter.start()
    c.close()
    waiter.join()
    assert "closed" in raised["error"]


BAD = [
    (lambda c: c.send(np.ones(3, np.float32), N), ValueError, "dst must be a rank"),
    (lambda c: c.isend(np.ones(3, np.float32), True), ValueError, "dst must be a rank"),
    (lambda c: c.recv(np.ones(3, np.float32), -1), ValueError, "src must be a rank"),
    (lambda c: c.send(np.ones(3, np.float32), RANK), ValueError, "this rank itself"),
    (lambda c: c.send(np.ones(3, np.float32), np.int64(RANK)), ValueError, "this rank itself"),
    (lambda c: c.recv(src=np.int32(RANK), count=3, dtype=np.float32), ValueError, "itself"),
    (lambda c: c.irecv(np.ones(6, np.float32), 0, shape=(2, 2)), ValueError, "shape"),
    (lambda c: c.irecv(np.ones(3, np.float32)[::2], 0), ValueError, "contiguous"),
    (lambda c: c.irecv(_read_only(), 0), ValueError, "writ"),
    (lambda c: c.irecv(np.ones(3, np.float32), 0, dtype=np.float64), TypeError, "dtype"),
    (lambda c: c.irecv(np.ones(3, np.float32), 0, count=4), ValueError, "elements"),
    (lambda c: c.irecv(src=0, count=3), ValueError, "count"),
    (lambda c: c.isend(np.ones(3, np.int32), 0, compressor="int8"), TypeError, "int32"),
    (lambda c: c.isend(np.ones(3, np.float32), 0, tag="a"), ValueError, "tag"),
    (lambda c: c.isend(np.ones(3, np.float32), 0, chunk_bytes=0), ValueError, "chunk_bytes"),
    (lambda c: c.batch_p2p([("put", np.ones(3), 0)]), ValueError, "op 0"),
    (
        lambda c: c.batch_p2p([("send", np.ones(3, np.float32), 0), ("recv", np.ones(3), N)]),
        ValueError,
        "src must be a rank",
    ),
]


def _read_only():
    a = np.ones(3, np.float32)
    a.setflags(write=False)
    return a


@pytest.mark.parametrize("call, error, text", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_arguments_are_refused_before_any_byte_moves(comm, call, error, text):
    with pytest.raises(error, match=text):
        call(comm)
    # nothing moved: the communicator works on
    x, y = np.arange(3, dtype=np.float32), np.empty(3, np.float32)
    [h.wait() for h in comm.batch_p2p([("send", x, RANK), ("recv", y, RANK)])]
    np.testing.assert_array_equal(x, y)


def _cupy():
    try:
        import cupy

        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:
        return None


@pytest.mark.skipif(_cupy() is None, reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("codec", ["identity", "int8"])
def test_device_data_staged_as_the_collectives(comm, codec):
    """Over backend="mpi" device arrays are staged as the collectives' are: a CuPy array
    sent around the ring lands in a CuPy ``out`` as the host path delivers it, the codec
    runs on the device (its payloads in the device pool, none in the host pool) and only
    payloads cross the pinned staging buffers, a chunk at a time (never the whole
    message: the p2p path once copied it to the host and ran the CPU codec there)."""
    cp = _cupy()
    seed = case_seed("device", codec)
    right, left = (RANK + 1) % N, (RANK - 1) % N
    count = 1 << 14  # 64 chunks of 1 KiB: the pipeline's window holds a few of them
    x = cp.asarray(rank_data(seed, RANK, count, np.float32))
    out = cp.empty(count, cp.float32)
    first = [("send", x, right), ("recv", out, left)]
    for h in comm.batch_p2p(first, compressor=codec, chunk_bytes=1024):
        h.wait()  # a first message: nothing of it counts below
    comm.reset_stats()
    hs = comm.isend(x, right, compressor=codec, chunk_bytes=1024)
    assert comm.irecv(out, left, compressor=codec, chunk_bytes=1024).wait() is out
    hs.wait()
    c = coccl.get_compressor(codec)
    expect = chunked_roundtrip(c, rank_data(seed, left, count, np.float32), 256)
    np.testing.assert_array_equal(cp.asnumpy(out), expect)
    stats = comm.stats()
    assert stats["peak_host_bytes"] == 0
    # a window of chunks in pinned staging, not the message's 64: a send's and a
    # receive's rounds in flight, received chunks whose copy to the device runs, and
    # the first message's last such chunks (in use when the statistics were reset)
    depth = coccl.config.settings().pipeline_depth
    block = size_class(c.encoded_nbytes(256, np.float32))
    assert 0 < stats["peak_pinned_bytes"] <= 4 * depth * block
    assert (stats["peak_device_bytes"] > 0) == (codec != "identity")


def test_a_handle_of_a_closed_communicator_raises():
    with communicator() as c:
        x, y = np.ones(4, np.float32), np.empty(4, np.float32)
        hs = c.batch_p2p([("send", x, RANK), ("recv", y, RANK)])
        # A send's completion may need more polls than the receive that matched it.
        assert hs[1].wait() is y and hs[0].wait() is None
        h = c.isend(x, RANK)  # never matched
    assert hs[0].wait() is None and hs[0].test()  # a finished handle stays finished
    with pytest.raises(coccl.CocclError, match="closed"):
        h.wait()
    with pytest.raises(coccl.CocclError, match="closed"):
        h.test()


@two_ranks
def test_messages_a_failure_left_unmatched_never_reach_a_later_communicator():
    """A send whose receiver raised leaves its chunk unreceived at the receiver; freeing
    the broken communicator's MPI duplicate would let MPI give its context to the next
    communicator, whose receive under the same tag would take the stale chunk."""
    with communicator() as c, meeting_at_the_end():
        if RANK == 0:
            h = c.isend(np.ones(1000, np.float32), 1, compressor="int8")  # data goes now
        MPI.COMM_WORLD.Barrier()  # ... before rank 1's header can reach rank 0
        if RANK < 2:
            with pytest.raises(coccl.CocclError, match="do not agree"):
                h.wait() if RANK == 0 else c.recv(src=0, count=1000, dtype=np.float32)
    with communicator() as c:
        x = np.arange(1000, dtype=np.float32)
        if RANK == 0:
            c.send(x, 1)
        elif RANK == 1:
            np.testing.assert_array_equal(c.recv(src=0, count=1000, dtype=np.float32), x)
