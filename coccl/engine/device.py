"""Per-GPU state of a Communicator: its streams and pooled device buffers.

coccl works on its own streams so that its pipeline can overlap compute and transfers,
and orders them against the caller's stream with events: the streams wait for whatever
the caller enqueued before the call (the input may still be being produced), and the
caller's stream waits for coccl's last work before it may read the output. So a call
behaves as if it ran on the caller's stream: the current stream of the array's own
framework (``coccl.core.arrays.caller_stream``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coccl.core.pool import BufferPool, device_pool


@dataclass
class DeviceContext:
    """coccl's streams on one device.

    Attributes:
        device: the CuPy device.
        compute: codec kernels (a round's ``pre``), and the stream every call starts and
            ends on.
        comm: NCCL groups (and staged copies).
        post: decodes after a round's receives (a round's ``post``).
        capture: the origin stream of CUDA graph captures (coccl.engine.graphs).
        pool: pooled device buffers of eagerly run schedules.
    """

    device: Any
    compute: Any
    comm: Any
    post: Any
    capture: Any
    pool: BufferPool

    @classmethod
    def create(cls, device_id: int) -> DeviceContext:
        import cupy as cp  # noqa: PLC0415

        device = cp.cuda.Device(device_id)
        with device:
            streams = [cp.cuda.Stream(non_blocking=True) for _ in range(4)]
        return cls(device, *streams, device_pool(device))

    def event(self, stream: Any) -> Any:
        """A new event recorded on ``stream``."""
        import cupy as cp  # noqa: PLC0415

        event = cp.cuda.Event(block=False, disable_timing=True)
        event.record(stream)
        return event

    def enter(self, caller: Any, all_streams: bool = True, host: bool = False) -> None:
        """Make coccl's streams (only ``compute`` unless ``all_streams``) wait for the work
        the caller enqueued on ``caller`` so far; and the host too if ``host`` (it hands
        device buffers to a CUDA-aware MPI next, which reads and writes them outside any
        stream)."""
        ready = self.event(caller)
        self.compute.wait_event(ready)
        if all_streams:
            self.comm.wait_event(ready)
            self.post.wait_event(ready)
        if host:
            ready.synchronize()

    def leave(self, caller: Any, all_streams: bool = True) -> None:
        """Make ``caller`` wait for everything coccl enqueued (on ``compute``, after it
        waits for ``comm`` and ``post`` when ``all_streams``)."""
        if all_streams:
            for stream in (self.comm, self.post):
                self.compute.wait_event(self.event(stream))
        caller.wait_event(self.event(self.compute))
