"""The overlap profile: a pipelined collective timed against its two halves.

``overlap_efficiency = max(codec-only time, transport-only time) / pipelined time``
(1.0: the shorter half hides completely behind the longer). The three runs use the same
plan (schedule, chunks, depth, buffers), run eagerly from the host:

* codec-only: ``NullTransport`` completes every message at once and moves nothing (the
  received payload bytes are whatever the buffer held), so only the compute runs;
* transport-only: ``WireOnlyCodec`` has the real codec's payload sizes but encodes and
  decodes nothing, so only the messages (and staging copies) run.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from coccl.algorithms import COLLECTIVES
from coccl.communicator.plans import CallPlan
from coccl.compressors import Compressor
from coccl.core.arrays import array_kind


class HostRunner(Protocol):
    """The runner's one call the profiler drives (``Runner.run_from_host``)."""

    rank: int
    size: int

    def run_from_host(self, plan: CallPlan, x: Any, transport: Any = None) -> Any: ...


def check_arguments(collective: str, algorithm: str, iters: int) -> None:
    """ValueError for a profile that cannot run (checked before anything else)."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}")
    if algorithm not in ("ring", "two_shot"):
        raise ValueError("overlap_profile takes algorithm='ring' or 'two_shot'")
    if not isinstance(iters, int) or isinstance(iters, bool) or iters < 1:
        raise ValueError(f"iters must be a positive integer, got {iters!r}")


def profile(
    runner: HostRunner,
    plan: CallPlan,
    x: Any,
    iters: int,
    *,
    barrier: Callable[[], None],
    slowest: Callable[[list[float]], list[list[float]]],
) -> dict[str, float]:
    """``Communicator.overlap_profile``: the three runs of ``plan`` on ``x``, interleaved
    (pipelined, codec-only, transport-only, pipelined, ...) so that a drift of the
    machine's speed weighs on the three alike; medians of ``iters`` runs after one
    warm-up round, the slowest rank's (``slowest`` gathers every rank's medians).
    Collective: every rank must call it."""
    runs: dict[str, tuple[CallPlan, Any]] = {
        "pipelined": (plan, None),
        "codec_only": (plan, NullTransport(runner.rank, runner.size)),
        "transport_only": (dataclasses.replace(plan, codec=WireOnlyCodec(plan.codec)), None),
    }
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(iters + 1):  # the first round warms up
        for name, (run_plan, transport) in runs.items():
            barrier()
            start = time.perf_counter()
            result = runner.run_from_host(run_plan, x, transport)
            _synchronize(result)
            if i:
                samples[name].append(time.perf_counter() - start)
    medians = [float(np.median(samples[name])) for name in runs]
    per_rank = slowest(medians)
    times = {f"{name}_s": max(m[k] for m in per_rank) for k, name in enumerate(runs)}
    longest_half = max(times["codec_only_s"], times["transport_only_s"])
    times["overlap_efficiency"] = longest_half / times["pipelined_s"]
    return times


def _synchronize(x: Any) -> None:
    """Wait for the device work of a call that returned ``x`` (no-op for host data)."""
    kind = array_kind(x)
    if kind == "numpy":
        return
    if kind == "torch":
        if x.device.type == "cuda":
            import torch  # noqa: PLC0415

            torch.cuda.current_stream(x.device).synchronize()
        return
    import cupy as cp  # noqa: PLC0415

    cp.cuda.get_current_stream().synchronize()


class NullTransport:
    """A transport whose sends and receives complete immediately without moving bytes."""

    name = "null"
    cuda_aware = True
    sends_follow_stream = False
    thread_safe = True
    bytes_sent = 0

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size

    def isend(self, buf: Any, peer: int, tag: int, landed: bool = False) -> Any:
        return _Complete(peer)

    def irecv(self, buf: Any, peer: int, tag: int, forward: bool = False) -> Any:
        return _Complete(peer)

    def finish(self) -> None:
        pass

    def cancel(self, handles: list[Any]) -> None:
        pass

    def pools(self) -> list[Any]:
        return []


class _Complete:
    __slots__ = ("peer",)

    def __init__(self, peer: int) -> None:
        self.peer = peer

    @staticmethod
    def test() -> bool:
        return True


class WireOnlyCodec(Compressor):
    """The payload sizes of ``inner`` with no encoding or decoding work."""

    codec_id = "wire-only"

    def __init__(self, inner: Compressor) -> None:
        self.inner = inner
        self.dtypes = inner.dtypes
        self.ops = inner.ops

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "inner": self.inner.get_config()}

    @property
    def alignment(self) -> int:
        return self.inner.alignment

    def encoded_nbytes(self, count: int, dtype: Any) -> int:
        return self.inner.encoded_nbytes(count, dtype)

    def encode_into(self, x: Any, payload: Any, dtype: np.dtype) -> None:
        pass

    def decode_into(self, payload: Any, out: Any, dtype: np.dtype, accumulate: bool) -> None:
        pass

    def reduce_encode_kernel(self, like: Any, dtype: np.dtype) -> Any:
        # the real codec's schedule (a fused ring hop, or load + reduce + encode), minus
        # its work: with a hop the ring holds no accumulator to load
        if self.inner.reduce_encode_kernel(like, dtype) is None:
            return None
        return _no_hop


def _no_hop(own: Any, payload: Any, out: Any, decoded: Any = None) -> None:
    pass


__all__ = ["HostRunner", "NullTransport", "WireOnlyCodec", "check_arguments", "profile"]
