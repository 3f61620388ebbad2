"""``all_to_all_single`` on a coccl group through ``Communicator.alltoall``.

torch splits along dimension 0 (``output_splits`` / ``input_splits`` count rows; empty
lists: equal parts); the Communicator counts elements, so each split is scaled by the
elements of one row. An equal split keeps its cached, agreed plan; an uneven one has its
counts agreed at every call (a split that does not match raises ``CocclError`` on every
rank before any byte moves). The codec is the group's when ``CocclOptions.compress``
names ``"alltoall"`` and the message is large enough (the group's ``call_arguments``),
exact otherwise; each rank's block is encoded once and decoded into its slot, this
rank's own block too.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def element_counts(t: torch.Tensor, splits: list[int], size: int) -> list[int] | None:
    """torch's row splits of ``t`` as element counts (None for an empty list: equal)."""
    if not splits:
        return None
    if len(splits) != size:
        raise ValueError(f"all_to_all_single: {len(splits)} split sizes for a group of {size}")
    row = math.prod(t.shape[1:]) if t.dim() > 0 else 1
    return [int(s) * row for s in splits]


def run(
    comm: Any,
    output: torch.Tensor,
    input: torch.Tensor,
    output_splits: list[int],
    input_splits: list[int],
    kwargs: dict[str, Any],
) -> bool:
    """All-to-all of ``input`` into ``output`` with the Communicator's ``kwargs``
    (compressor, algorithm, chunk_bytes); True if a tensor was copied in or out (a
    strided one)."""
    send = element_counts(input, input_splits, comm.size)
    recv = element_counts(output, output_splits, comm.size)
    if (send is None) != (recv is None):  # one side equal, the other given: both explicit
        send = send or [input.numel() // comm.size] * comm.size
        recv = recv or [output.numel() // comm.size] * comm.size
    x = input.detach()
    out = output.detach()
    src = x if x.is_contiguous() else x.contiguous()
    dst = out if out.is_contiguous() else torch.empty(out.shape, dtype=out.dtype, device=out.device)
    if out is x and src is not x:
        dst = src  # in place: the contiguous copy is the output too
    comm.alltoall(src, dst, send_counts=send, recv_counts=recv, **kwargs)
    if dst is not out:
        out.copy_(dst)
    return src is not x or dst is not out


__all__ = ["element_counts", "run"]
