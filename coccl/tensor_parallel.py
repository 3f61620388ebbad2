"""Megatron-style tensor parallelism on coccl collectives (PyTorch).

Two autograd functions carry all the communication of Megatron-LM's 1-D tensor
parallelism (Shoeybi et al., 2019, section 3):

- ``copy_to_tp_region`` (Megatron's *f*): identity forward, AllReduce of the gradient
  backward. It sits in front of a column-parallel layer, whose input is replicated and
  whose every rank contributes a partial input gradient.
- ``reduce_from_tp_region`` (Megatron's *g*): AllReduce forward, identity backward. It
  sits behind a row-parallel layer, whose every rank produces a partial output.

``ColumnParallelLinear`` (weight split along the output features) and
``RowParallelLinear`` (weight split along the input features) build on them; a
column-parallel layer followed by a row-parallel one (an MLP, or attention's QKV and
output projections) costs one AllReduce forward and one backward. Each AllReduce goes
through :meth:`coccl.Communicator.allreduce` with the layer's ``algorithm`` and
``compressor``, so TACO or INT8 can shrink the activations and activation gradients.

coccl makes every rank's AllReduce result bitwise identical, also when compressed, so
activations after *g* and input gradients after *f* are identical on every rank, and
so are the gradients of every replicated parameter (embeddings, layer norms, the
row-parallel bias): replicas never drift apart.

This module imports torch; ``import coccl`` does not import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from coccl import algorithms
from coccl.communicator import Communicator
from coccl.compressors import Compressor, get_compressor

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "TPGroup",
    "copy_to_tp_region",
    "is_tp_sharded",
    "reduce_from_tp_region",
]

# Attribute set on parameters that each rank holds a different shard of (Megatron calls it
# ``tensor_model_parallel``); every other parameter is replicated on all TP ranks.
SHARDED_ATTR = "coccl_tp_sharded"


@dataclass(frozen=True)
class TPGroup:
    """A tensor-parallel group and how its AllReduces run.

    Attributes:
        comm: the coccl Communicator of the TP ranks.
        algorithm: ``"ring"``, ``"two_shot"``, ``"native"`` or ``"auto"`` (note that
            ``"auto"`` sends small messages uncompressed; name a schedule to compress
            every AllReduce).
        compressor: a codec name, config dict or Compressor (resolved once here).
        chunk_bytes: pipeline chunk size, or None for coccl's default.
    """

    comm: Communicator
    algorithm: str = "two_shot"
    # A name or config dict is accepted and replaced by the Compressor it names.
    compressor: str | dict[str, Any] | Compressor = "identity"
    chunk_bytes: int | None = None

    def __post_init__(self) -> None:
        # Resolve names and dicts once, so that a bad codec or schedule fails at
        # construction and not in the middle of a backward pass.
        codec = get_compressor(self.compressor)
        algorithm = algorithms.check_algorithm(self.algorithm)
        if algorithm == "native" and not codec.lossless:
            raise ValueError(f"algorithm 'native' takes compressor='identity', not {codec!r}")
        object.__setattr__(self, "compressor", codec)
        object.__setattr__(self, "algorithm", algorithm)

    @property
    def size(self) -> int:
        return self.comm.size

    @property
    def rank(self) -> int:
        return self.comm.rank

    def allreduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the group into a new tensor (``x`` is left untouched)."""
        if self.comm.size == 1:
            # Nothing to reduce (as Megatron at TP=1): skip the codec's round trip too.
            return x.clone()
        return self.comm.allreduce(
            x.detach().contiguous(),
            op="sum",
            algorithm=self.algorithm,
            compressor=self.compressor,
            chunk_bytes=self.chunk_bytes,
        )


def _as_group(group: TPGroup | Communicator, algorithm: str, compressor: Any) -> TPGroup:
    if isinstance(group, TPGroup):
        return group
    return TPGroup(group, algorithm, compressor)


class _CopyToTPRegion(torch.autograd.Function):
    """f: forward identity, backward AllReduce."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: TPGroup) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.group.allreduce(grad), None


class _ReduceFromTPRegion(torch.autograd.Function):
    """g: forward AllReduce, backward identity."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: TPGroup) -> torch.Tensor:
        return group.allreduce(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def copy_to_tp_region(x: torch.Tensor, group: TPGroup) -> torch.Tensor:
    """Megatron's *f*: return ``x``; in backward, AllReduce its gradient over ``group``."""
    return _CopyToTPRegion.apply(x, group)


def reduce_from_tp_region(x: torch.Tensor, group: TPGroup) -> torch.Tensor:
    """Megatron's *g*: AllReduce ``x`` over ``group``; in backward, pass the gradient on."""
    return _ReduceFromTPRegion.apply(x, group)


def is_tp_sharded(p: torch.Tensor) -> bool:
    """Whether ``p`` is a shard (different on each TP rank) rather than a replica."""
    return bool(getattr(p, SHARDED_ATTR, False))


def _mark_sharded(p: nn.Parameter) -> nn.Parameter:
    setattr(p, SHARDED_ATTR, True)
    return p


def _shard_rows(full: torch.Tensor, rank: int, size: int, blocks: int) -> torch.Tensor:
    """Rank ``rank``'s share of dimension 0 of ``full``, seen as ``blocks`` equal
    consecutive blocks each split ``size`` ways (``blocks=3`` keeps a fused QKV's q, k
    and v apart: each rank gets its heads of all three)."""
    n = full.shape[0]
    if n % (blocks * size):
        raise ValueError(f"dimension {n} does not split into {blocks} block(s) over {size} ranks")
    parts = full.reshape(blocks, size, n // (blocks * size), *full.shape[1:])[:, rank]
    return parts.reshape(n // size, *full.shape[1:]).clone()


def _split_features(total: int, size: int, what: str) -> int:
    if total % size:
        raise ValueError(f"{what}={total} is not divisible by the TP size {size}")
    return total // size


class ColumnParallelLinear(nn.Module):
    """``y = x A^T + b`` with ``A`` split along its output features (rows of ``A``).

    The input is replicated on every rank; the output stays split (each rank holds
    ``out_features / size`` columns of ``y``), ready for a :class:`RowParallelLinear`.
    Backward AllReduces the input gradient (Megatron's *f*).

    Args:
        in_features: size of each input sample.
        out_features: size of each full output sample (divisible by the TP size).
        group: a :class:`TPGroup`, or a Communicator with ``algorithm`` and ``compressor``.
        bias: whether to learn a (split) bias.
        algorithm, compressor: used when ``group`` is a Communicator.
        device, dtype: of the parameters.

    Parameters are initialised as ``nn.Linear`` would for this shard's shape; to start
    from the same weights as an unsharded model, build it with :meth:`from_linear`.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        group: TPGroup | Communicator,
        *,
        bias: bool = True,
        algorithm: str = "two_shot",
        compressor: str | dict | Compressor = "identity",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self.group = _as_group(group, algorithm, compressor)
        self.in_features = in_features
        self.out_features = out_features
        self.out_per_rank = _split_features(out_features, self.group.size, "out_features")
        local = nn.Linear(in_features, self.out_per_rank, bias=bias, device=device, dtype=dtype)
        self.weight = _mark_sharded(local.weight)
        self.bias = _mark_sharded(local.bias) if bias else None

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        group: TPGroup | Communicator,
        *,
        blocks: int = 1,
        algorithm: str = "two_shot",
        compressor: str | dict | Compressor = "identity",
    ) -> ColumnParallelLinear:
        """This rank's shard of an unsharded ``linear`` (the same on every rank).

        ``blocks`` > 1 treats the output features as that many equal consecutive blocks
        (e.g. 3 for a fused ``[q | k | v]`` projection) and gives each rank its slice of
        every block, so the local output is ``[q_r | k_r | v_r]``.
        """
        # skip_init: no random init (it would only be overwritten, and drawing from the
        # global generator would shift every later draw away from the unsharded run's).
        layer = torch.nn.utils.skip_init(
            cls,
            linear.in_features,
            linear.out_features,
            group,
            bias=linear.bias is not None,
            algorithm=algorithm,
            compressor=compressor,
            device=linear.weight.device,
            dtype=linear.weight.dtype,
        )
        _mark_sharded(layer.weight)  # skip_init's to_empty made new Parameters
        if layer.bias is not None:
            _mark_sharded(layer.bias)
        rank, size = layer.group.rank, layer.group.size
        with torch.no_grad():
            layer.weight.copy_(_shard_rows(linear.weight, rank, size, blocks))
            if layer.bias is not None:
                layer.bias.copy_(_shard_rows(linear.bias, rank, size, blocks))
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to_tp_region(x, self.group)
        return nn.functional.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        g = self.group
        return (
            f"in_features={self.in_features}, out_features={self.out_features} "
            f"({self.out_per_rank} on rank {g.rank}/{g.size}), bias={self.bias is not None}, "
            f"algorithm={g.algorithm!r}, compressor={g.compressor!r}"
        )


class RowParallelLinear(nn.Module):
    """``y = x A^T + b`` with ``A`` split along its input features (columns of ``A``).

    The input arrives split (as a :class:`ColumnParallelLinear` leaves it); each rank
    computes a partial product and the forward AllReduces it (Megatron's *g*). The bias is
    replicated and added once, after the AllReduce; the output is replicated.

    Args:
        in_features: size of each full input sample (divisible by the TP size).
        out_features: size of each output sample.
        group: a :class:`TPGroup`, or a Communicator with ``algorithm`` and ``compressor``.
        bias: whether to learn a (replicated) bias.
        algorithm, compressor: used when ``group`` is a Communicator.
        device, dtype: of the parameters.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        group: TPGroup | Communicator,
        *,
        bias: bool = True,
        algorithm: str = "two_shot",
        compressor: str | dict | Compressor = "identity",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self.group = _as_group(group, algorithm, compressor)
        self.in_features = in_features
        self.out_features = out_features
        self.in_per_rank = _split_features(in_features, self.group.size, "in_features")
        local = nn.Linear(self.in_per_rank, out_features, bias=bias, device=device, dtype=dtype)
        self.weight = _mark_sharded(local.weight)
        self.bias = local.bias if bias else None

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        group: TPGroup | Communicator,
        *,
        algorithm: str = "two_shot",
        compressor: str | dict | Compressor = "identity",
    ) -> RowParallelLinear:
        """This rank's shard of an unsharded ``linear`` (the same on every rank)."""
        # skip_init: no random init (it would only be overwritten, and drawing from the
        # global generator would shift every later draw away from the unsharded run's).
        layer = torch.nn.utils.skip_init(
            cls,
            linear.in_features,
            linear.out_features,
            group,
            bias=linear.bias is not None,
            algorithm=algorithm,
            compressor=compressor,
            device=linear.weight.device,
            dtype=linear.weight.dtype,
        )
        _mark_sharded(layer.weight)  # skip_init's to_empty made new Parameters
        rank, size = layer.group.rank, layer.group.size
        with torch.no_grad():
            layer.weight.copy_(_shard_rows(linear.weight.t(), rank, size, 1).t())
            if layer.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = nn.functional.linear(x, self.weight)
        y = reduce_from_tp_region(partial, self.group)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        g = self.group
        return (
            f"in_features={self.in_features} ({self.in_per_rank} on rank {g.rank}/{g.size}), "
            f"out_features={self.out_features}, bias={self.bias is not None}, "
            f"algorithm={g.algorithm!r}, compressor={g.compressor!r}"
        )
