"""The interfaces between the pipeline engines and the transports that move bytes.

A transport moves contiguous ``uint8`` buffers between ranks; it knows no schedule. There
are two kinds, one per engine (coccl.core.rounds):

* a ``PollingTransport`` (MPI) starts nonblocking messages and reports their completion
  when tested; the host thread drives the pipeline by polling them;
* a ``StreamedTransport`` (NCCL) enqueues a round's sends and receives on a device stream
  as one group; completion is stream-ordered, so the host never waits per round.

Both also offer the transport's own collectives (``NativeCollectives``), the ``native``
baseline. Engines and the Communicator type against these protocols only.
"""

from __future__ import annotations

from typing import Any, Protocol


class Handle(Protocol):
    """One nonblocking message of a polling transport."""

    peer: int

    def test(self) -> bool:
        """Advance the message; True once it is complete (raises CocclError on failure)."""
        ...


class NativeCollectives(Protocol):
    """The transport's own collectives on flat arrays of one dtype (``native``)."""

    name: str

    def has_native(self, collective: str, dtype: Any, op: str) -> bool:
        """Whether the transport's own ``collective`` takes this dtype and op."""
        ...

    def native(self, collective: str, x: Any, out: Any, op: str, stream: Any) -> None:
        """Run the transport's own ``collective`` of flat ``x`` into flat ``out``
        (``stream``: the device stream to run on, None for host data)."""
        ...


class PollingTransport(NativeCollectives, Protocol):
    """Point-to-point messages that complete asynchronously (MPI)."""

    rank: int
    size: int
    bytes_sent: int
    # Device buffers go to the transport directly (else through pinned host staging).
    cuda_aware: bool
    # Device sends are copied out on the current stream (pinned staging), so a send may be
    # posted as soon as the kernels that fill its buffer are enqueued.
    sends_follow_stream: bool
    # Two threads may call it at once (MPI: only at MPI_THREAD_MULTIPLE).
    thread_safe: bool

    def isend(self, buf: Any, peer: int, tag: int, landed: bool = False) -> Handle:
        """Start sending ``buf``; ``landed``: its bytes are those of a completed receive."""
        ...

    def irecv(self, buf: Any, peer: int, tag: int, forward: bool = False) -> Handle:
        """Start receiving into ``buf``; ``forward``: a later send forwards these bytes."""
        ...

    def finish(self) -> None:
        """End of a collective: release what the transport kept for it."""
        ...

    def cancel(self, handles: list[Handle]) -> None:
        """Give up on unfinished messages after a failure (receives are cancelled)."""
        ...

    def pools(self) -> list[Any]:
        """The buffer pools the transport allocates from (for statistics)."""
        ...

    def close(self, abandoned: bool = False) -> None:
        """Free the transport's resources. ``abandoned``: messages may be left unmatched
        (after a failure, or messages given up): what they could reach later stays held."""
        ...


class StreamedTransport(NativeCollectives, Protocol):
    """Stream-ordered point-to-point groups (NCCL)."""

    rank: int
    size: int
    bytes_sent: int

    def group_exchange(
        self,
        sends: list[tuple[int, Any]],
        recvs: list[tuple[int, Any]],
        stream: Any,
        wire_dtype: Any = None,
    ) -> None:
        """Enqueue ``sends`` and ``recvs`` as one group on ``stream``."""
        ...

    def allgather_bytes(self, send: Any, recv: Any, stream: Any) -> None:
        """Enqueue an AllGather of ``send`` (uint8) into ``recv`` (``size`` times as long)."""
        ...

    def check_async_error(self) -> None:
        """Raise CocclError if the transport reported an asynchronous failure."""
        ...

    def pools(self) -> list[Any]:
        """The buffer pools the transport allocates from (for statistics)."""
        ...
