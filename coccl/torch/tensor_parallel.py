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

**Virtual ranks.** On a :class:`VirtualTPGroup` the same layers run all ``size`` ranks
of a group in one process: a layer holds every rank's shard (``rank_weights``) and
computes every rank's partial products with the same calls a real rank makes, and each
AllReduce is :func:`coccl.virtual_ranks.simulate_allreduce` of the ranks' partials,
bitwise what a real coccl AllReduce over ``size`` ranks returns (the same quantization
points, the same reduction order). Between the linears, activations are kept in the
unsharded layout (a column-parallel output holds every rank's features, rank after rank
within each block), so the modules in between, such as attention over the heads, run on
every rank's features at once, unchanged. A study of the wire codec at TP = 8 thus
becomes a one-process, one-GPU job.

This module imports torch; ``import coccl`` does not import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from coccl import algorithms
from coccl.algorithms.schedule_args import shard_stride
from coccl.algorithms.virtual_ranks import SIMULATED_ALGORITHMS, simulate_allreduce
from coccl.compressors import Compressor, get_compressor

if TYPE_CHECKING:
    # Not imported at run time: the Communicator imports mpi4py, which initialises MPI,
    # and a VirtualTPGroup needs no MPI at all.
    from coccl.communicator import Communicator

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "TPGroup",
    "VirtualTPGroup",
    "copy_to_tp_region",
    "copy_to_virtual_ranks",
    "is_tp_sharded",
    "merge_virtual_ranks",
    "reduce_from_tp_region",
    "reduce_from_virtual_ranks",
    "split_virtual_ranks",
]

# Attribute set on parameters that each rank holds a different shard of (Megatron calls it
# ``tensor_model_parallel``); every other parameter is replicated on all TP ranks.
SHARDED_ATTR = "coccl_tp_sharded"


@dataclass(frozen=True)
class TPGroup:
    """A tensor-parallel group and how its AllReduces run.

    Attributes:
        comm: the coccl Communicator of the TP ranks.
        algorithm: ``"ring"``, ``"two_shot"``, ``"native"`` or ``"auto"`` (with a lossy
            codec, auto compresses every AllReduce and picks the schedule).
        compressor: a codec name or label, config dict or Compressor (resolved once here).
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


@dataclass(frozen=True)
class VirtualTPGroup:
    """``size`` tensor-parallel ranks simulated in one process.

    Layers built on it hold every rank's shard and compute every rank's partial results;
    its AllReduce of the ``size`` partials is bitwise what each rank of a real coccl
    group with the same algorithm, compressor and rank count would receive
    (:func:`coccl.virtual_ranks.simulate_allreduce`).

    Attributes:
        size: the number of virtual ranks.
        algorithm: ``"ring"`` or ``"two_shot"`` (``"native"`` and ``"auto"`` reduce in the
            transport's own order, which cannot be reproduced bitwise).
        compressor: a codec name or label, config dict or Compressor (resolved once here).
        chunk_bytes: the pipeline chunk of the real group reproduced. It changes the
            result only for a ``payload_scoped`` codec (NVFP4, tah: ``coccl.virtual_ranks``
            says why). None with such a codec: one chunk per shard, each shard's every
            encode one payload, which is a real group given a ``chunk_bytes`` of at least
            a shard's bytes, and a real group over NCCL given none (and no
            ``COCCL_CHUNK_BYTES``, which would set its chunk) while a whole shard's round
            fits the staging limit (``communicator.sizing.nccl_chunk_bytes`` cuts the
            shard only beyond it).
    """

    size: int
    algorithm: str = "two_shot"
    # A name or config dict is accepted and replaced by the Compressor it names.
    compressor: str | dict[str, Any] | Compressor = "identity"
    chunk_bytes: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"size must be a positive integer, got {self.size!r}")
        if self.algorithm not in SIMULATED_ALGORITHMS:
            raise ValueError(
                f"VirtualTPGroup takes algorithm 'ring' or 'two_shot', not {self.algorithm!r}"
            )
        object.__setattr__(self, "compressor", get_compressor(self.compressor))

    def allreduce(self, partials: Sequence[torch.Tensor]) -> torch.Tensor:
        """The sum of ``partials`` (rank ``r``'s at index ``r``) as every rank of a real
        group receives it, in a new tensor (the partials are left untouched)."""
        if len(partials) != self.size:
            raise ValueError(f"{len(partials)} partials for {self.size} virtual ranks")
        if self.size == 1:
            # Nothing to reduce (as TPGroup at one rank): skip the codec's round trip too.
            return partials[0].detach().clone()
        chunk_bytes = self.chunk_bytes
        if chunk_bytes is None and self.compressor.payload_scoped:
            chunk_bytes = _whole_shard_bytes(partials[0], self.size, self.compressor.alignment)
        return simulate_allreduce(
            torch.stack([p.detach() for p in partials]),
            algorithm=self.algorithm,
            compressor=self.compressor,
            op="sum",
            chunk_bytes=chunk_bytes,
        )


def _whole_shard_bytes(x: torch.Tensor, size: int, alignment: int) -> int:
    """A chunk of one whole shard stride of ``x`` over ``size`` ranks (the planner's
    ``chunk_elems`` of it is the stride: one chunk per shard)."""
    return max(1, shard_stride(x.numel(), size, alignment) * x.element_size())


GroupLike = "TPGroup | VirtualTPGroup | Communicator"


def _as_group(group: GroupLike, algorithm: str, compressor: Any) -> TPGroup | VirtualTPGroup:
    if isinstance(group, (TPGroup, VirtualTPGroup)):
        return group
    from coccl.communicator import Communicator  # noqa: PLC0415

    if not isinstance(group, Communicator):
        raise TypeError(
            f"group must be a TPGroup, VirtualTPGroup or Communicator, got {type(group).__name__}"
        )
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


class _CopyToVirtualRanks(torch.autograd.Function):
    """f on virtual ranks: forward ``x`` once per rank, backward the simulated
    AllReduce of the ranks' gradients."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: VirtualTPGroup) -> tuple[torch.Tensor, ...]:
        ctx.group = group
        return tuple(x.view_as(x) for _ in range(group.size))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor, None]:
        # an output no rank used gets a zero gradient (autograd materialises it)
        return ctx.group.allreduce(grads), None


class _ReduceFromVirtualRanks(torch.autograd.Function):
    """g on virtual ranks: forward the simulated AllReduce of the ranks' partials,
    backward the output's gradient to every rank."""

    @staticmethod
    def forward(ctx: Any, group: VirtualTPGroup, *partials: torch.Tensor) -> torch.Tensor:
        ctx.size = len(partials)
        return group.allreduce(partials)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return (None, *([grad] * ctx.size))


def copy_to_tp_region(x: torch.Tensor, group: TPGroup) -> torch.Tensor:
    """Megatron's *f*: return ``x``; in backward, AllReduce its gradient over ``group``."""
    return _CopyToTPRegion.apply(x, group)


def reduce_from_tp_region(x: torch.Tensor, group: TPGroup) -> torch.Tensor:
    """Megatron's *g*: AllReduce ``x`` over ``group``; in backward, pass the gradient on."""
    return _ReduceFromTPRegion.apply(x, group)


def copy_to_virtual_ranks(x: torch.Tensor, group: VirtualTPGroup) -> list[torch.Tensor]:
    """*f* on ``group.size`` virtual ranks: ``x`` once per rank (rank ``r``'s input at
    index ``r``); in backward, the simulated AllReduce of the ranks' gradients."""
    return list(_CopyToVirtualRanks.apply(x, group))


def reduce_from_virtual_ranks(
    partials: Sequence[torch.Tensor], group: VirtualTPGroup
) -> torch.Tensor:
    """*g* on ``group.size`` virtual ranks: the simulated AllReduce of the ranks'
    ``partials``; in backward, the output's gradient goes to every rank."""
    return _ReduceFromVirtualRanks.apply(group, *partials)


def merge_virtual_ranks(outputs: Sequence[torch.Tensor], blocks: int = 1) -> torch.Tensor:
    """The ranks' local outputs of a column-parallel layer (rank ``r``: its slice of each
    of ``blocks`` blocks of features) as one tensor in the unsharded layout."""
    stacked = torch.stack(list(outputs), dim=-2)  # [..., ranks, blocks * per]
    per = stacked.shape[-1] // blocks
    return stacked.unflatten(-1, (blocks, per)).transpose(-3, -2).flatten(-3)


def split_virtual_ranks(x: torch.Tensor, size: int, blocks: int = 1) -> list[torch.Tensor]:
    """``x`` (last dimension in the unsharded layout) cut into the ``size`` ranks' local
    inputs of a row-parallel layer, each contiguous, as a real rank holds it; the inverse
    of :func:`merge_virtual_ranks`."""
    width = x.shape[-1]
    if width % (blocks * size):
        raise ValueError(f"dimension {width} does not split into {blocks} block(s) of {size}")
    parts = x.unflatten(-1, (blocks, size, width // (blocks * size)))
    return list(parts.movedim(-2, 0).contiguous().flatten(-2).unbind(0))


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


class _ParallelLinear(nn.Module):
    """What both layers share: the group, the shapes, the parameters and ``from_linear``.

    On a :class:`TPGroup` a layer holds this rank's shard, ``weight`` (and ``bias``); on
    a :class:`VirtualTPGroup` it holds every rank's, ``rank_weights[r]`` (and, where the
    bias is sharded, ``rank_biases[r]``), each the tensor rank ``r`` would hold.
    """

    sharded_dim: ClassVar[int]  # the dimension of the weight split over the ranks
    sharded_bias: ClassVar[bool]  # whether the bias is split too (else replicated)

    def __init__(
        self,
        in_features: int,
        out_features: int,
        group: GroupLike,
        *,
        bias: bool = True,
        blocks: int = 1,
        algorithm: str = "two_shot",
        compressor: str | dict | Compressor = "identity",
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        self.group = _as_group(group, algorithm, compressor)
        self.in_features, self.out_features, self.blocks = in_features, out_features, blocks
        self.virtual = isinstance(self.group, VirtualTPGroup)
        size = self.group.size
        if self.sharded_dim == 0:
            name, features = "out_features", out_features
        else:
            name, features = "in_features", in_features
        self.features_per_rank = _split_features(features, size * blocks, name) * blocks
        shape = [out_features, in_features]
        shape[self.sharded_dim] = self.features_per_rank
        # each rank's shard initialised as nn.Linear would for its shape
        shards = [
            nn.Linear(shape[1], shape[0], bias=bias, device=device, dtype=dtype)
            for _ in range(size if self.virtual else 1)
        ]
        if self.virtual:
            self.rank_weights = nn.ParameterList(s.weight for s in shards)
            self.rank_biases = (
                nn.ParameterList(s.bias for s in shards) if bias and self.sharded_bias else None
            )
            self.bias = shards[0].bias if bias and not self.sharded_bias else None
        else:
            self.weight = shards[0].weight
            self.bias = shards[0].bias if bias else None
        self._mark_sharded()

    def _mark_sharded(self) -> None:
        for weight, bias in self.shards():
            _mark_sharded(weight)
            if bias is not None and self.sharded_bias:
                _mark_sharded(bias)

    @property
    def ranks(self) -> list[int]:
        """The ranks whose shards this layer holds: every rank of a virtual group, else
        this process's."""
        return list(range(self.group.size)) if self.virtual else [self.group.rank]

    def shards(self) -> list[tuple[nn.Parameter, nn.Parameter | None]]:
        """``(weight, bias)`` of each rank in ``ranks``, as that rank holds them (a
        replicated bias is the same tensor for every rank)."""
        if not self.virtual:
            return [(self.weight, self.bias)]
        biases = self.rank_biases if self.rank_biases is not None else [self.bias] * len(self.ranks)
        return list(zip(self.rank_weights, biases, strict=True))

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        group: GroupLike,
        *,
        blocks: int = 1,
        algorithm: str = "two_shot",
        compressor: str | dict | Compressor = "identity",
    ) -> Any:
        """The shards of an unsharded ``linear`` (the same on every rank): this rank's on
        a TPGroup or Communicator, every rank's on a VirtualTPGroup.

        ``blocks`` > 1 treats the split features as that many equal consecutive blocks
        (e.g. 3 for a fused ``[q | k | v]`` projection) and gives each rank its slice of
        every block, so that its local features are ``[q_r | k_r | v_r]``.
        """
        # skip_init: no random init (it would only be overwritten, and drawing from the
        # global generator would shift every later draw away from the unsharded run's).
        layer = torch.nn.utils.skip_init(
            cls,
            linear.in_features,
            linear.out_features,
            group,
            bias=linear.bias is not None,
            blocks=blocks,
            algorithm=algorithm,
            compressor=compressor,
            device=linear.weight.device,
            dtype=linear.weight.dtype,
        )
        layer._mark_sharded()  # skip_init's to_empty made new Parameters
        size = layer.group.size
        with torch.no_grad():
            for rank, (weight, bias) in zip(layer.ranks, layer.shards(), strict=True):
                full = linear.weight if cls.sharded_dim == 0 else linear.weight.t()
                shard = _shard_rows(full, rank, size, blocks)
                weight.copy_(shard if cls.sharded_dim == 0 else shard.t())
                if bias is not None and cls.sharded_bias:
                    bias.copy_(_shard_rows(linear.bias, rank, size, blocks))
                elif bias is not None:
                    bias.copy_(linear.bias)
        return layer

    def extra_repr(self) -> str:
        g = self.group
        where = f"{g.size} virtual ranks" if self.virtual else f"rank {g.rank}/{g.size}"
        split = "out_features" if self.sharded_dim == 0 else "in_features"
        blocks = f" in {self.blocks} blocks" if self.blocks > 1 else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features} "
            f"({split} {self.features_per_rank} per rank{blocks}, {where}), "
            f"bias={self.bias is not None or getattr(self, 'rank_biases', None) is not None}, "
            f"algorithm={g.algorithm!r}, compressor={g.compressor!r}"
        )


class ColumnParallelLinear(_ParallelLinear):
    """``y = x A^T + b`` with ``A`` split along its output features (rows of ``A``).

    The input is replicated on every rank; the output stays split (each rank holds
    ``out_features / size`` columns of ``y``), ready for a :class:`RowParallelLinear`.
    Backward AllReduces the input gradient (Megatron's *f*). On a
    :class:`VirtualTPGroup` the output holds every rank's columns in the unsharded
    layout (:func:`merge_virtual_ranks`), and the input gradient is the simulated
    AllReduce of the ranks' partial input gradients.

    Args:
        in_features: size of each input sample.
        out_features: size of each full output sample (divisible by the TP size).
        group: a :class:`TPGroup` or :class:`VirtualTPGroup`, or a Communicator with
            ``algorithm`` and ``compressor``.
        bias: whether to learn a (split) bias.
        blocks: the output features as that many equal blocks, each split over the ranks
            (3 for a fused ``[q | k | v]``); see :meth:`from_linear`.
        algorithm, compressor: used when ``group`` is a Communicator.
        device, dtype: of the parameters.

    Parameters are initialised as ``nn.Linear`` would for each shard's shape; to start
    from the same weights as an unsharded model, build it with :meth:`from_linear`.
    """

    sharded_dim = 0
    sharded_bias = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.virtual:
            return nn.functional.linear(copy_to_tp_region(x, self.group), self.weight, self.bias)
        inputs = copy_to_virtual_ranks(x, self.group)
        outputs = [
            nn.functional.linear(x_r, weight, bias)
            for x_r, (weight, bias) in zip(inputs, self.shards(), strict=True)
        ]
        return merge_virtual_ranks(outputs, self.blocks)


class RowParallelLinear(_ParallelLinear):
    """``y = x A^T + b`` with ``A`` split along its input features (columns of ``A``).

    The input arrives split (as a :class:`ColumnParallelLinear` leaves it); each rank
    computes a partial product and the forward AllReduces it (Megatron's *g*). The bias is
    replicated and added once, after the AllReduce; the output is replicated. On a
    :class:`VirtualTPGroup` the input holds every rank's features in the unsharded layout
    (:func:`split_virtual_ranks` cuts it), and the output is the simulated AllReduce of
    the ranks' partial products.

    Args:
        in_features: size of each full input sample (divisible by the TP size).
        out_features: size of each output sample.
        group: a :class:`TPGroup` or :class:`VirtualTPGroup`, or a Communicator with
            ``algorithm`` and ``compressor``.
        bias: whether to learn a (replicated) bias.
        blocks: the input features as that many equal blocks, each split over the ranks.
        algorithm, compressor: used when ``group`` is a Communicator.
        device, dtype: of the parameters.
    """

    sharded_dim = 1
    sharded_bias = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.virtual:
            inputs = split_virtual_ranks(x, self.group.size, self.blocks)
            partials = [
                nn.functional.linear(x_r, weight)
                for x_r, (weight, _) in zip(inputs, self.shards(), strict=True)
            ]
            y = reduce_from_virtual_ranks(partials, self.group)
        else:
            y = reduce_from_tp_region(nn.functional.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias
