"""The Communicator: coccl's public face for collectives.

A call is checked, resolved, sized and run. The first three happen once per call
signature, when the call's plan is built (coccl/plans.py: every rank checks that the
others make the same call, before any byte moves); a repeated call looks its plan up and
runs it. Host (numpy, CPU torch) data travels over the host transport (MPI); device data
over NCCL, or over MPI (directly if CUDA-aware, else through pinned host staging). Over
NCCL a plan's schedule is replayed from a CUDA graph from its second call on
(coccl/graphs.py), and NCCL's own collectives run straight on the caller's stream.

A failure after bytes have moved (a timeout, an error, an interrupt) leaves the
communicator unusable: its peers' state is unknown, so every later call raises
``CocclError`` saying so, instead of pairing the wrong messages or hanging.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from coccl import algorithms
from coccl.arrays import (
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
from coccl.bootstrap import Bootstrap, MpiBootstrap, node_ranks
from coccl.compressors import Compressor, get_compressor
from coccl.config import SCHEDULE_SETTINGS, Settings, configure_logging, settings
from coccl.device import DeviceContext
from coccl.errors import CocclError
from coccl.graphs import CallGraph
from coccl.plans import CallPlan, PlanCache, disagreement
from coccl.polling import CpuExecutor, GpuExecutor, InlineExecutor, run_polling
from coccl.pool import BufferPool, host_pool
from coccl.reduction import check_op
from coccl.sizing import (
    INLINE_CHUNK_BYTES,
    chunk_elems,
    default_chunk_bytes,
    local_cpu_threads,
    needs_accumulator,
    pipeline_depth,
    replay_max_bytes,
    replays,
    staging_limit,
    window_bytes,
)
from coccl.streamed import run_streamed
from coccl.transport import PollingTransport
from coccl.watchdog import Watchdog

log = logging.getLogger(__name__)


class Call(NamedTuple):
    """A collective call's arguments, as the caller gave them (what a plan is built from)."""

    collective: str
    x: Any
    op: Any
    algorithm: Any
    compressor: Any
    chunk_bytes: Any


BACKENDS = ("auto", "mpi", "nccl")
# Launchers' variables that give the job's rank count: a 1-rank MPI world under one of
# them is a launch mistake (mpi4py built against another MPI, torchrun without mpiexec).
_LAUNCHER_SIZES = (
    ("WORLD_SIZE", "torchrun / torch.distributed"),
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpiexec"),
    ("PMI_SIZE", "MPICH's mpiexec (Hydra)"),
    ("PMIX_SIZE", "a PMIx launcher"),
    ("SLURM_STEP_NUM_TASKS", "Slurm's srun"),
)


class Communicator:
    """A group of ranks that run collectives together (build it with ``coccl.init``).

    Attributes:
        rank: this process's rank.
        size: the number of ranks.
        backend: ``"mpi"`` or ``"nccl"``, the transport for device arrays (host arrays
            always travel over the host transport, MPI).
        link: the class of link NCCL uses between the ranks (``nvlink``, ``pcie``,
            ``shm``, ``socket``, ``net``; ``self`` for one rank), or ``"mpi"``.
    """

    def __init__(
        self,
        boot: Bootstrap,
        host: PollingTransport,
        env: Settings,
        *,
        nccl: Any = None,
        link: str = "mpi",
        cpu_threads: int = 1,
        host_pipelined: bool = True,
    ) -> None:
        self._boot = boot
        self._host = host
        self._nccl = nccl
        self._settings = env
        self.rank: int = boot.rank
        self.size: int = boot.size
        self.backend: str = "nccl" if nccl is not None else "mpi"
        self.link = link
        self._cpu_threads = cpu_threads
        self._host_pipelined = host_pipelined
        self._host_pool = host_pool()
        self._devices: dict[int, DeviceContext] = {}
        self._codecs: dict[str, Compressor] = {}
        self._plans = PlanCache(env.plan_cache_bytes)
        self._closed = False
        self._broken: str | None = None
        self._watchdog: Watchdog | None = None
        if nccl is not None:
            me = weakref.ref(self)
            self._watchdog = Watchdog(
                nccl.device_id,
                env.timeout_s,
                lambda message: _expired(me, message),
                nccl.check_async_error,
            )
        _set_numba_threads(cpu_threads)
        self._resources = _Resources(boot, host, nccl, self._watchdog)
        self._finalizer = weakref.finalize(self, _release_unclosed, self._resources, repr(self))
        self._finalizer.atexit = False  # at exit, MPI_Finalize frees what is left

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._closed:
            state = "closed"
        else:
            state = f"rank={self.rank}, size={self.size}"
        return f"Communicator({state}, backend={self.backend!r})"

    def close(self) -> None:
        """Free the communicator's MPI duplicates, NCCL communicator, graphs and threads."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        if self._broken is not None and self._nccl is not None:
            self._nccl.abort()  # first: a graph's memory is freed once its work has ended
        for plan in self._plans.clear():
            _release_graph(plan)
        self._resources.release(abort=self._broken is not None)

    def abort(self) -> None:
        """Free the communicator without waiting for its peers (``ncclCommAbort``): after
        a failure, or when a peer is known to be gone. The communicator is then closed."""
        if self._closed:
            return
        self._broken = self._broken or "aborted"
        self.close()

    def barrier(self) -> None:
        """Block until every rank has called ``barrier`` (at most COCCL_TIMEOUT_S)."""
        self._check_usable()
        self._boot.allgather(None, self._settings.timeout_s, "barrier")

    # -------------------------------------------------------------- collectives
    def allreduce(
        self,
        x: Any,
        out: Any = None,
        *,
        op: str = "sum",
        algorithm: str = "auto",
        compressor: str | dict | Compressor = "identity",
        chunk_bytes: int | None = None,
    ) -> Any:
        """Reduce ``x`` across ranks; every rank gets the (bitwise identical) result.

        Args:
            x: contiguous numpy/CuPy/numba-device array or torch tensor, any shape.
            out: optional output of ``x``'s size, dtype and device; may be ``x``.
            op: ``"sum"``, ``"avg"``, or with the identity codec ``"max"``, ``"min"``,
                ``"prod"``.
            algorithm: ``"ring"``, ``"two_shot"``, ``"native"`` or ``"auto"`` (a lossy
                codec is always used; auto picks its schedule, or for identity the
                transport's own collective or coccl's two-shot, from a measured table).
            compressor: a codec name, config dict or Compressor.
            chunk_bytes: pipeline chunk size (default: coccl/sizing.py's rules).

        Returns:
            ``out``, or a new array of ``x``'s kind, shape, dtype and device.

        Example:
            >>> y = comm.allreduce(x, algorithm="two_shot", compressor="taco")
        """
        return self._collective("allreduce", x, out, op, algorithm, compressor, chunk_bytes)

    def reduce_scatter(
        self,
        x: Any,
        out: Any = None,
        *,
        op: str = "sum",
        algorithm: str = "auto",
        compressor: str | dict | Compressor = "identity",
        chunk_bytes: int | None = None,
    ) -> Any:
        """Reduce ``x`` (``size * n`` elements) and keep shard ``rank`` (``n`` elements),
        as ``ncclReduceScatter``. A new result has shape ``(x.shape[0] // size,
        *x.shape[1:])`` when the first dimension divides, else ``(n,)``."""
        return self._collective("reduce_scatter", x, out, op, algorithm, compressor, chunk_bytes)

    def allgather(
        self,
        x: Any,
        out: Any = None,
        *,
        algorithm: str = "auto",
        compressor: str | dict | Compressor = "identity",
        chunk_bytes: int | None = None,
    ) -> Any:
        """Gather every rank's ``x`` (``n`` elements) into ``size * n`` elements, rank
        ``r``'s at offset ``r * n``, as ``ncclAllGather``. A new result has shape
        ``(size * x.shape[0], *x.shape[1:])`` (``(size,)`` for a 0-d ``x``)."""
        return self._collective("allgather", x, out, "sum", algorithm, compressor, chunk_bytes)

    def describe(
        self,
        collective: str,
        x: Any,
        out: Any = None,
        *,
        op: str = "sum",
        algorithm: str = "auto",
        compressor: str | dict | Compressor = "identity",
        chunk_bytes: int | None = None,
    ) -> dict[str, Any]:
        """What a call with these arguments runs, and why, without moving a byte (a
        local query: no rank is asked). Keys: ``algorithm``, ``compressor`` (config),
        ``reason``, ``transport``, ``route``, ``link``, ``chunk_bytes``, ``depth``,
        ``allgather_phase``, ``graph`` (replayed from a CUDA graph), ``graph_reason``,
        ``graph_buffers`` (``"caller's"``: replays run on the call's buffers; ``"copies"``:
        the input is copied in and the result out; ``""``: no graph yet),
        ``graph_copy_reason``.

        Raises the errors the call itself would raise for bad arguments."""
        self._check_usable()
        if collective not in algorithms.COLLECTIVES:
            raise ValueError(
                f"unknown collective {collective!r}; coccl has {algorithms.COLLECTIVES}"
            )
        call = Call(collective, x, op, algorithm, compressor, chunk_bytes)
        plan = self._plans.get(self._key(call))
        return (plan or self._resolve(call)).describe()

    def overlap_profile(
        self,
        collective: str,
        x: Any,
        *,
        algorithm: str,
        compressor: str | dict | Compressor,
        chunk_bytes: int | None = None,
        iters: int = 5,
        op: str = "sum",
    ) -> dict[str, float]:
        """Time one pipelined collective against its two halves (``coccl.overlap``):
        pipelined, codec-only and transport-only, medians of ``iters`` runs, the slowest
        rank's. Collective: every rank must call it.

        Returns:
            ``{"pipelined_s", "codec_only_s", "transport_only_s", "overlap_efficiency"}``.
        """
        from coccl import overlap  # noqa: PLC0415

        return overlap.profile(
            self, collective, x, algorithm=algorithm, compressor=compressor,
            chunk_bytes=chunk_bytes, iters=iters, op=op,
        )  # fmt: skip

    # ------------------------------------------------------------- statistics
    def pools(self) -> list[BufferPool]:
        """Every buffer pool this communicator uses (for memory statistics)."""
        pools = [self._host_pool, *self._host.pools()]
        pools += [ctx.pool for ctx in self._devices.values()]
        pools += [p.graph.pool for p in self._plans.values() if p.graph and p.graph.pool]
        if self._nccl is not None:
            pools += self._nccl.pools()
        return pools

    def stats(self) -> dict[str, int]:
        """Counters for benchmarks: payload bytes this rank sent point to point (native
        collectives not counted), and the peak extra memory the pipeline's pools held in
        use (host, pinned host, device), since the last ``reset_stats``."""
        peaks = {"host": 0, "pinned": 0, "device": 0}
        for pool in self.pools():
            peaks[pool.kind] += pool.peak_in_use_bytes
        return {
            "bytes_sent": sum(t.bytes_sent for t in self._transports()),
            **{f"peak_{kind}_bytes": value for kind, value in peaks.items()},
            "pool_allocated_bytes": sum(p.allocated_bytes for p in self.pools()),
            "plans": len(self._plans),
            "graph_bytes": self._plans.graph_bytes,
        }

    def reset_stats(self) -> None:
        """Zero the counters of ``stats``."""
        for t in self._transports():
            t.bytes_sent = 0
        for pool in self.pools():
            pool.reset_peak()

    def _transports(self) -> list[Any]:
        return [self._host] + ([self._nccl] if self._nccl is not None else [])

    # ---------------------------------------------------------------- the call
    def _check_usable(self) -> None:
        if self._closed:
            raise CocclError("this communicator is closed")
        if self._broken is not None:
            raise CocclError(
                f"this communicator is unusable after an earlier failure ({self._broken}); "
                "its peers' state is unknown: create a new one with coccl.init()"
            )

    def _break(self, exc: BaseException) -> None:
        """A failure after bytes moved: from now on every call raises (see the module
        docstring); NCCL is aborted so that no kernel keeps waiting for a peer."""
        if self._broken is None:
            self._broken = f"{type(exc).__name__}: {exc}"
            if self._nccl is not None:
                self._nccl.abort()

    @staticmethod
    def _key(call: Call) -> Any:
        """A call's signature (None if an argument is unhashable: the checks will say)."""
        _, dtype, count, device = signature(call.x)
        compressor = call.compressor
        if isinstance(compressor, dict):
            try:
                compressor = ("config", json.dumps(compressor, sort_keys=True))
            except TypeError:
                return None
        elif isinstance(compressor, Compressor):
            compressor = ("object", id(compressor))
        key = (
            call.collective, dtype, count, device, call.op, call.algorithm, compressor,
            call.chunk_bytes,
        )  # fmt: skip
        try:
            hash(key)
        except TypeError:
            return None
        return key

    def _collective(
        self,
        collective: str,
        x: Any,
        out: Any,
        op: str,
        algorithm: str,
        compressor: Any,
        chunk_bytes: int | None,
    ) -> Any:
        self._check_usable()
        call = Call(collective, x, op, algorithm, compressor, chunk_bytes)
        return self._run(self._plan(call), x, out)

    def _plan(self, call: Call) -> CallPlan:
        """The call's plan: found by its signature, or built (collectively)."""
        key = self._key(call)
        plan = None if key is None else self._plans.get(key)
        if plan is not None and plan.compressor_arg is not None:
            if plan.compressor_arg is not call.compressor:  # another object at a reused id
                plan = None
        if plan is None:
            plan = self._new_plan(key, call)
        elif self._settings.check_calls:
            self._agree(call.collective, plan.fingerprint(), None)
        return plan

    def _agree(self, collective: str, entry: Any, error: BaseException | None) -> None:
        """Compare this rank's entry with every rank's; raise on every rank if any rank
        refused the call or the ranks disagree. One small exchange of digests when they
        agree; the entries themselves, to name the difference, when they do not."""
        what = f"checking that every rank makes the same {collective} call"
        digest = hashlib.sha1(repr(entry).encode()).hexdigest()
        try:
            digests = self._boot.allgather(digest, self._settings.timeout_s, what)
            entries = None
            if any(d != digests[0] for d in digests):
                entries = self._boot.allgather(entry, self._settings.timeout_s, what)
        except CocclError as exc:
            self._break(exc)
            raise
        if error is not None:
            raise error
        if entries is None:
            return
        problem = disagreement(collective, entries)
        if problem is not None:
            raise CocclError(problem)

    def _new_plan(self, key: Any, call: Call) -> CallPlan:
        """Resolve a call and agree on it with every rank (a refusal on any rank is raised
        on every rank); keep the plan under ``key`` unless it is None."""
        error: BaseException | None = None
        try:
            plan: CallPlan | None = self._resolve(call)
            entry: Any = plan.fingerprint()  # type: ignore[union-attr]
        except (TypeError, ValueError) as exc:
            plan, error, entry = None, exc, ("error", f"{type(exc).__name__}: {exc}")
        self._agree(call.collective, entry, error)
        assert plan is not None
        if isinstance(call.compressor, Compressor):
            plan.compressor_arg = call.compressor
        if key is not None:
            for victim in self._plans.add(key, plan):
                _release_graph(victim)
        log.debug(
            "new plan on rank %d: %s of %d %s elements: %s; route %s, link %s, chunk %d B, "
            "depth %d, graph: %s",
            self.rank, plan.label, plan.count, plan.dtype.name, plan.reason, plan.route,
            plan.link, plan.chunk_bytes, plan.depth,
            "from the second call" if plan.graph_bytes else f"no ({plan.graph_reason})",
        )  # fmt: skip
        return plan

    def _codec(self, spec: Any) -> Compressor:
        """``get_compressor(spec)``, remembered for names: a codec is immutable."""
        if isinstance(spec, str):
            codec = self._codecs.get(spec)
            if codec is None:
                codec = self._codecs[spec] = get_compressor(spec)
            return codec
        return get_compressor(spec)

    # -------------------------------------------------------- resolve and size
    def _resolve(self, call: Call) -> CallPlan:
        """Check a call's arguments and decide everything about it (raises TypeError or
        ValueError for bad arguments, identically on every rank that gets them)."""
        collective, x, op, algorithm, compressor, chunk_bytes = call
        n = self.size
        op = check_op(op)
        requested = algorithms.check_algorithm(algorithm)
        codec = self._codec(compressor)
        src = as_flat(x, "x")
        dtype, count = src.dtype, src.size
        codec.check_dtype(dtype)
        if collective != "allgather":
            codec.check_op(op)
        if requested == "native" and not codec.lossless:
            raise ValueError(
                "algorithm 'native' is the transport's own collective and takes "
                f"compressor='identity', not {codec.codec_id!r}"
            )
        if collective == "reduce_scatter" and count % n:
            raise ValueError(
                f"reduce_scatter needs a multiple of the rank count ({n}) elements, x has {count}"
            )
        if chunk_bytes is not None and (
            isinstance(chunk_bytes, bool)
            or not isinstance(chunk_bytes, (int, np.integer))
            or chunk_bytes < 1
        ):
            raise ValueError(f"chunk_bytes must be a positive integer, got {chunk_bytes!r}")
        device = src.device_id
        route, transport = self._route(device)
        link = self.link if route == "nccl" else route
        nbytes = count * dtype.itemsize
        if requested == "auto":
            choice = algorithms.choose(collective, nbytes, codec, transport.name, link, n)
            if choice.algorithm == "native" and not transport.has_native(collective, dtype, op):
                choice = algorithms.Choice(
                    "ring", choice.codec,
                    f"{transport.name} has no {collective} of {dtype_name(dtype)} with {op!r}",
                )  # fmt: skip
        else:
            choice = algorithms.Choice(requested, codec, "as asked")
            if requested == "native" and not transport.has_native(collective, dtype, op):
                raise TypeError(
                    f"the {transport.name} transport has no native {collective} of "
                    f"{dtype_name(dtype)} with op {op!r}; use algorithm='ring' or 'two_shot'"
                )
        env = self._settings
        out_count = {"allreduce": count, "reduce_scatter": count // n}.get(collective, count * n)
        plan = CallPlan(
            collective=collective,
            op=op,
            dtype=dtype,
            count=count,
            out_count=out_count,
            device=device,
            route=route,
            algorithm=choice.algorithm,
            codec=choice.codec,
            reason=choice.reason,
            requested=(requested, codec.get_config()),
            chunk_bytes=0,
            chunk_elems=0,
            depth=1,
            link=link,
        )
        if choice.algorithm == "native":
            plan.graph_reason = "the transport's own collective: one launch already"
            return plan
        limit = staging_limit(route, env.staging_limit_bytes)
        # Over NCCL the window bound leaves out the accumulator a fused-hop ring never holds;
        # the MPI routes keep the full bound, which set the depths their figures ran with.
        fused_hop = (
            route == "nccl" and choice.codec.reduce_encode_kernel(src.data, dtype) is not None
        )
        accumulates = needs_accumulator(choice.algorithm, collective, op, fused_hop, n)
        chunk = chunk_bytes
        if chunk is None:
            chunk = default_chunk_bytes(
                route,
                settings_chunk=env.chunk_bytes,
                chunk_set=env.chunk_bytes_set,
                host_pipelined=self._host_pipelined,
                limit=limit,
                n=n,
                codec=choice.codec,
                dtype=dtype,
                count=count,
                algorithm=choice.algorithm,
                collective=collective,
                accumulates=accumulates,
            )
        plan.chunk_bytes = int(chunk)
        plan.chunk_elems = chunk_elems(int(chunk), dtype.itemsize, choice.codec.alignment)
        window = partial(
            window_bytes, n, choice.codec, dtype, plan.chunk_elems, choice.algorithm,
            collective, route == "staged", accumulates=accumulates,
        )  # fmt: skip
        plan.depth = pipeline_depth(env.pipeline_depth, limit, window)
        plan.gather = (
            route == "nccl"
            and collective == "allreduce"
            and choice.algorithm == "two_shot"
            and not choice.codec.lossless
            and n > 1
            and algorithms.auto.gather_by_allgather(link, env.nccl_gather)
        )
        if route != "nccl":
            plan.graph_reason = f"{route} data travels over MPI (the host drives each message)"
        elif not env.graphs:
            plan.graph_reason = "COCCL_GRAPHS=0"
        elif not replays(link, nbytes, follows=plan.graph_follows):
            plan.graph_reason = (
                f"from {replay_max_bytes(link) >> 20} MiB on {link} the device outlasts the "
                "host's rounds and a replay would add two copies (coccl/sizing.py)"
            )
        else:
            plan.graph_bytes = plan.graph_buffer_bytes + window(plan.depth)
        return plan

    def _route(self, device: int | None) -> tuple[str, Any]:
        """Where a call's bytes go: ``(route, transport)``."""
        if device is None:
            return "host", self._host
        if self._nccl is not None:
            if device != self._nccl.device_id:
                raise ValueError(
                    f"x is on GPU {device}; this communicator's NCCL runs on GPU "
                    f"{self._nccl.device_id}"
                )
            return "nccl", self._nccl
        return ("device" if self._host.cuda_aware else "staged"), self._host

    # --------------------------------------------------------------------- run
    def _output(self, plan: CallPlan, src: Flat, out: Any) -> Flat:
        """The call's output as a flat view: ``out`` checked, or a new array."""
        if out is None:
            data, obj = src.new(_result_shape(plan.collective, src.shape, self.size))
            return Flat(data, obj, src.kind, tuple(getattr(obj, "shape", ())), src.new)
        self._check_out(plan, out)
        return as_flat(out, "out")

    @staticmethod
    def _check_out(plan: CallPlan, out: Any) -> None:
        """The checks of a given ``out``, from its attributes, before any byte moves."""
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

    def _run(self, plan: CallPlan, x: Any, out: Any) -> Any:
        """Run a call whose plan is settled: per-call checks first (before any byte
        moves), then the route's runner; a failure from then on breaks the communicator."""
        if plan.route == "nccl" and (plan.algorithm == "native" or plan.graph is not None):
            return self._run_nccl_launch(plan, x, out)
        src = as_flat(x, "x")  # checks contiguity, which the plan's key does not cover
        dst = self._output(plan, src, out)
        plan.calls += 1
        try:
            if plan.route == "host":
                self._run_host(plan, src, dst)
            else:
                self._run_device(plan, src, dst, caller_stream(x))
        except BaseException as exc:
            self._break(exc)
            raise
        return dst.obj

    def _run_host(
        self, plan: CallPlan, src: Flat, dst: Flat, transport: Any = None, codec: Any = None
    ) -> None:
        """Host data: the polling engine over MPI (``transport``, ``codec``: stand-ins of
        ``coccl.overlap``'s codec-only and transport-only runs)."""
        if plan.algorithm == "native":
            algorithms.native.run(self._host, plan.collective, src.data, dst.data, plan.op)
            return
        run_polling(
            self._rounds(plan, self._host_pool, src.data, dst.data, codec),
            transport or self._host,
            self._executor(min(plan.chunk_elems, plan.count) * plan.dtype.itemsize),
            depth=plan.depth,
            timeout_s=self._settings.timeout_s,
            label=plan.label,
        )

    def _run_nccl_launch(self, plan: CallPlan, x: Any, out: Any) -> Any:
        """The thin per-call path over NCCL: NCCL's own collective, or the plan's CUDA
        graph, enqueued on the caller's stream from the buffers' addresses alone (no
        array views, and for ``native`` no coccl stream or event but the watchdog's)."""
        out = self._checked_output(plan, x, out)
        plan.calls += 1
        stream = caller_stream(x)
        nccl = self._nccl
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
            self._break(exc)
            raise
        self._watchdog.track(stream, plan.label)  # type: ignore[union-attr]
        return out

    def _checked_output(self, plan: CallPlan, x: Any, out: Any) -> Any:
        """``_output`` from attributes alone, for the thin path: the same checks, and a
        new result of ``x``'s kind when ``out`` is None."""
        if not is_contiguous(x):
            as_flat(x, "x")  # raises the contiguity error
        if out is None:
            return new_like(x, _result_shape(plan.collective, tuple(x.shape), self.size))
        self._check_out(plan, out)
        return out

    def _run_device(self, plan: CallPlan, src: Flat, dst: Flat, caller: Any) -> None:
        ctx = self._device(plan.device)
        with ctx.device:
            if plan.route != "nccl":
                self._run_staged(plan, src, dst, ctx, caller)
                return
            if plan.graph is None and plan.graph_bytes and plan.calls >= 2:
                self._capture(plan, ctx)
            if plan.graph is not None:
                plan.graph.replay(caller, data_ptr(src.data), data_ptr(dst.data))
                self._nccl.bytes_sent += plan.bytes_per_call
            else:
                sent = self._nccl.bytes_sent
                self._run_streamed(plan, src, dst, ctx, caller)
                plan.bytes_per_call = self._nccl.bytes_sent - sent
            self._watchdog.track(caller, plan.label)  # type: ignore[union-attr]

    def _run_streamed(
        self, plan: CallPlan, src: Flat, dst: Flat, ctx: DeviceContext, caller: Any,
        codec: Any = None,
    ) -> None:  # fmt: skip
        """Device data over NCCL, run from the host: the streamed engine on coccl's
        streams, ordered after ``caller``'s work and before its next."""
        ctx.enter(caller)
        rounds = self._rounds(plan, ctx.pool, src.data, dst.data, codec)
        run_streamed(rounds, self._nccl, ctx, depth=plan.depth)
        ctx.leave(caller)

    def _run_staged(
        self, plan: CallPlan, src: Flat, dst: Flat, ctx: DeviceContext, caller: Any,
        transport: Any = None, codec: Any = None,
    ) -> None:  # fmt: skip
        """Device data over MPI: the polling engine with kernels on coccl's compute stream
        (staging copies run on it too)."""
        ctx.enter(caller)
        with ctx.compute:
            if plan.algorithm == "native":
                algorithms.native.run(self._host, plan.collective, src.data, dst.data, plan.op)
            else:
                run_polling(
                    self._rounds(plan, ctx.pool, src.data, dst.data, codec),
                    transport or self._host,
                    GpuExecutor(ctx.compute),
                    depth=plan.depth,
                    timeout_s=self._settings.timeout_s,
                    label=plan.label,
                )
        ctx.leave(caller)

    def _capture(self, plan: CallPlan, ctx: DeviceContext) -> None:
        """Record ``plan``'s schedule as a CUDA graph; every rank then replays it, or, if
        the capture failed anywhere, none does (NCCL needs the same on every rank)."""
        graph = CallGraph(
            ctx, plan.dtype, plan.count, plan.out_count, plan.graph_in_place,
            follow=plan.graph_follows,
        )  # fmt: skip
        sent = self._nccl.bytes_sent
        why = ""
        try:
            graph.capture(
                lambda pool, x, out: self._rounds(plan, pool, x, out), self._nccl, plan.depth
            )
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
        self._nccl.bytes_sent = sent  # capturing moved nothing
        outcomes = self._boot.allgather(
            (why, graph.follows, graph.copy_reason),
            self._settings.timeout_s,
            "agreeing on a capture",
        )
        failed = [(r, w) for r, (w, _, _) in enumerate(outcomes) if w]
        copying = [(r, c) for r, (_, follows, c) in enumerate(outcomes) if not follows]
        nbytes = plan.count * plan.dtype.itemsize
        reason = ""
        if failed:
            reason = "CUDA graph capture failed on rank {}: {}".format(*failed[0])
        elif copying and not replays(plan.link, nbytes, follows=False):
            reason = (
                "its graph would copy the buffers on rank {} ({}), which costs more than a "
                "replay saves at this size (coccl/sizing.py)".format(*copying[0])
            )
        if reason:
            graph.release()
            self._plans.graph_bytes -= plan.graph_bytes
            plan.graph_bytes = 0
            plan.graph_reason = reason
            log.debug("%s: %s; it runs from the host", plan.label, plan.graph_reason)
            return
        if not copying:  # no rank holds buffers of its own (the same on every rank)
            freed = plan.graph_buffer_bytes
            self._plans.graph_bytes -= freed
            plan.graph_bytes -= freed
        plan.graph = graph
        log.debug(
            "%s of %d elements: captured as a CUDA graph, replayed on %s",
            plan.label, plan.count,
            "the caller's buffers" if graph.follows else f"copies ({graph.copy_reason})",
        )  # fmt: skip

    def _run_with(self, plan: CallPlan, x: Any, *, transport: Any = None, codec: Any = None) -> Any:
        """Run ``plan``'s schedule from the host (never a graph), optionally with a
        stand-in transport or codec (``coccl.overlap``'s codec-only and transport-only
        runs); returns the result."""
        src = as_flat(x, "x")
        dst = self._output(plan, src, None)
        if plan.route == "host":
            self._run_host(plan, src, dst, transport, codec)
            return dst.obj
        ctx = self._device(plan.device)
        caller = caller_stream(x)
        with ctx.device:
            if transport is None and plan.route == "nccl":
                self._run_streamed(plan, src, dst, ctx, caller, codec)
            else:
                self._run_staged(plan, src, dst, ctx, caller, transport, codec)
        return dst.obj

    def _rounds(self, plan: CallPlan, pool: BufferPool, x: Any, out: Any, codec: Any = None) -> Any:
        """The rounds of ``plan``'s schedule on flat ``x`` and ``out``, with ``plan.codec``
        on the wire (or a stand-in with the same payload sizes, ``coccl.overlap``'s)."""
        codec = plan.codec if codec is None else codec
        aplan = algorithms.Plan(
            rank=self.rank,
            size=self.size,
            codec=codec,
            dtype=plan.dtype,
            op=plan.op,
            chunk_elems=plan.chunk_elems,
            pool=pool,
            label=plan.label,
            depth=plan.depth,
            gather=plan.gather,
        )
        if plan.op in ("sum", "avg"):
            aplan.hop = codec.reduce_encode_kernel(x, plan.dtype)
        return algorithms.schedule(plan.algorithm, plan.collective)(aplan, x, out)

    def _device(self, device_id: int | None) -> DeviceContext:
        assert device_id is not None  # only called for device data
        ctx = self._devices.get(device_id)
        if ctx is None:
            ctx = self._devices[device_id] = DeviceContext.create(device_id)
        return ctx

    def _executor(self, chunk_nbytes: int) -> Any:
        if chunk_nbytes <= INLINE_CHUNK_BYTES:
            return InlineExecutor()
        if self._resources.cpu is None:
            self._resources.cpu = CpuExecutor(self._cpu_threads)
        return self._resources.cpu


def _result_shape(collective: str, shape: tuple[int, ...], n: int) -> tuple[int, ...]:
    if collective == "allreduce":
        return shape
    if collective == "reduce_scatter":
        if shape and shape[0] % n == 0:
            return (shape[0] // n, *shape[1:])
        return (int(np.prod(shape)) // n,)
    return (n * shape[0], *shape[1:]) if shape else (n,)


def _release_graph(plan: CallPlan) -> None:
    if plan.graph is not None:
        plan.graph.release()
        plan.graph = None


def _expired(me: weakref.ref, message: str) -> None:
    """The watchdog's verdict (from its thread): abort NCCL, refuse every later call."""
    comm = me()
    if comm is not None and comm._broken is None:
        comm._broken = message
        if comm._nccl is not None:
            comm._nccl.abort()


class _Resources:
    """What a communicator must free: its bootstrap and transports (MPI duplicates, the
    NCCL communicator), the watchdog and the codec thread."""

    def __init__(self, boot: Bootstrap, host: Any, nccl: Any, watchdog: Any) -> None:
        self.boot, self.host, self.nccl, self.watchdog = boot, host, nccl, watchdog
        self.cpu: CpuExecutor | None = None

    def release(self, abort: bool = False) -> None:
        if self.cpu is not None:
            self.cpu.close()
        if self.watchdog is not None:
            self.watchdog.close()
        if self.nccl is not None:
            if abort:
                self.nccl.abort()
            else:
                self.nccl.close()
        self.host.close()
        self.boot.close()


def _release_unclosed(resources: _Resources, name: str) -> None:
    """A communicator collected without ``close()``: free what it holds (an MPI library
    has a limited number of communicators) and say so."""
    warnings.warn(
        f"{name} was not closed; call close() (or use it as a context manager)",
        ResourceWarning,
        stacklevel=2,
    )
    resources.release()


def _set_numba_threads(threads: int) -> None:
    """Size numba's thread pool; starting numba's OpenMP layer resets the process's
    OpenMP thread count, so torch's intra-op count (if torch is loaded) is restored."""
    import sys  # noqa: PLC0415

    import numba  # noqa: PLC0415

    torch = sys.modules.get("torch")
    torch_threads = torch.get_num_threads() if torch is not None else None
    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    if torch_threads is not None and torch.get_num_threads() != torch_threads:
        torch.set_num_threads(torch_threads)


def check_launcher(mpi_size: int) -> None:
    """CocclError if a launcher started more ranks than MPI sees (each process would be
    a 1-rank world of its own and 'reduce' only its own data)."""
    if mpi_size != 1:
        return
    for var, launcher in _LAUNCHER_SIZES:
        raw = os.environ.get(var, "").strip()
        if raw.isdigit() and int(raw) > 1:
            raise CocclError(
                f"{launcher} started {raw} processes ({var}={raw}) but MPI sees a world of "
                "1: each process would run alone. Launch with an mpiexec of the MPI that "
                "mpi4py uses (mpiexec -n N python -m mpi4py script.py), or, under torchrun, "
                "use the torch.distributed backend (import coccl.torch; "
                "dist.init_process_group('coccl'))"
            )


def init(mpi_comm: Any = None, backend: str = "auto") -> Communicator:
    """Create a Communicator over an MPI communicator (default ``MPI.COMM_WORLD``).

    Collective: every rank of ``mpi_comm`` must call it. The ranks check that their
    schedule-shaping settings (``COCCL_CHUNK_BYTES``, ``COCCL_PIPELINE_DEPTH``,
    ``COCCL_STAGING_LIMIT_BYTES``, ``COCCL_GRAPHS``, ``COCCL_NCCL_GATHER``) agree.

    Args:
        mpi_comm: an ``mpi4py.MPI.Comm``.
        backend: ``"mpi"``, ``"nccl"`` or ``"auto"`` (NCCL when every rank has a GPU of
            its own, else MPI). Host arrays always travel over MPI.

    Raises:
        ValueError: unknown backend, or a malformed ``COCCL_*`` variable.
        TypeError: ``mpi_comm`` is not an MPI communicator.
        CocclError: the NCCL backend cannot run here (no CuPy/GPU, or ranks share a GPU),
            the ranks' settings differ, or a launcher started more processes than MPI
            sees.

    Example:
        >>> comm = coccl.init()
        >>> y = comm.allreduce(x, compressor="taco")
        >>> comm.close()
    """
    from mpi4py import MPI  # noqa: PLC0415

    from coccl.mpi_transport import MpiTransport  # noqa: PLC0415  (initialises MPI)

    if mpi_comm is None:
        mpi_comm = MPI.COMM_WORLD
    if not isinstance(mpi_comm, MPI.Comm):
        raise TypeError(f"mpi_comm must be an mpi4py.MPI.Comm, got {type(mpi_comm).__name__}")
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; coccl takes {', '.join(BACKENDS)}")
    env = settings()
    if mpi_comm is MPI.COMM_WORLD:
        check_launcher(mpi_comm.Get_size())

    def mpi_host(env: Settings) -> PollingTransport:
        return MpiTransport(
            mpi_comm,
            cuda_aware=env.mpi_cuda_aware,
            timeout_s=env.timeout_s,
            forward_from_host=env.forward_from_pinned,
        )

    return create(MpiBootstrap(mpi_comm), mpi_host, backend, env)


def create(
    boot: Bootstrap,
    make_host: Callable[[Settings], PollingTransport],
    backend: str,
    env: Settings | None = None,
) -> Communicator:
    """Build a Communicator over a bootstrap, collectively (``coccl.init`` does it over
    MPI; ``coccl.torch`` over torch.distributed's store): agree on the settings, decide
    whether device data travels over NCCL (and on which GPU and link), create the host
    transport with ``make_host``. Takes ownership of ``boot`` (closed on failure)."""
    from coccl import nccl_transport  # noqa: PLC0415

    env = settings() if env is None else env
    configure_logging(env.log_level)
    nccl = None
    try:
        local_rank, local_size = node_ranks(boot, env.timeout_s)
        threads, pipelined = agree_settings(boot, env, local_size)
        resolved, device_id, reason = nccl_transport.decide(
            boot, backend, local_rank, env.timeout_s
        )
        if backend == "nccl" and resolved != "nccl":
            raise CocclError(f"backend='nccl' cannot run here: {reason}")
        if reason:
            log.debug("device data travels over MPI: %s", reason)
        link = "mpi"
        if resolved == "nccl":
            assert device_id is not None
            nccl = nccl_transport.NcclTransport(boot, device_id, env.timeout_s)
            link = nccl_transport.detect_link(boot, device_id, env.link, env.timeout_s)
        host = make_host(env)
    except BaseException:
        if nccl is not None:
            nccl.close()
        boot.close()
        raise
    return Communicator(
        boot, host, env, nccl=nccl, link=link, cpu_threads=threads, host_pipelined=pipelined
    )


def agree_settings(boot: Bootstrap, env: Settings, local_size: int) -> tuple[int, bool]:
    """Check that every rank has the same schedule-shaping settings (CocclError naming
    the variable and each rank's value otherwise); return this rank's codec threads and
    whether host data is pipelined, decided alike on every rank: only if every rank has
    a spare core for its codec thread (COCCL_CPU_THREADS or cores per local rank >= 2)."""
    threads = local_cpu_threads(local_size, env.cpu_threads)
    mine = {name: getattr(env, name) for name in SCHEDULE_SETTINGS}
    entries = boot.allgather((mine, threads), env.timeout_s, "comparing COCCL_* settings")
    variables = {
        "chunk_bytes": "COCCL_CHUNK_BYTES",
        "chunk_bytes_set": "COCCL_CHUNK_BYTES (set or not)",
        "pipeline_depth": "COCCL_PIPELINE_DEPTH",
        "staging_limit_bytes": "COCCL_STAGING_LIMIT_BYTES",
        "graphs": "COCCL_GRAPHS",
        "nccl_gather": "COCCL_NCCL_GATHER",
    }
    for name in SCHEDULE_SETTINGS:
        values = [e[0][name] for e in entries]
        if any(v != values[0] for v in values):
            per_rank = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
            raise CocclError(
                f"{variables[name]} differs between ranks ({per_rank}); settings that shape "
                "a collective's schedule must be the same on every rank"
            )
    return threads, min(t for _, t in entries) >= 2
