"""The in-process executor (tests/schedule_sim.py): it runs the existing ring and two-shot
schedules to their known results on 1-4 ranks, and it catches what a transport would
get wrong or hang on: sizes that differ, a receive nobody sends, a send buffer rewritten
in flight, messages that pair under MPI's tags but not in NCCL's order."""

import numpy as np
import pytest
from schedule_cases import (  # noqa: F401  (one_numba_thread: an autouse fixture)
    F32,
    integer_data,
    no_leaks,
    one_numba_thread,
    plans,
)
from schedule_sim import run_ranks

from coccl import algorithms
from coccl.core.rounds import Round


@pytest.mark.parametrize("seed", [None, 1])
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_existing_schedules_run_to_their_results(n, algorithm, collective, seed):
    rng = np.random.default_rng(n)
    count = 700
    xs = [integer_data(rng, count * (n if collective == "reduce_scatter" else 1), F32)]
    xs += [integer_data(rng, xs[0].size, F32) for _ in range(n - 1)]
    size_out = {"allreduce": count, "reduce_scatter": count, "allgather": n * count}
    outs = [np.empty(size_out[collective], F32) for _ in range(n)]
    ps = plans(n, "identity", F32, chunk_elems=128)
    schedule = algorithms.schedule(algorithm, collective)
    run_ranks([schedule(ps[r], xs[r], outs[r]) for r in range(n)], seed=seed)
    total = sum(xs)
    for r in range(n):
        expected = {
            "allreduce": total,
            "reduce_scatter": total[r * count : (r + 1) * count],
            "allgather": np.concatenate(xs),
        }[collective]
        np.testing.assert_array_equal(outs[r], expected)
    assert no_leaks(ps)


def _round(tag, sends=(), recvs=(), pre=None):
    return Round(label=f"r{tag}", tag=tag, sends=list(sends), recvs=list(recvs), pre=pre)


def test_sizes_must_match():
    a, b = np.zeros(4, np.uint8), np.zeros(5, np.uint8)
    with pytest.raises(AssertionError, match="4 bytes sent, 5 expected"):
        run_ranks([[_round(0, sends=[(1, a)])], [_round(0, recvs=[(0, b)])]])


def test_a_receive_without_a_send_is_a_deadlock():
    buf = np.zeros(4, np.uint8)
    with pytest.raises(AssertionError, match="deadlock.*recv from 0 tag 1"):
        run_ranks([[_round(0, sends=[(1, buf)])], [_round(1, recvs=[(0, buf)])]])


def test_a_send_buffer_rewritten_in_flight_fails():
    """Round 1 rewrites round 0's send buffer without waiting for it (no dependency):
    some orders change the bytes between posting and matching."""
    buf, dst = np.zeros(4, np.uint8), np.zeros(4, np.uint8)

    def rewrite():
        buf[...] = 7

    with pytest.raises(AssertionError, match="changed in flight"):
        for seed in range(50):
            buf[...] = 0
            rank0 = [_round(0, sends=[(1, buf)]), _round(1, pre=rewrite)]
            run_ranks([rank0, [_round(0, recvs=[(0, dst)])]], seed=seed)


def test_pres_whose_dependencies_are_ready_run_in_round_order():
    """The engine advances a window's rounds in order, so a round whose dependencies
    became ready submits its pre before any later round's: an encode after a phase's
    join round runs before the send that depends on both, in every order drawn."""
    buf, dst = np.zeros(4, np.uint8), np.zeros(4, np.uint8)

    def encode():
        buf[...] = 7

    for seed in range(50):
        buf[...] = 0
        join = Round(label="join", tag=0, post=lambda: None)
        own = Round(label="encode", tag=1, pre=encode, deps=[join])
        send = Round(label="send", tag=2, sends=[(1, buf)], deps=[join, own])
        run_ranks([[join, own, send], [_round(2, recvs=[(0, dst)])]], seed=seed)
        np.testing.assert_array_equal(dst, 7)


def test_messages_must_pair_in_order_for_nccl():
    """Two sends to one peer in one order, received in the other: MPI's tags pair them,
    NCCL's per-peer order would not."""
    a, b = np.zeros(4, np.uint8), np.ones(4, np.uint8)
    ra, rb = np.empty(4, np.uint8), np.empty(4, np.uint8)
    sender = [_round(0, sends=[(1, a)]), _round(1, sends=[(1, b)])]
    receiver = [_round(1, recvs=[(0, rb)]), _round(0, recvs=[(0, ra)])]
    with pytest.raises(AssertionError, match="tags do not increase|do not pair in order"):
        run_ranks([sender, receiver])


def test_dependencies_must_be_the_ranks_own_earlier_rounds():
    first = _round(0)
    later = _round(1)
    later.deps = [first]
    with pytest.raises(AssertionError, match="did not yield before"):
        run_ranks([[later], [first]])


@pytest.mark.parametrize("codec", ["int8", "taco"])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_two_shot_through_the_transports_allgather(n, codec):
    """Rounds exchanging through the transport's AllGather (two-shot's ``ScheduleArgs.gather``,
    on every rank count): bitwise the point-to-point result, on every rank."""
    rng = np.random.default_rng(n)
    xs = [rng.standard_normal(1000).astype(F32) for _ in range(n)]
    results = []
    for gather in (False, True):
        ps = plans(n, codec, F32, chunk_elems=256, gather=gather)
        outs = [np.empty_like(x) for x in xs]
        schedule = algorithms.schedule("two_shot", "allreduce")
        run_ranks([schedule(ps[r], xs[r], outs[r]) for r in range(n)], seed=n)
        assert no_leaks(ps)
        results.append(outs)
    for r in range(n):
        np.testing.assert_array_equal(results[1][r].view(np.uint8), results[0][r].view(np.uint8))
        np.testing.assert_array_equal(results[1][r].view(np.uint8), results[1][0].view(np.uint8))
