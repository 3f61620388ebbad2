"""Reusable byte buffers, so a pipeline allocates nothing per chunk in steady state.

A ``BufferPool`` hands out ``Block``s: a uint8 view of exactly the size asked for, cut
from a cached backing buffer of the next size class (eight per doubling). Blocks are
reference-counted because one received payload can be both forwarded (ring AllGather)
and decoded; the backing buffer returns to the pool when the last holder releases it.
The pool keeps what it allocated (it never shrinks), so memory is flat after warm-up and
bounded by the pipeline's window, not by the message size.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

_MIN_CLASS = 256


def size_class(nbytes: int) -> int:
    """The size of the backing buffer a block of ``nbytes`` takes: eight classes per
    doubling (at most 12.5% unused; power-of-two classes left up to half of a chunk's
    payload unused, which counted against the staging limit)."""
    if nbytes <= _MIN_CLASS:
        return _MIN_CLASS
    step = 1 << max(0, int(nbytes - 1).bit_length() - 4)
    return -(-nbytes // step) * step


class Block:
    """A pooled uint8 buffer: ``data`` is the exact-size view; ``as_array`` re-types it."""

    __slots__ = ("pool", "base", "data", "refs")

    def __init__(self, pool: BufferPool, base: Any, data: Any) -> None:
        self.pool = pool
        self.base = base
        self.data = data
        self.refs = 1

    def as_array(self, dtype: Any, count: int) -> Any:
        """The first ``count`` elements of ``dtype`` (the block must be large enough)."""
        dtype = np.dtype(dtype)
        return self.base[: count * dtype.itemsize].view(dtype)

    def retain(self) -> Block:
        self.refs += 1
        return self

    def release(self) -> None:
        self.refs -= 1
        if self.refs == 0:
            self.pool._recycle(self.base)
        elif self.refs < 0:
            raise RuntimeError("coccl internal error: pool block released twice")


class BufferPool:
    """Cached uint8 buffers of one memory kind (host, pinned host or device).

    Args:
        alloc: ``alloc(nbytes) -> uint8 array`` for a new backing buffer.
        kind: a label for statistics ("host", "pinned", "device").
    """

    def __init__(self, alloc: Callable[[int], Any], kind: str) -> None:
        self._alloc = alloc
        self.kind = kind
        self._free: dict[int, list[Any]] = defaultdict(list)
        self.allocated_bytes = 0  # all backing buffers ever made (kept for reuse)
        self.in_use_bytes = 0
        self.peak_in_use_bytes = 0
        # backing buffer id -> (nbytes, its view): a pipeline asks each buffer for the same
        # few sizes call after call, and slicing a CuPy array costs microseconds
        self._views: dict[int, tuple[int, Any]] = {}
        # one pool serves the threads of a communicator (the caller's, the queue's worker,
        # point-to-point's background thread): its lists and counters change under a lock
        self._lock = threading.Lock()

    def get(self, nbytes: int) -> Block:
        """A block of exactly ``nbytes`` bytes (contents undefined)."""
        size = size_class(nbytes)
        with self._lock:
            free = self._free[size]
            if free:
                base = free.pop()
            else:
                base = self._alloc(size)
                self.allocated_bytes += size
            self.in_use_bytes += size
            self.peak_in_use_bytes = max(self.peak_in_use_bytes, self.in_use_bytes)
            cached = self._views.get(id(base))
            if cached is not None and cached[0] == nbytes:
                view = cached[1]
            else:
                view = base[:nbytes]
                self._views[id(base)] = (nbytes, view)
        return Block(self, base, view)

    def _recycle(self, base: Any) -> None:
        size = int(base.size)
        with self._lock:
            self.in_use_bytes -= size
            self._free[size].append(base)

    def reset_peak(self) -> None:
        self.peak_in_use_bytes = self.in_use_bytes


def host_pool() -> BufferPool:
    return BufferPool(lambda n: np.empty(n, dtype=np.uint8), "host")


def device_pool(device: Any) -> BufferPool:
    import cupy as cp  # noqa: PLC0415

    def alloc(n: int) -> Any:
        with device:
            return cp.empty(n, dtype=np.uint8)

    return BufferPool(alloc, "device")


def pinned_pool() -> BufferPool:
    import cupy as cp  # noqa: PLC0415

    def alloc(n: int) -> Any:
        mem = cp.cuda.alloc_pinned_memory(n)
        return np.frombuffer(mem, dtype=np.uint8, count=n)

    return BufferPool(alloc, "pinned")
