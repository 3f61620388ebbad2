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
