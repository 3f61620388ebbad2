"""Over NCCL, a plan's schedule is replayed from a CUDA graph from its second call on:
bitwise what running it from the host gives, on every rank, whatever buffers each call
passes; and a call on any framework's side stream is ordered against that stream. One
GPU per rank (skipped otherwise)."""

import time

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

import coccl

from conftest import all_equal_across_ranks, case_seed, communicator, gpu_per_rank, rank_data

pytest.importorskip("cupy")
import cupy as cp  # noqa: E402

pytestmark = gpu_per_rank()

BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture(scope="module")
def graphed():
    with communicator("nccl") as c:
        yield c


@pytest.fixture(scope="module")
def eager():
    with communicator("nccl", COCCL_GRAPHS=0) as c:
        yield c


@pytest.mark.parametrize("count", [1, 4099, 3 << 16])
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("codec", ["identity", "int8", "taco"])
@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
def test_replay_equals_eager_bitwise(graphed, eager, collective, algorithm, codec, dtype, count):
    """Calls 1 (eager), 2 (capture and replay) and 3 (replay) on fresh data in fresh
    buffers each time, and in place for AllReduce: bitwise the eager communicator's."""
    n = graphed.size
    if collective == "reduce_scatter":
        count *= n
    kw = dict(algorithm=algorithm, compressor=codec, chunk_bytes=65536)
    for call in range(3):
        seed = case_seed("graph", collective, algorithm, codec, np.dtype(dtype).name, count, call)
        x = rank_data(seed, graphed.rank, count, dtype)
        want = cp.asnumpy(getattr(eager, collective)(cp.asarray(x), **kw))
        got = cp.asnumpy(getattr(graphed, collective)(cp.asarray(x), **kw))
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
        if collective == "allreduce":
            inplace = cp.asarray(x)
            graphed.allreduce(inplace, inplace, **kw)
            np.testing.assert_array_equal(cp.asnumpy(inplace).view(np.uint8), want.view(np.uint8))
        if collective != "reduce_scatter":
            assert all_equal_across_ranks(got)
    described = graphed.describe(collective, cp.asarray(x), **kw)
    assert described["graph"], described["graph_reason"]
    buffers = "copies" if codec == "identity" else "caller's"  # a lossy codec: no copies
    assert described["graph_buffers"] == buffers, described["graph_copy_reason"]


@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
def test_replays_follow_buffers_that_come_back(graphed, eager, algorithm):
    """Replays on two buffer pairs in turn, and in place, with fresh data each call
    (ranks take the pairs in different orders): bitwise the eager communicator's."""
    count, kw = 70001, dict(algorithm=algorithm, compressor="taco", chunk_bytes=1 << 16)
    pairs = [(cp.empty(count, cp.float32), cp.empty(count, cp.float32)) for _ in range(2)]
    for call in range(7):
        x, out = pairs[(call + graphed.rank) % 2]
        inplace = call % 3 == 2
        data = rank_data(case_seed("follow", algorithm, call), graphed.rank, count, np.float32)
        x.set(data)
        want = cp.asnumpy(eager.allreduce(cp.asarray(data), **kw))
        got = graphed.allreduce(x, x if inplace else out, **kw)
        assert got is (x if inplace else out)
        np.testing.assert_array_equal(cp.asnumpy(got).view(np.uint8), want.view(np.uint8))
    assert graphed.describe("allreduce", x, **kw)["graph_buffers"] == "caller's"


@pytest.mark.parametrize("codec", ["taco", "int8"])
def test_gather_phase_by_allgather_equals_p2p(eager, codec):
    """Two-shot's AllGather phase through ncclAllGather (on two ranks its ReduceScatter
    exchange too) gives bitwise the p2p result."""
    if eager.size == 1:
        pytest.skip("one rank has no AllGather phase")
    with communicator("nccl", COCCL_NCCL_GATHER="allgather") as c:
        for count in (1, 5, 129, 70001, 1 << 20):
            x = cp.asarray(rank_data(case_seed("gather", count), c.rank, count, BF16))
            kw = dict(algorithm="two_shot", compressor=codec, chunk_bytes=1 << 18)
            assert c.describe("allreduce", x, **kw)["allgather_phase"] == "allgather"
            for _ in range(3):  # eager, then captured, then replayed
                got = cp.asnumpy(c.allreduce(x, **kw))
                want = cp.asnumpy(eager.allreduce(x, **kw))
                np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


def _long_kernel_then(x_fill, value):
    """On the current stream: ~20 ms of GPU work, then fill ``x_fill`` with ``value``."""
    a = cp.ones((2048, 2048), cp.float32)
    for _ in range(20):
        a = a @ a * 1e-3
    x_fill[...] = value


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize(
    "algorithm, codec",
    [("native", "identity"), ("ring", "identity"), ("ring", "int8"), ("ring", "taco"),
     ("two_shot", "identity"), ("two_shot", "int8"), ("two_shot", "taco")],
)  # fmt: skip
def test_cupy_side_stream(graphed, algorithm, codec, inplace):
    """Input produced on a side stream behind a long kernel, result read on it."""
    stream = cp.cuda.Stream(non_blocking=True)
    for _ in range(3):  # eager, captured, replayed
        with stream:
            x = cp.empty(1 << 18, cp.float32)
            _long_kernel_then(x, 3.0)
            y = graphed.allreduce(x, x if inplace else None, algorithm=algorithm, compressor=codec)
            y *= 1.0  # more work on the stream, after the collective
            got = float(y[777]), float(y[-1])
        want = 3.0 * graphed.size
        assert abs(got[0] - want) <= 0.1 * want and abs(got[1] - want) <= 0.1 * want


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize(
    "algorithm, codec",
    [("native", "identity"), ("ring", "taco"), ("two_shot", "identity"), ("two_shot", "int8"),
     ("two_shot", "taco"), ("auto", "identity")],
)  # fmt: skip
def test_torch_side_stream(graphed, algorithm, codec, inplace):
    """A torch tensor produced on a torch side stream: coccl orders itself against
    torch's current stream, not CuPy's."""
    torch = pytest.importorskip("torch")
    side = torch.cuda.Stream()
    for _ in range(3):
        with torch.cuda.stream(side):
            torch.cuda._sleep(20_000_000)  # ~10 ms of GPU time before the producer
            x = torch.full((1 << 18,), 3.0, device="cuda", dtype=torch.bfloat16)
            y = graphed.allreduce(x, x if inplace else None, algorithm=algorithm, compressor=codec)
            y.mul_(1.0)
            got = y.float().cpu()  # synchronizes with the side stream only
        want = 3.0 * graphed.size
        assert torch.allclose(got, torch.full_like(got, want), rtol=0.07), (got.min(), got.max())


def test_numba_default_stream(graphed):
    from numba import cuda

    for _ in range(3):
        x = cuda.to_device(np.full(1 << 16, 2.0, np.float32))
        y = graphed.allreduce(x, algorithm="two_shot", compressor="identity")
        assert (y.copy_to_host() == 2.0 * graphed.size).all()


def test_watchdog_breaks_a_call_a_peer_skips():
    """A peer that skips a call over NCCL: the call's device work never finishes; after
    COCCL_TIMEOUT_S the watchdog aborts NCCL and the next call raises."""
    if MPI.COMM_WORLD.Get_size() < 2:
        pytest.skip("needs a peer")
    with communicator("nccl", COCCL_TIMEOUT_S=3) as c:
        x = cp.ones(1 << 16, cp.float32)
        c.allreduce(x, algorithm="native")
        if c.rank == 0:
            c.allreduce(x, algorithm="native")  # enqueued; rank 1 never joins
            time.sleep(6)
            with pytest.raises(coccl.CocclError, match="not finished after 3 s"):
                c.allreduce(x, algorithm="native")
        MPI.COMM_WORLD.Barrier()
        c.abort()
