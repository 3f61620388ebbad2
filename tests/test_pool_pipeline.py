"""Unit tests of the buffer pool's size classes and of when the pipeline posts sends."""

import random

import numpy as np

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
