"""Unit tests of the buffer pool's size classes, of when the pipeline posts sends, and of
which sends forward what a receive brought (and may go from its host copy)."""

import contextlib
import gc
import itertools
import random
import re
import weakref
from functools import partial

import ml_dtypes
import numpy as np
import pytest

import coccl
from coccl import algorithms
from coccl.communicator.overlap import WireOnlyCodec
from coccl.communicator.sizing import (
    nccl_chunk_bytes,
    needs_accumulator,
    p2p_chunk_bytes,
    replays,
    staged_chunk_bytes,
    staging_limit,
    window_bytes,
)
from coccl.compressors import get_compressor
from coccl.core.pool import BufferPool, host_pool, size_class
from coccl.core.rounds import Round
from coccl.engine.polling import DONE, EventHandle, advance, landed_buffers, may_send, run_polling
from coccl.engine.streamed import run_streamed

INF = float("inf")


def test_size_classes_waste_at_most_an_eighth():
    rng = random.Random(7)
    sizes = [1, 255, 256, 257, 1000, 1 << 20, (1 << 20) + 1, 4456448]
    sizes += [rng.randrange(1, 1 << 34) for _ in range(2000)]
    for n in sizes:
        c = size_class(n)
        assert c >= max(n, 256)
        assert c <= max(256, n + n // 8), (n, c)


def test_size_classes_are_monotone_and_eight_per_doubling():
    previous = 0
    for n in range(1, 1 << 16):
        c = size_class(n)
        assert c >= previous
        previous = c
    for k in (10, 20, 30):
        step = (1 << k) // 64  # finer than the classes' step, 1/8 of the doubling
        classes = {size_class(n) for n in range((1 << k) + 1, (1 << (k + 1)) + 1, step)}
        classes.add(size_class(1 << (k + 1)))
        assert len(classes) == 8, (k, sorted(classes))


def test_pool_reuses_a_block_of_the_same_class():
    pool = BufferPool(lambda n: np.empty(n, dtype=np.uint8), "host")
    a = pool.get(1_000_000)
    assert a.data.size == 1_000_000
    a.release()
    b = pool.get(1_010_000)  # same class: the backing buffer comes back
    assert b.base is a.base
    assert pool.allocated_bytes == size_class(1_000_000)
    b.release()
    assert pool.in_use_bytes == 0


def test_pool_views_have_the_asked_size_after_reuse():
    """A reused backing buffer hands out a view of the size asked for, whatever size the
    last holder had (views are cached per buffer)."""
    pool = BufferPool(lambda n: np.empty(n, dtype=np.uint8), "host")
    for nbytes in (1_000_000, 1_010_000, 1_010_000, 1_000_000, 999_999):
        block = pool.get(nbytes)
        assert block.data.size == nbytes
        assert (
            block.data.__array_interface__["data"][0] == block.base.__array_interface__["data"][0]
        )
        block.release()
    assert pool.allocated_bytes == size_class(1_000_000)


def test_staged_chunk_grows_only_with_four_chunks_per_shard():
    mib = 1 << 20
    # float32: 64 MiB on 4 ranks (16 MiB shards) keeps 8 MiB; 256 MiB (64 MiB shards)
    # takes 4M elements = 16 MiB
    assert staged_chunk_bytes(4 * mib, 4, True) == 8 * mib
    assert staged_chunk_bytes(16 * mib - 1, 4, True) == 8 * mib
    assert staged_chunk_bytes(16 * mib, 4, True) == 16 * mib
    # bfloat16: 4M elements are 8 MiB, so it stays 8 MiB at every size
    assert staged_chunk_bytes(8 * mib, 2, True) == 8 * mib
    assert staged_chunk_bytes(1 << 30, 2, True) == 8 * mib
    # uncompressed data has no codec cost per chunk to save: 8 MiB at every size
    assert staged_chunk_bytes(1 << 30, 4, False) == 8 * mib


def test_p2p_chunk_of_a_compressed_message_over_mpi_follows_the_staged_rule():
    """A compressed point-to-point message over MPI is cut as a staged shard, whatever its
    data (both ends must cut alike, and one may be host data), an uncompressed one at
    COCCL_CHUNK_BYTES; over NCCL an uncompressed message is one chunk and a compressed one
    COCCL_CHUNK_BYTES; a chunk set in the environment wins."""
    mib, setting = 1 << 20, 4 << 20
    for compressed in (False, True):
        for itemsize, count in ((4, 0), (4, 1), (2, 5 * mib + 1), (4, 16 * mib), (4, 1 << 28)):
            rule = partial(
                p2p_chunk_bytes, settings_chunk=setting, compressed=compressed,
                itemsize=itemsize, count=count,
            )  # fmt: skip
            staged = staged_chunk_bytes(count, itemsize, True) if compressed else setting
            assert rule("mpi", chunk_set=False) == staged
            assert rule("mpi", chunk_set=True) == rule("nccl", chunk_set=True) == setting
            whole = setting if compressed else max(setting, count * itemsize)
            assert rule("nccl", chunk_set=False) == whole
    # float32: a compressed message of 16M elements takes chunks of 4M elements
    assert (
        p2p_chunk_bytes(
            "mpi",
            settings_chunk=setting,
            chunk_set=False,
            compressed=True,
            itemsize=4,
            count=16 * mib,
        )
        == 16 * mib
    )


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16])
@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
@pytest.mark.parametrize("accumulates", [True, False])
def test_nccl_chunk_is_the_largest_halving_of_the_shard_whose_round_fits(
    n, algorithm, collective, accumulates
):
    """Over NCCL the default chunk is the whole shard, halved (to the codec's alignment)
    until one round's window fits the staging limit, never below COCCL_CHUNK_BYTES."""
    mib = 1 << 20
    for name in ("identity", "taco", "int8"):
        codec = get_compressor(name)
        align = codec.alignment
        for dtype in (np.dtype(np.float32), np.dtype(np.float16)):
            item = dtype.itemsize

            def fits(elems, codec=codec, dtype=dtype):
                window = window_bytes(
                    n, codec, dtype, elems, algorithm, collective, False, 1, accumulates
                )
                return window <= 256 * mib

            for shard in (1, 1000, 3 << 20, 100 << 20, 1 << 28):
                got = nccl_chunk_bytes(
                    n, codec, dtype, algorithm, collective, shard, 256 * mib, 4 * mib, accumulates
                )
                whole = -(-shard // align) * align
                assert got >= 4 * mib and got % item == 0
                elems = got // item
                if got > 4 * mib:
                    assert elems % align == 0 and fits(elems)
                    assert elems == whole or not fits(-(-(2 * elems) // align) * align)
                else:
                    assert whole * item <= 4 * mib or not fits(-(-(elems * 2) // align) * align)
            # an explicit floor above the shard wins
            assert (
                nccl_chunk_bytes(
                    n, codec, dtype, algorithm, collective, 1 << 20, 1, 512 * mib, accumulates
                )
                == 512 * mib
            )


def test_nccl_chunk_on_two_h200s():
    """Two ranks, bfloat16 taco (the sizes bench/NOTES.md measured): one chunk per shard
    up to 256 MiB messages under the default 1 GiB limit over NCCL; a schedule summing
    with the fused hop holds no accumulator, so its chunks are larger than one that does."""
    mib = 1 << 20
    taco, bf16 = get_compressor("taco"), np.dtype(ml_dtypes.bfloat16)
    limit = staging_limit("nccl", None)
    assert limit == 1 << 30 and staging_limit("staged", None) == 256 * mib
    assert staging_limit("nccl", 5 * mib) == 5 * mib
    for message in (16 * mib, 64 * mib, 256 * mib):
        shard = message // 2 // 2  # elements
        ring = nccl_chunk_bytes(2, taco, bf16, "ring", "allreduce", shard, limit, 4 * mib, False)
        assert ring == message // 2
    two = nccl_chunk_bytes(2, taco, bf16, "two_shot", "allreduce", 1 << 28, limit, 4 * mib)
    ring = nccl_chunk_bytes(2, taco, bf16, "ring", "allreduce", 1 << 28, limit, 4 * mib, False)
    assert 4 * mib < two < ring < 512 * mib


def test_needs_accumulator_and_replay_sizes():
    assert not needs_accumulator("ring", "allreduce", "sum", True, 2)
    assert needs_accumulator("ring", "allreduce", "sum", True, 1)  # one rank: local sum
    assert needs_accumulator("ring", "allreduce", "avg", True, 2)
    assert needs_accumulator("ring", "allreduce", "sum", False, 2)
    assert needs_accumulator("ring", "reduce_scatter", "sum", True, 2)
    assert not needs_accumulator("two_shot", "allreduce", "sum", True, 2)  # its one hop
    assert needs_accumulator("two_shot", "allreduce", "sum", True, 3)
    assert needs_accumulator("two_shot", "reduce_scatter", "sum", True, 2)
    assert replays("nvlink", (128 << 20) - 1) and not replays("nvlink", 128 << 20)
    assert replays("shm", (64 << 20) - 1) and not replays("shm", 64 << 20)
    assert replays("pcie", 1 << 20) and not replays("pcie", 64 << 20)  # unknown: the least
    # a graph that follows the caller's buffers copies nothing: replayed at every size
    assert replays("nvlink", 1 << 30, follows=True) and replays("shm", 1 << 34, follows=True)
    assert not replays("nvlink", 128 << 20, follows=False)


def test_wire_only_codec_keeps_the_schedule_of_its_codec():
    """transport-only runs the real codec's schedule: a fused ring hop (doing nothing)
    where the codec has one, the three steps where it has none."""
    taco = get_compressor("taco")
    host = np.zeros(4, np.float32)
    assert taco.reduce_encode_kernel(host, np.dtype(np.float32)) is None  # no CPU kernel
    assert WireOnlyCodec(taco).reduce_encode_kernel(host, np.dtype(np.float32)) is None

    class _WithHop(type(taco)):
        def reduce_encode_kernel(self, like, dtype):
            return lambda own, payload, out, decoded=None: None

    hop = WireOnlyCodec(_WithHop()).reduce_encode_kernel(host, np.dtype(np.float32))
    assert hop is not None
    hop(host, None, None)  # no work


class _Event:
    done = False  # the kernels are enqueued, not yet run


class _Future:
    def __init__(self, done: bool) -> None:
        self._done = done

    def done(self) -> bool:
        return self._done


class _Transport:
    def __init__(self, follows: bool) -> None:
        self.sends_follow_stream = follows


def _round(handle: object) -> Round:
    rnd = Round(label="r", tag=0)
    rnd.pre_handle = handle
    return rnd


def test_staged_sends_start_once_the_encode_is_enqueued():
    queued = _round(EventHandle(_Event()))
    assert may_send(queued, _Transport(follows=True))
    # a transport that reads the buffer itself (host MPI, CUDA-aware MPI) waits for it
    assert not may_send(queued, _Transport(follows=False))


def test_host_compute_is_waited_for():
    running = _round(_Future(done=False))  # a worker thread's future
    assert not may_send(running, _Transport(follows=True))
    finished = _round(_Future(done=True))
    assert may_send(finished, _Transport(follows=True))


def _schedule(algorithm: str, collective: str, codec: str = "taco", size: int = 4):
    plan = algorithms.ScheduleArgs(
        rank=1,
        size=size,
        codec=get_compressor(codec),
        dtype=np.dtype(np.float32),
        op="sum",
        chunk_elems=256,
        pool=host_pool(),
        label="t",
    )
    n = size * 1024
    x = np.ones(n // size if collective == "allgather" else n, np.float32)
    out = np.empty(n // size if collective == "reduce_scatter" else n, np.float32)
    return algorithms.schedule(algorithm, collective)(plan, x, out)


def _gather_step(rnd: Round) -> int | None:
    """k of a ring AllGather round labelled "all-gather step k/n", else None."""
    found = re.search(r"ring all-gather step (\d+)/", rnd.label)
    return int(found.group(1)) if found else None


def test_only_ring_allgather_forwards_are_landed_sends():
    """On 4 ranks a ring AllGather has steps 1-3: steps 1 and 2 receive what the next
    step forwards unchanged (their rounds are marked ``forwards``), and steps 2 and 3
    send what the step before received (landed sends). Nothing else is either: a send
    that a round's own compute fills never is."""
    cases = itertools.product(
        ("ring", "two_shot"), ("allreduce", "reduce_scatter", "allgather"), ("taco", "identity")
    )
    for algorithm, collective, codec in cases:
        for rnd in _schedule(algorithm, collective, codec):
            step = _gather_step(rnd)
            landed = [b for _, b in rnd.sends if any(b is x for x in landed_buffers(rnd))]
            assert len(landed) == (1 if step in (2, 3) else 0), rnd.label
            assert rnd.forwards == (step in (1, 2)), rnd.label
            if rnd.pre is not None:
                assert landed_buffers(rnd) == []


class _Recorder:
    """A transport whose messages complete at once, recording the engine's hints."""

    sends_follow_stream = True

    def __init__(self) -> None:
        self.landed: list[bool] = []
        self.forward: list[bool] = []

    def isend(self, buf, peer, tag, landed=False):
        self.landed.append(landed)
        return _Test()

    def irecv(self, buf, peer, tag, forward=False):
        self.forward.append(forward)
        return _Test()

    def finish(self) -> None:
        pass


class _Test:
    @staticmethod
    def test() -> bool:
        return True


class _Executor:
    @staticmethod
    def submit(fn):
        return EventHandle(_Event())  # enqueued, not yet run

    @staticmethod
    def idle(spins: int) -> None:
        pass


def test_engine_tells_the_transport_what_is_forwarded():
    producer = Round(label="recv", tag=0, forwards=True)
    buf, other = np.zeros(8, np.uint8), np.zeros(8, np.uint8)
    producer.recvs = [(0, buf)]
    producer.recvs_done, producer.post_handle = True, DONE
    forward = Round(label="fwd", tag=1, sends=[(1, buf), (2, other)], deps=[producer])
    transport = _Recorder()
    advance(forward, transport, _Executor())
    assert transport.landed == [True, False]
    producer.forwards = False  # a receive that was not kept is not sent from the host
    again = Round(label="fwd", tag=2, sends=[(1, buf)], deps=[producer])
    advance(again, transport, _Executor())
    assert transport.landed[-1] is False


def test_engine_passes_the_forward_hint_of_each_receive():
    rounds = list(_schedule("ring", "allreduce"))
    expected = [rnd.forwards for rnd in rounds for _ in rnd.recvs]
    landed = sum(  # read before the run: a finished round lets go of its dependencies
        1 for rnd in rounds for _, b in rnd.sends if any(b is x for x in landed_buffers(rnd))
    )
    transport = _Recorder()
    run_polling(iter(rounds), transport, _ImmediateExecutor(), depth=4, timeout_s=INF, label="t")
    assert transport.forward == expected and any(expected)
    assert sum(transport.landed) == landed and landed


class _ImmediateExecutor:
    @staticmethod
    def submit(fn):
        return DONE  # nothing is computed: only the engine's hints are under test

    @staticmethod
    def idle(spins: int) -> None:
        pass


class _Hold:
    """A stand-in for a pool block that records which rounds' blocks are alive."""

    def __init__(self, live: list) -> None:
        self.live = live
        live.append(self)

    def release(self) -> None:
        self.live.remove(self)


class _Stream(contextlib.nullcontext):
    @staticmethod
    def wait_event(event) -> None:
        pass


class _StreamCtx:
    compute, comm, post = _Stream(), _Stream(), _Stream()

    @staticmethod
    def event(stream):
        return _DoneEvent()


class _DoneEvent:
    done = True


class _StreamTransport:
    @staticmethod
    def group_exchange(sends, recvs, stream, wire_dtype) -> None:
        pass

    @staticmethod
    def check_async_error() -> None:
        pass


@pytest.mark.parametrize("engine", ["polling", "streamed"])
@pytest.mark.parametrize("depth", [1, 2, 4])
def test_engines_hold_at_most_depth_rounds(engine, depth):
    """A schedule allocates a round's blocks as it yields the round, so an engine may take
    the next round only once its window has room: the depth bound on staging memory
    counts ``depth`` rounds (the streamed engine once held one more)."""
    live: list = []
    peak = [0]

    def rounds():
        for i in range(12):
            rnd = Round(label=f"r{i}", tag=i, sends=[(1, None)], holds=[_Hold(live)])
            peak[0] = max(peak[0], len(live))
            yield rnd

    if engine == "polling":
        run_polling(
            rounds(), _Recorder(), _ImmediateExecutor(), depth=depth, timeout_s=INF, label="t"
        )
    else:
        run_streamed(rounds(), _StreamTransport(), _StreamCtx(), depth=depth)
    assert peak[0] == depth and not live


@pytest.mark.parametrize("engine", ["polling", "streamed"])
@pytest.mark.parametrize("codec", ["identity", "taco"])
@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
def test_a_finished_call_holds_no_reference_to_the_callers_arrays(engine, codec, algorithm):
    """Once the engine returns, nothing of the call keeps its input or output alive, with
    the garbage collector off: a released round drops its steps, whose payloads point
    back at it (a cycle through the caller's buffers). torch's cudagraph trees snapshot
    their memory pool as a recording ends; a tensor then held only by such a cycle stayed
    allocated in the snapshot for good ("tensor(s) in the cudagraph pool not tracked as
    outputs" once the snapshot was restored)."""
    plan = algorithms.ScheduleArgs(
        rank=1, size=4, codec=get_compressor(codec), dtype=np.dtype(np.float32), op="sum",
        chunk_elems=256, pool=host_pool(), label="t",
    )  # fmt: skip
    x = np.ones(4096, np.float32)
    out = np.empty_like(x)
    refs = (weakref.ref(x), weakref.ref(out))
    rounds = algorithms.schedule(algorithm, "allreduce")(plan, x, out)
    del x, out
    enabled = gc.isenabled()
    gc.disable()
    try:
        with np.errstate(all="ignore"):  # the stand-in transport delivers no bytes
            if engine == "polling":
                run_polling(
                    rounds, _Recorder(), _RunningExecutor(), depth=4, timeout_s=INF, label="t"
                )
            else:
                run_streamed(rounds, _StreamTransport(), _StreamCtx(), depth=4)
        del rounds
        assert [r() for r in refs] == [None, None]
    finally:
        if enabled:
            gc.enable()


class _RunningExecutor(_ImmediateExecutor):
    @staticmethod
    def submit(fn):
        if fn is not None:
            fn()
        return DONE


class _Never:
    peer = 1

    @staticmethod
    def test() -> bool:
        return False


class _StuckFirst(_Recorder):
    """Round 0's receive never completes; every other message completes at once."""

    def irecv(self, buf, peer, tag, forward=False):
        return _Never() if tag == 0 else _Test()

    def cancel(self, handles) -> None:
        self.cancelled = handles


def test_a_round_finished_behind_a_stuck_one_is_not_progress():
    """Rounds that finished behind an unfinished first round must not count as progress
    on every poll, or the timeout never fires."""
    buf = np.zeros(8, np.uint8)
    rounds = [Round(label=f"round {i}", tag=i, recvs=[(1, buf)]) for i in range(3)]
    transport = _StuckFirst()
    with pytest.raises(coccl.CocclError, match="round 0: timed out.*from rank 1"):
        run_polling(
            iter(rounds), transport, _ImmediateExecutor(), depth=3, timeout_s=0.2, label="t"
        )
    assert rounds[1].finished and rounds[2].finished and not rounds[0].finished
    assert len(transport.cancelled) == 3  # the stuck receive's round and the rest given up
