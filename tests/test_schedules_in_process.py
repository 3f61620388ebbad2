"""Schedules of two ranks run in one process, in lockstep, by a small executor standing in
for a streamed transport (NCCL): two-shot's exchanges through the transport's AllGather
(``ScheduleArgs.gather``; on two ranks both phases) give bitwise what point-to-point gives, on
every rank, at every count. On real GPUs tests/mpi/test_nccl_graphs_gpu.py checks the
same over NCCL."""

import itertools

import ml_dtypes
import numpy as np
import pytest

from coccl import algorithms
from coccl.compressors import get_compressor
from coccl.core.pool import host_pool
from coccl.core.rounds import Round

BF16 = np.dtype(ml_dtypes.bfloat16)


def _exchange(pair: tuple[Round, Round]) -> None:
    """Move the bytes of one round on both ranks: an AllGather of equal slots, or each
    receive filled from the other rank's send to it (one per peer per round here)."""
    if pair[0].gather is not None or pair[1].gather is not None:
        assert pair[0].gather is not None and pair[1].gather is not None, "AllGather on one rank"
        sends = [np.array(rnd.gather[0]) for rnd in pair]  # sends may be views of recvs
        assert sends[0].size == sends[1].size, "AllGather slots differ between ranks"
        for rnd in pair:
            recv = rnd.gather[1]
            assert recv.size == 2 * sends[0].size
            for j, data in enumerate(sends):
                recv[j * data.size : (j + 1) * data.size] = data
        return
    for r, rnd in enumerate(pair):
        peer = pair[1 - r]
        incoming = [data for dst, data in peer.sends if dst == r]
        assert len(incoming) == len(rnd.recvs), "sends and receives do not pair"
        for (src, buf), data in zip(rnd.recvs, incoming, strict=True):
            assert src == 1 - r and buf.nbytes == data.nbytes
            buf.view(np.uint8)[...] = data.view(np.uint8)


def _allreduce_two_ranks(xs: list[np.ndarray], codec: str, gather: bool) -> list[np.ndarray]:
    """Two-shot AllReduce of ``xs`` (one array per rank), rounds run in the order the
    schedules yield them: pre on both ranks, the exchange, post on both, release."""
    outs = [np.empty_like(x) for x in xs]
    plans = [
        algorithms.ScheduleArgs(
            rank=r,
            size=2,
            codec=get_compressor(codec),
            dtype=xs[0].dtype,
            op="sum",
            chunk_elems=256,
            pool=host_pool(),
            label="t",
            gather=gather,
        )  # fmt: skip
        for r in range(2)
    ]
    schedule = algorithms.schedule("two_shot", "allreduce")
    gens = [schedule(plans[r], xs[r], outs[r]) for r in range(2)]
    for pair in itertools.zip_longest(*gens):
        assert None not in pair, "the ranks yield different rounds"
        assert pair[0].tag == pair[1].tag
        for rnd in pair:
            if rnd.pre is not None:
                rnd.pre()
        _exchange(pair)
        for rnd in pair:
            if rnd.post is not None:
                rnd.post()
            rnd.release()
    return outs


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("codec", ["taco", "int8"])
def test_two_shot_through_allgather_equals_point_to_point(codec, dtype):
    """Both phases through the AllGather (two ranks): bitwise the point-to-point result
    on both ranks, equal across ranks, close to the exact sum; counts 0, 1 (fewer than
    ranks), not multiples of the group size, several chunks."""
    rng = np.random.default_rng(7)
    for count in (0, 1, 5, 129, 1000, 70001):
        xs = [rng.standard_normal(count).astype(dtype) for _ in range(2)]
        by_p2p = _allreduce_two_ranks(xs, codec, gather=False)
        by_gather = _allreduce_two_ranks(xs, codec, gather=True)
        for r in range(2):
            np.testing.assert_array_equal(by_gather[r].view(np.uint8), by_p2p[r].view(np.uint8))
        np.testing.assert_array_equal(by_gather[0].view(np.uint8), by_gather[1].view(np.uint8))
        exact = xs[0].astype(np.float64) + xs[1].astype(np.float64)
        err = np.linalg.norm(by_gather[0].astype(np.float64) - exact)
        assert err <= 0.1 * max(np.linalg.norm(exact), 1e-30)


def test_gather_rounds_on_two_ranks_carry_both_phases():
    """With ``gather`` on two ranks no round of a two-shot AllReduce sends point to point:
    the ReduceScatter's exchange and the AllGather phase are both AllGathers."""
    x = np.ones(4096, np.float32)
    plan = algorithms.ScheduleArgs(
        rank=0, size=2, codec=get_compressor("taco"), dtype=x.dtype, op="sum",
        chunk_elems=256, pool=host_pool(), label="t", gather=True,
    )  # fmt: skip
    rounds = list(algorithms.schedule("two_shot", "allreduce")(plan, x, np.empty_like(x)))
    assert rounds and all(r.gather is not None and not r.sends and not r.recvs for r in rounds)
    labels = {r.label.split(" chunk")[0] for r in rounds}
    assert labels == {"t two-shot reduce-scatter", "t two-shot all-gather"}
