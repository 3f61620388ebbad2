"""Hierarchical (two-level) AllReduce and ReduceScatter over nodes of ``local_size``
consecutive ranks (rank = node * local_size + local index; every node the same size).

AllReduce of ``n`` elements, ``L = local_size`` ranks a node, ``N`` nodes:

1. inside each node, a ReduceScatter: local index l gets the node's sum of shard l
   (``L`` shards of ``m`` elements, ``m`` a multiple of the intra codec's alignment),
   written straight into its place in ``out``;
2. across nodes, between the ranks of local index l, an AllReduce of that shard, in
   place;
3. inside each node, an AllGather of the shards into ``out``, each owner decoding its own
   payload as the others do, so every rank ends bitwise equal.

The last ``n - L * m`` elements (fewer than ``L`` times the alignment) are all-reduced
inside the node, then across nodes, in place: the same quantization count as the rest,
and bitwise equal everywhere because every local index computes it from equal inputs.

Two encodes are made redundantly, by several ranks from bitwise equal inputs: phase 3's
of shard l (by local index l of every node) and the leftover's across nodes (by every
local index of a node). A stochastic codec must then draw the same random stream on each
of those ranks, so those encodes are salted by what they compute, not by who computes
it: the stream numbered ``size + l`` for phase 3's shard l and ``size + L + node`` for
the node's leftover (after the real ranks' numbers, so never one a rank draws for its
own encodes), each counted from 0 in its phase, where every rank of the redundant set
issues the same encodes in the same order. Every other encode draws from the rank's own
stream (``ScheduleArgs.next_salt``).

ReduceScatter of ``size * n`` elements: phase 1 is ``N`` intra-node ReduceScatters, one
per node-sized segment of ``x`` (segment j holds global shards ``j*L .. j*L + L - 1``),
so local index l ends with the node's sums of shards ``j*L + l`` for every node j, in
node order, in one pooled buffer; phase 2 is a ReduceScatter of that buffer across nodes,
which leaves shard ``node*L + l`` on rank ``node*L + l``: the flat ReduceScatter's layout.

Each phase is an existing ring or two-shot schedule run on a sub-plan (the sub-group's
rank and size, its level's codec) whose rounds' peers are mapped to global ranks. The
sub-plans share the plan's tag counter, so every phase's tags follow the previous one's
(distinct tag spaces; every rank of a sub-group draws alike because every sub-group of a
phase has the same geometry). Between phases a local join round (no messages) depends on
every round of the phase before, and every round of the next phase depends on it.

Quantization points per element of an AllReduce (a codec roundtrip each; the intra
codec in phases 1 and 3, the inter codec in phase 2):

- two-shot intra + two-shot inter: 1 + 2 + 1 = 4;
- ring intra + ring inter: (L - 1) + N + 1 = L + N;
- mixed: (1 or L - 1) + (2 or N) + 1;
- one node (N = 1): the intra AllReduce alone (2, or L for a ring); one rank a node
  (L = 1): the inter AllReduce alone (2, or N).

A ReduceScatter quantizes (1 or L - 1) + (1 or N - 1) times: 2 for two-shot at both
levels. Between phases the partial sums are stored in the data type (a 16-bit type
rounds them once there, as the identity codec's ring rounds its partial sums). ``avg``
divides once, by the global rank count, at the last reduction (phase 2).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from coccl.compressors import Compressor
from coccl.compressors.intq import STREAM_RANK_BITS
from coccl.core.reduction import finalize
from coccl.core.rounds import Round

from . import ring, two_shot
from .footprint import Footprint
from .schedule_args import ScheduleArgs

LEVEL_ALGORITHMS = ("ring", "two_shot")
STREAMS = 1 << STREAM_RANK_BITS  # the streams a stochastic codec's salts can number


@dataclass(eq=False, kw_only=True)
class HierarchicalArgs(ScheduleArgs):
    """A ``ScheduleArgs`` for two levels: ``codec`` is the intra-node codec.

    Attributes:
        local_size: ranks per node (``COCCL_LOCAL_SIZE`` or the host names).
        inter_codec: the codec between nodes.
        intra_algorithm, inter_algorithm: "ring" or "two_shot" at each level.
    """

    local_size: int
    inter_codec: Compressor
    intra_algorithm: str = "two_shot"
    inter_algorithm: str = "two_shot"


@dataclass(eq=False)
class _LevelArgs(ScheduleArgs):
    """A sub-group's plan; ``avg`` divides by the global rank count (``divisor``)."""

    divisor: int = 1

    def finalize(self, acc: Any) -> None:
        finalize(acc, self.op, self.divisor)


def footprint(collective: str, n: int) -> Footprint:
    """A round of either level holds at most what a flat two-shot round on ``n`` ranks
    holds (a level's group is smaller), so sizing reads that bound."""
    return two_shot.footprint(collective, n)


def fuses_hop(collective: str, n: int) -> bool:
    """The levels' reductions may need an accumulator: sizing keeps one."""
    return False


def check_plan(plan: HierarchicalArgs) -> tuple[int, int]:
    """(nodes, local size), or ValueError for a node size that does not divide the ranks
    or an unknown level algorithm."""
    local = plan.local_size
    if isinstance(local, bool) or not isinstance(local, int) or local < 1:
        raise ValueError(f"local_size must be a positive integer, got {local!r}")
    if plan.size % local:
        raise ValueError(
            f"hierarchical schedules need nodes of equal size: {plan.size} ranks do not "
            f"split into nodes of {local}"
        )
    for name in (plan.intra_algorithm, plan.inter_algorithm):
        if name not in LEVEL_ALGORITHMS:
            raise ValueError(f"unknown level algorithm {name!r}; coccl takes ring, two_shot")
    return plan.size // local, local


def _level(
    plan: HierarchicalArgs, level: str, op: str, like: Any, stream: int | None = None
) -> _LevelArgs:
    """The sub-plan of this rank's node (``intra``) or of its local index (``inter``).
    With ``stream``, a stochastic codec's salts come from that stream, counted from 0,
    instead of the rank's own (the redundant encodes of the module docstring)."""
    nodes, local = plan.size // plan.local_size, plan.local_size
    node, index = divmod(plan.rank, local)
    codec = plan.codec if level == "intra" else plan.inter_codec
    rank, size = (index, local) if level == "intra" else (node, nodes)
    chunk = -(-plan.chunk_elems // codec.alignment) * codec.alignment
    hop = codec.reduce_encode_kernel(like, plan.dtype) if op in ("sum", "avg") else None
    fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(ScheduleArgs)}
    fields.update(rank=rank, size=size, codec=codec, op=op, chunk_elems=chunk, hop=hop)
    fields.update(stream_rank=plan.rank if plan.stream_rank < 0 else plan.stream_rank)
    if stream is not None:
        fields.update(stream_rank=stream, _salts=itertools.count())
    # the transport's AllGather spans every rank, never a sub-group
    fields.update(gather=False, label=f"{plan.label} {level}")
    return _LevelArgs(**fields, divisor=plan.size)  # _tags: the plan's own counter


def _members(plan: HierarchicalArgs, level: str) -> list[int]:
    """Global ranks of this rank's sub-group, by sub-group rank."""
    local = plan.local_size
    node, index = divmod(plan.rank, local)
    if level == "intra":
        return [node * local + i for i in range(local)]
    return [j * local + index for j in range(plan.size // local)]


def _schedule(plan: HierarchicalArgs, level: str, collective: str) -> Callable[..., Any]:
    name = plan.intra_algorithm if level == "intra" else plan.inter_algorithm
    return getattr(ring if name == "ring" else two_shot, collective)


class _Phases:
    """Runs sub-schedules phase by phase: peers mapped to global ranks, every round
    of a phase after the join round that closed the phase before."""

    def __init__(self, plan: HierarchicalArgs) -> None:
        self.plan = plan
        self.join: Round | None = None
        self.phase: list[Round] = []

    def run(self, level: str, rounds: Iterator[Round]) -> Iterator[Round]:
        members = _members(self.plan, level)
        for rnd in rounds:
            if rnd.gather is not None:  # sub-plans never gather (see _level)
                raise RuntimeError("coccl internal error: an AllGather round in a sub-group")
            rnd.sends = [(members[p], buf) for p, buf in rnd.sends]
            rnd.recvs = [(members[p], buf) for p, buf in rnd.recvs]
            if self.join is not None:
                rnd.deps = [*rnd.deps, self.join]
            self.phase.append(rnd)
            yield rnd

    def close(self, holds: list[Any] | None = None) -> Iterator[Round]:
        """The join round ending a phase. Its ``post`` is a no-op so that it counts as
        ready only once it ran, after every dependency was ready: waiting for it is then
        waiting for the whole phase (a round without ``post`` is ready at once)."""
        join = Round(label=f"{self.plan.label} hierarchical phase end", tag=self.plan.next_tag())
        join.deps, join.post, join.holds = self.phase, _noop, holds or []
        self.join, self.phase = join, []
        yield join


def _noop() -> None:
    pass


def allreduce(plan: HierarchicalArgs, x: Any, out: Any) -> Iterator[Round]:
    """Hierarchical AllReduce of flat ``x`` into flat ``out`` (same size; may be ``x``).

    Raises:
        ValueError: nodes of unequal size, an unknown level algorithm, or (stochastic
            codecs) more ranks than the salts' streams.
    """
    nodes, local = check_plan(plan)
    stochastic = plan.codec.stochastic or plan.inter_codec.stochastic
    if stochastic and plan.size + local + nodes > STREAMS:  # the shared streams' numbers
        raise ValueError(
            f"a stochastic codec's salts number at most {STREAMS} streams: {plan.size} ranks "
            f"and the {local + nodes} shared streams of the two levels are too many"
        )
    return _allreduce(plan, x, out, nodes, local)


def _allreduce(plan: HierarchicalArgs, x: Any, out: Any, nodes: int, local: int) -> Iterator:
    phases = _Phases(plan)
    inner = "sum" if plan.op == "avg" else plan.op  # avg divides once, in phase 2
    if nodes == 1 or local == 1:  # one level: its AllReduce alone
        level = "intra" if nodes == 1 else "inter"
        sub = _level(plan, level, plan.op, x)
        yield from phases.run(level, _schedule(plan, level, "allreduce")(sub, x, out))
        return
    align = plan.codec.alignment
    m = x.size // (local * align) * align
    main, index = local * m, plan.rank % local
    shard = out[index * m : (index + 1) * m]
    intra, tail = _level(plan, "intra", inner, x), slice(main, x.size)
    if m:
        yield from phases.run(
            "intra", _schedule(plan, "intra", "reduce_scatter")(intra, x[:main], shard)
        )
    if main < x.size:
        yield from phases.run(
            "intra", _schedule(plan, "intra", "allreduce")(intra, x[tail], out[tail])
        )
    yield from phases.close()
    inter = _level(plan, "inter", plan.op, x)
    if m:
        yield from phases.run("inter", _schedule(plan, "inter", "allreduce")(inter, shard, shard))
    if main < x.size:  # every local index alike: the node's stream (module docstring)
        node = plan.rank // local
        leftover = _level(plan, "inter", plan.op, x, stream=plan.size + local + node)
        yield from phases.run(
            "inter", _schedule(plan, "inter", "allreduce")(leftover, out[tail], out[tail])
        )
    if m:
        yield from phases.close()
        gather = _level(plan, "intra", inner, x, stream=plan.size + index)  # every node alike
        yield from phases.run(
            "intra", _schedule(plan, "intra", "allgather")(gather, shard, out[:main])
        )


def reduce_scatter(plan: HierarchicalArgs, x: Any, out: Any) -> Iterator[Round]:
    """Hierarchical ReduceScatter: ``x`` holds ``size * n`` elements, ``out`` gets the
    ``n`` reduced elements of shard ``rank`` (the flat ReduceScatter's layout).

    Raises:
        ValueError: nodes of unequal size, an unknown level algorithm, or an ``x`` that
            is not ``size`` times ``out``.
    """
    nodes, local = check_plan(plan)
    if x.size != plan.size * out.size:
        raise ValueError(
            f"x holds {x.size} elements; a ReduceScatter needs {plan.size} x {out.size}"
        )
    return _reduce_scatter(plan, x, out, nodes, local)


def _reduce_scatter(plan: HierarchicalArgs, x: Any, out: Any, nodes: int, local: int) -> Iterator:
    phases = _Phases(plan)
    n = out.size
    if nodes == 1 or local == 1:
        level = "intra" if nodes == 1 else "inter"
        sub = _level(plan, level, plan.op, x)
        yield from phases.run(level, _schedule(plan, level, "reduce_scatter")(sub, x, out))
        return
    inner = "sum" if plan.op == "avg" else plan.op
    intra = _level(plan, "intra", inner, x)
    block = plan.pool.get(nodes * n * plan.dtype.itemsize)
    partials = block.as_array(plan.dtype, nodes * n)  # shards j*L + l of each node j
    segment = local * n
    for j in range(nodes):
        rounds = _schedule(plan, "intra", "reduce_scatter")(
            intra, x[j * segment : (j + 1) * segment], partials[j * n : (j + 1) * n]
        )
        yield from phases.run("intra", rounds)
    yield from phases.close()
    inter = _level(plan, "inter", plan.op, x)
    yield from phases.run("inter", _schedule(plan, "inter", "reduce_scatter")(inter, partials, out))
    yield from phases.close(holds=[block])  # the partial sums live until phase 2 is done


__all__ = ["LEVEL_ALGORITHMS", "HierarchicalArgs", "allreduce", "check_plan", "reduce_scatter"]
