"""The progress engine's groups of streamed (NCCL) messages, on one rank without a GPU:
the messages posted since the last launch are launched together at the first wait or
test, a batch at once as a group of its own; merged rounds chain the messages of one
(peer, direction) and carry chunk c of every channel in round c."""

import numpy as np
import pytest
from mpi4py import MPI

from coccl.communicator import p2p_agreement as agreement
from coccl.communicator.p2p_engine import P2PEngine, Posting
from coccl.communicator.p2p_nccl import merged_rounds
from coccl.core.rounds import Round
from coccl.engine.polling import InlineExecutor
from coccl.transports.mpi import MpiTransport


@pytest.fixture
def engine():
    launched = []
    transport = MpiTransport(MPI.COMM_SELF)
    eng = P2PEngine(0, transport, transport.tag_ub, 30.0, 4, lambda exc: None, launched.append)
    eng.launched = launched
    yield eng
    eng.close()


def streamed(kind, count):
    sig = agreement.signature(count, "float32", {"id": "identity"}, 0, 256, "nccl")
    return Posting(kind, 0, sig, lambda: iter(()), InlineExecutor(), lambda: kind, streamed=True)


def test_posted_messages_launch_together_at_the_first_wait(engine):
    hs, hr = engine.post([streamed("send", 5)]) + engine.post([streamed("recv", 5)])
    assert engine.launched == []  # nothing launched at the posts
    assert engine.wait(hr) == "recv"
    assert [[p.kind for p in group] for group in engine.launched] == [["send", "recv"]]
    assert engine.wait(hs) == "send" and len(engine.launched) == 1


def test_a_batch_is_a_group_of_its_own_after_the_open_one(engine):
    first = engine.post([streamed("send", 1)])
    batch = engine.post([streamed("recv", 1), streamed("send", 2)], group=True)
    assert [[p.sig["count"] for p in g] for g in engine.launched] == [[1], [1, 2]]
    later = engine.post([streamed("recv", 2)])
    assert engine.test(later[0]) or engine.wait(later[0]) == "recv"
    assert len(engine.launched) == 3
    for m in first + batch:
        engine.wait(m)


def test_a_mismatch_raises_before_its_group_launches(engine):
    with pytest.raises(Exception, match="count: sender 5, receiver 6"):  # noqa: PT012
        messages = engine.post([streamed("send", 5), streamed("recv", 6)])
        engine.wait(messages[0])
    assert engine.launched == []


def source(name, chunks):
    return iter(Round(f"{name}{c}", 0, sends=[(0, f"{name}{c}")]) for c in range(chunks))


def test_merged_rounds_chain_one_channel_and_zip_the_channels():
    rounds = merged_rounds(
        [(("1", "send"), source("a", 2)), (("2", "send"), source("x", 3)),
         (("1", "send"), source("b", 1))],
        "p2p",
    )  # fmt: skip
    assert [[buf for _, buf in r.sends] for r in rounds] == [
        ["a0", "x0"],
        ["a1", "x1"],
        ["b0", "x2"],
    ]


def test_merged_rounds_run_every_parts_compute_in_order():
    calls = []
    parts = [
        Round(
            "r",
            0,
            pre=lambda i=i: calls.append(("pre", i)),
            post=lambda i=i: calls.append(("post", i)),
        )
        for i in range(2)
    ]
    (merged,) = merged_rounds(
        [(("a", "send"), iter(parts[:1])), (("b", "recv"), iter(parts[1:]))], "p"
    )
    merged.pre()
    merged.post()
    assert calls == [("pre", 0), ("pre", 1), ("post", 0), ("post", 1)]
    assert np.all([merged.wire_dtype is None])


class _Stream:
    """A stand-in for a device stream: work runs at once, so waits are no-ops."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def wait_event(self, event):
        pass


class _Ctx:
    """A stand-in DeviceContext on the host (p2p_nccl needs its streams and events)."""

    def __init__(self):
        self.device, self.compute, self.comm, self.post = _Stream(), _Stream(), _Stream(), _Stream()

    def event(self, stream):
        return "event"


class _SelfNccl:
    """One rank's NCCL on the host: a group's sends to itself land in its receives, in
    the order each was enqueued, as NCCL pairs them; sizes must match."""

    def __init__(self):
        self.groups = 0

    def group_exchange(self, sends, recvs, stream, wire_dtype=None):
        assert len(sends) == len(recvs)
        for (_, s), (_, r) in zip(sends, recvs, strict=True):
            assert s.size == r.size
            r[...] = s
        self.groups += 1


def test_launch_group_delivers_every_message_through_merged_rounds():
    """The data path of a streamed group on a host stand-in for NCCL: two messages of
    different sizes to one peer and their receives, int8 chunked, arrive as the CPU
    codec's chunked roundtrip, each in its own place."""
    import coccl
    from coccl import algorithms
    from coccl.algorithms import p2p
    from coccl.communicator.p2p_nccl import DeviceMessage, launch_group
    from coccl.core.pool import host_pool

    codec = coccl.get_compressor("int8")
    pool = host_pool()

    def posting(kind, data):
        plan = algorithms.ScheduleArgs(
            rank=0, size=1, codec=codec, dtype=np.dtype(np.float32), op="sum",
            chunk_elems=256, pool=pool, label=kind,
        )  # fmt: skip
        schedule = p2p.send if kind == "send" else p2p.recv
        return Posting(
            kind, 0, {}, lambda: schedule(plan, data, 0), InlineExecutor(), lambda: None,
            streamed=True, device=DeviceMessage(_Stream(), "ready"),
        )  # fmt: skip

    rng = np.random.default_rng(7)
    a, b = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(40).astype(np.float32)
    ra, rb = np.zeros_like(a), np.zeros_like(b)
    group = [posting("send", a), posting("send", b), posting("recv", ra), posting("recv", rb)]
    nccl = _SelfNccl()
    launch_group(group, nccl, _Ctx(), 2, None, "point-to-point")
    assert nccl.groups == 5  # a's four chunks, then b's one, each with its receive
    assert all(p.device.done_event == "event" for p in group)
    for sent, got in ((a, ra), (b, rb)):
        expected = np.concatenate(
            [codec.decode(codec.encode(sent[i : i + 256]), count=min(256, sent.size - i),
                          dtype=np.float32) for i in range(0, sent.size, 256)]
        )  # fmt: skip
        np.testing.assert_array_equal(got, expected)


def host(kind, count):
    sig = agreement.signature(count, "float32", {"id": "identity"}, 0, 256, "mpi")
    return Posting(kind, 0, sig, lambda: iter(()), InlineExecutor(), lambda: kind)


@pytest.mark.parametrize("thread_safe", [True, False])
def test_host_messages_move_in_the_background_only_where_threads_may_share_mpi(thread_safe):
    """The background thread calls the transport beside the caller's thread: only where
    two threads may (MPI at MPI_THREAD_MULTIPLE); elsewhere messages move at the calls."""
    transport = MpiTransport(MPI.COMM_SELF)
    assert transport.thread_safe == (MPI.Query_thread() == MPI.THREAD_MULTIPLE)
    transport.thread_safe = thread_safe
    eng = P2PEngine(0, transport, transport.tag_ub, 30.0, 4, lambda exc: None)
    try:
        recv = eng.post([host("recv", 0)])[0]  # its sender is not posted yet: in flight
        started = eng._background is not None
        send = eng.post([host("send", 0)])[0]
        assert eng.wait(recv) == "recv" and eng.wait(send) == "send"
        assert started == thread_safe
    finally:
        eng.close()
