"""``native``: the transport's own collective (MPI_Allreduce, ncclAllReduce...), identity
only. It is the baseline every benchmark shows beside coccl's schedules."""

from __future__ import annotations

from typing import Any


def run(transport: Any, collective: str, x: Any, out: Any, op: str) -> None:
    if collective == "allreduce":
        transport.native_allreduce(x, out, op)
    elif collective == "reduce_scatter":
        transport.native_reduce_scatter(x, out, op)
    elif collective == "allgather":
        transport.native_allgather(x, out)
    else:
        raise ValueError(f"unknown collective {collective!r}")
