"""The Megatron-style tensor-parallel transformer block that ``coccl-bench tp-step`` times.

One rank's shard of a pre-LayerNorm block, written with plain torch ops so that the same
code runs over any ``torch.distributed`` group (Gloo, NCCL, coccl) or over none:

- attention: QKV column-parallel (each rank holds ``heads / tp`` query heads and
  ``kv_heads / tp`` key/value heads), causal SDPA, the output projection row-parallel;
- MLP: the up projection column-parallel (``ffn / tp`` units; SwiGLU models hold the
  gate and up projections side by side), the down projection row-parallel.

As in Megatron-LM (Shoeybi et al., 2019, section 3) and ``coccl.tensor_parallel``, the
output of each row-parallel layer is all-reduced forward (*g*) and the input gradient
of each column-parallel layer backward (*f*): four AllReduces of ``tokens x hidden``
elements per block and step. Layer norms are replicated; biases are left out (they
cost little compute and no communication).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.nn import functional as F

from .tp_shapes import ModelShape

INIT_STD = 0.02  # GPT-2's initialization; the step's cost does not depend on it


# ------------------------------------------------------------------ collectives
class AllReduceTimer:
    """The in-place sum over ``group`` that the block's *f* and *g* call, with the time of
    each call kept: CUDA events around it on the current stream (GPU: the collective is
    ordered on that stream, so the interval is what it adds to the step), the wall clock
    on the CPU (there the call has finished when it returns).

    Args:
        group: the process group of the tensor-parallel ranks.
        device: where the tensors live.
    """

    def __init__(self, group: Any, device: torch.device) -> None:
        self.group = group
        self.cuda = device.type == "cuda"
        self._events: list[tuple[Any, Any]] = []
        self._seconds = 0.0
        self.calls = 0
        self.bytes = 0

    def __call__(self, t: torch.Tensor) -> None:
        self.calls += 1
        self.bytes += t.numel() * t.element_size()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dist.all_reduce(t, group=self.group)
            end.record()
            self._events.append((start, end))
        else:
            begin = time.perf_counter()
            dist.all_reduce(t, group=self.group)
            self._seconds += time.perf_counter() - begin

    def reset(self) -> None:
        """Forget the calls so far (at the start of a step)."""
        self._events.clear()
        self._seconds = 0.0
        self.calls = 0
        self.bytes = 0

    def seconds(self) -> float:
        """The calls' time since ``reset()`` (on a GPU: after the device has finished)."""
        return self._seconds + sum(s.elapsed_time(e) for s, e in self._events) / 1e3


Reduce = Callable[[torch.Tensor], None]


class _ReduceForward(torch.autograd.Function):
    """Megatron's g: AllReduce forward (in place on the row-parallel output), identity
    backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, reduce: Reduce) -> torch.Tensor:
        reduce(x)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _ReduceBackward(torch.autograd.Function):
    """Megatron's f: identity forward, AllReduce of the input gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, reduce: Reduce) -> torch.Tensor:
        ctx.reduce = reduce
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        # a copy: autograd may hand the same gradient buffer to other consumers
        out = grad.contiguous().clone()
        ctx.reduce(out)
        return out, None


# ------------------------------------------------------------------------ block
class TPBlock(torch.nn.Module):
    """Rank ``rank``'s shard of one block of ``shape`` split over ``tp`` ranks.

    Args:
        shape: the model width.
        tp: the tensor-parallel ranks the block is split over.
        rank: this rank's index among them.
        layer: the block's index (with ``seed``, it seeds the weights).
        dtype: the parameters' and activations' type.
        device: where they live.
        seed: the weights depend only on (seed, layer, tp, rank), so every group of a run
            computes with the same weights.
    """

    def __init__(
        self,
        shape: ModelShape,
        tp: int,
        rank: int,
        layer: int,
        dtype: torch.dtype,
        device: torch.device,
        seed: int,
    ) -> None:
        super().__init__()
        problem = shape.problem(tp)
        if problem:
            raise ValueError(problem)
        self.shape, self.tp = shape, tp
        self.q_heads, self.kv_heads = shape.heads // tp, shape.kv_heads // tp
        d, h = shape.head_dim, shape.hidden
        ffn = shape.ffn // tp
        gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + layer * 1009 + rank)

        def weight(rows: int, cols: int, std: float = INIT_STD) -> torch.nn.Parameter:
            w = torch.randn(rows, cols, generator=gen, device=device) * std
            return torch.nn.Parameter(w.to(dtype))

        def ones() -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.ones(h, device=device, dtype=dtype))

        # GPT-2's scaled init of the projections that feed the residual stream
        out_std = INIT_STD / math.sqrt(2 * max(1, layer + 1))
        self.ln1, self.ln2 = ones(), ones()
        self.qkv = weight((self.q_heads + 2 * self.kv_heads) * d, h)
        self.proj = weight(h, self.q_heads * d, out_std)
        self.up = weight((2 if shape.gated else 1) * ffn, h)
        self.down = weight(h, ffn, out_std)
        self.reduce: Reduce | None = None

    def _f(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.reduce is None else _ReduceBackward.apply(x, self.reduce)

    def _g(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.reduce is None else _ReduceForward.apply(x, self.reduce)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``[batch, seq, hidden]``, the same on every rank of the group."""
        b, s, h = x.shape
        d = self.shape.head_dim
        a = self._f(F.layer_norm(x, (h,), self.ln1))
        q, k, v = F.linear(a, self.qkv).split(
            [self.q_heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1
        )
        q = q.view(b, s, self.q_heads, d).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, d).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, d).transpose(1, 2)
        gqa = self.kv_heads != self.q_heads
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        a = a.transpose(1, 2).reshape(b, s, self.q_heads * d)
        x = x + self._g(F.linear(a, self.proj))
        m = F.linear(self._f(F.layer_norm(x, (h,), self.ln2)), self.up)
        if self.shape.gated:
            gate, up = m.chunk(2, dim=-1)
            m = F.silu(gate) * up
        else:
            m = F.gelu(m, approximate="tanh")
        return x + self._g(F.linear(m, self.down))


class TPStack(torch.nn.Module):
    """``layers`` blocks of one rank, their AllReduces through ``reduce`` (None: none, as
    at TP = 1 or for the compute of one shard alone)."""

    def __init__(self, layers: int, reduce: Reduce | None = None, **block: Any) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(TPBlock(layer=i, **block) for i in range(layers))
        for blk in self.blocks:
            blk.reduce = reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        return x


def allreduces_per_step(layers: int) -> dict[str, int]:
    """AllReduces of one forward + backward of ``layers`` blocks at TP > 1."""
    return {"forward": 2 * layers, "backward": 2 * layers}
