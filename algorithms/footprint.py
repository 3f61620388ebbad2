"""What a schedule declares about its own memory and its use of the codec's fused hop,
so that sizing (``coccl.communicator.sizing``) reads it instead of knowing each schedule.
Each schedule module defines ``footprint(collective, n)`` and ``fuses_hop(collective, n)``
beside its code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Footprint:
    """The payloads one pipeline round of a schedule holds, in units of one chunk's
    payload (``sizing.window_bytes`` turns them into bytes).

    Attributes:
        messages: payloads a round sends and receives.
        steps: the steps a chunk passes through.
        waiting: payloads waiting between a chunk's steps, per round of depth (a chunk's
            next step runs ``depth`` waves later).
        staged_kept: payloads a round staged through pinned memory keeps pinned (a ring
            AllGather payload waiting to be forwarded).
        second_accumulator: the schedule's last ReduceScatter step holds a second
            accumulator, once per pass of the window over the steps.
    """

    messages: int
    steps: int
    waiting: int
    staged_kept: int = 0
    second_accumulator: bool = False


def hop_kernel(codec: Any, like: Any, dtype: Any, op: str) -> Any:
    """The codec's fused ring-hop kernel for data like ``like`` (``own + decode(received)``
    encoded in one kernel, ``Compressor.reduce_encode_kernel``), or None: sums only."""
    if op not in ("sum", "avg"):
        return None
    return codec.reduce_encode_kernel(like, dtype)
