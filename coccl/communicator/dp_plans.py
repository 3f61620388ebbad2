"""The plans of the data-parallel calls: the nodes of the two-level schedules, the
codec pair of ``algorithm="hierarchical"``, and the schedules' rounds of the plans that
are not one flat schedule (``Runner`` asks ``dp_rounds`` for them: all-to-all, the
two-level schedules, a ``DeltaState``'s AllGather).

Nodes are ``COCCL_LOCAL_SIZE`` consecutive ranks, or the ranks of each host; the
hierarchical schedules need them node-major (rank = node * local size + local index,
every node the same size), and a layout that is not is refused when a call asks for the
schedule, with the reason found at ``init``.
"""

from __future__ import annotations

import dataclasses
import socket
from dataclasses import dataclass
from typing import Any

from coccl import algorithms
from coccl.algorithms import alltoall, hierarchical
from coccl.algorithms.delta_allgather import allgather_delta
from coccl.compressors import Compressor

HIERARCHICAL_COLLECTIVES = ("allreduce", "reduce_scatter")


@dataclass(frozen=True)
class NodeLayout:
    """The ranks per node of a communicator, or why its ranks are not node-major.

    Attributes:
        local_size: ranks per node (0 when ``reason`` says why there is none).
        source: ``"COCCL_LOCAL_SIZE"`` or ``"host names"``.
        reason: why the hierarchical schedules cannot run ("" when they can).
    """

    local_size: int
    source: str
    reason: str = ""


def node_layout(hosts: list[str], local_setting: int | None) -> NodeLayout:
    """The node layout of ranks on ``hosts`` (rank r on ``hosts[r]``), or of
    ``COCCL_LOCAL_SIZE`` when set (``local_setting``)."""
    size = len(hosts)
    if local_setting is not None:
        if size % local_setting:
            why = f"COCCL_LOCAL_SIZE={local_setting} does not divide the {size} ranks"
            return NodeLayout(0, "COCCL_LOCAL_SIZE", why)
        return NodeLayout(local_setting, "COCCL_LOCAL_SIZE")
    local = hosts.count(hosts[0])
    blocks = [hosts[start : start + local] for start in range(0, size, local)]
    major = size % local == 0 and len({b[0] for b in blocks}) == len(blocks)
    if not (major and all(h == b[0] for b in blocks for h in b)):
        return NodeLayout(
            0, "host names",
            "the ranks are not node-major (every host must hold the same number of "
            f"consecutive ranks; hosts by rank: {hosts}); reorder the ranks or set "
            "COCCL_LOCAL_SIZE",
        )  # fmt: skip
    return NodeLayout(local, "host names")


def is_pair(spec: Any) -> bool:
    """Whether a compressor argument is an ``(intra, inter)`` pair (a tuple, or a list as
    JSON gives one) rather than one codec."""
    return isinstance(spec, tuple | list)


def level_codecs(
    codec_of: Any, spec: Any, requested: str, collective: str
) -> tuple[Compressor, Compressor | None]:
    """The call's codec and, for ``hierarchical``, the inter-node one: ``spec`` is a
    codec (both levels) or an ``(intra, inter)`` pair. ValueError for a pair given to
    another schedule, or ``hierarchical`` for a collective it has no schedule of."""
    pair = is_pair(spec)
    if requested != "hierarchical":
        if pair:
            raise ValueError(
                "a (intra, inter) compressor pair is for algorithm='hierarchical', "
                f"not {requested!r}"
            )
        return codec_of(spec), None
    if collective not in HIERARCHICAL_COLLECTIVES:
        raise ValueError(
            f"algorithm 'hierarchical' runs allreduce and reduce_scatter, not {collective}"
        )
    if not pair:
        codec = codec_of(spec)
        return codec, codec
    if len(spec) != 2:
        raise ValueError(f"compressor pair must be (intra, inter), got {len(spec)} entries")
    return codec_of(spec[0]), codec_of(spec[1])


def hierarchical_notes(
    nodes: NodeLayout, size: int, collective: str, inter: Compressor
) -> dict[str, Any]:
    """What a hierarchical plan adds to its fingerprint and ``describe()``: the inter
    codec, the node size and the quantization points per element (two-shot at both
    levels; ``algorithms.hierarchical``'s docstring). ValueError without a node layout."""
    if nodes.reason:
        raise ValueError(f"algorithm 'hierarchical' cannot run here: {nodes.reason}")
    local = nodes.local_size
    count = size // local
    if count == 1 or local == 1:  # one level: its two-shot collective alone
        level = "intra" if count == 1 else "inter"
        points = 2 if collective == "allreduce" else 1
        where = f"one level: the {level} two-shot {collective}"
    elif collective == "allreduce":
        points = 4
        where = "intra ReduceScatter, inter ReduceScatter and AllGather, intra AllGather"
    else:
        points = 2
        where = "intra ReduceScatter, inter ReduceScatter"
    return {
        "inter compressor": inter.get_config(),
        "local size": local,
        "nodes": count,
        "quantizations": f"{points} per element ({where}; intra codec inside nodes, "
        "inter codec between them)",
    }


def hierarchical_plan(aplan: algorithms.ScheduleArgs, local_size: int, inter: Compressor) -> Any:
    """``aplan`` as a two-level plan (two-shot at both levels)."""
    fields = {f.name: getattr(aplan, f.name) for f in dataclasses.fields(algorithms.ScheduleArgs)}
    return hierarchical.HierarchicalArgs(**fields, local_size=local_size, inter_codec=inter)


def dp_rounds(plan: Any, aplan: algorithms.ScheduleArgs, x: Any, out: Any) -> Any:
    """The rounds of a data-parallel plan (an all-to-all or a hierarchical one), or None
    for a flat schedule."""
    if plan.collective == "alltoall":
        return alltoall.alltoall(aplan, x, out, plan.sends, plan.recvs)
    if plan.algorithm in ("delta", "delta_exact"):  # a DeltaState's (communicator.state)
        return allgather_delta(aplan, x, out, exact=plan.algorithm == "delta_exact")
    if plan.algorithm == "hierarchical":
        two = hierarchical_plan(aplan, plan.local_size, plan.inter_codec)
        return getattr(hierarchical, plan.collective)(two, x, out)
    return None


def find_nodes(boot: Any, timeout_s: float, local_setting: int | None) -> NodeLayout:
    """This communicator's node layout (collective: the ranks exchange host names)."""
    hosts = boot.allgather(socket.gethostname(), timeout_s, "finding the nodes")
    return node_layout(hosts, local_setting)
