"""Collective schedules over coccl's transports: ``ring``, ``two_shot``, ``native`` (the
transport's own collective, the baseline) and ``auto`` (a measured size-gated choice).

A schedule is a function ``(plan, x, out) -> iterator of pipeline Rounds``; it never
reaches back into the Communicator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from . import native, ring, two_shot
from .auto import Choice, choose
from .plan import Plan

ALGORITHMS = ("auto", "ring", "two_shot", "native")
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather")

Schedule = Callable[[Plan, Any, Any], Iterator[Any]]

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


__all__ = [
    "ALGORITHMS",
    "COLLECTIVES",
    "Choice",
    "Plan",
    "check_algorithm",
    "choose",
    "native",
    "schedule",
]
