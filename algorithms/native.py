"""``native``: the transport's own collective (MPI_Allreduce, ncclAllReduce...), identity
only. It is the baseline every benchmark shows beside coccl's schedules."""

from __future__ import annotations

from typing import Any

from coccl.core.transport import NativeCollectives


def run(
    transport: NativeCollectives, collective: str, x: Any, out: Any, op: str, stream: Any = None
) -> None:
    """Run ``collective`` of flat ``x`` into flat ``out`` with the transport's own
    collective (``stream``: the device stream to enqueue it on; None for host data)."""
    transport.native(collective, x, out, op, stream)
