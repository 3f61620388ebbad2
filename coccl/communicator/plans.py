"""Call plans: everything a collective call can decide once, cached per call signature.

A ``CallPlan`` holds what a call resolved when it was first made: its checked arguments,
the schedule ``auto`` picked and why, the route its bytes take, the chunk and depth, and,
over NCCL, its CUDA graph. The ``PlanCache`` keeps plans per signature (collective, dtype,
count, device, op, algorithm, codec, chunk size) so that a repeated call does little
more than launch its plan, under a bound on the device memory the plans' graphs hold,
evicting the least recently used ones.

Building a plan is collective: every rank compares what it is about to run
(``fingerprint``) with every other rank's, and a call that differs on any rank (count,
dtype, op, codec configuration, schedule, collective, or the route of its bytes) is a
``CocclError`` on every rank, naming what differs, before any byte moves. Eviction is
deterministic (the same call sequence evicts the same plans on every rank), so every rank
builds, captures and replays each plan at the same call, as NCCL requires of CUDA graphs.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coccl.compressors import Compressor

log = logging.getLogger(__name__)

# Plans kept at most (host-only plans hold no device memory, but their count is bounded too).
MAX_PLANS = 1024


# Why a plan with a stochastic codec is not replayed from a CUDA graph, coccl's or the caller's.
STOCHASTIC_REPLAY = "a stochastic codec draws new random bits every call; a graph would repeat them"


@dataclass
class CallPlan:
    """One call signature's resolved decisions (see the module docstring).

    Attributes:
        collective, op: as called (op checked).
        dtype: the element type (numpy's).
        count, out_count: input and output elements.
        device: the GPU ordinal of the data, None for host data.
        route: where the bytes go: "host" (host data over MPI), "staged" (device data over
            MPI through pinned host memory), "cuda_aware" (device data to a CUDA-aware MPI) or
            "nccl".
        algorithm, codec: what runs (``auto`` resolved); ``reason``: why.
        requested: the algorithm and codec configuration as the caller gave them.
        chunk_bytes, chunk_elems, depth: the pipeline's cut (unused by ``native``).
        link: the link class auto's table was read for.
        transport: what carries the bytes: "nccl", or the host transport's name ("mpi", or
            "gloo" under the torch backend's torchrun).
        gather: two-shot's AllGather phase through the transport's AllGather.
        graph_bytes: device memory the plan's CUDA graph would hold (0: no graph).
        graph_reason: why the plan has no graph, if it has none.
        graph: the plan's ``CallGraph`` once captured.
        calls: how many times the plan ran.
        bytes_per_call: payload bytes this rank sends per call (statistics of replays).
    """

    collective: str
    op: str
    dtype: np.dtype
    count: int
    out_count: int
    device: int | None
    route: str
    algorithm: str
    codec: Compressor
    reason: str
    requested: tuple[str, dict[str, Any]]
    chunk_bytes: int
    chunk_elems: int
    depth: int
    link: str
    transport: str = "mpi"
    gather: bool = False
    graph_bytes: int = 0
    graph_reason: str = ""
    graph: Any = None
    calls: int = 0
    bytes_per_call: int = 0
    compressor_arg: Any = field(default=None, repr=False)
    # the data-parallel calls (coccl.communicator.dp_plans): a hierarchical plan's inter
    # codec and node size, an all-to-all's split; ``notes`` join fingerprint and describe
    inter_codec: Compressor | None = None
    local_size: int = 0
    sends: list[int] | None = None
    recvs: list[int] | None = None
    notes: dict[str, Any] = field(default_factory=dict)
    # error feedback (coccl.communicator.state): the running call's residual, set for
    # the call only (a plan is shared by every Feedback of its signature)
    residual: Any = field(default=None, repr=False)

    @property
    def stochastic(self) -> bool:
        """Whether a codec of the plan draws random bits, new ones every call (salted by
        the call's number), which a CUDA graph would replay unchanged."""
        return self.codec.stochastic or bool(self.inter_codec and self.inter_codec.stochastic)

    @property
    def graph_follows(self) -> bool:
        """Whether the plan's graph is to run on each call's buffers rather than copy them
        (``coccl.engine.graphs``): a lossy codec's messages are payloads the graph owns."""
        return not self.codec.lossless

    @property
    def graph_in_place(self) -> bool:
        """Whether the graph is captured with the output in the input's buffer: an
        AllReduce whose graph copies (one that follows must tell input from output)."""
        return self.collective == "allreduce" and not self.graph_follows

    @property
    def graph_buffer_bytes(self) -> int:
        """Device memory of the buffers the graph is captured on (its own input and
        output, or the one buffer of ``graph_in_place``)."""
        out = 0 if self.graph_in_place else self.out_count
        return (self.count + out) * self.dtype.itemsize

    @property
    def label(self) -> str:
        return f"{self.collective} ({self.algorithm}, {self.codec.codec_id})"

    def fingerprint(self) -> dict[str, Any]:
        """What every rank must agree on: everything that decides which messages move."""
        return {
            "collective": self.collective,
            "count": self.count,
            "dtype": self.dtype.name,
            "op": self.op if self.collective != "allgather" else "-",
            "algorithm asked": self.requested[0],
            "compressor asked": self.requested[1],
            "algorithm": self.algorithm,
            "compressor": self.codec.get_config(),
            "route": self.route,
            "chunk elements": self.chunk_elems,
            "pipeline depth": self.depth,
            "allgather phase": "AllGather" if self.gather else "point-to-point",
            "graph": bool(self.graph_bytes),
            **self.notes,
        }

    def describe(self) -> dict[str, Any]:
        """What the call runs and why (``Communicator.describe``)."""
        g = self.graph
        return {
            "collective": self.collective,
            "algorithm": self.algorithm,
            "compressor": self.codec.get_config(),
            "reason": self.reason,
            "transport": self.transport,
            "route": self.route,
            "link": self.link,
            "chunk_bytes": self.chunk_bytes,
            "depth": self.depth,
            "allgather_phase": "allgather" if self.gather else "p2p",
            "graph": self.graph is not None,
            "graph_reason": self.graph_reason,
            "graph_buffers": "" if g is None else "caller's" if g.follows else "copies",
            "graph_copy_reason": "" if g is None or g.follows else g.copy_reason,
            **self.notes,
        }


class PlanCache:
    """Plans by signature, least recently used first, with a bound on graph memory."""

    def __init__(self, graph_bytes_limit: int) -> None:
        self.limit = graph_bytes_limit
        self._plans: OrderedDict[Any, CallPlan] = OrderedDict()
        self.graph_bytes = 0  # charged by every plan that may hold a graph

    def __len__(self) -> int:
        return len(self._plans)

    def get(self, key: Any) -> CallPlan | None:
        plan = self._plans.get(key)
        if plan is not None:
            self._plans.move_to_end(key)
        return plan

    def values(self) -> list[CallPlan]:
        return list(self._plans.values())

    def add(self, key: Any, plan: CallPlan) -> list[CallPlan]:
        """Keep ``plan``; evict least recently used plans until its graph memory fits (a
        plan whose graph alone exceeds the bound runs without one); returns the evicted
        plans, whose graphs the caller releases."""
        evicted = []
        old = self._plans.pop(key, None)
        if old is not None:
            evicted.append(old)
            self.graph_bytes -= old.graph_bytes
        if plan.graph_bytes > self.limit:
            plan.graph_reason = (
                f"its graph would hold {plan.graph_bytes} bytes, more than "
                f"COCCL_PLAN_CACHE_BYTES={self.limit}"
            )
            plan.graph_bytes = 0
        while self._plans and (
            self.graph_bytes + plan.graph_bytes > self.limit or len(self._plans) >= MAX_PLANS
        ):
            _, victim = self._plans.popitem(last=False)
            self.graph_bytes -= victim.graph_bytes
            evicted.append(victim)
        self._plans[key] = plan
        self.graph_bytes += plan.graph_bytes
        for victim in evicted:
            log.debug("plan evicted: %s of %d elements", victim.label, victim.count)
        return evicted

    def drop_graph(self, plan: CallPlan, reason: str) -> None:
        """``plan`` runs without a graph after all (``reason``): its charge is returned."""
        self.graph_bytes -= plan.graph_bytes
        plan.graph_bytes = 0
        plan.graph_reason = reason

    def refund(self, plan: CallPlan, nbytes: int) -> None:
        """``plan``'s graph holds ``nbytes`` less than it was charged for."""
        self.graph_bytes -= nbytes
        plan.graph_bytes -= nbytes

    def clear(self) -> list[CallPlan]:
        plans = list(self._plans.values())
        self._plans.clear()
        self.graph_bytes = 0
        return plans
