"""Timing helpers shared by the benchmarks: one timed call, a series of them, and the
rank-combined figure a table shows.

Each call is timed on its own, between a barrier and the end of its work: the barrier
makes every rank start together (a late rank would otherwise be charged to its peers),
and on a GPU the device is synchronized before the clock stops, because a collective
returns once its work is queued, not once it is done. A series is summarised by its
median (robust to the odd scheduler hiccup), and ranks by their slowest median: a
collective is as fast as its slowest participant.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def no_sync() -> None:
    """The host's "synchronize": a host collective is done when it returns."""


def device_sync() -> Callable[[], None]:
    """A function that waits until the current CUDA device has finished all its work."""
    import cupy as cp  # noqa: PLC0415

    def sync() -> None:
        cp.cuda.runtime.deviceSynchronize()

    return sync


def timed_call(
    fn: Callable[[], Any], barrier: Callable[[], None], sync: Callable[[], None]
) -> float:
    """Seconds ``fn()`` took, started right after a barrier, stopped after ``sync()``."""
    sync()  # nothing of earlier calls may still run on the device
    barrier()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def time_calls(
    fn: Callable[[], Any],
    iters: int,
    barrier: Callable[[], None],
    sync: Callable[[], None],
    before: Callable[[], None] | None = None,
) -> list[float]:
    """Time ``iters`` calls of ``fn`` one by one; ``before()`` (untimed) runs before each,
    e.g. to restore the input that an in-place call overwrote."""
    samples = []
    for _ in range(iters):
        if before is not None:
            before()
        samples.append(timed_call(fn, barrier, sync))
    return samples


def slowest_median(mpi_comm: Any, samples: list[float]) -> float:
    """The median of this rank's samples, then the largest such median over all ranks of
    ``mpi_comm`` (a collective call: every rank must make it)."""
    from mpi4py import MPI  # noqa: PLC0415

    local = statistics.median(samples) if samples else 0.0
    return float(mpi_comm.allreduce(local, op=MPI.MAX))
