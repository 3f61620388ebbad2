"""Stateful codecs owned by the caller: ``DeltaState`` (weight-delta AllGather) and
``Feedback`` (error feedback of AllReduce, ReduceScatter and all-to-all), and the
Communicator's path for a call that carries one.

A state is per rank and per buffer: the caller keeps it between calls, as torch's
PowerSGD keeps its error dict. It is bound at its first call to (communicator,
collective, count, dtype, device, codec config, and an all-to-all's split); a call with
another is a ``ValueError`` naming what differs. Every stateful call exchanges one small
digest among the ranks (as ``COCCL_CHECK_CALLS`` does for plain calls) so that a state
misused on one rank, or a delta state at its first call on one rank and not on another,
raises on every rank before any byte moves: a refusing rank raises its ``ValueError``,
the others ``CocclError`` naming it. A state binds only once that exchange succeeded.

An exact codec (identity) loses nothing, so a state has nothing to carry: ``delta=`` and
``feedback=`` with a lossless codec are refused (``ValueError``), not run as an exact
call in disguise. Stateful plans never replay from a CUDA graph (the state's buffers are
not the graph's) and never use a codec's fused ring hop (feedback needs the partial sum).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

from coccl.algorithms.alltoall import buffers_overlap
from coccl.communicator.collectives import KINDS
from coccl.communicator.planner import Call
from coccl.communicator.plans import CallPlan
from coccl.compressors import Compressor
from coccl.core.arrays import Flat, accumulate_dtype, as_flat, dtype_name

FEEDBACK_COLLECTIVES = ("allreduce", "reduce_scatter", "alltoall")


class _State:
    """What both states share: the binding and its check."""

    kind = ""

    def __init__(self) -> None:
        self._binding: dict[str, Any] | None = None
        self._comm: weakref.ref | None = None

    @property
    def bound(self) -> bool:
        """Whether a call has bound the state (``reset`` unbinds it)."""
        return self._binding is not None

    def reset(self) -> None:
        """Forget the binding and the buffers: the next call starts afresh (a delta
        state's next AllGather is exact again)."""
        self._binding, self._comm = None, None
        self._drop()

    def _drop(self) -> None:
        raise NotImplementedError

    def check(self, comm: Any, binding: dict[str, Any]) -> None:
        """ValueError if the state is bound to another call than ``binding`` on ``comm``."""
        if self._binding is None:
            return
        mine = self._comm() if self._comm is not None else None
        if mine is not comm:
            raise ValueError(
                f"this {type(self).__name__} is bound to another communicator; "
                "keep one state per buffer and communicator (or reset() it)"
            )
        diff = [
            f"{k} {self._binding[k]!r} (now {binding[k]!r})"
            for k in self._binding
            if self._binding[k] != binding.get(k)
        ]
        if diff:
            raise ValueError(
                f"this {type(self).__name__} is bound to another call: " + "; ".join(diff)
            )

    def _bind(self, comm: Any, binding: dict[str, Any]) -> None:
        if self._binding is None:
            self._binding, self._comm = binding, weakref.ref(comm)


class Feedback(_State):
    """Error feedback for ``allreduce``, ``reduce_scatter`` and ``alltoall``
    (``feedback=fb``): what this rank's encodes lost in one call is added to its next
    call's input before encoding, so the codec's errors cancel over calls instead of
    adding up (the mean of many calls' results converges to the mean of the exact ones).

    Which losses it carries (each at the positions of the input it came from):

    * two-shot: this rank's encode of its own chunk of every other shard (its own shard
      is exact), and, as owner of a shard, the encode of the reduced shard for the
      AllGather (in sum terms: times the rank count for ``avg``);
    * ring: its own chunk at the first step, the partial sums it re-encodes at the later
      steps (its contribution plus what it received), and the reduced shard it owns;
    * all-to-all: the encode of every block, its own block too;
    * a ReduceScatter has no encode of the reduced shard; bfloat16/float16 inputs also
      carry the rounding of ``x + residual`` to their dtype.

    The residual is kept in the accumulate type (float32; float64 for float64) on ``x``'s
    device; ``residual`` shows it (None before the first call).
    """

    kind = "feedback"

    def __init__(self) -> None:
        super().__init__()
        self.residual: Any = None

    def _drop(self) -> None:
        self.residual = None

    def prepare(self, src: Flat) -> Any:
        """This call's encoder input ``x + residual`` in ``x``'s dtype; ``residual`` then
        holds what that rounding lost (zero for float32 and float64), and the schedule
        adds each encode's loss to it."""
        xp, acc = src.xp, accumulate_dtype(src.dtype)
        if self.residual is None:
            where = src.data.device if src.device_id is not None else contextlib.nullcontext()
            with where:  # on x's device, as the schedule's buffers
                self.residual = xp.zeros(src.size, dtype=acc)
        res = self.residual
        res += src.data.astype(acc, copy=False)
        fed = res.astype(src.dtype)
        res -= fed.astype(acc, copy=False)
        return fed


class DeltaState(_State):
    """The replica of a weight-delta AllGather (``allgather(x, out, delta=state)``).

    The first call gathers every rank's ``x`` exactly into the replica; each later call
    sends the encoded difference ``x - replica[own slot]``, and every rank, the owner
    too, adds every decoded difference into the replica
    (``coccl.algorithms.delta_allgather``). So the replica is bitwise the same on every
    rank and tracks a slowly changing ``x`` to about one update's quantization error.

    ``out`` is the replica: the first call's ``out`` (or a new array when None) becomes
    it, later calls take ``out=None`` or that same array and return it. Do not write it
    between calls (``reset()`` after loading other weights into it).
    """

    kind = "delta"

    def __init__(self) -> None:
        super().__init__()
        self.replica: Any = None  # the caller's object (``out``)
        self._flat: Any = None

    def _drop(self) -> None:
        self.replica, self._flat = None, None

    def output(self, src: Flat, out: Any, size: int) -> Any:
        """The replica this call writes: ``out`` checked against the bound one (ValueError
        for another array), or a new one at the first call."""
        if self._flat is not None:
            if out is not None and not _same_array(as_flat(out, "out").data, self._flat):
                raise ValueError(
                    "out is not this DeltaState's replica: pass out=None or the array of "
                    "its first call (reset() the state to gather into another)"
                )
            return self.replica
        if out is None:
            return src.new(KINDS["allgather"].result_shape(src.shape, size))[1]
        return out


def _same_array(a: Any, b: Any) -> bool:
    """Whether flat ``a`` is the memory of flat ``b`` (any empty array of its dtype
    stands for an empty replica)."""
    if a.dtype != b.dtype or a.size != b.size:
        return False
    return a.size == 0 or buffers_overlap(a, b) == "same"


def _kind_problem(collective: str, state: Any, codec: Compressor, algorithm: Any) -> str:
    """Why this state cannot go with this call ("" if it can)."""
    if isinstance(state, DeltaState):
        if collective != "allgather":
            return f"delta= is for allgather, not {collective}"
        if algorithm != "auto":
            return f"delta= runs the delta AllGather: algorithm must be 'auto', not {algorithm!r}"
    elif isinstance(state, Feedback):
        if collective not in FEEDBACK_COLLECTIVES:
            return f"feedback= is for {', '.join(FEEDBACK_COLLECTIVES)}, not {collective}"
        if algorithm == "hierarchical":
            return "feedback= is not carried through algorithm='hierarchical'"
    else:
        return f"expected a coccl.Feedback or coccl.DeltaState, got {type(state).__name__}"
    if codec.lossless:
        return (
            f"{type(state).__name__} needs a lossy compressor; {codec.codec_id!r} is exact "
            "and loses nothing to carry"
        )
    return ""


def binding_of(plan: CallPlan) -> dict[str, Any]:
    """What a state is bound to, from the call's plan (an all-to-all's split too)."""
    split = None if plan.sends is None else (tuple(plan.sends), tuple(plan.recvs or ()))
    return {
        "collective": plan.collective,
        "count": plan.count,
        "dtype": dtype_name(plan.dtype),
        "device": plan.device,
        "compressor": plan.codec.get_config(),
        "split": split,
    }


def check_state(comm: Any, collective: str, state: Any, plan: CallPlan) -> str:
    """Raise ValueError if ``state`` cannot go with this call; return its note for the
    ranks' agreement (the delta phase: its first, exact call or an update)."""
    problem = _kind_problem(collective, state, plan.codec, plan.requested[0])
    if problem:
        raise ValueError(problem)
    state.check(comm, binding_of(plan))
    if isinstance(state, DeltaState):
        return "delta update" if state.bound else "delta, first call (exact)"
    return "feedback"


class StatefulCalls:
    """The Communicator's path for ``allreduce``/``reduce_scatter`` with ``feedback=``
    and ``allgather`` with ``delta=`` (``alltoall``'s is in ``dp_calls``)."""

    def _stateful(self, call: Call, out: Any, state: Any) -> Any:
        """Check the call and the state, agree with every rank (one exchange), bind the
        state, run (see the module docstring)."""
        error: BaseException | None = None
        plan: CallPlan | None = None
        try:
            plan = self._state_plan(call, state)
            note = check_state(self, call.collective, state, plan)
            src = as_flat(call.x, "x")
            if out is not None and not isinstance(state, DeltaState):
                self._runner.check_out(plan, call.x, out)  # here, not after the residual moved
            if isinstance(state, DeltaState):
                out = state.output(src, out, self.size)
                replica = as_flat(out, "out")
                if buffers_overlap(src.data, replica.data):  # even as its own block
                    raise ValueError(
                        "x overlaps the replica: pass the new values in their own array"
                    )
                self._runner.check_out(plan, call.x, out)
            entry: Any = {**plan.fingerprint(), "state": note}
        except (TypeError, ValueError) as exc:
            error, entry = exc, ("error", f"{type(exc).__name__}: {exc}")
        self._agreement.agree(call.collective, entry, error)  # type: ignore[attr-defined]
        assert plan is not None
        state._bind(self, binding_of(plan))
        if isinstance(state, DeltaState):
            return self._run_delta(plan, src, out, state)
        return run_fed(self._runner, plan, src, out, state, self.size)

    def _state_plan(self, call: Call, state: Any) -> CallPlan:
        """The stateful call's plan (cached apart from plain calls' plans): no graph, and
        for a delta state the delta schedule (exact at the state's first call)."""
        phase = ""
        if isinstance(state, DeltaState):
            phase = "delta" if state.bound else "delta_exact"
        base = self._planner.key(call)
        key = None if base is None else ("state", phase, base)
        plan = None if key is None else self._plans.get(key)
        arg = None if plan is None else plan.compressor_arg
        if arg is not None and arg is not call.compressor:  # another object at a reused id
            plan = None
        if plan is None:
            plan = self._planner.resolve(call)
            if isinstance(call.compressor, Compressor):
                plan.compressor_arg = call.compressor
            stateful_plan(plan, phase)
            if key is not None:
                for victim in self._plans.add(key, plan):
                    if victim.graph is not None:
                        victim.graph.release()
                        victim.graph = None
        return plan

    def _run_delta(self, plan: CallPlan, src: Flat, out: Any, state: DeltaState) -> Any:
        result = self._runner.run(plan, src.obj, out)
        if state._flat is None:
            state.replica, state._flat = result, as_flat(result, "out").data
        return result


def stateful_plan(plan: CallPlan, phase: str) -> None:
    """Mark a freshly resolved plan as stateful: no CUDA graph; ``phase`` names a delta
    AllGather's schedule (``dp_plans.dp_rounds``)."""
    plan.graph_bytes = 0
    plan.graph_reason = "a stateful call (delta= or feedback=) runs eagerly"
    if phase:
        plan.algorithm = phase
        plan.reason = (
            "delta AllGather: the first call gathers x exactly"
            if phase == "delta_exact"
            else "delta AllGather: every rank adds the decoded x - replica into its replica"
        )


def run_fed(runner: Any, plan: CallPlan, src: Flat, out: Any, fb: Feedback, size: int) -> Any:
    """Run ``plan`` on ``x + residual`` with ``fb``'s residual recording every encode's
    loss (``ScheduleArgs.residual``)."""
    fed = fb.prepare(src)
    if out is None:
        shape = KINDS[plan.collective].result_shape(src.shape, size)
        if plan.collective == "alltoall" and plan.out_count != src.size:
            shape = (plan.out_count,)
        out = src.new(shape)[1]
    plan.residual = fb.residual
    try:
        runner.run(plan, fed, out)
    finally:
        plan.residual = None
    return out


__all__ = ["DeltaState", "Feedback", "StatefulCalls"]
