"""Nonblocking collectives and buckets on the Communicator (coccl/communicator/
nonblocking.py, buckets.py) over MPI: every nonblocking form against an exact float64
reference of every rank's deterministic data, at counts 0, 1, fewer than the ranks and
not a multiple of them; several handles pending at once, waited for out of order; a
blocking call between nonblocking ones keeps the issue order; a handle is pending while
a peer has not posted (coordinated over COMM_WORLD, not by sleeping) and completes once
it has; refusals and disagreements reach wait() on every rank and leave the communicator
working; buckets (lists of arrays, mixed dtypes, count-0 elements, in place) equal the
single calls."""

import numpy as np
import pytest
from mpi4py import MPI

import coccl

from conftest import case_seed
from conftest import rank_data as normal_data

N = MPI.COMM_WORLD.Get_size()
RANK = MPI.COMM_WORLD.Get_rank()
COUNTS = [0, 1, 3, 1001]  # 3: fewer than four ranks; 1001: a multiple of none of 2, 3, 4


def rank_data(seed, rank, count, dtype):
    """Integer-valued data: a float64 (or float32) sum of it is exact in any order, so
    every schedule's result equals the float64 reference bitwise."""
    return np.round(normal_data(seed, rank, count, np.float64) * 64).astype(dtype)


def parts(seed, count, dtype=np.float64):
    return [rank_data(seed, r, count, dtype) for r in range(N)]


def exact_sum(seed, count, dtype=np.float64):
    return np.sum([p.astype(np.float64) for p in parts(seed, count, dtype)], axis=0)


@pytest.mark.parametrize("count", COUNTS)
def test_several_pending_allreduces_waited_out_of_order(comm, count):
    seeds = [case_seed("iallreduce", count, i) for i in range(3)]
    xs = [rank_data(s, RANK, count, np.float64) for s in seeds]
    hs = [
        comm.iallreduce(x, algorithm=alg)
        for x, alg in zip(xs, ["ring", "two_shot", "auto"], strict=True)
    ]
    for s, h in reversed(list(zip(seeds, hs, strict=True))):
        np.testing.assert_array_equal(h.wait(), exact_sum(s, count).reshape(-1))
        assert h.test()


@pytest.mark.parametrize("count", COUNTS)
def test_reduce_scatter_allgather_alltoall(comm, count):
    seed = case_seed("irs", count)
    x = rank_data(seed, RANK, N * count, np.float64)
    h_rs = comm.ireduce_scatter(x, algorithm="ring")
    h_ag = comm.iallgather(x[:count].copy())
    h_a2a = comm.ialltoall(x)
    full = exact_sum(seed, N * count)
    np.testing.assert_array_equal(h_rs.wait(), full[RANK * count : (RANK + 1) * count])
    gathered = np.concatenate([p[:count] for p in parts(seed, N * count)])
    np.testing.assert_array_equal(h_ag.wait(), gathered)
    want = np.concatenate([p[RANK * count : (RANK + 1) * count] for p in parts(seed, N * count)])
    np.testing.assert_array_equal(h_a2a.wait(), want)


@pytest.mark.parametrize("count", COUNTS)
def test_rooted_calls(comm, count):
    seed = case_seed("rooted", count)
    root = N - 1
    x = rank_data(seed, RANK, count, np.float64)
    b = x.copy()
    hb = comm.ibroadcast(b, root=root)
    hr = comm.ireduce(x, root=root, op="sum")
    hg = comm.igather(x, root=0)
    full = rank_data(seed, 0, N * count, np.float64)
    hs = comm.iscatter(full if RANK == 0 else None, np.empty(count), root=0)
    hbar = comm.ibarrier()
    assert hb.wait() is b
    np.testing.assert_array_equal(b, rank_data(seed, root, count, np.float64))
    reduced = hr.wait()
    if RANK == root:
        np.testing.assert_array_equal(reduced, exact_sum(seed, count))
    else:
        assert reduced is None
    gathered = hg.wait()
    if RANK == 0:
        np.testing.assert_array_equal(gathered, np.concatenate(parts(seed, count)))
    np.testing.assert_array_equal(hs.wait(), full[RANK * count : (RANK + 1) * count])
    assert hbar.wait() is None


def test_blocking_call_between_keeps_the_order(comm):
    """Blocking calls wait for the nonblocking ones issued before them: the ranks pair
    the same calls even though the blocking one starts on another thread."""
    seeds = [case_seed("order", i) for i in range(4)]
    xs = [rank_data(s, RANK, 257 + i, np.float64) for i, s in enumerate(seeds)]
    h0 = comm.iallreduce(xs[0])
    h1 = comm.iallgather(xs[1])
    mid = comm.allreduce(xs[2], algorithm="ring")  # blocking, while h0, h1 may be pending
    h3 = comm.iallreduce(xs[3])
    np.testing.assert_array_equal(mid, exact_sum(seeds[2], 259))
    np.testing.assert_array_equal(h0.wait(), exact_sum(seeds[0], 257))
    np.testing.assert_array_equal(h1.wait(), np.concatenate(parts(seeds[1], 258)))
    np.testing.assert_array_equal(h3.wait(), exact_sum(seeds[3], 260))


@pytest.mark.skipif(N < 2, reason="needs a peer that posts late")
def test_pending_until_the_peer_posts(comm):
    """Rank 0's handle cannot complete before the others post, and they post only after
    rank 0 has seen it pending; then test() becomes True without a wait()."""
    seed = case_seed("late")
    x = rank_data(seed, RANK, 100, np.float64)
    world = MPI.COMM_WORLD
    if RANK == 0:
        h = comm.iallreduce(x)
        pending = h.test()
        for r in range(1, N):
            world.send(pending, dest=r, tag=77)
        assert pending is False
        while not h.test():  # the worker progresses it: nobody waits
            pass
        result = h.wait()
    else:
        assert world.recv(source=0, tag=77) is False
        result = comm.iallreduce(x).wait()
    np.testing.assert_array_equal(result, exact_sum(seed, 100))


def test_refusal_reaches_wait_everywhere_then_working(comm):
    x = normal_data(1, RANK, 64, np.float32)
    bad = comm.iallreduce(x.astype(np.complex64))
    good = comm.iallreduce(x.astype(np.float64))
    with pytest.raises(TypeError, match="complex64"):
        bad.wait()
    want = np.sum([normal_data(1, r, 64, np.float32).astype(np.float64) for r in range(N)], 0)
    np.testing.assert_allclose(good.wait(), want, rtol=1e-12)


@pytest.mark.skipif(N < 2, reason="needs ranks that disagree")
def test_disagreement_reaches_wait_everywhere(comm):
    h = comm.iallreduce(np.ones(10 + RANK))
    with pytest.raises(coccl.CocclError, match="count: rank 0 10, rank 1 11"):
        h.wait()
    np.testing.assert_array_equal(comm.iallreduce(np.ones(5)).wait(), np.full(5, float(N)))


def test_misspelt_keyword_raises_at_once(comm):
    with pytest.raises(TypeError, match="feedbak"):
        comm.iallreduce(np.ones(4), feedbak=None)
    np.testing.assert_array_equal(comm.allreduce(np.ones(4)), np.full(4, float(N)))


# ----------------------------------------------------------------------- buckets
BUCKET_COUNTS = [[0], [1, 0, 3], [1001, 1, 2]]


@pytest.mark.parametrize("counts", BUCKET_COUNTS, ids=str)
@pytest.mark.parametrize("nonblocking", [False, True])
def test_allreduce_bucket(comm, counts, nonblocking):
    seed = case_seed("bucket", counts)
    dtypes = [np.float64, np.float32, np.float64][: len(counts)]
    xs = [
        rank_data(seed + i, RANK, c, d) for i, (c, d) in enumerate(zip(counts, dtypes, strict=True))
    ]
    xs[0] = xs[0].reshape(counts[0], 1)
    h = comm.iallreduce(xs, algorithm="ring") if nonblocking else None
    ys = h.wait() if h else comm.allreduce(xs, algorithm="ring")
    assert isinstance(ys, list) and len(ys) == len(xs)
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        assert y.shape == x.shape and y.dtype == x.dtype
        want = exact_sum(seed + i, counts[i], dtypes[i]).astype(dtypes[i]).reshape(x.shape)
        np.testing.assert_array_equal(y, want)


def test_allreduce_bucket_in_place_equals_the_single_calls(comm):
    seed = case_seed("in place")
    xs = [normal_data(seed + i, RANK, c, np.float32) for i, c in enumerate([5, 0, 300])]
    copies = [x.copy() for x in xs]
    assert all(a is b for a, b in zip(comm.allreduce(xs, xs, algorithm="ring"), xs, strict=True))
    # the bucket's one staged call, by hand
    flat = comm.allreduce(np.concatenate(copies), algorithm="ring")
    np.testing.assert_array_equal(np.concatenate(xs), flat)


@pytest.mark.parametrize("counts", BUCKET_COUNTS, ids=str)
def test_reduce_scatter_and_allgather_buckets(comm, counts):
    seed = case_seed("rs bucket", counts)
    xs = [rank_data(seed + i, RANK, N * c, np.float64) for i, c in enumerate(counts)]
    rs = comm.reduce_scatter(xs, algorithm="ring")
    ag = comm.allgather([x[:c] for x, c in zip(xs, counts, strict=True)])
    for i, c in enumerate(counts):
        full = exact_sum(seed + i, N * c)
        np.testing.assert_array_equal(rs[i], full[RANK * c : (RANK + 1) * c])
        np.testing.assert_array_equal(
            ag[i], np.concatenate([p[:c] for p in parts(seed + i, N * c)])
        )


def test_bucket_refusals(comm):
    assert comm.allreduce([]) == []
    with pytest.raises(ValueError, match="list of 2 outputs"):
        comm.allreduce([np.ones(2), np.ones(3)], [np.ones(2)])
    with pytest.raises(ValueError, match=r"out\[1\] has 2 elements"):
        comm.allreduce([np.ones(2), np.ones(3)], [np.ones(2), np.ones(2)])
    with pytest.raises(TypeError, match=r"out\[0\] has dtype float32"):
        comm.allgather([np.ones(2)], [np.ones(2 * N, np.float32)])
    if N > 1:
        with pytest.raises(ValueError, match=r"x\[0\]: reduce_scatter needs a multiple"):
            comm.reduce_scatter([np.ones(N + 1)])
    np.testing.assert_array_equal(comm.allreduce(np.ones(3)), np.full(3, float(N)))


def test_a_bucket_refused_for_a_later_dtype_runs_no_group(comm):
    """A codec that refuses the bucket's second dtype refuses the bucket before its first
    dtype's group runs: the float32 array, in place, is left as it was."""
    a, b = np.ones(8, np.float32), np.ones(8, np.int32)
    with pytest.raises(TypeError, match="int32"):
        comm.allreduce([a, b], [a, b], compressor="int8")
    np.testing.assert_array_equal(a, np.ones(8, np.float32))


@pytest.mark.skipif(N < 2, reason="needs two ranks")
def test_bucket_layouts_that_differ_raise_on_every_rank(comm):
    """Ranks whose buckets hold the same bytes in another order (one staged call of the
    same count each) are refused, not reduced into each other's arrays."""
    a, b = np.ones(4, np.float32), np.ones(2, np.float32)
    with pytest.raises(coccl.CocclError, match="do not make the same allreduce call.*arrays"):
        comm.allreduce([a, b] if comm.rank == 0 else [b, a])
    np.testing.assert_array_equal(comm.allreduce([a, b])[0], np.full(4, float(N), np.float32))


@pytest.mark.skipif(N < 2, reason="needs two ranks")
def test_a_bucket_refused_on_one_rank_fails_on_every_rank(comm):
    x = [np.ones(3, np.float32), np.ones(2, np.float32)]
    if comm.rank == 0:
        with pytest.raises(ValueError, match="list of 2 outputs"):
            comm.allreduce(x, [np.ones(3, np.float32)])
    else:
        with pytest.raises(coccl.CocclError, match="rank 0 refused this allreduce.*list of 2"):
            comm.allreduce(x)
    np.testing.assert_array_equal(comm.allreduce(x)[1], np.full(2, float(N), np.float32))


def test_bucket_outputs_that_overlap_are_refused_before_any_group_runs(comm):
    """An output overlapping its array other than in place, or another array of the
    bucket, is refused before the first dtype group runs; in place as the single call
    allows it runs."""
    a, o = np.ones(4, np.float32), np.zeros(4, np.float32)
    big = np.ones(6, np.float64)
    with pytest.raises(ValueError, match="out overlaps x"):
        comm.allreduce([a, big[:4]], [o, big[1:5]])
    with pytest.raises(ValueError, match=r"overlaps .*\[0\]"):
        comm.allreduce([a, big[:4]], [big[2:6].view(np.float32)[:4], np.zeros(4)])
    np.testing.assert_array_equal(o, np.zeros(4, np.float32))  # no group ran
    n, r = 3, comm.rank
    out = np.zeros(n * N, np.float32)
    out[r * n : (r + 1) * n] = r + 1
    got = comm.allgather([out[r * n : (r + 1) * n]], [out])[0]
    np.testing.assert_array_equal(got, np.repeat(np.arange(1, N + 1, dtype=np.float32), n))


def test_a_callbacks_call_ends_before_the_callers_next_call_starts(comm):
    """A completion callback's collective runs in the turn of the call that completed:
    the caller's next blocking call, issued once ``wait()`` returns, starts after it (a
    future wakes its waiter before running its callbacks, which ran the two calls side
    by side on one transport and mixed their messages)."""
    a, b = case_seed("callback", 0), case_seed("callback", 1)
    comm.allreduce(rank_data(a, RANK, 64, np.float64))  # plans built: no agreement between
    for i in range(10):
        got = {}
        handle = comm.iallreduce(rank_data(b, RANK, 1 << 16, np.float32), compressor="int8")
        handle.add_done_callback(
            lambda got=got: got.setdefault("cb", comm.allreduce(rank_data(a, RANK, 64, np.float64)))
        )
        handle.wait()
        mine = comm.allreduce(rank_data(a + 1 + i, RANK, 64, np.float64))
        np.testing.assert_array_equal(mine, exact_sum(a + 1 + i, 64))
        comm.barrier()
        np.testing.assert_array_equal(got["cb"], exact_sum(a, 64))
