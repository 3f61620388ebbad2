"""Per-GPU state of a Communicator: its streams and pooled device buffers.

coccl works on its own streams so that its pipeline can overlap compute and transfers,
and orders them against the caller's current stream with events: the compute stream
waits for whatever the caller enqueued before the call (the input may still be being
produced), and the caller's stream waits for coccl's last kernel before it may read the
output. So a call behaves as if it ran on the caller's current stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coccl.pool import BufferPool, device_pool


@dataclass
class DeviceContext:
    device: Any
    compute: Any
    comm: Any
    post: Any
    pool: BufferPool

    @classmethod
    def create(cls, device_id: int) -> DeviceContext:
        import cupy as cp  # noqa: PLC0415

        device = cp.cuda.Device(device_id)
        with device:
            compute = cp.cuda.Stream(non_blocking=True)
            comm = cp.cuda.Stream(non_blocking=True)
            post = cp.cuda.Stream(non_blocking=True)
        return cls(device, compute, comm, post, device_pool(device))

    def event(self, stream: Any) -> Any:
        import cupy as cp  # noqa: PLC0415

        event = cp.cuda.Event(block=False, disable_timing=True)
        event.record(stream)
        return event

    def enter(self) -> Any:
        """Make coccl's streams wait for the caller's work; return the caller's stream."""
        import cupy as cp  # noqa: PLC0415

        caller = cp.cuda.get_current_stream()
        ready = self.event(caller)
        for stream in (self.compute, self.comm, self.post):
            stream.wait_event(ready)
        return caller

    def leave(self, caller: Any) -> None:
        """Make the caller's stream wait for everything coccl enqueued."""
        for stream in (self.comm, self.post):
            self.compute.wait_event(self.event(stream))
        caller.wait_event(self.event(self.compute))
