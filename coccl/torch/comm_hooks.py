"""A DDP communication hook that all-reduces gradient buckets through coccl, as torch's
own ``default_hooks.allreduce_hook`` and PowerSGD plug into
``DistributedDataParallel.register_comm_hook``::

    state = coccl.torch.CocclHookState(group=dp_group, feedback=True)
    ddp.register_comm_hook(state, coccl.torch.allreduce_hook)

The bucket is averaged (``op="avg"``: coccl sums, then divides once) by the Communicator
of a coccl process group (``state.group``, default the default group), with the group's
codec, schedule and size threshold (``CocclProcessGroup.call_arguments``), or with
``state.compressor`` / ``state.algorithm`` when given. On two ranks with the identity
codec the result is bitwise DDP's own (which multiplies by 1/2 before summing: exact);
on other rank counts it may differ from it in the last bits (one division, not one
multiplication per rank).

With ``feedback=True`` each bucket keeps a ``coccl.Feedback`` (by ``bucket.index()``):
what the codec lost is added to that bucket's next gradients. DDP rebuilds its buckets
once, after the first iteration, in the order the gradients became ready; a bucket index
may then hold other parameters, so the state keys each bucket's layout by its
parameters and, when a layout changes, moves every parameter's residual into its new
place (``carry_residuals``): nothing is dropped. A bucket the group's rules send exact
(smaller than ``min_compress_bytes``, or an identity codec) keeps no residual.
"""

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

import coccl
from coccl.core.arrays import array_module
from coccl.torch.introspect import coccl_group


@dataclass(frozen=True)
class _Bucket:
    """One bucket's layout (its parameters' ids and sizes, in order) and Feedback."""

    params: tuple[int, ...]
    sizes: tuple[int, ...]
    feedback: Any  # coccl.Feedback (loaded with the Communicator, on first use)


@dataclass
class CocclHookState:
    """The hook's state (one per DDP model).

    Attributes:
        group: the coccl process group (None: the default group).
        compressor: a codec name or config for every bucket (None: the group's rules).
        algorithm: the schedule with ``compressor`` (default ``"auto"``).
        feedback: carry each bucket's codec losses to its next call.
        rebuilds: how many times the bucket layouts changed (residuals were moved).
        calls: buckets all-reduced so far, by path (``"compressed"``, ``"exact"``).
    """

    group: Any = None
    compressor: str | dict | None = None
    algorithm: str = "auto"
    feedback: bool = False
    rebuilds: int = 0
    calls: Counter = field(default_factory=Counter)
    _buckets: dict[int, _Bucket] = field(default_factory=dict)
    _owner: dict[int, int] = field(default_factory=dict)  # parameter id -> bucket index
    _moved: dict[int, Any] = field(default_factory=dict)  # parameter id -> its residual

    def __post_init__(self) -> None:
        if self.compressor is not None:
            codec = coccl.get_compressor(self.compressor)  # ValueError for an unknown one
            if self.feedback and codec.lossless:
                raise ValueError(f"feedback=True needs a lossy compressor, not {codec.codec_id!r}")

    def arguments(self, pg: Any, buffer: torch.Tensor) -> tuple[str, dict[str, Any]]:
        """``(path, Communicator.allreduce keyword arguments)`` for one bucket."""
        path, kwargs = pg.call_arguments("allreduce", buffer, "avg")
        kwargs.pop("op", None)
        if self.compressor is not None:
            kwargs.update(compressor=self.compressor, algorithm=self.algorithm)
            path = "exact" if coccl.get_compressor(self.compressor).lossless else "compressed"
        return path, kwargs

    def feedback_for(self, bucket: Any) -> Any:
        """The bucket's ``coccl.Feedback``; a changed layout moves every residual (see the
        module)."""
        params = tuple(id(p) for p in bucket.parameters())
        index = bucket.index()
        entry = self._buckets.get(index)
        if entry is not None and entry.params == params:
            return entry.feedback
        if entry is not None or any(p in self._owner for p in params):  # rebuilt buckets
            self.rebuilds += 1
            self._moved.update(residual_pieces(self._buckets.values()))
            self._buckets.clear()
            self._owner.clear()
        sizes = tuple(p.numel() for p in bucket.parameters())
        fb = coccl.Feedback()
        if any(p in self._moved for p in params):
            fb.residual = assemble(self._moved, params, sizes)
        self._buckets[index] = _Bucket(params, sizes, fb)
        self._owner.update(dict.fromkeys(params, index))
        return fb


def allreduce_hook(
    state: CocclHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Average the gradient ``bucket`` over the group through coccl (see the module);
    returns a completed Future holding the bucket's buffer, as DDP expects."""
    pg = coccl_group(state.group)
    buffer = bucket.buffer()
    path, kwargs = state.arguments(pg, buffer)
    fb = state.feedback_for(bucket) if state.feedback and path == "compressed" else None
    state.calls[path] += 1
    pg.comm.allreduce(buffer, buffer, op="avg", feedback=fb, **kwargs)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future


def residual_pieces(buckets: Any) -> dict[int, Any]:
    """Every parameter's residual in ``buckets`` (``_Bucket``s), by parameter id: views
    of the buckets' residuals."""
    pieces: dict[int, Any] = {}
    for b in buckets:
        res = b.feedback.residual
        if res is None:
            continue
        offset = 0
        for pid, n in zip(b.params, b.sizes, strict=True):
            pieces[pid] = res[offset : offset + n]
            offset += n
    return pieces


def assemble(moved: dict[int, Any], params: tuple[int, ...], sizes: tuple[int, ...]) -> Any:
    """A new bucket's residual: each parameter's moved residual in its new place (taken
    out of ``moved``), zero for a parameter that had none."""
    first = next(moved[p] for p in params if p in moved)
    out = array_module(first).zeros(sum(sizes), dtype=first.dtype)
    offset = 0
    for pid, n in zip(params, sizes, strict=True):
        piece = moved.pop(pid, None)
        if piece is not None:
            out[offset : offset + n] = piece
        offset += n
    return out


__all__ = ["CocclHookState", "allreduce_hook", "assemble", "residual_pieces"]
