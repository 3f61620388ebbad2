"""Caller-kept states on 1-4 ranks (coccl/communicator/state.py): the weight-delta
AllGather (``delta=coccl.DeltaState()``) and error feedback (``feedback=coccl.Feedback()``)
of allreduce, reduce_scatter and alltoall, against exact float64 references; every
mismatch of a state and a call raises on every rank before a byte moves."""

import numpy as np
import pytest
from mpi4py import MPI

import coccl
from coccl.compressors import get_compressor

from conftest import all_equal_across_ranks, case_seed, communicator, rank_data

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
U = float(np.finfo(np.float32).eps) / 2
INT4 = {"id": "int", "bits": 4}
COUNTS = [0, 1, 7, 301]


def slot(n: int, r: int, count: int) -> slice:
    return slice(r * count, (r + 1) * count)


# ------------------------------------------------------------------ delta AllGather
@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("dtype", [F32, "bfloat16"], ids=str)
@pytest.mark.parametrize("codec", ["int8", INT4, "taco"], ids=str)
def test_delta_allgather_first_exact_then_replicas_equal(comm, codec, dtype, count):
    n, r = comm.size, comm.rank
    seed = case_seed("delta", codec, str(dtype), count)
    xs = [rank_data(seed, s, count, F32) for s in range(n)]
    state = coccl.DeltaState()
    cast = (lambda a: a.astype(dtype)) if dtype != F32 else (lambda a: a)
    out = comm.allgather(cast(xs[r]), compressor=codec, delta=state)
    assert out is state.replica
    np.testing.assert_array_equal(out, np.concatenate([cast(x) for x in xs]))
    rng = np.random.default_rng([seed, 1])
    for _ in range(3):
        xs = [x + 0.01 * rng.standard_normal(count).astype(F32) for x in xs]
        again = comm.allgather(cast(xs[r]), compressor=codec, delta=state)
        assert again is out
        assert all_equal_across_ranks(out)
    truth = np.concatenate(xs).astype(F64)
    err = np.linalg.norm(out.astype(F64) - truth)
    assert err <= 0.05 * np.linalg.norm(truth) + 1e-6


@pytest.mark.parametrize("codec", ["int8", INT4], ids=str)
def test_delta_allgather_tracks_slow_updates(comm, codec):
    """100 updates of relative size 1e-3: the replica's error after every call stays
    within b/(1-b) of one update (one difference's quantization), while a plain lossy
    AllGather of the same data errs by the codec's error on the data, every call."""
    n, r, count, eps = comm.size, comm.rank, 257, 1e-3
    seed = case_seed("slow", codec)
    b = get_compressor(codec).rel_error_bound
    xs = [rank_data(seed, s, count, F32) for s in range(n)]
    state = coccl.DeltaState()
    replica = np.empty(n * count, F32)
    comm.allgather(xs[r], replica, compressor=codec, delta=state)
    delta_errors, plain_errors, bound = [], [], 0.0
    for step in range(100):
        updates = [eps * rank_data(seed + step + 1, s, count, F32) for s in range(n)]
        xs = [x + d for x, d in zip(xs, updates, strict=True)]
        comm.allgather(xs[r], replica, compressor=codec, delta=state)
        plain = comm.allgather(xs[r], compressor=codec, algorithm="two_shot")
        truth = np.concatenate(xs).astype(F64)
        update = np.linalg.norm(np.concatenate(updates).astype(F64))
        bound = max(bound, b / (1 - b) * update + 4 * U * np.linalg.norm(truth))
        delta_errors.append(np.linalg.norm(replica - truth))
        plain_errors.append(np.linalg.norm(plain - truth))
    assert all_equal_across_ranks(replica)
    assert max(delta_errors) <= bound
    assert min(plain_errors) >= 0.5 * plain_errors[0] > 0
    assert max(delta_errors) < 0.05 * min(plain_errors)


# ------------------------------------------------------------------ error feedback
def _call(comm, collective, x, codec, algorithm, fb):
    if collective == "alltoall":
        return comm.alltoall(x, compressor=codec, feedback=fb)
    return getattr(comm, collective)(x, algorithm=algorithm, compressor=codec, feedback=fb)


def _exact(collective, xs, r, n):
    total = np.sum([x.astype(F64) for x in xs], axis=0)
    if collective == "allreduce":
        return total
    if collective == "reduce_scatter":
        return total[slot(n, r, total.size // n)]
    per = xs[r].size // n
    return np.concatenate([x[slot(n, r, per)].astype(F64) for x in xs])


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "alltoall"])
def test_feedback_mean_error_shrinks(comm, collective, algorithm, count):
    """The same data 24 times: without feedback every call errs alike, so the mean of
    the results errs as one call; with it the losses telescope and the mean's error is
    the last residual over 24."""
    if collective == "alltoall" and algorithm == "ring":
        pytest.skip("all-to-all has one schedule")
    n, r, calls = comm.size, comm.rank, 24
    total = count * n if collective != "allreduce" else count
    seed = case_seed("feedback", collective, algorithm, count)
    xs = [rank_data(seed, s, total, F32) for s in range(n)]
    exact = _exact(collective, xs, r, n)
    fb = coccl.Feedback()
    fed, plain = [], []
    for _ in range(calls):
        fed.append(_call(comm, collective, xs[r], INT4, algorithm, fb).astype(F64))
        plain.append(_call(comm, collective, xs[r], INT4, algorithm, None).astype(F64))
        if collective == "allreduce":
            assert all_equal_across_ranks(fed[-1])
    tiny = 16 * U * (np.linalg.norm(exact) + 1)
    fed_err = np.linalg.norm(np.mean(fed, axis=0) - exact)
    plain_err = np.linalg.norm(np.mean(plain, axis=0) - exact)
    assert fed_err <= 0.25 * plain_err + tiny
    assert fb.residual is not None and fb.residual.size == total


@pytest.mark.parametrize("op", ["sum", "avg"])
def test_feedback_allreduce_bfloat16_and_avg(comm, op):
    n, r, count = comm.size, comm.rank, 333
    xs = [rank_data(case_seed("bf16", op), s, count, F32) for s in range(n)]
    exact = np.sum([x.astype(F64) for x in xs], axis=0) / (n if op == "avg" else 1)
    fb, outs = coccl.Feedback(), []
    x = xs[r].astype("bfloat16")
    for _ in range(16):
        out = comm.allreduce(x, op=op, algorithm="two_shot", compressor=INT4, feedback=fb)
        assert out.dtype == x.dtype and all_equal_across_ranks(out)
        outs.append(out.astype(F64))
    once = np.linalg.norm(outs[0] - exact)
    assert np.linalg.norm(np.mean(outs, axis=0) - exact) <= 0.5 * once + 1e-3


# ------------------------------------------------------------------- mismatches
def test_exact_codec_refused(comm):
    x = np.ones(8, F32)
    with pytest.raises(ValueError, match="needs a lossy compressor"):
        comm.allreduce(x, feedback=coccl.Feedback())
    with pytest.raises(ValueError, match="needs a lossy compressor"):
        comm.allgather(x, compressor="identity", delta=coccl.DeltaState())


def test_wrong_kind_of_state_refused(comm):
    x = np.ones(8 * comm.size, F32)
    with pytest.raises(ValueError, match="delta= is for allgather"):
        comm.allreduce(x, compressor="int8", feedback=coccl.DeltaState())
    with pytest.raises(ValueError, match="feedback= is for"):
        comm.allgather(x, compressor="int8", delta=coccl.Feedback())
    with pytest.raises(ValueError, match="hierarchical"):
        comm.allreduce(x, algorithm="hierarchical", compressor="int8", feedback=coccl.Feedback())
    with pytest.raises(ValueError, match="algorithm must be 'auto'"):
        comm.allgather(x, algorithm="ring", compressor="int8", delta=coccl.DeltaState())


@pytest.mark.parametrize("change", ["count", "dtype", "compressor", "collective", "split"], ids=str)
def test_bound_state_refuses_another_call_on_every_rank(comm, change):
    n = comm.size
    x = np.ones(4 * n, F32)
    fb = coccl.Feedback()
    if change == "split":
        if n == 1:
            pytest.skip("one rank has one split")
        comm.alltoall(x, compressor="int8", feedback=fb)
        to_zero = [4 * n] + [0] * (n - 1)  # every rank sends all to rank 0
        recvs = [4 * n] * n if comm.rank == 0 else [0] * n
        with pytest.raises(ValueError, match="bound to another call: split"):
            comm.alltoall(x, send_counts=to_zero, recv_counts=recvs, compressor="int8", feedback=fb)
        return
    comm.allreduce(x, compressor="int8", feedback=fb)
    call = {
        "count": lambda: comm.allreduce(np.ones(4 * n + 1, F32), compressor="int8", feedback=fb),
        "dtype": lambda: comm.allreduce(x.astype(F64), compressor="int8", feedback=fb),
        "compressor": lambda: comm.allreduce(x, compressor="taco", feedback=fb),
        "collective": lambda: comm.reduce_scatter(x, compressor="int8", feedback=fb),
    }[change]
    with pytest.raises(ValueError, match=f"bound to another call: {change}"):
        call()
    comm.allreduce(x, compressor="int8", feedback=fb)  # still bound, still usable


def test_misuse_on_one_rank_raises_on_every_rank(comm):
    """Rank 0 passes a Feedback bound to another count: it raises ValueError, every
    other rank CocclError naming it, and no byte moved (the communicator still works)."""
    n, r = comm.size, comm.rank
    other = coccl.Feedback()
    comm.allreduce(np.ones(3, F32), compressor="int8", feedback=other)
    fb = other if r == 0 else coccl.Feedback()
    x = np.ones(5, F32)
    expected = ValueError if r == 0 else (coccl.CocclError if n > 1 else ValueError)
    with pytest.raises(expected, match="bound to another call|rank 0 refused"):
        comm.allreduce(x, compressor="int8", feedback=fb)
    np.testing.assert_array_equal(comm.allreduce(x), np.full(5, n, F32))


def test_delta_phase_differs_between_ranks(comm):
    """Rank 0 resets its DeltaState (its next call would be exact), the others do not:
    every rank raises CocclError, naming the state."""
    n, r = comm.size, comm.rank
    state = coccl.DeltaState()
    x = np.arange(6, dtype=F32)
    comm.allgather(x, compressor="int8", delta=state)
    if r == 0:
        state.reset()
    if n == 1:
        comm.allgather(x, compressor="int8", delta=state)
        return
    with pytest.raises(coccl.CocclError, match="state"):
        comm.allgather(x, compressor="int8", delta=state)


def test_delta_refuses_another_out_communicator_or_overlap(comm):
    n = comm.size
    state = coccl.DeltaState()
    x = np.arange(6, dtype=F32)
    out = comm.allgather(x, compressor="int8", delta=state)
    with pytest.raises(ValueError, match="not this DeltaState's replica"):
        comm.allgather(x, np.empty(6 * n, F32), compressor="int8", delta=state)
    with pytest.raises(ValueError, match="overlaps the replica"):
        comm.allgather(out[:6], compressor="int8", delta=state)
    with communicator() as other:
        with pytest.raises(ValueError, match="another communicator"):
            other.allgather(x, compressor="int8", delta=state)
    state.reset()
    again = comm.allgather(x, np.empty(6 * n, F32), compressor="int8", delta=state)
    np.testing.assert_array_equal(again, np.tile(x, n))


def test_bad_out_refused_before_bytes_move(comm):
    n = comm.size
    with pytest.raises(ValueError, match="out has"):
        comm.allgather(
            np.ones(4, F32), np.empty(4 * n + 1, F32), compressor="int8",
            delta=coccl.DeltaState(),
        )  # fmt: skip
    assert MPI.COMM_WORLD.allreduce(1) == n


@pytest.mark.parametrize("collective", ["allreduce", "alltoall"])
def test_feedback_bad_out_on_one_rank_raises_on_every_rank(comm, collective):
    n, r = comm.size, comm.rank
    x = np.ones(4 * n, F32)
    out = np.empty(4 * n, F64 if r == 0 else F32)
    fb = coccl.Feedback()
    expected = TypeError if r == 0 else coccl.CocclError
    with pytest.raises(expected, match="out has dtype float64|rank 0 refused"):
        getattr(comm, collective)(x, out, compressor="int8", feedback=fb)
    assert fb.residual is None and not fb.bound  # nothing moved, nothing bound


def test_states_with_buckets_refused_before_bytes_move(comm):
    """A delta state takes one array (a bucket stages into new buffers each call, so its
    second call would find another replica); a Feedback takes a bucket of one dtype."""
    x = rank_data(case_seed("bucket state"), comm.rank, 30, F32)
    with pytest.raises(ValueError, match="delta= takes one array"):
        comm.allgather([x, x[:7]], compressor="int8", delta=coccl.DeltaState())
    fb = coccl.Feedback()
    with pytest.raises(ValueError, match="several dtypes"):
        comm.allreduce([x, x.astype(F64)], compressor="int8", feedback=fb)
    assert not fb.bound
    comm.allreduce([x, x[:7].copy()], compressor="int8", feedback=fb)  # one dtype: one call
    assert fb.bound
