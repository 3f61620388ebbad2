"""What each collective is, as the planner and the runner need it: whether it reduces
(takes ``op``), how many elements its output holds, the shape of a new result, and the
count it requires. A new collective is one entry of ``KINDS``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from coccl.core.arrays import overlap_offset


def _no_count_rule(count: int, n: int) -> None:
    return None


def _multiple_of_ranks(count: int, n: int) -> None:
    if count % n:
        raise ValueError(
            f"reduce_scatter needs a multiple of the rank count ({n}) elements, x has {count}"
        )


def _scattered_shape(shape: tuple[int, ...], n: int) -> tuple[int, ...]:
    if shape and shape[0] % n == 0:
        return (shape[0] // n, *shape[1:])
    return (int(np.prod(shape)) // n,)


def _gathered_shape(shape: tuple[int, ...], n: int) -> tuple[int, ...]:
    return (n * shape[0], *shape[1:]) if shape else (n,)


def _same_place(rank: int, x_nbytes: int, out_nbytes: int) -> int:
    return 0


@dataclass(frozen=True)
class Kind:
    """One collective's shape rules on ``n`` ranks.

    Attributes:
        name: the collective (``algorithms.COLLECTIVES``).
        reduces: whether it combines values with ``op`` (the codec must support the op).
        out_count: output elements for ``count`` input elements.
        result_shape: the shape of a new result for an input of ``shape``.
        check_count: raises ValueError for an input count the collective cannot take.
        in_place: where ``x`` lies in ``out`` when the call runs in place, as NCCL
            defines it: ``x``'s address minus ``out``'s for rank ``rank`` and the two
            byte sizes (any other overlap of the two is refused).
        in_place_rule: that place in words, for the refusal.
    """

    name: str
    reduces: bool
    out_count: Callable[[int, int], int]
    result_shape: Callable[[tuple[int, ...], int], tuple[int, ...]]
    check_count: Callable[[int, int], None] = _no_count_rule
    in_place: Callable[[int, int, int], int] = _same_place
    in_place_rule: str = "out is x"


KINDS: dict[str, Kind] = {
    "allreduce": Kind("allreduce", True, lambda count, n: count, lambda shape, n: shape),
    "reduce_scatter": Kind(
        "reduce_scatter",
        True,
        lambda count, n: count // n,
        _scattered_shape,
        _multiple_of_ranks,
        lambda rank, x_nbytes, out_nbytes: -rank * out_nbytes,
        "out is this rank's block of x",
    ),
    "allgather": Kind(
        "allgather",
        False,
        lambda count, n: count * n,
        _gathered_shape,
        _no_count_rule,
        lambda rank, x_nbytes, out_nbytes: rank * x_nbytes,
        "x is this rank's block of out",
    ),
    # equal splits; an uneven all-to-all's plan holds its own out_count (dp_calls)
    "alltoall": Kind(
        "alltoall",
        False,
        lambda count, n: count,
        lambda shape, n: shape,
        in_place_rule="out is x, with send_counts equal to recv_counts",
    ),
}


def check_in_place(
    kind: str,
    rank: int,
    x: Any,
    x_nbytes: int,
    out: Any,
    out_nbytes: int,
    *,
    call: str | None = None,
    equal_split: bool = True,
) -> None:
    """Refuse (ValueError) an ``out`` that overlaps ``x`` other than in place as the
    collective ``kind`` defines it (``Kind.in_place``; an all-to-all only where the split
    is the same both ways): the call would read values it had already overwritten.
    ``call`` names the call in the message (default ``kind``)."""
    offset = overlap_offset(x, x_nbytes, out, out_nbytes)
    if offset is not None:
        rule = KINDS[kind]
        if offset != rule.in_place(rank, x_nbytes, out_nbytes) or not equal_split:
            raise ValueError(
                f"out overlaps x: {call or kind} runs in place only where "
                f"{rule.in_place_rule}; pass disjoint arrays otherwise"
            )
