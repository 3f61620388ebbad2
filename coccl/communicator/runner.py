"""The runner: every way a settled plan runs, and its CUDA graph's capture.

A call whose plan is settled takes one of these paths (``Runner.run``):

* NCCL's own collective, or the plan's CUDA graph, enqueued on the caller's stream from
  the buffers' addresses alone (the thin path);
* host data: the polling engine over MPI (``coccl.engine.polling``), codec kernels inline
  or on a worker thread;
* device data over NCCL: the streamed engine on coccl's streams
  (``coccl.engine.streamed``), captured as a graph at the plan's second call when the plan
  allows one, and replayed from then on;
* device data over MPI (staged through pinned memory, or CUDA-aware): the polling engine
  with kernels on coccl's compute stream;
* a call made while the caller's stream captures a CUDA graph of its own: recorded into
  that graph (``coccl.engine.graphs.CallerCapture``), over NCCL only.

A failure from the first byte on breaks the communicator (``on_failure``). Tools run a
plan's schedule eagerly through the one declared call ``run_from_host``.
"""

from __future__ import annotations

import copy
import itertools
import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from coccl import algorithms
from coccl.communicator.collectives import KINDS, check_in_place
from coccl.communicator.dp_plans import dp_rounds
from coccl.communicator.plans import STOCHASTIC_REPLAY, CallPlan, PlanCache
from coccl.communicator.resources import Resources
from coccl.communicator.sizing import INLINE_CHUNK_BYTES, replays
from coccl.compressors import require_graph_safe
from coccl.config import Settings
from coccl.core.arrays import (
    Flat,
    as_flat,
    caller_stream,
    data_ptr,
    dtype_name,
    is_contiguous,
    new_like,
    require_writeable,
    signature,
)
from coccl.core.pool import BufferPool, host_pool
from coccl.core.transport import PollingTransport
from coccl.engine.device import DeviceContext
from coccl.engine.graphs import CallerCapture, CallGraph
from coccl.engine.polling import CpuExecutor, GpuExecutor, InlineExecutor, run_polling
from coccl.engine.streamed import run_streamed
from coccl.errors import GraphCaptureError

log = logging.getLogger(__name__)


class Runner:
    """Runs one communicator's plans (see the module docstring).

    Args:
        rank, size: this process's rank and the number of ranks.
        resources: the communicator's transports, watchdog and codec thread.
        plans: the plan cache (a capture that fails returns its graph's charge to it).
        settings: the communicator's ``COCCL_*`` settings.
        cpu_threads: threads of the CPU codec kernels' worker.
        on_failure: called with the exception when a call fails after bytes moved.
    """

    def __init__(
        self,
        rank: int,
        size: int,
        resources: Resources,
        plans: PlanCache,
        settings: Settings,
        cpu_threads: int,
        on_failure: Callable[[BaseException], None],
    ) -> None:
        self.rank, self.size = rank, size
        self.resources = resources
        # stochastic calls in issue order: the salts' call numbers (ScheduleArgs.call)
        self._stochastic_calls = itertools.count()
        self._stochastic_sends = itertools.count()
        self.host: PollingTransport = resources.host
        self.nccl = resources.nccl
        self.plans = plans
        self.settings = settings
        self.cpu_threads = cpu_threads
        self.on_failure = on_failure
        self.host_pool = host_pool()
        self.devices: dict[int, DeviceContext] = {}
        self.caller_captures: dict[int, CallerCapture] = {}

    # --------------------------------------------------------------- the call
    def run(self, plan: CallPlan, x: Any, out: Any) -> Any:
        """Run a call whose plan is settled: per-call checks first (before any byte
        moves), then the route's path; a failure from then on breaks the communicator."""
        caller = None if plan.route == "host" else caller_stream(x)
        if caller is not None and _capturing(caller):
            return self._run_in_caller_capture(plan, x, out, caller)
        if plan.route == "nccl" and (plan.algorithm == "native" or plan.graph is not None):
            return self._run_nccl_launch(plan, x, out, caller)
        src = as_flat(x, "x")  # checks contiguity, which the plan's key does not cover
        dst = self._output(plan, src, out)
        plan.calls += 1
        try:
            if plan.route == "host":
                self._run_host(plan, src, dst)
            else:
                self._run_device(plan, src, dst, caller)
        except BaseException as exc:
            self.on_failure(exc)
            raise
        return dst.obj

    def run_from_host(
        self, plan: CallPlan, x: Any, transport: PollingTransport | None = None
    ) -> Any:
        """Run ``plan``'s schedule eagerly from the host (never a graph) on a new output,
        and return it: the declared call of tools (``coccl.communicator.overlap``).
        ``transport``: every message goes through this polling transport instead (device
        data then runs on the polling engine); a stand-in codec comes in ``plan.codec``."""
        runner = self if transport is None else self._over(transport)
        src = as_flat(x, "x")
        dst = runner._output(plan, src, None)
        if plan.route == "host":
            runner._run_host(plan, src, dst)
            return dst.obj
        ctx = runner._device(plan.device)
        caller = caller_stream(x)
        with ctx.device:
            if transport is None and plan.route == "nccl":
                runner._run_streamed(plan, src, dst, ctx, caller)
            else:
                runner._run_staged(plan, src, dst, ctx, caller)
        return dst.obj

    def _over(self, transport: PollingTransport) -> Runner:
        """This runner with ``transport`` as its host transport (the same pools, device
        contexts and codec thread)."""
        runner = copy.copy(self)
        runner.host = transport
        return runner

    # ------------------------------------------------------------- outputs
    def _output(self, plan: CallPlan, src: Flat, out: Any) -> Flat:
        """The call's output as a flat view: ``out`` checked, or a new array."""
        if out is None:
            data, obj = src.new(KINDS[plan.collective].result_shape(src.shape, self.size))
            return Flat(data, obj, src.kind, tuple(getattr(obj, "shape", ())), src.new)
        self.check_out(plan, src.obj, out)
        return as_flat(out, "out")

    def _checked_output(self, plan: CallPlan, x: Any, out: Any) -> Any:
        """``_output`` from attributes alone, for the thin path: the same checks, and a
        new result of ``x``'s kind when ``out`` is None."""
        if not is_contiguous(x):
            as_flat(x, "x")  # raises the contiguity error
        if out is None:
            return new_like(x, KINDS[plan.collective].result_shape(tuple(x.shape), self.size))
        self.check_out(plan, x, out)
        return out

    def check_out(self, plan: CallPlan, x: Any, out: Any) -> None:
        """The checks of a given ``out`` of the call of ``x``, from their attributes,
        before any byte moves: writeable, contiguous, of the plan's dtype, count and
        device, and apart from ``x`` unless in place as the collective defines it
        (``KINDS``: a partial overlap would read values the call has overwritten)."""
        require_writeable(out, "out")
        kind, dtype, count, device = signature(out)
        if kind == "other" or not isinstance(dtype, np.dtype) or not is_contiguous(out):
            as_flat(out, "out")  # raises the type, dtype or contiguity error
        if dtype != plan.dtype:
            raise TypeError(f"out has dtype {dtype_name(dtype)}, x has {dtype_name(plan.dtype)}")
        if count != plan.out_count:
            raise ValueError(f"out has {count} elements; {plan.collective} needs {plan.out_count}")
        if device != plan.device:
            raise ValueError("out must be on the same device as x")
        check_in_place(
            plan.collective, self.rank, x, plan.count * dtype.itemsize, out,
            count * dtype.itemsize, equal_split=plan.sends == plan.recvs,
        )  # fmt: skip

    # --------------------------------------------------------------- paths
    def _run_nccl_launch(self, plan: CallPlan, x: Any, out: Any, stream: Any) -> Any:
        """The thin per-call path over NCCL: NCCL's own collective, or the plan's CUDA
        graph, enqueued on the caller's stream from the buffers' addresses alone (no
        array views, and for ``native`` no coccl stream or event but the watchdog's)."""
        out = self._checked_output(plan, x, out)
        plan.calls += 1
        nccl = self.nccl
        try:
            if plan.graph is None:
                nccl.native_ptrs(
                    plan.collective, data_ptr(x), data_ptr(out), plan.count, plan.dtype,
                    plan.op, stream.ptr,
                )  # fmt: skip
            else:
                with plan.graph.ctx.device:
                    plan.graph.replay(stream, data_ptr(x), data_ptr(out))
                nccl.bytes_sent += plan.bytes_per_call
        except BaseException as exc:
            self.on_failure(exc)
            raise
        self.resources.watchdog.track(stream, plan.label)
        return out

    def _run_host(self, plan: CallPlan, src: Flat, dst: Flat) -> None:
        """Host data: the polling engine over MPI."""
        if plan.algorithm == "native":
            algorithms.native.run(self.host, plan.collective, src.data, dst.data, plan.op)
            return
        run_polling(
            self._rounds(plan, self.host_pool, src.data, dst.data),
            self.host,
            self._executor(min(plan.chunk_elems, plan.count) * plan.dtype.itemsize),
            depth=plan.depth,
            timeout_s=self.settings.timeout_s,
            label=plan.label,
        )

    def _run_device(self, plan: CallPlan, src: Flat, dst: Flat, caller: Any) -> None:
        """Device data: staged over MPI, or over NCCL (captured at the second call of a
        plan that allows a graph, replayed from then on)."""
        ctx = self._device(plan.device)
        with ctx.device:
            if plan.route != "nccl":
                self._run_staged(plan, src, dst, ctx, caller)
                return
            if plan.graph is None and plan.graph_bytes and plan.calls >= 2:
                self._capture(plan, ctx)
            if plan.graph is not None:
                plan.graph.replay(caller, data_ptr(src.data), data_ptr(dst.data))
                self.nccl.bytes_sent += plan.bytes_per_call
            else:
                sent = self.nccl.bytes_sent
                self._run_streamed(plan, src, dst, ctx, caller)
                plan.bytes_per_call = self.nccl.bytes_sent - sent
            self.resources.watchdog.track(caller, plan.label)

    def _run_in_caller_capture(self, plan: CallPlan, x: Any, out: Any, caller: Any) -> Any:
        """The caller's stream captures a CUDA graph of its own: record the call into it
        (the streamed engine, or NCCL's own collective, on the caller's stream), or refuse
        before anything is enqueued where a recording could not replay correctly."""
        require_graph_safe(plan.codec, f"a Communicator {plan.label}")
        if plan.stochastic:
            raise GraphCaptureError(
                f"{plan.label}: {STOCHASTIC_REPLAY}; make this call outside the capture, or "
                "pick a codec that rounds to nearest"
            )
        if plan.route != "nccl":
            raise _staged_capture_error(plan.label)
        if plan.calls == 0:
            raise GraphCaptureError(
                f"{plan.label}: run this call once before capturing it (NCCL connects the "
                "peers at a plan's first call, which a capture cannot record; the warm-up "
                "iterations torch.cuda.graph asks for do this)"
            )
        src = as_flat(x, "x")
        dst = self._output(plan, src, out)
        plan.calls += 1
        ctx = self._device(plan.device)
        try:
            with ctx.device:
                if plan.algorithm == "native":
                    self.nccl.native_ptrs(
                        plan.collective, data_ptr(src.data), data_ptr(dst.data), plan.count,
                        plan.dtype, plan.op, caller.ptr,
                    )  # fmt: skip
                    return dst.obj
                capture = self.caller_captures.get(plan.device)
                if capture is None:
                    capture = self.caller_captures[plan.device] = CallerCapture(ctx)
                build = lambda pool, a, b: self._rounds(plan, pool, a, b)  # noqa: E731
                capture.record(build, self.nccl, plan.depth, caller, src.data, dst.data)
        except Exception as exc:
            raise GraphCaptureError(
                f"recording {plan.label} into the caller's CUDA graph failed ({exc}); "
                "coccl allocates its buffers while recording, with the thread in relaxed "
                "capture mode: if the capture still forbids a call, capture with "
                "capture_error_mode='relaxed' (torch.cuda.graph) or cudaStreamCaptureModeRelaxed"
            ) from exc
        return dst.obj

    def _run_streamed(
        self, plan: CallPlan, src: Flat, dst: Flat, ctx: DeviceContext, caller: Any
    ) -> None:
        """Device data over NCCL, run from the host: the streamed engine on coccl's
        streams, ordered after ``caller``'s work and before its next."""
        ctx.enter(caller)
        rounds = self._rounds(plan, ctx.pool, src.data, dst.data)
        run_streamed(rounds, self.nccl, ctx, depth=plan.depth)
        ctx.leave(caller)

    def _run_staged(
        self, plan: CallPlan, src: Flat, dst: Flat, ctx: DeviceContext, caller: Any
    ) -> None:
        """Device data over MPI: the polling engine with kernels on coccl's compute stream
        (staging copies run on it too)."""
        ctx.enter(caller, host=self.host.cuda_aware)
        with ctx.compute:
            if plan.algorithm == "native":
                algorithms.native.run(self.host, plan.collective, src.data, dst.data, plan.op)
            else:
                run_polling(
                    self._rounds(plan, ctx.pool, src.data, dst.data),
                    self.host,
                    GpuExecutor(ctx.compute),
                    depth=plan.depth,
                    timeout_s=self.settings.timeout_s,
                    label=plan.label,
                )
        ctx.leave(caller)

    # ------------------------------------------------------------- capture
    def _capture(self, plan: CallPlan, ctx: DeviceContext) -> None:
        """Record ``plan``'s schedule as a CUDA graph; every rank then replays it, or, if
        the capture failed anywhere, none does (NCCL needs the same on every rank)."""
        graph = CallGraph(
            ctx, plan.dtype, plan.count, plan.out_count, plan.graph_in_place,
            follow=plan.graph_follows,
        )  # fmt: skip
        sent = self.nccl.bytes_sent
        why = ""
        try:
            graph.capture(
                lambda pool, x, out: self._rounds(plan, pool, x, out), self.nccl, plan.depth
            )
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
        self.nccl.bytes_sent = sent  # capturing moved nothing
        outcomes = self.resources.boot.allgather(
            (why, graph.follows, graph.copy_reason),
            self.settings.timeout_s,
            "agreeing on a capture",
        )
        reason = _refusal(plan, outcomes)
        if reason:
            graph.release()
            self.plans.drop_graph(plan, reason)
            log.debug("%s: %s; it runs from the host", plan.label, plan.graph_reason)
            return
        if all(follows for _, follows, _ in outcomes):  # no rank holds buffers of its own
            self.plans.refund(plan, plan.graph_buffer_bytes)
        plan.graph = graph
        log.debug(
            "%s of %d elements: captured as a CUDA graph, replayed on %s",
            plan.label, plan.count,
            "the caller's buffers" if graph.follows else f"copies ({graph.copy_reason})",
        )  # fmt: skip

    # ------------------------------------------------------------- helpers
    def stream_call(self, *codecs: Any, p2p: bool = False) -> int:
        """The next call number of a stochastic codec's salts (``algorithms.stream_call``)
        if any of ``codecs`` is stochastic, else 0: one count for the collectives (the
        same on every rank, which issue them in the same order), one for this rank's
        point-to-point sends."""
        if not any(c is not None and c.stochastic for c in codecs):
            return 0
        counter = self._stochastic_sends if p2p else self._stochastic_calls
        return algorithms.stream_call(next(counter), p2p=p2p)

    def _rounds(self, plan: CallPlan, pool: BufferPool, x: Any, out: Any) -> Any:
        """The rounds of ``plan``'s schedule on flat ``x`` and ``out``, with ``plan.codec``
        on the wire."""
        aplan = algorithms.ScheduleArgs(
            rank=self.rank,
            size=self.size,
            codec=plan.codec,
            dtype=plan.dtype,
            op=plan.op,
            chunk_elems=plan.chunk_elems,
            pool=pool,
            label=plan.label,
            depth=plan.depth,
            gather=plan.gather,
            call=self.stream_call(plan.codec, plan.inter_codec),
        )
        if plan.residual is None:  # feedback needs every sum it encodes: no fused hop
            aplan.hop = algorithms.hop_kernel(plan.codec, x, plan.dtype, plan.op)
        aplan.residual = plan.residual
        rounds = dp_rounds(plan, aplan, x, out)
        if rounds is not None:
            return rounds
        return algorithms.schedule(plan.algorithm, plan.collective)(aplan, x, out)

    def _device(self, device_id: int | None) -> DeviceContext:
        assert device_id is not None  # only called for device data
        ctx = self.devices.get(device_id)
        if ctx is None:
            ctx = self.devices[device_id] = DeviceContext.create(device_id)
        return ctx

    def _executor(self, chunk_nbytes: int) -> Any:
        if chunk_nbytes <= INLINE_CHUNK_BYTES:
            return InlineExecutor()
        if self.resources.cpu is None:
            self.resources.cpu = CpuExecutor(self.cpu_threads)
        return self.resources.cpu


def _capturing(stream: Any) -> bool:
    """Whether ``stream`` (a CuPy stream) is capturing a CUDA graph."""
    return bool(stream.is_capturing())


def refuse_staged_capture(caller: Any, label: str) -> None:
    """Raise ``GraphCaptureError`` when ``caller`` captures a CUDA graph and ``label``'s
    device data would move through the host (MPI): checked before anything is enqueued,
    as ``Runner._run_in_caller_capture`` does for the collectives."""
    if _capturing(caller):
        raise _staged_capture_error(label)


def refuse_p2p_capture(caller: Any, label: str, over: str) -> None:
    """Raise ``GraphCaptureError`` when ``caller`` captures a CUDA graph and ``label`` is a
    point-to-point message of device data (``over`` MPI or NCCL), checked before it is
    posted: the engine moves a message at later waits or tests, and its chunk buffers go
    back to coccl's pool once it ends, where a replay would still write them."""
    if _capturing(caller):
        raise GraphCaptureError(
            f"{label} over {over}: point-to-point messages are not recorded into the "
            "caller's CUDA graph (coccl moves them at later waits and reuses their buffers "
            "once they end); make this call outside the capture"
        )


def _staged_capture_error(label: str) -> GraphCaptureError:
    """The refusal of a capture whose device data would move over MPI (every call kind)."""
    return GraphCaptureError(
        f"{label}: device data over MPI moves through host memory while the call runs, "
        "which a CUDA graph cannot record; capture over backend='nccl' (one GPU per rank), "
        "or make this call outside the capture"
    )


def _refusal(plan: CallPlan, outcomes: list[tuple[str, bool, str]]) -> str:
    """Why no rank replays ``plan``'s captured graph ("" if every rank does): a capture
    failed somewhere, or a rank's graph copies buffers at a size where that costs more
    than a replay saves (``sizing.replays``)."""
    failed = [(r, w) for r, (w, _, _) in enumerate(outcomes) if w]
    copying = [(r, c) for r, (_, follows, c) in enumerate(outcomes) if not follows]
    nbytes = plan.count * plan.dtype.itemsize
    if failed:
        return "CUDA graph capture failed on rank {}: {}".format(*failed[0])
    if copying and not replays(plan.link, nbytes, follows=False):
        return (
            "its graph would copy the buffers on rank {} ({}), which costs more than a "
            "replay saves at this size (coccl.communicator.sizing)".format(*copying[0])
        )
    return ""
