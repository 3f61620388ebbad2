"""Timing helpers shared by the benchmarks: one timed call, a series of them, and the
rank-combined figure a table shows.

Each call is timed on its own, between a barrier and the end of its work: the barrier
makes every rank start together (a late rank would otherwise be charged to its peers),
and on a GPU the device is synchronized before the clock stops, because a collective
returns once its work is queued, not once it is done. A rank's series is summarised by
its median (robust to the odd scheduler hiccup), minimum and maximum; the ranks' figures
are then combined as nccl-tests' ``-a`` says: rank 0's, their average, their minimum or
their maximum. coccl-bench's default is the maximum (nccl-tests' the average): a
collective is as fast as its slowest participant.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# nccl-tests' -a values: how the ranks' times are combined into the one a row shows.
AVERAGES: dict[int, str] = {0: "rank0", 1: "avg", 2: "min", 3: "max"}
DEFAULT_AVERAGE = 3


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


# Timed loops per point: their per-call times give the min / median / max of a point.
LOOPS = 3


def time_calls(
    fn: Callable[[], Any],
    iters: int,
    barrier: Callable[[], None],
    sync: Callable[[], None],
    before: Callable[[], None] | None = None,
) -> list[float]:
    """Per-call seconds of ``LOOPS`` loops of ``iters`` back-to-back calls of ``fn``, as
    nccl-tests times: each loop starts after a barrier and ends once the device is done,
    and its time is divided by ``iters``, so a small message is not charged a barrier and
    a synchronization per call (bench/NOTES.md measures what those cost).
    ``before()`` (untimed) runs before each loop, e.g. to restore the input that in-place
    calls overwrite (within a loop they reduce their own results, as in nccl-tests)."""
    samples = []
    for _ in range(LOOPS):
        if before is not None:
            before()
        sync()
        barrier()
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        samples.append((time.perf_counter() - start) / iters)
    return samples


def combine(values: Sequence[float], average: str) -> float:
    """The ranks' ``values`` (rank order) combined as ``average`` (``AVERAGES``)."""
    if average == "rank0":
        return values[0]
    if average == "avg":
        return statistics.fmean(values)
    if average == "min":
        return min(values)
    if average == "max":
        return max(values)
    raise ValueError(f"unknown average {average!r}: choose from {', '.join(AVERAGES.values())}")


@dataclass(frozen=True)
class TimeStats:
    """A series of timed calls on every rank, summarised (seconds).

    Attributes:
        time: the figure a row shows: each rank's median, ranks combined by ``average``.
        iters: ``{"min", "median", "max"}`` over the calls: each rank's, ranks combined
            by ``average`` (``iters["median"] == time``).
        ranks: ``{"rank0", "avg", "min", "max"}``: the ranks' medians combined each way.
    """

    time: float
    iters: dict[str, float]
    ranks: dict[str, float]


def summarize(mpi_comm: Any, samples: list[float], average: str) -> TimeStats:
    """Summarise this rank's ``samples`` with every other rank's (a collective call:
    every rank of ``mpi_comm`` must make it, and every rank gets the same result)."""
    local = (min(samples), statistics.median(samples), max(samples)) if samples else (0.0,) * 3
    per_rank = mpi_comm.allgather(local)
    iters = {
        name: combine([r[i] for r in per_rank], average)
        for i, name in enumerate(("min", "median", "max"))
    }
    medians = [r[1] for r in per_rank]
    ranks = {name: combine(medians, name) for name in AVERAGES.values()}
    return TimeStats(iters["median"], iters, ranks)
