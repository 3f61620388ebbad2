"""FSDP2 over coccl: the comm objects that ``fully_shard``'s ``set_custom_all_gather`` /
``set_custom_reduce_scatter`` take, with coccl's codecs and its caller-owned states::

    fully_shard(block, mesh=mesh["dp"])
    coccl.torch.shard_comms(
        block,
        gather=Traffic({"id": "int", "bits": 4, "group_size": 2048}, state="delta"),
        reduce=Traffic({"id": "int", "bits": 8, "group_size": 128}, "two_shot"),
    )

FSDP2 gathers the parameters and reduce-scatters the gradients of flat buffers it packs
afresh at every step, and its own calls (``all_gather_into_tensor``,
``reduce_scatter_tensor``) take no state. A comm object here belongs to one FSDP module:
one parameter group, the same flat layout at every call, so it can keep a state per
buffer (``coccl.DeltaState``, ``coccl.Feedback``) for the Communicator of the group FSDP2
hands it.

- Gather with ``state="delta"`` (SDP4Bit's weight differences): the first call gathers
  the shards exactly; later calls send each shard's encoded difference from the replica
  every rank holds, and every rank adds the decoded differences into it
  (``Communicator.allgather(..., delta=)``): the replicas stay bitwise equal and track
  the master shards to about one update's quantization error. FSDP2's output buffer gets
  a copy of the replica (FSDP2 owns and frees that buffer; the replica must live on).
- Reduce with ``state="feedback"``: what the codec lost at one call is added to the next
  call's gradients (``Communicator.reduce_scatter(..., feedback=)``).
- A message below the traffic's ``min_compress_bytes``, a non-float one, an op other than
  SUM or AVG, and an exact codec run exact. A lossy traffic over a group that is not a
  coccl group is a ``TypeError`` at the first call, on every rank alike.

A lossy gather codec quantizes each flat buffer in groups: on a TP x DP mesh, keep
TP-replicated and TP-sharded parameters in separate FSDP units, or a group mixing both
would quantize the replicated ones with other scales on each TP rank and the TP replicas
would drift apart (``examples/train_3d.py`` does so).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

import coccl
from coccl.torch.backend import CocclProcessGroup, CocclWork, _reduce_op, compressible
from coccl.torch.policy import Traffic

_EXACT = Traffic({"id": "identity"})
# torch 2.13 names them all_gather_single / reduce_scatter_single (the older names warn
# there); 2.11 and 2.12 have only the older ones
_GATHER = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)
_REDUCE = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


def _base_classes() -> tuple[type, type]:
    """FSDP2's comm interfaces (a private module of torch's: imported when needed)."""
    from torch.distributed.fsdp._fully_shard._fsdp_api import (  # noqa: PLC0415
        AllGather,
        ReduceScatter,
    )

    return AllGather, ReduceScatter


def _check(traffic: Traffic | None, kind: str, states: tuple[str, ...]) -> Traffic:
    traffic = _EXACT if traffic is None else traffic
    if not isinstance(traffic, Traffic):
        raise TypeError(f"{kind} must be a coccl.torch.Traffic, got {type(traffic).__name__}")
    if traffic.state not in (None, *states):
        raise ValueError(f"{kind} takes state {states} or None, not {traffic.state!r}")
    if traffic.state is not None and not traffic.lossy:
        raise ValueError(f"{kind} state {traffic.state!r} needs a lossy codec, not {traffic.codec}")
    return traffic


class _Comm:
    """What both comm objects share: the traffic, the choice of path, FSDP2's buffers."""

    collective = ""

    def __init__(self, traffic: Traffic) -> None:
        self.traffic = traffic
        self.lossy = traffic.lossy  # a codec pair (schedule "hierarchical"): either level
        self.calls: dict[str, int] = {"compressed": 0, "exact": 0}

    def allocate(
        self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """A fresh buffer for FSDP2 (torch's caching allocator)."""
        return torch.empty(*size, dtype=dtype, device=device)

    def compressed(self, x: torch.Tensor, group: Any, op: str = "sum") -> bool:
        """Whether this call of ``x`` runs the codec (see the module docstring)."""
        t = self.traffic
        lossy = self.lossy and compressible(x, op, t.min_compress_bytes)
        if lossy and not isinstance(group, CocclProcessGroup):
            raise TypeError(
                f"a lossy FSDP {self.collective} ({t.codec}) needs a coccl group, got "
                f"{type(group).__name__}: create it with backend='coccl'"
            )
        self.calls["compressed" if lossy else "exact"] += 1
        return lossy

    def finish(self, out: torch.Tensor, async_op: bool) -> Any:
        """torch's return: a Work (completed, or enqueued on the current CUDA stream)."""
        return CocclWork([out]) if async_op else None


class _Gather(_Comm):
    collective = "allgather"

    def __init__(self, traffic: Traffic) -> None:
        super().__init__(traffic)
        self.delta = coccl.DeltaState() if traffic.state == "delta" else None
        self.replica: torch.Tensor | None = None

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any,
        async_op: bool = False,
    ) -> Any:
        if not self.compressed(input_tensor, group):
            return _GATHER(output_tensor, input_tensor, group=group, async_op=async_op)
        comm, t = group.comm, self.traffic
        if self.delta is None:
            group.note_call(self.collective, "compressed")
            comm.allgather(input_tensor, output_tensor, compressor=t.codec, algorithm=t.schedule)
            return self.finish(output_tensor, async_op)
        if self.replica is None:
            self.replica = torch.empty_like(output_tensor)
        group.note_call(self.collective, "compressed" if self.delta.bound else "exact")
        comm.allgather(input_tensor, self.replica, compressor=t.codec, delta=self.delta)
        output_tensor.copy_(self.replica)
        return self.finish(output_tensor, async_op)


class _Reduce(_Comm):
    collective = "reduce_scatter"

    def __init__(self, traffic: Traffic) -> None:
        super().__init__(traffic)
        self.feedback = coccl.Feedback() if traffic.state == "feedback" else None

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any,
        op: Any,
        async_op: bool = False,
    ) -> Any:
        mapped = _reduce_op(op)
        name = mapped[0] if mapped is not None and mapped[1] is None else ""
        if not self.compressed(input_tensor, group, name):
            return _REDUCE(output_tensor, input_tensor, op=op, group=group, async_op=async_op)
        t = self.traffic
        group.note_call(self.collective, "compressed")
        group.comm.reduce_scatter(
            input_tensor, output_tensor, op=name, compressor=t.codec, algorithm=t.schedule,
            feedback=self.feedback,
        )  # fmt: skip
        return self.finish(output_tensor, async_op)


def fsdp_comms(gather: Traffic | None = None, reduce: Traffic | None = None) -> tuple[Any, Any]:
    """A new parameter gather and gradient reduce for ONE FSDP module (each keeps its own
    state): FSDP2 ``AllGather`` / ``ReduceScatter`` objects.

    Args:
        gather: how the parameters travel (``state`` None or ``"delta"``); None: exact.
        reduce: how the gradients travel (``state`` None or ``"feedback"``); None: exact.
    """
    all_gather, reduce_scatter = _base_classes()
    gather_cls = type("CocclAllGather", (_Gather, all_gather), {})
    reduce_cls = type("CocclReduceScatter", (_Reduce, reduce_scatter), {})
    return (
        gather_cls(_check(gather, "gather", ("delta",))),
        reduce_cls(_check(reduce, "reduce", ("feedback",))),
    )


def shard_comms(
    module: Any, gather: Traffic | None = None, reduce: Traffic | None = None
) -> tuple[Any, Any]:
    """Give a ``fully_shard``-ed ``module`` a new pair of :func:`fsdp_comms` (its
    ``set_custom_all_gather`` / ``set_custom_reduce_scatter``) and return them."""
    for name in ("set_custom_all_gather", "set_custom_reduce_scatter"):
        if not hasattr(module, name):
            raise TypeError(f"module has no {name}: call fully_shard(module) first")
    comms = fsdp_comms(gather, reduce)
    module.set_custom_all_gather(comms[0])
    module.set_custom_reduce_scatter(comms[1])
    return comms


__all__ = ["fsdp_comms", "shard_comms"]
