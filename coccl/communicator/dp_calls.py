"""The data-parallel calls of the Communicator: ``alltoall`` (equal or uneven splits,
MoE's dispatch and combine) and ``split`` (sub-communicators, MPI_Comm_split's
semantics). The hierarchical AllReduce and ReduceScatter go through the ordinary calls
(``algorithm="hierarchical"``; ``coccl.communicator.dp_plans``).

An all-to-all's plan is keyed by its count vectors too. At every call whose checks are on
(``COCCL_CHECK_CALLS``, and always at a new signature) the ranks exchange their plans'
fingerprints and count vectors in one exchange, and a split that does not match (rank r
sends rank d a block of another size than d expects) raises ``CocclError`` on every rank,
naming each mismatch, before any byte moves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from coccl.algorithms.alltoall import check_split, split_mismatches
from coccl.communicator.agreement import disagreement, is_digest, ranks_in_other_calls
from coccl.communicator.dp_plans import NodeLayout
from coccl.communicator.planner import Call
from coccl.communicator.plans import CallPlan
from coccl.communicator.state import Feedback, binding_of, check_state, run_fed
from coccl.compressors import Compressor
from coccl.core.arrays import as_flat, signature
from coccl.core.options import check_chunk_bytes
from coccl.errors import CocclError

ALLTOALL_ALGORITHMS = ("auto", "direct")


@dataclass(frozen=True)
class DpSetup:
    """What the data-parallel calls need from ``setup.create``.

    Attributes:
        nodes: the node layout of the hierarchical schedules.
        spawn: ``spawn(mpi_comm, backend, settings)`` builds a Communicator over an MPI
            communicator (``setup.over_mpi``): how ``split`` makes its sub-communicator.
    """

    nodes: NodeLayout
    spawn: Callable[[Any, str, Any], Any]


class DataParallelCalls:
    """The Communicator's ``alltoall`` and ``split`` (see the module docstring)."""

    def alltoall(
        self,
        x: Any,
        out: Any = None,
        *,
        send_counts: Any = None,
        recv_counts: Any = None,
        compressor: str | dict | Compressor = "identity",
        algorithm: str = "auto",
        chunk_bytes: int | None = None,
        feedback: Feedback | None = None,
    ) -> Any:
        """Send block d of ``x`` to rank d; slot s of the result receives rank s's block,
        as ``torch.distributed.all_to_all_single``. Collective.

        Args:
            x: contiguous array; ``size`` blocks in rank order.
            out: optional output (``sum(recv_counts)`` elements, or ``x``'s count for
                an equal split), of ``x``'s dtype and device; may be ``x`` when the split
                is the same both ways.
            send_counts, recv_counts: elements of each block and slot (both or neither;
                neither: equal blocks of ``x.size / size``). Rank r's ``send_counts[d]``
                must equal rank d's ``recv_counts[r]``; blocks may be empty.
            compressor: a codec name or label, config dict or Compressor; each block is encoded
                once (its groups restart at every block) and decoded into its slot, this
                rank's own block too.
            algorithm: ``"auto"`` or ``"direct"`` (the one schedule: every block straight
                to its rank).
            chunk_bytes: pipeline chunk size.
            feedback: a ``coccl.Feedback`` (``coccl.communicator.state``): every block's
                encode loss is added to the next call's input; bound to the split too.

        Returns:
            ``out``, or a new array of ``x``'s kind: ``x``'s shape for an equal split,
            else flat.

        Raises:
            TypeError, ValueError: bad arguments, on this rank (the others then raise
                ``CocclError`` naming it). CocclError: the ranks' splits do not match.
        """
        self._check_usable()
        call = Call("alltoall", x, "sum", algorithm, compressor, chunk_bytes)
        key = self._planner.key(call)
        if feedback is not None:  # agreed every call: the state is checked on every rank
            plan = self._agreed_alltoall(call, key, send_counts, recv_counts, out, None, feedback)
        elif send_counts is None and recv_counts is None:  # equal: the key is every rank's
            plan = None if key is None else self._plans.get(key)
            if plan is not None and not _same_codec(plan, compressor):
                plan = None
            if plan is None or self._settings.check_calls:
                plan = self._agreed_alltoall(call, key, None, None, out, plan)
        else:  # uneven: the plan is keyed by every rank's counts, so they travel each call
            plan = self._agreed_alltoall(call, key, send_counts, recv_counts, out, None)
        if out is None and recv_counts is not None:
            out = as_flat(x, "x").new((plan.out_count,))[1]
        if feedback is not None:
            return run_fed(self._runner, plan, as_flat(x, "x"), out, feedback, self.size)
        return self._runner.run(plan, x, out)

    def _agreed_alltoall(
        self,
        call: Call,
        key: Any,
        send_counts: Any,
        recv_counts: Any,
        out: Any,
        cached: Any,
        state: Feedback | None = None,
    ) -> CallPlan:
        """The call's plan, agreed: this rank's checks (and its ``state``'s), one
        exchange of every rank's fingerprint and counts (``_agree_split``), then the plan
        of the whole split (the cache's, or this one sized from the split, alike on every
        rank); ``state`` binds once the exchange succeeded."""
        mine: CallPlan | None = cached
        error: BaseException | None = None
        try:
            if mine is None:
                mine = self._check_alltoall(call, send_counts, recv_counts, out)
            fingerprint = _split_fingerprint(mine)
            if state is not None:
                fingerprint["state"] = check_state(self, "alltoall", state, mine)
            if out is not None:  # before any rank moves a byte (or its residual)
                self._runner.check_out(mine, call.x, out)
            entry: Any = (fingerprint, mine.sends, mine.recvs)
        except (TypeError, ValueError) as exc:
            error, entry = exc, ("error", f"{type(exc).__name__}: {exc}")
        matrix = self._agree_split(entry, error)
        assert mine is not None  # else _agree_split raised
        if state is not None:
            state._bind(self, binding_of(mine))
        # an equal split's key already is every rank's; an uneven one's needs the split
        full = key if key is None or send_counts is None else (*key, matrix)
        plan = None if full is None else self._plans.get(full)
        if plan is not None and _same_codec(plan, call.compressor):
            return plan
        if isinstance(call.compressor, Compressor):
            mine.compressor_arg = call.compressor
        if mine.chunk_elems == 0:  # not sized yet: from the largest block of the split
            largest = max((c for row in matrix for c in row), default=0)
            mine.count, count = largest * self.size, mine.count
            self._planner._size(mine, as_flat(call.x, "x"), call.chunk_bytes)
            mine.count = count
        if full is not None:
            for victim in self._plans.add(full, mine):
                if victim.graph is not None:  # an evicted plan's graph (none of ours)
                    victim.graph.release()
                    victim.graph = None
        return mine

    def _check_alltoall(self, call: Call, send_counts: Any, recv_counts: Any, out: Any) -> CallPlan:
        """An all-to-all's plan from this rank's arguments, not yet sized (TypeError or
        ValueError for bad ones)."""
        planner = self._planner
        if not isinstance(call.algorithm, str) or call.algorithm not in ALLTOALL_ALGORITHMS:
            raise ValueError(
                f"unknown all-to-all algorithm {call.algorithm!r}; coccl takes "
                + ", ".join(ALLTOALL_ALGORITHMS)
            )
        codec = planner.codec(call.compressor)
        src = as_flat(call.x, "x")
        codec.check_dtype(src.dtype)
        if out is not None:
            out_count = signature(out)[2]
        else:
            out_count = src.size if recv_counts is None else _total(recv_counts)
        sends, recvs = check_split(send_counts, recv_counts, src.size, out_count, self.size)
        check_chunk_bytes(call.chunk_bytes)
        route, _ = planner.route(src.device_id)
        return CallPlan(
            collective="alltoall", op="sum", dtype=src.dtype, count=src.size,
            out_count=sum(recvs), device=src.device_id, route=route, algorithm="direct",
            codec=codec, reason="the direct exchange (every block straight to its rank)",
            requested=(call.algorithm, codec.get_config()), chunk_bytes=0, chunk_elems=0,
            depth=1, link=self.link if route == "nccl" else route, sends=sends, recvs=recvs,
            graph_reason="an all-to-all runs from the host (no CUDA graph of it yet)",
        )  # fmt: skip

    def _agree_split(self, entry: Any, error: BaseException | None) -> tuple:
        """One exchange of every rank's fingerprint and counts: a refusal anywhere, a
        different call, or a split that does not match raises on every rank. Returns
        the split: every rank's send counts, by rank."""
        what = "checking that every rank makes the same alltoall"
        entries = self._exchange(entry, what)
        others = ranks_in_other_calls(
            entries, _is_alltoall_entry, lambda e: self._exchange(e, what),
            f"rank {self.rank} makes an alltoall here",
        )  # fmt: skip
        if error is not None:
            raise error
        if others:
            raise CocclError(_other_calls_message(others, "an alltoall"))
        problem = disagreement("alltoall", [e if e[0] == "error" else e[0] for e in entries])
        if problem is not None:
            raise CocclError(problem)
        mismatches = split_mismatches([e[1] for e in entries], [e[2] for e in entries])
        if mismatches:
            raise CocclError("the ranks' all-to-all splits do not match: " + "; ".join(mismatches))
        return tuple(tuple(e[1]) for e in entries)

    def _exchange(self, obj: Any, what: str) -> list[Any]:
        """Every rank's ``obj`` (at most COCCL_TIMEOUT_S); a failed exchange breaks the
        communicator, as a collective that failed would."""
        try:
            return self._boot.allgather(obj, self._settings.timeout_s, what)
        except CocclError as exc:
            self._break(exc)
            raise

    def split(self, color: Any, key: Any = None) -> Any:
        """A sub-communicator of the ranks that give the same ``color``, ordered by
        ``key`` (then by rank; default: this rank), as ``MPI_Comm_split``. Collective:
        every rank must call it. It has its own host transport, its own NCCL
        communicator where this one has NCCL, and this one's settings.

        Args:
            color: a non-negative int, or None / ``MPI.UNDEFINED``: this rank joins none.
            key: an int ordering the ranks of the new communicator.

        Returns:
            The new Communicator (close it when done), or None for no color.

        Raises:
            ValueError: a color or key that is not an int (on this rank; the others
                raise CocclError naming it). CocclError: a communicator not built over
                MPI (``coccl.torch``'s), or a failed exchange.
        """
        from mpi4py import MPI  # noqa: PLC0415

        self._check_usable()
        mpi_comm = getattr(self._boot, "comm", None)
        if self._dp is None or not isinstance(mpi_comm, MPI.Comm):
            raise CocclError("split needs a communicator built by coccl.init over MPI")
        problem = _split_problem(color, key, MPI.UNDEFINED)
        what = "splitting the communicator"
        problems = self._exchange(problem, what)
        others = ranks_in_other_calls(
            problems, lambda e: isinstance(e, str) and not is_digest(e),
            lambda e: self._exchange(e, what), f"rank {self.rank} splits the communicator here",
        )  # fmt: skip
        if problem:
            raise ValueError(problem)
        if others:
            raise CocclError(_other_calls_message(others, "a split"))
        for rank, theirs in enumerate(problems):
            if theirs:
                raise CocclError(f"rank {rank} refused this split: {theirs}")
        undefined = color is None or color == MPI.UNDEFINED
        sub = mpi_comm.Split(MPI.UNDEFINED if undefined else int(color), _key(key, self.rank))
        if sub == MPI.COMM_NULL:
            return None
        try:
            return self._dp.spawn(sub, self.backend, self._settings)
        finally:
            sub.Free()  # the new communicator holds its own duplicates


def _split_problem(color: Any, key: Any, undefined: int) -> str:
    """Why ``color`` or ``key`` cannot split ("" if they can)."""
    if color is not None and color != undefined:
        if isinstance(color, bool) or not isinstance(color, int) or color < 0:
            return f"color must be a non-negative int, None or MPI.UNDEFINED, got {color!r}"
    if key is not None and (isinstance(key, bool) or not isinstance(key, int)):
        return f"key must be an int or None, got {key!r}"
    return ""


def _is_alltoall_entry(entry: Any) -> bool:
    """Whether a rank's entry of ``_agree_split`` is an all-to-all's (its plan's
    fingerprint and counts, or ``("error", message)``)."""
    if not isinstance(entry, tuple):
        return False
    if len(entry) == 2:
        return entry[0] == "error"
    return (
        len(entry) == 3 and isinstance(entry[0], dict) and entry[0].get("collective") == "alltoall"
    )


def _other_calls_message(ranks: list[int], call: str) -> str:
    return (
        f"rank(s) {ranks} make another call where this rank makes {call}; do all ranks "
        "make the same calls in the same order?"
    )


def _key(key: Any, rank: int) -> int:
    return rank if key is None else int(key)


def _total(counts: Any) -> int:
    """The sum of a count vector, or -1 when it is no vector of ints (the split's checks
    then say what is wrong with it)."""
    try:
        return sum(int(v) for v in counts)
    except (TypeError, ValueError):
        return -1


def _same_codec(plan: CallPlan, compressor: Any) -> bool:
    """Whether a cached plan was built for this Compressor object (its key holds the
    object's id, which a new object may reuse), or for a name or config."""
    return plan.compressor_arg is None or plan.compressor_arg is compressor


def _split_fingerprint(plan: CallPlan) -> dict[str, Any]:
    """What every rank's all-to-all must agree on before its counts are compared: the
    fingerprint without the count (each rank's own) and the sizes (set from the split,
    after the exchange)."""
    sized = ("count", "chunk elements", "pipeline depth")
    return {k: v for k, v in plan.fingerprint().items() if k not in sized}
