"""Virtual pipeline stages and data-parallel replicas, in one process (PyTorch).

Beside :class:`coccl.tensor_parallel.VirtualTPGroup` (virtual TP ranks), this module
simulates the two other dimensions of a 3D-parallel run, so that TP x PP x DP with a
codec on each kind of traffic trains on one GPU:

* :func:`pp_boundary` (and the module :class:`PPBoundary`): a stage boundary. Forward it
  returns ``decode(encode(x))`` with the forward codec, backward ``decode(encode(grad))``
  with the backward codec: what the next stage receives from a compressed send of the
  activation, and what the previous stage receives from a compressed send of its
  gradient (``None``: exact).
* :class:`VirtualDPGroup`: ``size`` replicas. ``reduce_scatter`` is the arithmetic of
  coccl's two-shot compressed ReduceScatter (``algorithms/two_shot.py``): each replica's
  part of shard ``k`` that is not replica ``k``'s own is encoded once, the owner starts a
  float32 accumulator from its own part, exact, and adds the decoded parts of replicas
  ``0..n-1`` (not ``k``) in rank order; ``avg`` divides once. ``allgather_delta`` is the
  delta rule for the parameter AllGather: every replica holds the same replica of the full
  weights; the owner of shard ``k`` sends ``Q(w_new - replica)`` and every replica, the
  owner included, adds the decoded difference, so replicas stay bitwise equal and the
  quantization error does not accumulate (the first call per buffer sends exact weights).

Every roundtrip is :func:`coccl.virtual_ranks.simulate_allreduce` over one rank (one
payload: encode, then decode), so it runs the codec's own kernels on torch's current
stream, inside a CUDA graph capture too; there a codec that is not ``graph_safe`` raises
``coccl.errors.GraphCaptureError`` instead of running. A stochastic codec (int with
``rounding="stochastic"``) is refused with a ValueError: a real rank salts its random
streams by rank, call and encode, which a simulation does not reproduce.

**Chunks.** A real send or ReduceScatter cuts a message into chunks of a multiple of the
codec's alignment, starting at the message's (shard's) start, and encodes each chunk as
one payload. A codec whose every decision is per group of ``alignment`` elements
(identity, int8, taco, int) encodes the same groups from the same values whether they come
in one payload or several, so one payload per message (per shard) here is bitwise the
chunked real one. A codec with a payload-wide decision (tah picks the lowest-entropy
share of a payload's tokens, NVFP4 one float32 scale per payload: ``payload_scoped``)
depends on the cut: give :func:`pp_boundary` the real cut's ``chunk_elems``; a
``VirtualDPGroup`` encodes one payload per shard, a real call whose chunk holds the
shard. Rows of a batched ``reduce_scatter`` or ``allgather_delta`` (several DP groups at
once) share one payload per shard, which is bitwise one payload per row for the codecs
that are not payload-scoped; for those that are, batched rows are refused.

**What is checked against real ranks** (``tests/mpi/test_virtual_3d.py``, 1-4 CPU
ranks, bitwise): ``VirtualDPGroup.reduce_scatter`` against
``Communicator.reduce_scatter(algorithm="two_shot")``, ``allgather_delta`` against
``Communicator.allgather(delta=)`` over several updates, and :func:`pp_boundary` against
a compressed ``send``/``recv`` (one payload, and the real send's chunks given as
``chunk_elems``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch
from torch import nn

from coccl import get_compressor
from coccl.virtual_ranks import simulate_allreduce

__all__ = ["PPBoundary", "VirtualDPGroup", "pp_boundary", "roundtrip"]


def _resolve(codec: Any) -> Any:
    """A Compressor from a name, config dict or Compressor; None stays None (exact)."""
    return None if codec is None else get_compressor(codec)


def roundtrip(x: torch.Tensor, codec: Any, chunk_elems: int | None = None) -> torch.Tensor:
    """``decode(encode(x))`` in a new tensor of ``x``'s shape, dtype and device.

    Args:
        x: a tensor of a dtype the codec takes.
        codec: a Compressor, name or config dict; None returns an exact copy.
        chunk_elems: encode each run of this many elements (of the flattened ``x``) as its
            own payload, as a real send that cuts chunks does; None: one payload.

    Raises:
        ValueError: a ``chunk_elems`` that is not a positive multiple of the codec's
            alignment. TypeError: a dtype the codec refuses.
    """
    x = x.detach()
    c = _resolve(codec)
    if c is None:
        return x.clone()
    flat = x.contiguous().reshape(1, -1)
    if chunk_elems is None or chunk_elems >= flat.shape[1]:
        out = simulate_allreduce(flat, algorithm="two_shot", compressor=c)
        return out.view(x.shape)
    if isinstance(chunk_elems, bool) or not isinstance(chunk_elems, int) or chunk_elems < 1:
        raise ValueError(f"chunk_elems must be a positive integer, got {chunk_elems!r}")
    if chunk_elems % c.alignment:
        raise ValueError(f"chunk_elems={chunk_elems} is not a multiple of {c!r}'s alignment")
    parts = [
        simulate_allreduce(part, algorithm="two_shot", compressor=c)
        for part in flat.split(chunk_elems, dim=1)
    ]
    return torch.cat(parts).view(x.shape)  # each part: one rank's (chunk,) result


class _PPBoundary(torch.autograd.Function):
    """Forward: the activation as the next stage receives it; backward: the gradient as
    the previous stage receives it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fwd: Any, bwd: Any, chunk: int | None) -> torch.Tensor:
        ctx.bwd, ctx.chunk = bwd, chunk
        return roundtrip(x, fwd, chunk)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return roundtrip(grad, ctx.bwd, ctx.chunk), None, None, None


def pp_boundary(
    x: torch.Tensor, fwd_codec: Any = None, bwd_codec: Any = None, chunk_elems: int | None = None
) -> torch.Tensor:
    """A pipeline stage boundary: ``x`` through a send with ``fwd_codec``, and its
    gradient back through a send with ``bwd_codec`` (None: exact).

    ``chunk_elems``: the real send's cut (one payload per run of that many elements);
    None, one payload per message. The module docstring says when the cut matters.
    """
    return _PPBoundary.apply(x, _resolve(fwd_codec), _resolve(bwd_codec), chunk_elems)


class PPBoundary(nn.Module):
    """:func:`pp_boundary` as a module, to put between two stages of a model.

    Args:
        fwd_codec: the activations' codec (name, config dict, Compressor; None: exact).
        bwd_codec: the activation gradients' codec.
        chunk_elems: the real send's chunk in elements, or None (one payload).
    """

    def __init__(
        self, fwd_codec: Any = None, bwd_codec: Any = None, chunk_elems: int | None = None
    ) -> None:
        super().__init__()
        self.fwd_codec, self.bwd_codec = _resolve(fwd_codec), _resolve(bwd_codec)
        self.chunk_elems = chunk_elems

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _PPBoundary.apply(x, self.fwd_codec, self.bwd_codec, self.chunk_elems)

    def extra_repr(self) -> str:
        return f"fwd={self.fwd_codec!r}, bwd={self.bwd_codec!r}, chunk_elems={self.chunk_elems}"


class VirtualDPGroup:
    """``size`` data-parallel replicas simulated in one process.

    Args:
        size: the number of replicas.
        reduce_codec: the gradients' ReduceScatter codec (name, config dict, Compressor).
        gather_codec: the parameters' AllGather codec.
        delta: AllGather weight differences against the replicas' copy (the delta rule);
            False: every AllGather encodes the weights themselves.

    Tensors are float32 (the gradients and master weights of mixed-precision training:
    the owner's exact part and every decoded part are added in float32, as the real
    accumulator does). A tensor's last dimension is one flat buffer of ``size * m``
    elements, shard ``k`` at ``[k m, (k + 1) m)`` (NCCL's layout); leading dimensions are
    independent groups run at once (e.g. one DP group per TP rank), one payload per shard
    holding every row's part (the module docstring says when that is bitwise one payload
    per row; ``m`` must then be a multiple of the codec's alignment).
    """

    def __init__(
        self,
        size: int,
        reduce_codec: Any = "identity",
        gather_codec: Any = "identity",
        *,
        delta: bool = True,
    ) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive integer, got {size!r}")
        self.size = size
        self.reduce_codec = get_compressor(reduce_codec)
        self.gather_codec = get_compressor(gather_codec)
        self.delta = bool(delta)
        self._started: set[Hashable] = set()  # buffers whose exact first AllGather ran

    def __repr__(self) -> str:
        return (
            f"VirtualDPGroup(size={self.size}, reduce={self.reduce_codec!r}, "
            f"gather={self.gather_codec!r}, delta={self.delta})"
        )

    # ---------------------------------------------------------------- checks
    def _check(self, tensors: Sequence[torch.Tensor], what: str) -> None:
        if len(tensors) != self.size:
            raise ValueError(f"{len(tensors)} {what} for {self.size} replicas")
        first = tensors[0]
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{what}[{i}] is a {type(t).__name__}, not a torch.Tensor")
            if t.dtype != torch.float32:
                raise TypeError(f"{what}[{i}] has dtype {t.dtype}; VirtualDPGroup takes float32")
            if t.shape != first.shape or t.device != first.device:
                raise ValueError(
                    f"{what}[{i}] has shape {tuple(t.shape)} on {t.device}; "
                    f"{what}[0] has {tuple(first.shape)} on {first.device}"
                )
        if first.dim() == 0:
            raise ValueError(f"{what} must have at least one dimension")

    def _shard_len(self, length: int, rows: int, codec: Any) -> int:
        if length % self.size:
            raise ValueError(
                f"a buffer of {length} elements does not split into {self.size} shards"
            )
        m = length // self.size
        if rows > 1 and codec.payload_scoped:
            raise ValueError(
                f"rows batched in one payload are not one payload per row for the "
                f"payload-scoped codec {codec!r} (its groups depend on the rest of the "
                f"payload): reduce or gather one row at a time"
            )
        if rows > 1 and m % codec.alignment:
            raise ValueError(
                f"rows batched in one payload need shards ({m} elements) that are a "
                f"multiple of {codec!r}'s alignment {codec.alignment}"
            )
        return m

    # --------------------------------------------------------- ReduceScatter
    def reduce_scatter(self, grads: Sequence[torch.Tensor], op: str = "sum") -> list[torch.Tensor]:
        """Every replica's reduced shard, as a real two-shot compressed ReduceScatter.

        Args:
            grads: replica ``j``'s flat buffer at index ``j`` (last dimension ``size * m``).
            op: ``"sum"`` or ``"avg"``.

        Returns:
            ``size`` new float32 tensors, replica ``k``'s shard ``k`` (last dimension ``m``).
        """
        if op not in ("sum", "avg"):
            raise ValueError(f"reduce_scatter takes op 'sum' or 'avg', not {op!r}")
        self._check(grads, "grads")
        self.reduce_codec.check_op(op)
        n, length = self.size, grads[0].shape[-1]
        rows = grads[0].numel() // max(length, 1)
        m = self._shard_len(length, rows, self.reduce_codec)
        out = []
        for k in range(n):
            part = slice(k * m, (k + 1) * m)
            acc = grads[k][..., part].detach().clone()  # the owner's own part, exact
            for j in range(n):
                if j != k and m:
                    acc += roundtrip(grads[j][..., part], self.reduce_codec)
            if op == "avg":
                # a true division by a device tensor, as numpy's acc /= float32(n) (torch
                # turns a division by a host scalar into a product with its reciprocal on
                # the GPU); torch.full is a fill kernel, so a CUDA graph can capture it
                acc /= torch.full((), n, dtype=acc.dtype, device=acc.device)
            out.append(acc)
        return out

    # ------------------------------------------------------------- AllGather
    def allgather_delta(
        self, shards: Sequence[torch.Tensor], replica: torch.Tensor, key: Hashable
    ) -> torch.Tensor:
        """Bring ``replica`` (every replica's copy of the full buffer) to the owners' new
        shards, in place, and return it.

        Args:
            shards: replica ``k``'s new values of its shard ``k`` (last dimension ``m``).
            replica: the buffer every replica holds (last dimension ``size * m``).
            key: names the buffer: its first call sends exact weights (with ``delta``).

        With ``delta``, shard ``k`` of the replica becomes ``replica + decode(encode(
        shards[k] - replica))`` (float32 subtraction and addition), so ``replica`` misses
        the new weights by one difference's quantization error, whatever came before;
        without it, ``decode(encode(shards[k]))``.
        """
        self._check(shards, "shards")
        if not isinstance(replica, torch.Tensor) or replica.dtype != torch.float32:
            raise TypeError("replica must be a float32 torch.Tensor")
        m = shards[0].shape[-1]
        if replica.shape != (*shards[0].shape[:-1], self.size * m):
            raise ValueError(
                f"replica has shape {tuple(replica.shape)}; {self.size} shards of "
                f"{tuple(shards[0].shape)} need {(*shards[0].shape[:-1], self.size * m)}"
            )
        rows = replica.numel() // max(replica.shape[-1], 1)
        self._shard_len(replica.shape[-1], rows, self.gather_codec)
        first = self.delta and key not in self._started
        with torch.no_grad():
            for k, new in enumerate(shards):
                part = replica[..., k * m : (k + 1) * m]
                if first:
                    part.copy_(new)
                elif self.delta:
                    part += roundtrip(new - part, self.gather_codec)
                else:
                    part.copy_(roundtrip(new, self.gather_codec))
        if self.delta:
            self._started.add(key)
        return replica

    def state_dict(self) -> dict[str, Any]:
        """The buffers whose first (exact) AllGather ran, for a checkpoint."""
        return {"started": sorted(self._started, key=repr)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._started = set(state["started"])
