"""The delta AllGather (algorithms/delta_allgather.py) in one process
(tests/schedule_sim.py): replicas stay bitwise equal on every rank; the first (exact)
call gathers the data exactly; over many slowly changing updates the replica's error
stays at one update's quantization size, while a plain lossy AllGather's error stays at
the data's."""

import numpy as np
import pytest
from schedule_cases import (  # noqa: F401  (one_numba_thread: an autouse fixture)
    BF16,
    F32,
    F64,
    no_leaks,
    normal_data,
    one_numba_thread,
    plans,
    unit_roundoff,
)
from schedule_sim import run_ranks

from coccl import algorithms
from coccl.algorithms.delta_allgather import allgather_delta


def _gather(ps, xs, replicas, exact=False, seed=None):
    n = len(ps)
    run_ranks(
        [allgather_delta(ps[r], xs[r], replicas[r], exact=exact) for r in range(n)], seed=seed
    )


@pytest.mark.parametrize("count", [0, 5, 300])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
@pytest.mark.parametrize("codec", ["identity", "int8", "taco"])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_first_call_exact_then_deltas_keep_replicas_equal(n, codec, dtype, count):
    rng = np.random.default_rng(count + n)
    ps = plans(n, codec, dtype, chunk_elems=128)
    xs = [normal_data(rng, count, dtype) for _ in range(n)]
    replicas = [np.full(n * count, np.nan, dtype) for _ in range(n)]
    _gather(ps, xs, replicas, exact=True, seed=1)
    for r in range(n):
        np.testing.assert_array_equal(replicas[r], np.concatenate(xs))
    for step in range(3):
        xs = [(x.astype(F32) + 0.01 * normal_data(rng, count, F32)).astype(dtype) for x in xs]
        _gather(ps, xs, replicas, seed=step)
        for r in range(1, n):
            np.testing.assert_array_equal(replicas[r].view(np.uint8), replicas[0].view(np.uint8))
        if codec == "identity":
            np.testing.assert_array_equal(replicas[0], np.concatenate(xs))
    assert no_leaks(ps)


@pytest.mark.parametrize("codec", ["int8", "taco"])
def test_errors_do_not_accumulate_over_slow_updates(codec):
    """100 updates of size ``eps`` relative to the data: the replica's error after every
    call is within ``b / (1 - b)`` of the largest update (one difference's quantization,
    carried into the next difference and corrected there), while a plain lossy
    AllGather of the same data errs by the codec's error on the data, call after call."""
    n, count, eps = 3, 300, 1e-3
    rng = np.random.default_rng(11)
    ps = plans(n, codec, F32, chunk_elems=128)
    plain_ps = plans(n, codec, F32, chunk_elems=128)
    b, u = ps[0].codec.rel_error_bound, unit_roundoff(F32)
    xs = [normal_data(rng, count, F32) for _ in range(n)]
    replicas = [np.empty(n * count, F32) for _ in range(n)]
    _gather(ps, xs, replicas, exact=True)
    plain_out = [np.empty(n * count, F32) for _ in range(n)]
    delta_errors, plain_errors, bound = [], [], 0.0
    for _ in range(100):
        updates = [eps * normal_data(rng, count, F32) for _ in range(n)]
        xs = [x + d for x, d in zip(xs, updates, strict=True)]
        _gather(ps, xs, replicas)
        run_ranks([algorithms.schedule("two_shot", "allgather")(plain_ps[r], xs[r], plain_out[r])
                   for r in range(n)])  # fmt: skip
        truth = np.concatenate(xs).astype(F64)
        update = np.linalg.norm(np.concatenate(updates).astype(F64))
        bound = max(bound, b / (1 - b) * update + 4 * u * np.linalg.norm(truth))
        delta_errors.append(np.linalg.norm(replicas[0] - truth))
        plain_errors.append(np.linalg.norm(plain_out[0] - truth))
    assert max(delta_errors) <= bound
    # the plain gather's error is a fraction of the data's size at every call, never less
    assert min(plain_errors) >= 0.5 * plain_errors[0] > 0
    assert max(delta_errors) < 0.01 * min(plain_errors)


def test_refuses_a_replica_of_the_wrong_size_or_overlapping_x():
    ps = plans(2, "taco", F32)
    replica = np.zeros(8, F32)
    with pytest.raises(ValueError, match="needs 2 x 4"):
        allgather_delta(ps[0], np.zeros(4, F32), np.zeros(9, F32))
    with pytest.raises(ValueError, match="overlaps"):
        allgather_delta(ps[0], replica[:4], replica)
