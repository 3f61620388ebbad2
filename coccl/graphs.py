"""One call plan's CUDA graph: the whole pipelined schedule over NCCL, recorded once and
replayed in one launch.

A collective over NCCL costs the host 100-175 us of Python per chunk round (launches,
events, NCCL groups), more than the transfer itself over NVLink. Recorded with CUDA stream
capture (coccl/streamed.py runs the same code eagerly or under capture: it never waits on
the host), the schedule's kernels, NCCL groups and cross-stream dependencies become one
graph, and a call costs a few launches.

NCCL treats a captured operation as collective: every rank must replay the graph derived
from the same capture, at the same call. So the decision is made per plan, identically on
every rank (coccl/plans.py): a plan's first call runs eagerly (it also makes NCCL connect
the peers, which it must do before capturing point-to-point operations), the second
captures and replays, later ones replay; if capture fails on any rank, every rank keeps
running that plan eagerly. The graph cannot follow the caller's buffers, whose addresses
change from call to call and rank to rank, so it works on buffers of its own: a call
copies its input in and the result out (two device-to-device copies, outside the graph).
Large calls (coccl/sizing.py's REPLAY_MAX_BYTES) are not replayed: there the device
outlasts the host's enqueueing and the copies would cost more than the replay saves.
Everything the graph touches (those buffers, the schedule's pool, any temporary allocated
during capture) is owned here until the plan is evicted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from coccl.device import DeviceContext
from coccl.pipeline import Round
from coccl.pool import BufferPool, device_pool
from coccl.streamed import run_streamed
from coccl.transport import StreamedTransport

log = logging.getLogger(__name__)

# build(pool, x, out) -> the schedule's rounds on flat views of the graph's own buffers
BuildRounds = Callable[[BufferPool, Any, Any], Iterable[Round]]


class CallGraph:
    """The CUDA graph of one plan, with every buffer it uses.

    Args:
        ctx: the device's streams.
        dtype: element type of the input and output.
        count: input elements; ``out_count``: output elements.
        in_place: the schedule may run with the output in the input's buffer (AllReduce):
            one buffer instead of two.
    """

    def __init__(
        self, ctx: DeviceContext, dtype: Any, count: int, out_count: int, in_place: bool
    ) -> None:
        self.ctx = ctx
        self.dtype = dtype
        self.count, self.out_count = count, out_count
        self.in_place = in_place
        self.graph: Any = None
        self._keep: list[Any] = []  # memory allocated during capture, owned by the graph
        self.pool: BufferPool | None = None
        self._in: Any = None
        self._out: Any = None

    @property
    def in_nbytes(self) -> int:
        return self.count * self.dtype.itemsize

    @property
    def out_nbytes(self) -> int:
        return self.out_count * self.dtype.itemsize

    def capture(self, build: BuildRounds, transport: StreamedTransport, depth: int) -> None:
        """Record the schedule ``build`` gives on the graph's own buffers (raises what
        the capture raised; the streams are released from capture either way)."""
        import cupy as cp  # noqa: PLC0415

        ctx = self.ctx
        memory_pool = cp.get_default_memory_pool()

        def keep(nbytes: int) -> Any:
            memory = memory_pool.malloc(nbytes)
            self._keep.append(memory)
            return memory

        with ctx.device:
            self._in = cp.empty(max(1, self.in_nbytes), dtype=cp.uint8)
            self._out = self._in if self.in_place else cp.empty(max(1, self.out_nbytes), cp.uint8)
            self.pool = device_pool(ctx.device)
            x = self._in[: self.in_nbytes].view(self.dtype)
            out = self._out[: self.out_nbytes].view(self.dtype)
            origin = ctx.capture
            error: BaseException | None = None
            # Every allocation while capturing (the pool's buffers, a codec's temporaries)
            # comes from `keep`, so nothing the graph reads or writes is freed while the
            # graph lives. Relaxed mode lets the memory pool grow during the capture.
            with cp.cuda.using_allocator(keep):
                origin.begin_capture(cp.cuda.runtime.streamCaptureModeRelaxed)
                try:
                    ctx.enter(origin)
                    run_streamed(build(self.pool, x, out), transport, ctx, depth=depth)
                    ctx.leave(origin)
                except BaseException as exc:
                    error = exc
                finally:
                    try:
                        graph = origin.end_capture()
                    except Exception as exc:
                        error = error or exc
            if error is not None:
                self.release()
                raise error
            self.graph = graph
            graph.upload(ctx.compute)

    def replay(self, caller: Any, src_ptr: int, dst_ptr: int) -> None:
        """One call: copy the input in, launch the graph, copy the result out, all on the
        compute stream, ordered after ``caller``'s work and before its next."""
        import cupy as cp  # noqa: PLC0415

        ctx, runtime = self.ctx, cp.cuda.runtime
        kind = runtime.memcpyDeviceToDevice
        ctx.enter(caller, all_streams=False)
        compute = ctx.compute.ptr
        if self.in_nbytes:
            runtime.memcpyAsync(self._in.data.ptr, src_ptr, self.in_nbytes, kind, compute)
        self.graph.launch(ctx.compute)
        if self.out_nbytes:
            runtime.memcpyAsync(dst_ptr, self._out.data.ptr, self.out_nbytes, kind, compute)
        ctx.leave(caller, all_streams=False)

    def release(self) -> None:
        """Free the graph and its memory once every replay has run."""
        if self.graph is not None or self._keep:
            self.ctx.compute.synchronize()
        self.graph = None
        self._keep.clear()
        self.pool = None
        self._in = self._out = None
