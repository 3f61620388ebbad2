"""One call plan's CUDA graph: the whole pipelined schedule over NCCL, recorded once and
replayed in one launch.

A collective over NCCL costs the host Python work per chunk round (launches, events,
NCCL groups), more than the transfer itself over NVLink (bench/NOTES.md). Recorded with CUDA stream
capture (coccl.engine.streamed runs the same code eagerly or under capture: it never waits on
the host), the schedule's kernels, NCCL groups and cross-stream dependencies become one
graph, and a call costs a few launches.

NCCL treats a captured operation as collective: every rank must replay the graph derived
from the same capture, at the same call. So the decision is made per plan, identically on
every rank (coccl.communicator.plans): a plan's first call runs eagerly (it also makes NCCL connect
the peers, which it must do before capturing point-to-point operations), the second
captures and replays, later ones replay; if capture fails on any rank, every rank keeps
running that plan eagerly.

The graph is captured on buffers of its own, since the caller's addresses change from call
to call and rank to rank. With a lossy codec its NCCL operations only move payloads the
graph owns, and only its codec kernels read the input and write the output: before a
replay on other buffers, those kernels are pointed at the caller's (coccl.engine.graph_rebase),
and the call runs on them directly. Otherwise (the identity codec, whose messages are the
caller's data, or a graph whose nodes cannot be rebased) a call copies its input in and
the result out, two device-to-device copies outside the graph; such plans are not replayed
from coccl.communicator.sizing's REPLAY_MAX_BYTES up, where the device outlasts the host's
enqueueing and the copies would cost more than the replay saves. Everything the graph
touches (the schedule's pool, any temporary allocated during capture, and the buffers of
its own while it copies) is owned here until the plan is evicted.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from coccl.core.pool import BufferPool, device_pool
from coccl.core.rounds import Round
from coccl.core.transport import StreamedTransport
from coccl.engine.device import DeviceContext
from coccl.engine.graph_rebase import CapturedBuffer, NotRebasable, Rebase, WatchedTransport
from coccl.engine.streamed import run_streamed
from coccl.errors import CocclError

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
            one buffer instead of two (never with ``follow``: rebasing tells the input's
            addresses from the output's).
        follow: after capture, point the graph at each call's buffers (a lossy codec's
            schedule) instead of copying; ``copy_reason`` says why it copies if it must.
    """

    def __init__(
        self,
        ctx: DeviceContext,
        dtype: Any,
        count: int,
        out_count: int,
        in_place: bool,
        follow: bool = False,
    ) -> None:
        self.ctx = ctx
        self.dtype = dtype
        self.count, self.out_count = count, out_count
        if in_place and follow:
            raise ValueError("a graph that follows the caller's buffers needs two of its own")
        self.in_place = in_place
        self.follow = follow
        self.graph: Any = None
        self.rebase: Rebase | None = None
        self.copy_reason = "" if follow else "the schedule's messages are the caller's data"
        self._keep: list[Any] = []  # memory allocated during capture, owned by the graph
        self.pool: BufferPool | None = None
        self._in: Any = None
        self._out: Any = None

    @property
    def follows(self) -> bool:
        """Whether replays run on the caller's buffers (no copies)."""
        return self.rebase is not None

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
        keep = _allocator_into(self._keep)
        with ctx.device:
            self._in = cp.empty(max(1, self.in_nbytes), dtype=cp.uint8)
            self._out = self._in if self.in_place else cp.empty(max(1, self.out_nbytes), cp.uint8)
            self.pool = device_pool(ctx.device)
            x = self._in[: self.in_nbytes].view(self.dtype)
            out = self._out[: self.out_nbytes].view(self.dtype)
            spans = [CapturedBuffer(0, self._in.data.ptr, self.in_nbytes)]
            if not self.in_place:
                spans.append(CapturedBuffer(1, self._out.data.ptr, self.out_nbytes))
            watched = WatchedTransport(transport, spans)
            origin = ctx.capture
            error: BaseException | None = None
            # Every allocation while capturing (the pool's buffers, a codec's temporaries)
            # comes from `keep`, so nothing the graph reads or writes is freed while the
            # graph lives. Relaxed mode lets the memory pool grow during the capture.
            with cp.cuda.using_allocator(keep):
                origin.begin_capture(cp.cuda.runtime.streamCaptureModeRelaxed)
                try:
                    ctx.enter(origin)
                    run_streamed(build(self.pool, x, out), watched, ctx, depth=depth)
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
            if self.follow:
                self._follow(spans, watched.touched)

    def _follow(self, spans: list[CapturedBuffer], touched: str) -> None:
        """Find the nodes that hold the captured buffers' addresses; then the graph's own
        buffers are no longer needed (every replay points it at the caller's first)."""
        if touched:
            self.copy_reason = touched
            return
        try:
            self.rebase = Rebase(self.graph.graph, self.graph.graphExec, spans)
        except NotRebasable as exc:
            self.copy_reason = str(exc)
            return
        self._in = self._out = None

    def replay(self, caller: Any, src_ptr: int, dst_ptr: int) -> None:
        """One call on the compute stream, ordered after ``caller``'s work and before its
        next: the graph pointed at the caller's buffers and launched, or the input copied
        in, the graph launched and the result copied out."""
        import cupy as cp  # noqa: PLC0415

        ctx, runtime = self.ctx, cp.cuda.runtime
        ctx.enter(caller, all_streams=False)
        if self.rebase is not None:
            try:
                self.rebase.point_at((src_ptr, dst_ptr))
            except NotRebasable as exc:  # the driver refused an update it took before
                raise CocclError(f"pointing a CUDA graph at the call's buffers: {exc}") from exc
            self.graph.launch(ctx.compute)
            ctx.leave(caller, all_streams=False)
            return
        kind = runtime.memcpyDeviceToDevice
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
        self.rebase = None
        self._keep.clear()
        self.pool = None
        self._in = self._out = None


class CallerCapture:
    """Memory of the schedules recorded into CUDA graphs that callers capture themselves
    (``torch.cuda.graph``, CuPy stream capture), on one device.

    A call made while its caller's stream captures runs the streamed engine as usual: its
    streams fork from the caller's stream and join it again by events, so the capture
    records every kernel and NCCL operation, and each replay of the caller's graph runs
    the whole call. What those operations touch must outlive the caller's graph, which
    coccl cannot see: every buffer allocated while recording (a fresh pool's, a codec's
    temporaries) is kept here as long as the communicator lives.
    """

    def __init__(self, ctx: DeviceContext) -> None:
        self.ctx = ctx
        self._keep: list[Any] = []

    def record(
        self,
        build: BuildRounds,
        transport: StreamedTransport,
        depth: int,
        caller: Any,
        x: Any,
        out: Any,
    ) -> None:
        """Run the schedule ``build`` gives on ``x`` and ``out`` into ``caller``'s capture."""
        import cupy as cp  # noqa: PLC0415

        keep = _allocator_into(self._keep)
        pool = device_pool(self.ctx.device)
        self._keep.append(pool)
        with cp.cuda.using_allocator(keep):
            self.ctx.enter(caller)
            run_streamed(build(pool, x, out), transport, self.ctx, depth=depth)
            self.ctx.leave(caller)


def _allocator_into(kept: list[Any]) -> Callable[[int], Any]:
    """A CuPy allocator (``cupy.cuda.using_allocator``) drawing on the default memory pool
    that appends every allocation to ``kept``, so nothing a captured graph touches is
    freed while its owner holds ``kept``. The pool may have to grow (``cudaMalloc``)
    while a stream captures: that runs with this thread in relaxed capture mode, as
    torch's caching allocator does, since a global or thread-local capture (cudagraph
    trees capture thread-local) forbids it otherwise; the memory is never freed before
    the graph, so no replay can meet it reused."""
    import cupy as cp  # noqa: PLC0415

    memory_pool = cp.get_default_memory_pool()

    def keep(nbytes: int) -> Any:
        with relaxed_thread():
            memory = memory_pool.malloc(nbytes)
        kept.append(memory)
        return memory

    return keep


_THREAD_LOCAL = 1  # CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
_RELAXED = 2  # CU_STREAM_CAPTURE_MODE_RELAXED
_exchange: list[Any] = []  # the driver's cuThreadExchangeStreamCaptureMode, or None


def _exchange_function() -> Any:
    if not _exchange:
        try:
            fn = ctypes.CDLL("libcuda.so.1").cuThreadExchangeStreamCaptureMode
            fn.argtypes = [ctypes.POINTER(ctypes.c_int)]
            fn.restype = ctypes.c_int
        except (OSError, AttributeError):
            fn = None
        _exchange.append(fn)
    return _exchange[0]


@contextlib.contextmanager
def relaxed_thread() -> Iterator[None]:
    """This thread's CUDA calls in the block are judged as in a relaxed-mode capture
    (``cuThreadExchangeStreamCaptureMode``), whatever mode a capture in progress has;
    without the driver library, the block runs as it is."""
    fn = _exchange_function()
    mode = ctypes.c_int(_RELAXED)
    exchanged = fn is not None and fn(ctypes.byref(mode)) == 0
    try:
        yield
    finally:
        if exchanged:
            fn(ctypes.byref(mode))  # mode holds the thread's previous mode


def ignore_other_threads_captures() -> None:
    """From now on, this thread's CUDA calls are judged only by captures of its own
    (``cuThreadExchangeStreamCaptureMode`` to thread-local), not by another thread's
    global-mode capture, which an event query from here would otherwise invalidate (the
    caller's ``torch.cuda.graph``, say). For threads coccl owns, which query events of
    earlier calls while the caller may capture (as torch's NCCL watchdog does); without
    the driver library, nothing changes."""
    fn = _exchange_function()
    if fn is not None:
        fn(ctypes.byref(ctypes.c_int(_THREAD_LOCAL)))
