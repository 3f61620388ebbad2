"""The Communicator: coccl's public face for collectives.

A call is checked, resolved, sized and run. The first three happen once per call
signature, when the call's plan is built (``coccl.communicator.planner``; every rank
checks that the others make the same call before any byte moves,
``coccl.communicator.agreement``); a repeated call looks its plan up in the plan cache and
runs it (``coccl.communicator.runner``: host data over MPI, device data over NCCL, a plan's
CUDA graph replayed from its second call on, or over MPI, CUDA-aware or staged).

A failure after bytes have moved (a timeout, an error, an interrupt) leaves the
communicator unusable: its peers' state is unknown, so every later call raises
``CocclError`` saying so, instead of pairing the wrong messages or hanging.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from coccl import algorithms
from coccl.communicator import overlap
from coccl.communicator.agreement import CallAgreement
from coccl.communicator.dp_calls import DataParallelCalls
from coccl.communicator.exact_calls import ExactCalls
from coccl.communicator.nonblocking import NonblockingCalls, in_issue_order
from coccl.communicator.p2p_calls import PointToPointCalls
from coccl.communicator.planner import Call, Planner
from coccl.communicator.plans import CallPlan, PlanCache
from coccl.communicator.resources import Resources, release_unclosed, set_numba_threads
from coccl.communicator.runner import Runner
from coccl.communicator.state import DeltaState, Feedback, StatefulCalls
from coccl.compressors import Compressor
from coccl.config import Settings
from coccl.core.pool import BufferPool
from coccl.core.transport import PollingTransport
from coccl.engine.watchdog import Watchdog
from coccl.errors import CocclError
from coccl.transports.bootstrap import Bootstrap

log = logging.getLogger(__name__)


@in_issue_order  # collectives in issue order, nonblocking ones queued, lists as buckets
class Communicator(
    PointToPointCalls, DataParallelCalls, ExactCalls, StatefulCalls, NonblockingCalls
):
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
        settings: Settings,
        *,
        nccl: Any = None,
        link: str = "mpi",
        cpu_threads: int = 1,
        host_pipelined: bool = True,
        p2p: PollingTransport | None = None,
        dp: Any = None,
    ) -> None:
        self._boot = boot
        self._nccl = nccl
        self._settings = settings
        self.rank: int = boot.rank
        self.size: int = boot.size
        self.backend: str = "nccl" if nccl is not None else "mpi"
        self.link = link
        self._plans = PlanCache(settings.plan_cache_bytes)
        self._agreement = CallAgreement(boot, settings, self._break)
        self._closed = False
        self._broken: str | None = None
        watchdog = None
        if nccl is not None:
            me = weakref.ref(self)
            watchdog = Watchdog(
                nccl.device_id,
                settings.timeout_s,
                lambda message: _expired(me, message),
                nccl.check_async_error,
            )
        set_numba_threads(cpu_threads)
        self._resources = Resources(boot, host, nccl, watchdog)
        self._planner = Planner(self.size, host, nccl, link, settings, host_pipelined)
        self._dp = dp  # dp_calls.DpSetup: the node layout and how a split builds its own
        if dp is not None:
            self._planner.nodes = dp.nodes
        self._runner = Runner(
            self.rank, self.size, self._resources, self._plans, settings, cpu_threads, self._break
        )
        self._init_point_to_point(p2p)  # its own transport: p2p tags never meet collectives'
        self._finalizer = weakref.finalize(self, release_unclosed, self._resources, repr(self))
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
        """Free the communicator without waiting for its peers (``ncclCommAbort``), after
        a failure or when a peer is gone; it keeps its MPI duplicates, as a failure does."""
        if self._closed:
            return
        self._broken = self._broken or "aborted"
        self.close()

    def barrier(self) -> None:
        """Block until every rank has called ``barrier`` (at most COCCL_TIMEOUT_S)."""
        self._check_usable()
        self._agreement.agree("barrier", {"collective": "barrier"}, None)

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
        feedback: Feedback | None = None,
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
            compressor: a codec name or label, config dict or Compressor.
            chunk_bytes: pipeline chunk size (default: ``coccl.communicator.sizing``'s
                rules).
            feedback: a ``coccl.Feedback`` (``coccl.communicator.state``; reduce_scatter too).

        Returns:
            ``out``, or a new array of ``x``'s kind, shape, dtype and device.

        Example:
            >>> y = comm.allreduce(x, algorithm="two_shot", compressor="taco")
        """
        return self._collective(
            "allreduce", x, out, op, algorithm, compressor, chunk_bytes, feedback
        )

    def reduce_scatter(
        self,
        x: Any,
        out: Any = None,
        *,
        op: str = "sum",
        algorithm: str = "auto",
        compressor: str | dict | Compressor = "identity",
        chunk_bytes: int | None = None,
        feedback: Feedback | None = None,
    ) -> Any:
        """Reduce ``x`` (``size * n`` elements) and keep shard ``rank`` (``n`` elements),
        as ``ncclReduceScatter``. A new result has shape ``(x.shape[0] // size,
        *x.shape[1:])`` when the first dimension divides, else ``(n,)``."""
        return self._collective(
            "reduce_scatter", x, out, op, algorithm, compressor, chunk_bytes, feedback
        )

    def allgather(
        self,
        x: Any,
        out: Any = None,
        *,
        algorithm: str = "auto",
        compressor: str | dict | Compressor = "identity",
        chunk_bytes: int | None = None,
        delta: DeltaState | None = None,
    ) -> Any:
        """Gather every rank's ``x`` (``n`` elements) into ``size * n`` elements, rank
        ``r``'s at offset ``r * n``, as ``ncclAllGather``. A new result has shape
        ``(size * x.shape[0], *x.shape[1:])`` (``(size,)`` for a 0-d ``x``).
        ``delta``: a ``coccl.DeltaState``; ``out`` is its replica (``communicator.state``)."""
        return self._collective(
            "allgather", x, out, "sum", algorithm, compressor, chunk_bytes, delta
        )

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
        plan = self._plans.get(self._planner.key(call))
        return (plan or self._planner.resolve(call)).describe()

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
        """Time one pipelined collective against its two halves
        (``coccl.communicator.overlap``): pipelined, codec-only and transport-only,
        medians of ``iters`` runs, the slowest rank's. Collective: every rank must call it.

        Returns:
            ``{"pipelined_s", "codec_only_s", "transport_only_s", "overlap_efficiency"}``.
        """
        overlap.check_arguments(collective, algorithm, iters)
        self._check_usable()
        plan = self._plan(Call(collective, x, op, algorithm, compressor, chunk_bytes))
        return overlap.profile(
            self._runner, plan, x, iters,
            barrier=self.barrier,
            slowest=lambda medians: self._boot.allgather(
                medians, self._settings.timeout_s, "overlap profile"
            ),
        )  # fmt: skip

    # ------------------------------------------------------------- statistics
    def pools(self) -> list[BufferPool]:
        """Every buffer pool this communicator uses (for memory statistics)."""
        runner = self._runner
        pools = [runner.host_pool, *runner.host.pools(), *self._p2p_pools()]
        pools += [ctx.pool for ctx in runner.devices.values()]
        pools += [p.graph.pool for p in self._plans.values() if p.graph and p.graph.pool]
        if self._nccl is not None:
            pools += self._nccl.pools()
        return pools

    def stats(self) -> dict[str, int]:
        """Counters: payload bytes sent point to point, pool peaks (host, pinned, device) since
        ``reset_stats``; plans kept; p2p signatures agreed (one per new peer, signature)."""
        peaks = dict.fromkeys(("host", "pinned", "device"), 0)
        for pool in self.pools():
            peaks[pool.kind] += pool.peak_in_use_bytes
        return {
            "bytes_sent": sum(t.bytes_sent for t in self._transports()),
            **{f"peak_{kind}_bytes": value for kind, value in peaks.items()},
            "pool_allocated_bytes": sum(p.allocated_bytes for p in self.pools()),
            "plans": len(self._plans),
            "graph_bytes": self._plans.graph_bytes,
            "p2p_agreements": self._p2p.agreements if self._p2p else 0,
        }

    def reset_stats(self) -> None:
        """Zero the counters of ``stats``."""
        for t in self._transports():
            t.bytes_sent = 0
        for pool in self.pools():
            pool.reset_peak()

    def _transports(self) -> list[Any]:
        p2p = [self._p2p.transport] if self._p2p is not None else []
        return [self._runner.host, *p2p] + ([self._nccl] if self._nccl is not None else [])

    # ---------------------------------------------------------------- the call
    def _check_usable(self) -> None:
        if self._closed:
            raise CocclError("this communicator is closed")
        if self._broken is not None:
            raise CocclError(
                f"this communicator is unusable after an earlier failure ({self._broken}); "
                "its peers' state is unknown: create a new one with coccl.init()"
            )

    def _break(self, exc: BaseException | str) -> None:
        """A failure after bytes moved: from now on every call raises (see the module
        docstring); NCCL is aborted so that no kernel keeps waiting for a peer."""
        if self._broken is None:
            self._broken = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
            self._resources.broken = True
            if self._nccl is not None:
                self._nccl.abort()

    def _collective(
        self,
        collective: str,
        x: Any,
        out: Any,
        op: str,
        algorithm: str,
        compressor: Any,
        chunk_bytes: int | None,
        state: Any = None,
    ) -> Any:
        self._check_usable()
        call = Call(collective, x, op, algorithm, compressor, chunk_bytes)
        if state is not None:  # a caller-kept state (coccl.communicator.state)
            return self._stateful(call, out, state)
        return self._runner.run(self._plan(call, out), x, out)

    def _plan(self, call: Call, out: Any = None) -> CallPlan:
        """The call's plan: found by its signature, or built (collectively; a given
        ``out`` is checked then, so that its refusal is every rank's)."""
        key = self._planner.key(call)
        plan = None if key is None else self._plans.get(key)
        if plan is not None and plan.compressor_arg is not None:
            if plan.compressor_arg is not call.compressor:  # another object at a reused id
                plan = None
        if plan is None:
            plan = self._new_plan(key, call, out)
        elif self._settings.check_calls:
            self._agreement.agree(call.collective, plan.fingerprint(), None)
        return plan

    def _new_plan(self, key: Any, call: Call, out: Any) -> CallPlan:
        """Resolve a call, check its ``out`` and agree with every rank (a refusal on any
        rank raises on every rank); keep the plan under ``key`` unless it is None."""
        error: BaseException | None = None
        try:
            plan: CallPlan | None = self._planner.resolve(call)
            if out is not None:
                self._runner.check_out(plan, call.x, out)  # type: ignore[arg-type]
            entry: Any = plan.fingerprint()  # type: ignore[union-attr]
        except (TypeError, ValueError) as exc:
            plan, error, entry = None, exc, ("error", f"{type(exc).__name__}: {exc}")
        self._agreement.agree(call.collective, entry, error)
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


def _release_graph(plan: CallPlan) -> None:
    if plan.graph is not None:
        plan.graph.release()
        plan.graph = None


def _expired(me: weakref.ref, message: str) -> None:
    """The watchdog's verdict (from its thread): abort NCCL, refuse every later call."""
    comm = me()
    if comm is not None:
        comm._break(message)
