"""Collective schedules over coccl's transports: ``ring``, ``two_shot``, ``native`` (the
transport's own collective, the baseline) and ``auto`` (a measured size-gated choice).

A schedule is a function ``(plan, x, out) -> iterator of pipeline Rounds``; it never
reaches back into the Communicator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from . import alltoall, hierarchical, native, ring, two_shot
from .auto import Choice, choose
from .footprint import Footprint, hop_kernel
from .schedule_args import ScheduleArgs, stream_call

ALGORITHMS = ("auto", "ring", "two_shot", "native", "hierarchical")
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather")

Schedule = Callable[[ScheduleArgs, Any, Any], Iterator[Any]]

_SCHEDULES: dict[str, dict[str, Schedule]] = {
    "ring": {
        "allreduce": ring.allreduce,
        "reduce_scatter": ring.reduce_scatter,
        "allgather": ring.allgather,
    },
    "two_shot": {
        "allreduce": two_shot.allreduce,
        "reduce_scatter": two_shot.reduce_scatter,
        "allgather": two_shot.allgather,
    },
}


def check_algorithm(name: Any) -> str:
    if not isinstance(name, str) or name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; coccl takes {', '.join(ALGORITHMS)}")
    return name


def schedule(algorithm: str, collective: str) -> Schedule:
    return _SCHEDULES[algorithm][collective]


# The modules of coccl's own schedules: each declares its footprint and fused-hop use.
_MODULES = {
    "ring": ring,
    "two_shot": two_shot,
    "hierarchical": hierarchical,
    "direct": alltoall,
}


def footprint(algorithm: str, collective: str, n: int) -> Footprint:
    """The memory one round of ``algorithm``'s ``collective`` holds on ``n`` ranks."""
    return _MODULES[algorithm].footprint(collective, n)


def fuses_hop(algorithm: str, collective: str, n: int) -> bool:
    """Whether ``algorithm``'s ``collective`` on ``n`` ranks reduces only with the codec's
    fused hop (where the codec has one), holding no accumulator."""
    return _MODULES[algorithm].fuses_hop(collective, n)


__all__ = [
    "ALGORITHMS",
    "COLLECTIVES",
    "Choice",
    "Footprint",
    "ScheduleArgs",
    "check_algorithm",
    "choose",
    "footprint",
    "fuses_hop",
    "hop_kernel",
    "native",
    "schedule",
    "stream_call",
]
