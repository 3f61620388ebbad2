"""Unit tests of the buffer pool's size classes and of when the pipeline posts sends."""

import random

import numpy as np

from coccl.communicator import staged_chunk_bytes
from coccl.compressors import get_compressor
from coccl.overlap import WireOnlyCodec
from coccl.pipeline import Round, _EventHandle, _may_send
from coccl.pool import BufferPool, size_class


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


def test_wire_only_codec_keeps_the_schedule_of_its_codec():
    """transport-only runs the real codec's schedule: a fused ring hop (doing nothing)
    where the codec has one, the three steps where it has none."""
    taco = get_compressor("taco")
    host = np.zeros(4, np.float32)
    assert taco.reduce_encode_kernel(host, np.dtype(np.float32)) is None  # no CPU kernel
    assert WireOnlyCodec(taco).reduce_encode_kernel(host, np.dtype(np.float32)) is None

    class _WithHop(type(taco)):
        def reduce_encode_kernel(self, like, dtype):
            return lambda own, payload, out: None

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
    queued = _round(_EventHandle(_Event()))
    assert _may_send(queued, _Transport(follows=True))
    # a transport that reads the buffer itself (host MPI, CUDA-aware MPI) waits for it
    assert not _may_send(queued, _Transport(follows=False))
    assert not _may_send(queued, object())


def test_host_compute_is_waited_for():
    running = _round(_Future(done=False))  # a worker thread's future
    assert not _may_send(running, _Transport(follows=True))
    finished = _round(_Future(done=True))
    assert _may_send(finished, _Transport(follows=True))
