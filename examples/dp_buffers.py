"""The DP side of the 3D harness (``train3d_convergence_gpu.py``): flat gradient buffers
per pipeline stage, and AdamW on the shards of a virtual DP group.

A buffer holds rows of parameters of equal shapes: one row per TP rank of its shards (the
TP ranks' DP groups, simulated at once), or one row of the parameters every TP rank holds
alike. Its ``replica`` (rows x length, float32) is the weights every DP replica holds: the
model's parameters are views into it, so the delta AllGather updates the model in place.
Its ``master`` is the owners' float32 master weights, AdamW's parameters (views too), whose
gradients are views into ``grad``, where the reduced shards land.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from coccl.tensor_parallel import ColumnParallelLinear, RowParallelLinear, is_tp_sharded
from coccl.torch.virtual_3d import VirtualDPGroup


class DPBuffer:
    """One flat buffer: ``rows`` of parameters, zero-padded to a multiple of ``quantum``."""

    def __init__(self, name: str, rows: list[list[nn.Parameter]], quantum: int) -> None:
        self.name, self.rows = name, rows
        shapes = [p.shape for p in rows[0]]
        if any([p.shape for p in row] != shapes for row in rows):
            raise ValueError(f"buffer {name}: rows of different shapes")
        sizes = [p.numel() for p in rows[0]]
        self.offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        self.used = sum(sizes)
        self.length = -(-self.used // quantum) * quantum
        device = rows[0][0].device
        self.replica = torch.zeros(len(rows), self.length, device=device)
        with torch.no_grad():
            for r, row in enumerate(rows):
                for p, view in zip(row, self.views(self.replica, r), strict=True):
                    view.copy_(p)
                    p.data = view  # the model reads the replica
        self.master = self.replica.clone()
        self.grad = torch.zeros_like(self.master)
        self.master_params = []
        for r in range(len(rows)):
            grads = self.views(self.grad, r)
            for view, g in zip(self.views(self.master, r), grads, strict=True):
                mp = nn.Parameter(view)  # shares the master's memory
                mp.grad = g
                self.master_params.append(mp)
        self.pad = torch.zeros(self.length - self.used, device=device)

    def views(self, flat: torch.Tensor, r: int) -> list[torch.Tensor]:
        """Row ``r`` of ``flat`` cut into tensors shaped like the row's parameters."""
        return [
            flat[r, a : a + p.numel()].view(p.shape)
            for p, a in zip(self.rows[r], self.offsets, strict=True)
        ]

    def flatten(self, grads: dict[Any, torch.Tensor]) -> torch.Tensor:
        """A replica's gradients of this buffer's parameters, as one (rows, length)
        tensor (one concatenation)."""
        parts = []
        for row in self.rows:
            parts += [grads[p].reshape(-1) for p in row]
            if self.pad.numel():
                parts.append(self.pad)
        return torch.cat(parts).view(len(self.rows), self.length)


def stage_buffers(model: nn.Module, half: int, dp_size: int, dp: VirtualDPGroup) -> list[DPBuffer]:
    """Per pipeline stage (blocks before ``half`` with the embeddings; the rest with the
    final norm and head): the TP shards' buffer and the replicated parameters' buffer.
    Padded so that every shard is a whole number of both codecs' groups."""
    align = math.lcm(dp.reduce_codec.alignment, dp.gather_codec.alignment)
    quantum = dp_size * align
    stage_of = {name: _stage(name, half) for name, _ in model.named_parameters()}
    tp = max(len(m.rank_weights) for m in _parallel_linears(model))
    sharded: list[list[list[nn.Parameter]]] = [[[] for _ in range(tp)] for _ in range(2)]
    for name, m in model.named_modules():
        if isinstance(m, (ColumnParallelLinear, RowParallelLinear)):
            s = stage_of[f"{name}.rank_weights.0"]
            for r in range(tp):
                sharded[s][r].append(m.rank_weights[r])
                if m.rank_biases is not None:
                    sharded[s][r].append(m.rank_biases[r])
    replicated: list[list[nn.Parameter]] = [[], []]
    for name, p in model.named_parameters():
        if not is_tp_sharded(p):
            replicated[stage_of[name]].append(p)
    buffers = []
    for s in range(2):
        buffers.append(DPBuffer(f"stage{s}.tp_shards", sharded[s], quantum))
        buffers.append(DPBuffer(f"stage{s}.replicated", [replicated[s]], quantum))
    held = {id(p) for b in buffers for row in b.rows for p in row}
    if held != {id(p) for p in model.parameters()}:
        raise RuntimeError("the DP buffers do not hold every parameter exactly once")
    return buffers


def _parallel_linears(model: nn.Module) -> list[Any]:
    return [m for m in model.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]


def _stage(name: str, half: int) -> int:
    """The pipeline stage of a parameter of tp_gpt's GPT (two stages)."""
    if name.startswith(("tok.", "pos.")):
        return 0
    if name.startswith("blocks."):
        return 0 if int(name.split(".")[1]) < half else 1
    return 1


class ShardedAdamW:
    """AdamW on the DP shards: the reduced gradient shards, the update of the master
    weights (elementwise, so one AdamW over every shard is each owner's own), then the
    AllGather of the new weights into the replicas. Quacks like the optimizer that
    ``tp_convergence_gpu.train`` checkpoints and feeds a learning rate."""

    def __init__(
        self, buffers: list[DPBuffer], dp: VirtualDPGroup, lr: Any, make_optimizer: Callable
    ) -> None:
        self.buffers, self.dp = buffers, dp
        self.masters = nn.ParameterList(p for b in buffers for p in b.master_params)
        self.adam = make_optimizer(self.masters, lr, fused=True, capturable=True)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.adam.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to clear: each step takes its gradients from ``autograd.grad``."""

    def step(self, grads: list[list[torch.Tensor]]) -> None:
        """``grads[j][i]``: replica ``j``'s flat gradients of buffer ``i``."""
        n = self.dp.size
        for i, b in enumerate(self.buffers):
            m = b.length // n
            shards = self.dp.reduce_scatter([g[i] for g in grads], "avg")
            for k, shard in enumerate(shards):
                b.grad[:, k * m : (k + 1) * m].copy_(shard)
        self.adam.step()
        for b in self.buffers:
            m = b.length // n
            owners = [b.master[:, k * m : (k + 1) * m] for k in range(n)]
            self.dp.allgather_delta(owners, b.replica, b.name)

    def state_dict(self) -> dict[str, Any]:
        return {
            "adam": self.adam.state_dict(),
            "master": [b.master.detach().clone() for b in self.buffers],
            "dp": self.dp.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.adam.load_state_dict(state["adam"])
        with torch.no_grad():
            for b, master in zip(self.buffers, state["master"], strict=True):
                b.master.copy_(master)
        self.dp.load_state_dict(state["dp"])
