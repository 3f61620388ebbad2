"""The point-to-point schedules (algorithms/p2p.py) in one process
(tests/schedule_sim.py): a received message is ``decode(encode(x))`` of the sent one,
bitwise (the identity codec: ``x`` itself), chunk by chunk; grouped exchanges in both
directions around a ring complete; every chunk is its own independent round."""

import numpy as np
import pytest
from schedule_cases import (  # noqa: F401  (one_numba_thread: an autouse fixture)
    BF16,
    CODECS,
    DTYPES,
    F32,
    no_leaks,
    normal_data,
    one_numba_thread,
    plans,
    roundtrip,
)
from schedule_sim import run_ranks

from coccl.algorithms.p2p import exchange, recv, send

COUNTS = [0, 1, 5, 129, 700]


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("codec", CODECS)
def test_send_recv(codec, dtype, count):
    """Rank 2 sends to rank 0 of three (rank 1 idle): the receiver holds the message
    through one roundtrip of each chunk, which is the whole message's roundtrip."""
    rng = np.random.default_rng(count)
    ps = plans(3, codec, dtype, chunk_elems=256)
    x = normal_data(rng, count, dtype)
    out = np.full(count, np.nan, dtype)
    run_ranks([recv(ps[0], out, 2), iter(()), send(ps[2], x, 0)], seed=count)
    np.testing.assert_array_equal(out.view(np.uint8), roundtrip(ps[0].codec, x).view(np.uint8))
    if codec == "identity":
        np.testing.assert_array_equal(out, x)
    assert no_leaks(ps)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_exchange_both_ways_around_a_ring(codec, n):
    """Every rank sends to its right and its left neighbour and receives from both, in
    one group, with different counts each way (a pipeline's forward activations and
    backward gradients): every send is posted with every receive, so no rank waits for
    another's post, and every message arrives whole. On one rank both neighbours are the
    rank itself."""
    rng = np.random.default_rng(n)
    ps = plans(n, codec, F32, chunk_elems=128)
    right_counts = [100 * r + 300 for r in range(n)]  # rank r's message to r + 1
    left_counts = [50 * r + 1 for r in range(n)]  # rank r's message to r - 1
    to_right = [normal_data(rng, c, F32) for c in right_counts]
    to_left = [normal_data(rng, c, F32) for c in left_counts]
    from_left = [np.empty(right_counts[(r - 1) % n], F32) for r in range(n)]
    from_right = [np.empty(left_counts[(r + 1) % n], F32) for r in range(n)]
    schedules = []
    for r in range(n):
        # messages to one peer pair in the order given: on two ranks (and one) both
        # neighbours are the same rank, so both ends list "the one going right" first
        ops = [
            ("send", to_right[r], (r + 1) % n),
            ("send", to_left[r], (r - 1) % n),
            ("recv", from_left[r], (r - 1) % n),
            ("recv", from_right[r], (r + 1) % n),
        ]
        schedules.append(exchange(ps[r], ops))
    run_ranks(schedules, seed=n)
    c = ps[0].codec
    for r in range(n):
        np.testing.assert_array_equal(from_left[r], roundtrip(c, to_right[(r - 1) % n]))
        np.testing.assert_array_equal(from_right[r], roundtrip(c, to_left[(r + 1) % n]))
    assert no_leaks(ps)


def test_messages_to_one_peer_pair_in_order():
    """Two messages from rank 0 to rank 1 in one group land in the order given."""
    ps = plans(2, "int8", BF16, chunk_elems=128)
    a, b = np.arange(300, dtype=BF16), -np.arange(200, dtype=BF16)
    ra, rb = np.empty_like(a), np.empty_like(b)
    run_ranks(
        [exchange(ps[0], [("send", a, 1), ("send", b, 1)]),
         exchange(ps[1], [("recv", ra, 0), ("recv", rb, 0)])],
        seed=5,
    )  # fmt: skip
    np.testing.assert_array_equal(ra, roundtrip(ps[0].codec, a))
    np.testing.assert_array_equal(rb, roundtrip(ps[0].codec, b))


@pytest.mark.parametrize("codec", ["identity", "taco"])
def test_each_chunk_is_an_independent_round(codec):
    """One round per chunk, none waiting on another, so the engine's window overlaps the
    encode of chunk i+1, the wire of chunk i and the decode of chunk i-1: the sender's
    rounds encode in pre and send; the receiver's receive and decode in post; the
    identity codec sends from x and receives into out directly."""
    ps = plans(2, codec, F32, chunk_elems=256)
    x, out = np.ones(1000, F32), np.empty(1000, F32)
    sent, received = list(send(ps[0], x, 1)), list(recv(ps[1], out, 0))
    assert len(sent) == len(received) == 4
    assert [r.tag for r in sent] == [r.tag for r in received] == [0, 1, 2, 3]
    assert all(not r.deps for r in sent + received)
    assert all(len(r.sends) == 1 and not r.recvs and r.post is None for r in sent)
    assert all(len(r.recvs) == 1 and not r.sends for r in received)
    if codec == "identity":
        assert all(r.pre is None and np.shares_memory(r.sends[0][1], x) for r in sent)
        assert all(r.post is None and np.shares_memory(r.recvs[0][1], out) for r in received)
    else:
        assert all(r.pre is not None for r in sent)
        assert all(r.post is not None for r in received)


@pytest.mark.parametrize(
    "ops, match",
    [
        ([("put", np.zeros(1, F32), 1)], "kind"),
        ([("send", np.zeros(1, F32), 2)], "peer must be a rank in 0..1"),
        ([("recv", np.zeros(1, F32), -1)], "peer"),
        ([("send", np.zeros(1, F32))], "tuple"),
    ],
)
def test_exchange_refuses_bad_ops_before_any_round(ops, match):
    with pytest.raises(ValueError, match=match):
        exchange(plans(2, "identity", F32)[0], ops)


def test_send_refuses_a_peer_outside_the_group():
    with pytest.raises(ValueError, match="peer"):
        send(plans(2, "identity", F32)[0], np.zeros(3, F32), 2)
    with pytest.raises(ValueError, match="peer"):
        recv(plans(2, "identity", F32)[0], np.zeros(3, F32), True)
