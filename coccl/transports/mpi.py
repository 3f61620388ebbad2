"""MPI transport: nonblocking point-to-point byte messages over mpi4py, plus MPI's own
collectives as the ``native`` baseline.

Host (numpy) buffers go to MPI directly. Device (CuPy) buffers go directly when the MPI
library is CUDA-aware; otherwise they travel through pinned host staging buffers: a send
copies device -> pinned on the current (compute) stream and posts ``Isend`` only once that
copy's event has completed; a receive lands in pinned memory and, once MPI reports it
complete, is copied pinned -> device on the current stream, so every later kernel on that
stream sees the data. A receive that will be forwarded unchanged (``forward``) keeps its
pinned copy, and the send that forwards it (``landed``) goes from there: no copy back to
the host, no wait for the stream. The transport knows no schedule: it moves the bytes it
is given.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from mpi4py import MPI

from coccl.core.arrays import FLOAT_DTYPES, array_module, is_device_array
from coccl.core.pool import Block, BufferPool, pinned_pool
from coccl.core.reduction import finalize
from coccl.errors import CocclError
from coccl.transports.bootstrap import free_duplicate, wait_request

_MPI_OPS = {"sum": MPI.SUM, "avg": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN, "prod": MPI.PROD}
_MPI_NATIVE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def mpi_cuda_aware() -> bool:
    """Whether this MPI library accepts device pointers (MPIX_Query_cuda_support)."""
    query = getattr(MPI, "Query_cuda_support", None)
    if query is None:
        return False
    try:
        return bool(query())
    except Exception:  # an MPI without the extension
        return False


class Handle:
    """One nonblocking message. ``test()`` advances it and says whether it is complete."""

    __slots__ = ("peer", "kind", "nbytes", "_req", "_done")

    def __init__(self, peer: int, kind: str, nbytes: int, req: MPI.Request | None) -> None:
        self.peer = peer
        self.kind = kind
        self.nbytes = nbytes
        self._req = req
        self._done = req is None

    def cancel(self) -> None:
        """Cancel an unfinished receive (MPI cannot reliably cancel sends)."""
        if self.kind == "recv" and self._req is not None and not self._done:
            try:
                self._req.Cancel()
                self._req.Free()
            except MPI.Exception:  # already matched or freed: nothing to give up
                pass
            self._done = True

    def test(self) -> bool:
        if not self._done:
            status = MPI.Status()
            try:
                self._done = bool(self._req.Test(status))
            except MPI.Exception as exc:
                raise CocclError(
                    f"MPI {self.kind} with rank {self.peer} failed: {exc}; do all ranks call "
                    "the same collective with the same count, dtype and options?"
                ) from exc
            if self._done and self.kind == "recv" and status.Get_count(MPI.BYTE) != self.nbytes:
                raise CocclError(
                    f"rank {self.peer} sent {status.Get_count(MPI.BYTE)} bytes where "
                    f"{self.nbytes} were expected: do all ranks call the same collective "
                    "with the same count, dtype and options?"
                )
        return self._done


class _StagedSend(Handle):
    """MPI Isend of a pinned block, released once sent. ``buf`` given: the block is
    filled from that device buffer on the compute stream first, and sent once copied."""

    __slots__ = ("_comm", "_block", "_event", "_tag")

    def __init__(self, comm: MPI.Comm, block: Block, peer: int, tag: int, buf: Any) -> None:
        super().__init__(peer, "send", int(block.data.size), None)
        self._done = False
        self._comm, self._tag = comm, tag
        self._block = block
        self._event = None
        if buf is not None:
            import cupy as cp  # noqa: PLC0415

            buf.get(out=block.data, blocking=False)
            self._event = cp.cuda.Event(block=False, disable_timing=True)
            self._event.record()

    def test(self) -> bool:
        if self._req is None:
            if self._event is not None and not self._event.done:
                return False
            self._req = self._comm.Isend([self._block.data, MPI.BYTE], self.peer, self._tag)
        if super().test():
            if self._block is not None:
                self._block.release()
                self._block = None
            return True
        return False


class _StagedRecv(Handle):
    """MPI Irecv into pinned host -> device copy on the compute stream once received."""

    __slots__ = ("_buf", "_block", "_transport", "_keep")

    def __init__(self, transport: MpiTransport, buf: Any, peer: int, tag: int, keep: bool) -> None:
        self._transport = transport
        self._buf, self._keep = buf, keep
        self._block = transport._pinned.get(int(buf.size))
        req = transport.comm.Irecv([self._block.data, MPI.BYTE], peer, tag)
        super().__init__(peer, "recv", int(buf.size), req)
        self._done = False

    def test(self) -> bool:
        if self._block is None:
            return True
        if not super().test():
            return False
        import cupy as cp  # noqa: PLC0415

        self._buf.set(self._block.data, stream=cp.cuda.get_current_stream())
        event = cp.cuda.Event(block=False, disable_timing=True)
        event.record()
        # The pinned block must outlive the asynchronous copy: release it later (at the
        # next post or completion of a message on this transport whose copy has ended).
        self._transport._reap()
        self._transport._deferred.append((event, self._block))
        if self._keep:  # the forwarding send takes this reference
            self._transport._forwardable[id(self._buf)] = (self._buf, self._block.retain())
        self._block = None
        return True


class MpiTransport:
    """Point-to-point bytes over an MPI communicator (a private duplicate of the caller's).

    Args:
        comm: the MPI communicator; coccl duplicates it so its messages never match the
            caller's own.
        cuda_aware: hand device buffers to MPI directly (None: ask the library).
        timeout_s: how long the native collectives wait for the other ranks.
        forward_from_host: staged ring AllGather forwards go from the pinned copy they
            arrived in (COCCL_FORWARD_FROM_PINNED).
    """

    name = "mpi"

    def __init__(
        self,
        comm: MPI.Comm,
        cuda_aware: bool | None = None,
        timeout_s: float = float("inf"),
        forward_from_host: bool = True,
    ) -> None:
        try:
            self.comm = comm.Dup()
        except MPI.Exception as exc:
            raise CocclError(
                f"MPI could not duplicate the communicator ({exc}); an MPI library holds a "
                "limited number of communicators: close() the coccl communicators you no "
                "longer use (one closed after a failure keeps its duplicates)"
            ) from exc
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        # the largest tag MPI takes: an attribute of COMM_WORLD, which some MPI libraries
        # (Open MPI) do not carry over to a communicator made by MPI_Comm_split
        tag_ub = self.comm.Get_attr(MPI.TAG_UB) or MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
        self.tag_ub = int(tag_ub) if tag_ub else 32767  # MPI's guaranteed minimum
        self.cuda_aware = mpi_cuda_aware() if cuda_aware is None else cuda_aware
        self.timeout_s = timeout_s
        self._pinned_pool: BufferPool | None = None
        self._deferred: list[tuple[Any, Block]] = []
        # id(device buffer) -> (the buffer, the pinned block it was received through), for
        # receives that a later send forwards unchanged (the buffer is held: ids stay unique)
        self._forwardable: dict[int, tuple[Any, Block]] = {}
        self.forward_from_host = forward_from_host
        self.bytes_sent = 0  # payload bytes handed to isend (statistics)
        self.thread_safe = MPI.Query_thread() == MPI.THREAD_MULTIPLE

    # ------------------------------------------------------------------ plumbing
    @property
    def _pinned(self) -> BufferPool:
        if self._pinned_pool is None:
            self._pinned_pool = pinned_pool()
        return self._pinned_pool

    def pools(self) -> list[BufferPool]:
        return [] if self._pinned_pool is None else [self._pinned_pool]

    def _reap(self, wait: bool = False) -> None:
        keep = []
        for event, block in self._deferred:
            if wait:
                event.synchronize()
            if wait or event.done:
                block.release()
            else:
                keep.append((event, block))
        self._deferred = keep

    @property
    def sends_follow_stream(self) -> bool:
        """Device sends are copied out on the current stream (staging), so a send may be
        posted as soon as the kernels that fill its buffer are enqueued."""
        return not self.cuda_aware

    def _staged(self, buf: Any) -> bool:
        return is_device_array(buf) and not self.cuda_aware

    # ----------------------------------------------------------- point to point
    def isend(self, buf: Any, peer: int, tag: int, landed: bool = False) -> Handle:
        """Start sending the uint8 array ``buf`` to ``peer``. A device buffer must already
        be complete on the current stream's timeline (the engine ensures it). ``landed``:
        ``buf``'s bytes are those of a completed receive (a forward): a staged one goes
        from the pinned copy it arrived in, if that receive kept it."""
        self._reap()
        self.bytes_sent += int(buf.size)
        if self._staged(buf):
            kept = self._forwardable.pop(id(buf), None) if landed else None
            if kept is not None:
                return _StagedSend(self.comm, kept[1], peer, tag, None)
            return _StagedSend(self.comm, self._pinned.get(int(buf.size)), peer, tag, buf)
        return Handle(peer, "send", int(buf.size), self.comm.Isend([buf, MPI.BYTE], peer, tag))

    def irecv(self, buf: Any, peer: int, tag: int, forward: bool = False) -> Handle:
        """Start receiving into the uint8 array ``buf`` from ``peer``. ``forward``: a
        later send forwards these bytes unchanged (``isend(..., landed=True)``)."""
        self._reap()  # a rank that only receives (point to point) sends nothing to reap at
        if self._staged(buf):
            return _StagedRecv(self, buf, peer, tag, forward and self.forward_from_host)
        return Handle(peer, "recv", int(buf.size), self.comm.Irecv([buf, MPI.BYTE], peer, tag))

    def finish(self) -> None:
        """Release staging buffers whose copies are still in flight, and kept receives
        that no send forwarded (end of a collective)."""
        self._reap(wait=True)
        for _, block in self._forwardable.values():
            block.release()
        self._forwardable.clear()

    def cancel(self, handles: list[Handle]) -> None:
        """Cancel the receives among ``handles`` that have not completed (after a failure:
        the communicator is unusable from then on, but MPI keeps no buffers posted)."""
        for handle in handles:
            if isinstance(handle, Handle):
                handle.cancel()

    @staticmethod
    def has_native(collective: str, dtype: Any, op: str) -> bool:
        """MPI reduces every coccl dtype (16-bit floats via float32)."""
        return True

    def native(self, collective: str, x: Any, out: Any, op: str, stream: Any = None) -> None:
        """The MPI collective of flat ``x`` into flat ``out`` (device data through host
        copies unless MPI is CUDA-aware); waits at most ``timeout_s`` for the peers."""
        if collective == "allreduce":
            self.native_allreduce(x, out, op)
        elif collective == "reduce_scatter":
            self.native_reduce_scatter(x, out, op)
        else:
            self.native_allgather(x, out)

    def _complete(self, request: MPI.Request, what: str) -> None:
        """Wait for a nonblocking collective, at most ``timeout_s``."""
        wait_request(
            request,
            time.monotonic() + self.timeout_s,
            lambda: (
                f"{what}: timed out after {self.timeout_s:g} s waiting for every rank "
                "(COCCL_TIMEOUT_S); do all ranks call the same collective?"
            ),
        )

    # ------------------------------------------------------- native collectives
    def _for_mpi(self, x: Any) -> Any:
        """x where MPI can read it: a host copy of device data unless MPI is CUDA-aware."""
        if not is_device_array(x):
            return x
        if self.cuda_aware:
            import cupy as cp  # noqa: PLC0415

            cp.cuda.get_current_stream().synchronize()
            return x
        return x.get()

    def _reducible(self, x: Any) -> Any:
        """bfloat16/float16 reduce in float32: MPI has no such types."""
        dtype = np.dtype(x.dtype)
        if dtype in FLOAT_DTYPES and dtype not in _MPI_NATIVE_DTYPES:
            return x.astype(np.float32)
        return x

    @staticmethod
    def _store(result: Any, out: Any) -> None:
        if result.dtype != out.dtype:
            result = result.astype(out.dtype)
        if is_device_array(out) and not is_device_array(result):
            out.set(result)
        else:
            out[...] = result

    def native_allreduce(self, x: Any, out: Any, op: str) -> None:
        """MPI_Allreduce (bfloat16/float16 are reduced in float32)."""
        send = self._reducible(self._for_mpi(x))
        recv = array_module(send).empty_like(send)
        self._complete(self.comm.Iallreduce(send, recv, op=_MPI_OPS[op]), "MPI_Allreduce")
        finalize(recv, op, self.size)
        self._store(recv, out)

    def native_reduce_scatter(self, x: Any, out: Any, op: str) -> None:
        """MPI_Reduce_scatter_block (NCCL layout: shard ``rank`` of ``size`` shards)."""
        send = self._reducible(self._for_mpi(x))
        recv = array_module(send).empty(send.size // self.size, dtype=send.dtype)
        request = self.comm.Ireduce_scatter_block(send, recv, op=_MPI_OPS[op])
        self._complete(request, "MPI_Reduce_scatter_block")
        finalize(recv, op, self.size)
        self._store(recv, out)

    def native_allgather(self, x: Any, out: Any) -> None:
        """MPI_Allgather (rank r's data at offset r * n); moves bytes, any dtype."""
        send = self._for_mpi(x).view(np.uint8)
        recv = array_module(send).empty(send.size * self.size, dtype=np.uint8)
        request = self.comm.Iallgather([send, MPI.BYTE], [recv, MPI.BYTE])
        self._complete(request, "MPI_Allgather")
        self._store(recv.view(out.dtype), out)

    def barrier(self) -> None:
        self._complete(self.comm.Ibarrier(), "barrier")

    def close(self, abandoned: bool = False) -> None:
        """Free the duplicate, once the staged sends' copies ended; ``abandoned``: messages
        may be left unmatched (after a failure, or messages given up), and the duplicate is
        kept instead (see ``free_duplicate``)."""
        if self.comm != MPI.COMM_NULL and not MPI.Is_finalized():
            self._reap(wait=True)
            free_duplicate(self.comm, abandoned)
