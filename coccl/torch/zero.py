"""A ZeRO-1 sharded optimizer over a coccl group: each rank keeps the optimizer state
of one shard of the flattened parameters (SDP4Bit / ZeRO++'s recipe)::

    opt = coccl.torch.ShardedOptimizer(model.parameters(), group=dp,
                                       reduce_compressor="int8", feedback=True)
    loss.backward(); opt.step(); opt.zero_grad()

At construction the parameters (one dtype, one device) become views of one flat buffer,
the *replica* every rank holds, zero-padded to a multiple of the group size; each rank
keeps a float32 (float64 for float64) master copy of its shard. ``step()``:

1. flattens the local gradients (a missing one counts as zero) and reduce-scatters their
   average with ``reduce_compressor`` (with ``feedback=True`` a ``coccl.Feedback``
   carries what the codec lost into the next step's gradients);
2. runs the inner optimizer (``optimizer_class``, AdamW by default) on the master shard;
3. all-gathers the new shard into the replica: with a lossy ``gather_compressor`` as a
   delta AllGather (``coccl.DeltaState``: the first gather, at construction, is exact;
   then each step sends the quantized change from the replica, so the replicas stay
   bitwise equal on every rank and quantization errors do not accumulate), with an exact
   one as a plain AllGather.

Gradients are not all-reduced by anything else: use the model without DDP. The replica
is the model's parameters, so do not write them outside ``step()`` (build a new
optimizer after loading weights).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

import coccl
from coccl.torch.introspect import coccl_group

DEFAULT_GATHER = {"id": "int", "bits": 4, "group_size": 2048}


class ShardedOptimizer:
    """ZeRO-1 on a coccl group (see the module docstring).

    Args:
        params: the model's parameters (every rank the same, in the same order).
        group: a coccl process group (None: the default group).
        optimizer_class: the inner optimizer, run on this rank's master shard.
        reduce_compressor: the gradients' codec (default ``"int8"``).
        gather_compressor: the parameters' codec (default 4-bit ``int`` in groups of
            2048, sent as differences; an exact codec gathers the shard itself).
        feedback: error feedback on the gradients' ReduceScatter.
        **optimizer_kwargs: passed to ``optimizer_class``.
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        group: Any = None,
        optimizer_class: type = torch.optim.AdamW,
        *,
        reduce_compressor: str | dict = "int8",
        gather_compressor: str | dict = DEFAULT_GATHER,
        feedback: bool = False,
        **optimizer_kwargs: Any,
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("ShardedOptimizer got no parameters that require grad")
        if len({(p.dtype, p.device) for p in self.params}) != 1:
            raise ValueError("ShardedOptimizer needs parameters of one dtype on one device")
        self.comm = coccl_group(group).comm
        self.reduce_compressor, self.gather_compressor = reduce_compressor, gather_compressor
        self.feedback = coccl.Feedback() if feedback else None
        self.delta = (
            None if coccl.get_compressor(gather_compressor).lossless else coccl.DeltaState()
        )
        size, rank = self.comm.size, self.comm.rank
        used = sum(p.numel() for p in self.params)
        self.shard_len = -(-used // size)
        first = self.params[0]
        self.replica = torch.zeros(size * self.shard_len, dtype=first.dtype, device=first.device)
        self.grad = torch.zeros_like(self.replica)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                view = self.replica[offset : offset + p.numel()].view(p.shape)
                view.copy_(p)
                p.data = view  # the model reads the replica
                offset += p.numel()
        own = self.replica[rank * self.shard_len : (rank + 1) * self.shard_len]
        master_dtype = torch.float64 if first.dtype == torch.float64 else torch.float32
        self.master = torch.nn.Parameter(own.detach().to(master_dtype, copy=True))
        self.master.grad = torch.zeros_like(self.master)
        self.optimizer = optimizer_class([self.master], **optimizer_kwargs)
        self._gather()  # every rank's replica from the owners' shards (a delta's exact call)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The inner optimizer's groups (a learning-rate schedule may set ``lr``)."""
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """Reduce-scatter the gradients, step the master shard, gather the replica."""
        offset = 0
        for p in self.params:
            part = self.grad[offset : offset + p.numel()]
            if p.grad is None:
                part.zero_()
            else:
                part.copy_(p.grad.reshape(-1))
            offset += p.numel()
        shard = torch.empty(self.shard_len, dtype=self.grad.dtype, device=self.grad.device)
        self.comm.reduce_scatter(
            self.grad, shard, op="avg", compressor=self.reduce_compressor,
            feedback=self.feedback,
        )  # fmt: skip
        self.master.grad.copy_(shard)
        self.optimizer.step()
        self._gather()

    def _gather(self) -> None:
        new = self.master.detach().to(self.replica.dtype)
        if self.delta is None:
            self.comm.allgather(new, self.replica, compressor=self.gather_compressor)
        else:
            self.comm.allgather(
                new, self.replica, compressor=self.gather_compressor, delta=self.delta
            )

    def state_dict(self) -> dict[str, Any]:
        """This rank's inner optimizer state (of its shard)."""
        return self.optimizer.state_dict()


__all__ = ["ShardedOptimizer"]
