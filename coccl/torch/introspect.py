"""A coccl group's statistics and what a call on it will run, from its public handle:
``coccl.torch.stats(group)`` and ``coccl.torch.describe(group, "all_reduce", tensor)``."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from coccl.core.reduction import check_op
from coccl.torch.backend import CocclProcessGroup

# torch.distributed's names of the collectives a coccl group runs, and coccl's
TORCH_NAMES = {
    "all_reduce": "allreduce",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_gather_into_tensor": "allgather",
    "allreduce": "allreduce",
    "reduce_scatter": "reduce_scatter",
    "allgather": "allgather",
}


def coccl_group(group: Any = None) -> CocclProcessGroup:
    """The coccl process group ``group`` (None: the default group); TypeError if it is
    not one."""
    pg = dist.group.WORLD if group is None else group
    if not isinstance(pg, CocclProcessGroup):
        raise TypeError(
            f"{'the default group' if group is None else 'group'} is not a coccl group "
            f"({type(pg).__name__}); create it with backend='coccl'"
        )
    return pg


def stats(group: Any = None) -> dict[str, int]:
    """A coccl group's counters: its calls by ``collective:path`` (``allreduce:exact``,
    ``allreduce:compressed``, ``forwarded:broadcast``, ``copied:allreduce`` for a
    non-contiguous tensor copied in and out...), and its Communicator's ``stats()``
    under ``comm:`` (``comm:bytes_sent``...).

    Args:
        group: a process group created with ``backend="coccl"`` (None: the default one).
    """
    pg = coccl_group(group)
    return {**pg.stats(), **{f"comm:{k}": v for k, v in pg.comm.stats().items()}}


def describe(
    group: Any,
    collective: str,
    tensor: torch.Tensor,
    op: Any = dist.ReduceOp.SUM,
    backward: bool | None = None,
) -> dict[str, Any]:
    """What ``collective`` of ``tensor`` on a coccl group runs now (with the
    ``coccl.torch.options`` overrides in force), without moving a byte: the
    Communicator's ``describe`` plus ``path`` (``"compressed"`` or ``"exact"``).

    Args:
        group: a coccl process group (None: the default one).
        collective: ``"all_reduce"``, ``"reduce_scatter_tensor"``,
            ``"all_gather_into_tensor"`` (or coccl's names).
        tensor: the call's input.
        op: a ``ReduceOp`` or coccl's name of one.
        backward: the call's direction: ``True`` as if issued in autograd's backward
            pass (``CocclOptions.backward_compressor``), ``False`` outside it; None: where
            ``describe`` is called (``coccl.torch.in_backward()``).
    """
    pg = coccl_group(group)
    name = TORCH_NAMES.get(collective)
    if name is None:
        raise ValueError(f"a coccl group runs {sorted(TORCH_NAMES)}, not {collective!r}")
    path, kwargs = pg.call_arguments(name, tensor, check_op(op), backward)
    x = tensor if tensor.is_contiguous() else tensor.contiguous()
    return {"path": path, **pg.comm.describe(name, x, **kwargs)}
