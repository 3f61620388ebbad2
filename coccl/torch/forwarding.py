"""What a coccl group hands to an inner torch group: the operations coccl does not run
(broadcast, the list forms of AllGather and all-to-all, gather, scatter, reduce, barrier)
and the calls it does not carry (an op or dtype it lacks), on an inner Gloo group (CPU
tensors) or an inner NCCL group (CUDA tensors, created on first use)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

log = logging.getLogger("coccl.torch.backend")


class Forwarding:
    """The forwarding methods of ``CocclProcessGroup`` (a mixin: the group has the inner
    Gloo group ``_gloo``, the NCCL one ``_nccl`` or None, ``_store``, ``_timeout`` and
    the statistics ``_counts``)."""

    _gloo: Any
    _nccl: Any
    _store: Any
    _timeout: Any
    _counts: Any
    _group_name: str | None

    def _inner(self, tensors: Any) -> Any:
        """The inner group for these tensors: NCCL (created on first use) for CUDA
        tensors, Gloo otherwise."""
        host = self._host_group()  # raises once the group is destroyed
        if not any(t.is_cuda for t in flatten(tensors)):
            return host
        if self._nccl is None:
            # Creating a ProcessGroupNCCL does not communicate (NCCL's communicator is
            # made by its first operation), so any subset of ranks may get here first.
            nccl_opts = dist.ProcessGroupNCCL.Options()
            nccl_opts._timeout = self._timeout
            self._nccl = dist.ProcessGroupNCCL(
                dist.PrefixStore("nccl/", self._store), self.rank(), self.size(), nccl_opts
            )
        return self._nccl

    def _forward(self, method: str, *args: Any) -> Any:
        """Run ``method`` on the inner group that fits the tensors in ``args``."""
        self._counts[f"forwarded:{method}"] += 1
        log.debug("coccl group %s: %s forwarded to the inner group", self._group_name, method)
        return getattr(self._inner(args), method)(*args)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return self._forward("broadcast", tensors, or_default(opts, c10d.BroadcastOptions))

    def allgather(self, outputs: list, inputs: list[torch.Tensor], opts: Any = None) -> Any:
        return self._forward("allgather", outputs, inputs, or_default(opts, c10d.AllgatherOptions))

    def allgather_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> Any:
        return self._forward(
            "allgather_coalesced", outputs, inputs, or_default(opts, c10d.AllgatherOptions)
        )

    def gather(self, outputs: list, inputs: list[torch.Tensor], opts: Any = None) -> Any:
        return self._forward("gather", outputs, inputs, or_default(opts, c10d.GatherOptions))

    def scatter(self, outputs: list[torch.Tensor], inputs: list, opts: Any = None) -> Any:
        return self._forward("scatter", outputs, inputs, or_default(opts, c10d.ScatterOptions))

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        return self._forward("reduce", tensors, or_default(opts, c10d.ReduceOptions))

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list, opts: Any = None):
        return self._forward(
            "reduce_scatter", outputs, inputs, or_default(opts, c10d.ReduceScatterOptions)
        )

    def alltoall(self, outputs: list[torch.Tensor], inputs: list, opts: Any = None) -> Any:
        return self._forward("alltoall", outputs, inputs, or_default(opts, c10d.AllToAllOptions))

    def _host_group(self) -> Any:
        if self._gloo is None:
            raise RuntimeError("this coccl process group was destroyed (shutdown or abort)")
        return self._gloo


def or_default(opts: Any, default: Callable[[], Any]) -> Any:
    """torch's options object, or a default one where torch passes None."""
    return default() if opts is None else opts


def flatten(items: Any) -> list[torch.Tensor]:
    """The tensors in nested lists (other leaves, such as split sizes, left out)."""
    if isinstance(items, torch.Tensor):
        return [items]
    if isinstance(items, (list, tuple)):
        return [t for item in items for t in flatten(item)]
    return []


__all__ = ["Forwarding", "flatten", "or_default"]
