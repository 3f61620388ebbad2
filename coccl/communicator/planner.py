"""The planner: a call's arguments checked, its route, its schedule and its sizes decided.

``Planner.resolve`` turns a ``Call`` into a ``CallPlan``, in four steps, each a method:
check the arguments (TypeError or ValueError, identically on every rank that gets the
same ones), route the bytes (host MPI, staged MPI, CUDA-aware MPI or NCCL), choose the
schedule (``auto``'s table, or as asked), and size the pipeline (chunk, depth, the
AllGather phase, whether a CUDA graph may replay it). Every rank applies the same rules
to the same arguments and settings, so every rank decides alike; agreeing on the result
is the face's (``coccl.communicator.agreement``).
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any, NamedTuple

from coccl import algorithms
from coccl.algorithms.schedule_args import chunk_elems
from coccl.communicator.collectives import KINDS
from coccl.communicator.dp_plans import NodeLayout, hierarchical_notes, level_codecs
from coccl.communicator.plans import STOCHASTIC_REPLAY, CallPlan
from coccl.communicator.sizing import (
    default_chunk_bytes,
    needs_accumulator,
    pipeline_depth,
    replay_max_bytes,
    replays,
    staging_limit,
    window_bytes,
)
from coccl.compressors import Compressor, get_compressor
from coccl.config import Settings
from coccl.core.arrays import Flat, as_flat, dtype_name, signature
from coccl.core.options import check_chunk_bytes
from coccl.core.reduction import check_op, normalize_op


class Call(NamedTuple):
    """A collective call's arguments, as the caller gave them (what a plan is built from)."""

    collective: str
    x: Any
    op: Any
    algorithm: Any
    compressor: Any
    chunk_bytes: Any


class Planner:
    """Builds the plans of one communicator's calls (see the module docstring).

    Args:
        size: the number of ranks.
        host: the host transport (MPI, or Gloo under the torch backend's torchrun).
        nccl: the NCCL transport, or None.
        link: the link class between the ranks (``Communicator.link``).
        settings: the communicator's ``COCCL_*`` settings.
        host_pipelined: whether host data is pipelined (``agree_settings``).
    """

    def __init__(
        self,
        size: int,
        host: Any,
        nccl: Any,
        link: str,
        settings: Settings,
        host_pipelined: bool,
    ) -> None:
        self.size = size
        self.host = host
        self.nccl = nccl
        self.link = link
        self.settings = settings
        self.host_pipelined = host_pipelined
        self._codecs: dict[str, Compressor] = {}
        self.nodes = NodeLayout(0, "", "no node layout was found")  # set by the face

    @staticmethod
    def key(call: Call) -> Any:
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
            call.collective, dtype, count, device, normalize_op(call.op), call.algorithm,
            compressor, call.chunk_bytes,
        )  # fmt: skip
        try:
            hash(key)
        except TypeError:
            return None
        return key

    def codec(self, spec: Any) -> Compressor:
        """``get_compressor(spec)``, remembered for names: a codec is immutable."""
        if isinstance(spec, str):
            codec = self._codecs.get(spec)
            if codec is None:
                codec = self._codecs[spec] = get_compressor(spec)
            return codec
        return get_compressor(spec)

    def resolve(self, call: Call) -> CallPlan:
        """Check a call's arguments and decide everything about it (raises TypeError or
        ValueError for bad arguments, identically on every rank that gets them)."""
        op, requested, codec, inter, src = self._check(call)
        dtype, count = src.dtype, src.size
        route, transport = self.route(src.device_id)
        link = self.link if route == "nccl" else route
        choice = self._choose(call.collective, requested, codec, dtype, count, op, transport, link)
        plan = CallPlan(
            collective=call.collective,
            op=op,
            dtype=dtype,
            count=count,
            out_count=KINDS[call.collective].out_count(count, self.size),
            device=src.device_id,
            route=route,
            algorithm=choice.algorithm,
            codec=choice.codec,
            reason=choice.reason,
            requested=(requested, codec.get_config()),
            chunk_bytes=0,
            chunk_elems=0,
            depth=1,
            link=link,
            transport="nccl" if route == "nccl" else self.host.name,
        )
        if inter is not None:
            plan.inter_codec, plan.local_size = inter, self.nodes.local_size
            plan.notes = hierarchical_notes(self.nodes, self.size, call.collective, inter)
        if choice.algorithm == "native":
            plan.graph_reason = "the transport's own collective: one launch already"
            return plan
        window = self._size(plan, src, call.chunk_bytes)
        plan.graph_reason = self._no_graph_reason(plan)
        if not plan.graph_reason:
            plan.graph_bytes = plan.graph_buffer_bytes + window(plan.depth)
        return plan

    def _check(self, call: Call) -> tuple[str, str, Compressor, Compressor | None, Flat]:
        """The argument checks, in the order their errors are raised."""
        kind = KINDS[call.collective]
        op = check_op(call.op)
        requested = algorithms.check_algorithm(call.algorithm)
        codec, inter = level_codecs(self.codec, call.compressor, requested, call.collective)
        src = as_flat(call.x, "x")
        for level in (codec, inter or codec):
            level.check_dtype(src.dtype)
            if kind.reduces:
                level.check_op(op)
        if requested == "native" and not codec.lossless:
            raise ValueError(
                "algorithm 'native' is the transport's own collective and takes "
                f"compressor='identity', not {codec.codec_id!r}"
            )
        kind.check_count(src.size, self.size)
        check_chunk_bytes(call.chunk_bytes)
        return op, requested, codec, inter, src

    def route(self, device: int | None) -> tuple[str, Any]:
        """Where a call's bytes go: ``(route, transport)`` (``sizing.ROUTES``)."""
        if device is None:
            return "host", self.host
        if self.nccl is not None:
            if device != self.nccl.device_id:
                raise ValueError(
                    f"x is on GPU {device}; this communicator's NCCL runs on GPU "
                    f"{self.nccl.device_id}"
                )
            return "nccl", self.nccl
        return ("cuda_aware" if self.host.cuda_aware else "staged"), self.host

    def _choose(
        self,
        collective: str,
        requested: str,
        codec: Compressor,
        dtype: Any,
        count: int,
        op: str,
        transport: Any,
        link: str,
    ) -> algorithms.Choice:
        """The schedule and codec that run: ``auto``'s table, or as asked."""
        if requested != "auto":
            if requested == "native" and not transport.has_native(collective, dtype, op):
                raise TypeError(
                    f"the {transport.name} transport has no native {collective} of "
                    f"{dtype_name(dtype)} with op {op!r}; use algorithm='ring' or 'two_shot'"
                )
            return algorithms.Choice(requested, codec, "as asked")
        nbytes = count * dtype.itemsize
        choice = algorithms.choose(collective, nbytes, codec, transport.name, link, self.size)
        if choice.algorithm == "native" and not transport.has_native(collective, dtype, op):
            choice = algorithms.Choice(
                "ring", choice.codec,
                f"{transport.name} has no {collective} of {dtype_name(dtype)} with {op!r}",
            )  # fmt: skip
        return choice

    def _size(self, plan: CallPlan, src: Flat, chunk_bytes: int | None) -> Any:
        """Set the plan's chunk, depth and AllGather phase; returns the window bound of
        the plan's rounds as a function of the depth (``sizing.window_bytes``)."""
        n, conf, codec, dtype = self.size, self.settings, plan.codec, plan.dtype
        limit = staging_limit(plan.route, conf.staging_limit_bytes)
        # Over NCCL the window bound leaves out the accumulator a fused-hop ring never holds;
        # the MPI routes keep the full bound, which set the depths they were tuned with.
        hop = algorithms.hop_kernel(codec, src.data, dtype, plan.op)
        fused_hop = plan.route == "nccl" and hop is not None
        accumulates = needs_accumulator(plan.algorithm, plan.collective, plan.op, fused_hop, n)
        chunk = chunk_bytes
        if chunk is None:
            chunk = default_chunk_bytes(
                plan.route,
                settings_chunk=conf.chunk_bytes,
                chunk_set=conf.chunk_bytes_set,
                host_pipelined=self.host_pipelined,
                limit=limit,
                n=n,
                codec=codec,
                dtype=dtype,
                count=plan.count,
                algorithm=plan.algorithm,
                collective=plan.collective,
                accumulates=accumulates,
            )
        plan.chunk_bytes = int(chunk)
        plan.chunk_elems = chunk_elems(int(chunk), dtype.itemsize, codec.alignment)
        window = partial(
            window_bytes, n, codec, dtype, plan.chunk_elems, plan.algorithm,
            plan.collective, plan.route == "staged", accumulates=accumulates,
        )  # fmt: skip
        plan.depth = pipeline_depth(conf.pipeline_depth, limit, window)
        plan.gather = (
            plan.route == "nccl"
            and plan.collective == "allreduce"
            and plan.algorithm == "two_shot"
            and not codec.lossless
            and n > 1
            and algorithms.auto.gather_by_allgather(plan.link, conf.nccl_gather)
        )
        return window

    def _no_graph_reason(self, plan: CallPlan) -> str:
        """Why the plan may not be replayed from a CUDA graph ("" if it may)."""
        if plan.route != "nccl":
            over = {"mpi": "MPI", "gloo": "Gloo"}.get(plan.transport, plan.transport)
            return f"{plan.route} data travels over {over} (the host drives each message)"
        if not self.settings.graphs:
            return "COCCL_GRAPHS=0"
        if not plan.codec.graph_safe:
            return (
                f"compressor {plan.codec.codec_id!r} is not graph_safe (its GPU kernels "
                "allocate or synchronise per call)"
            )
        if plan.stochastic:
            return STOCHASTIC_REPLAY
        nbytes = plan.count * plan.dtype.itemsize
        if not replays(plan.link, nbytes, follows=plan.graph_follows):
            return (
                f"from {replay_max_bytes(plan.link) >> 20} MiB on {plan.link} the device "
                "outlasts the host's rounds and a replay would add two copies "
                "(coccl.communicator.sizing)"
            )
        return ""
