"""A coccl group's choices and their direction: ``CocclOptions`` (torch's ``pg_options``
of a ``backend="coccl"`` group), the ``options()`` overrides of the calls inside a
``with`` block, and ``in_backward()``, which picks a collective's codec between
``compressor`` and ``backward_compressor`` (``coccl.torch.backend`` applies them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from coccl import algorithms
from coccl.communicator.dp_plans import HIERARCHICAL_COLLECTIVES, is_pair, level_codecs
from coccl.compressors import Compressor, get_compressor
from coccl.core.options import check_chunk_bytes

COMPRESSIBLE = (*algorithms.COLLECTIVES, "alltoall")  # what CocclOptions.compress may name
DEVICE_BACKENDS = ("auto", "nccl", "none")
DEFAULT_MIN_COMPRESS_BYTES = 64 << 10


@dataclass(frozen=True)
class CocclOptions:
    """A coccl group's choices, given as ``pg_options`` to ``init_process_group`` /
    ``new_group`` (or in ``init_device_mesh``'s ``backend_override``); ``options()``
    overrides them for the calls inside a ``with`` block.

    Attributes:
        compressor: codec name, label or config dict (``"taco"``, ``{"id": "int8"}``...) for the
            collectives in ``compress``, or with ``algorithm="hierarchical"`` an
            ``(intra, inter)`` pair of them (a tuple; a list is taken as one), one codec a
            level, as the Communicator takes it. Default ``"identity"``: exact.
        algorithm: ``"auto"``, ``"ring"``, ``"two_shot"``, ``"native"`` or
            ``"hierarchical"`` (AllReduce and ReduceScatter over nodes of
            ``COCCL_LOCAL_SIZE`` ranks; ``compress`` may then name no AllGather, nor an
            all-to-all with a pair; an exact AllGather runs ``"auto"``).
        chunk_bytes: pipeline chunk size (None: coccl's sizing rules).
        min_compress_bytes: messages (input bytes) smaller than this run exact, so a
            loss-averaging AllReduce of a scalar or a metric is never quantized.
        compress: which collectives use a lossy ``compressor`` (``"allreduce"``,
            ``"reduce_scatter"``, ``"allgather"``, ``"alltoall"``); AllGather and all-to-all
            are left out by default (gathering parameters lossily is rarely wanted).
        device_backend: ``"auto"``: CUDA tensors travel over coccl's NCCL transport when
            every rank has a GPU of its own; ``"nccl"``: require it; ``"none"``: CPU
            tensors only (no NCCL communicator is created).
        p2p_forward: codec of point-to-point messages to a higher group rank (a pipeline's
            activations); the receiver of a message from a lower rank uses it too.
        p2p_backward: codec of messages to a lower group rank (activation gradients).
            Both exact by default; lossy ones apply as ``compressor`` does (floating
            tensors of at least ``min_compress_bytes``; ``coccl.torch.p2p``).
        backward_compressor: codec of the collectives issued while autograd runs a
            backward pass (``in_backward()``): with DTensor's ``ColwiseParallel`` /
            ``RowwiseParallel``, the TP AllReduces of the input gradients, while
            ``compressor`` carries the forward ones (the activations). ``None``: the
            same as ``compressor``. ``algorithm``, ``min_compress_bytes`` and
            ``compress`` apply to both directions. An ``options()`` block that sets
            ``compressor`` and not this field sets it to ``None`` for the block (its
            codec in both directions). Where autograd's state does not say which
            direction a call carries, see ``in_backward()``.
    """

    compressor: str | dict | tuple = "identity"
    algorithm: str = "auto"
    chunk_bytes: int | None = None
    min_compress_bytes: int = DEFAULT_MIN_COMPRESS_BYTES
    compress: tuple[str, ...] = ("allreduce", "reduce_scatter")
    device_backend: str = "auto"
    p2p_forward: str | dict = "identity"
    p2p_backward: str | dict = "identity"
    backward_compressor: str | dict | tuple | None = None

    def __post_init__(self) -> None:
        for name in ("compressor", "backward_compressor"):
            if isinstance(getattr(self, name), list):  # a pair from JSON: held as a tuple
                object.__setattr__(self, name, tuple(getattr(self, name)))
        algorithms.check_algorithm(self.algorithm)
        # ValueError for an unknown codec, or a pair with another algorithm
        codecs, backward = self.codecs, self.backward_codecs
        if self.algorithm == "native" and not codecs[0].lossless:
            raise ValueError(f"algorithm 'native' takes compressor='identity', not {codecs[0]!r}")
        if self.algorithm == "native" and not backward[0].lossless:
            raise ValueError(
                f"algorithm 'native' takes backward_compressor='identity' (or None), not "
                f"{backward[0]!r}"
            )
        check_chunk_bytes(self.chunk_bytes)
        if isinstance(self.min_compress_bytes, bool) or not isinstance(
            self.min_compress_bytes, int
        ):
            raise ValueError(f"min_compress_bytes must be an int, got {self.min_compress_bytes!r}")
        names = (self.compress,) if isinstance(self.compress, str) else self.compress
        object.__setattr__(self, "compress", tuple(names))  # one name may come alone
        unknown = [c for c in self.compress if c not in COMPRESSIBLE]
        if unknown:
            raise ValueError(f"compress names {unknown}; coccl's collectives are {COMPRESSIBLE}")
        if self.algorithm == "hierarchical":
            # no two-level AllGather; an all-to-all has one schedule, so one codec
            pair = len(codecs) == 2 or len(backward) == 2
            runs = HIERARCHICAL_COLLECTIVES if pair else (*HIERARCHICAL_COLLECTIVES, "alltoall")
            beyond = [c for c in self.compress if c not in runs]
            if beyond:
                raise ValueError(
                    f"algorithm 'hierarchical' compresses {', '.join(runs)} only"
                    f"{' (a codec pair)' if pair else ''}; compress names {beyond}"
                )
        self.p2p_codecs  # noqa: B018  (ValueError for an unknown codec)
        if self.device_backend not in DEVICE_BACKENDS:
            raise ValueError(
                f"device_backend must be one of {DEVICE_BACKENDS}, got {self.device_backend!r}"
            )

    @property
    def _timeout(self) -> None:
        """torch's own Options carry a timeout, which DeviceMesh reads from
        ``backend_override``; a coccl group takes the timeout ``new_group`` is given."""
        return None

    @functools.cached_property
    def codecs(self) -> tuple[Compressor, ...]:
        """The group's codec objects: ``(codec,)``, or ``(intra, inter)`` for a pair."""
        return _levels(self.compressor, self.algorithm)

    @functools.cached_property
    def backward_codecs(self) -> tuple[Compressor, ...]:
        """The backward pass's codec objects (``codecs`` when ``backward_compressor`` is
        None)."""
        if self.backward_compressor is None:
            return self.codecs
        return _levels(self.backward_compressor, self.algorithm)

    @property
    def codec(self) -> Compressor:
        """The group's codec object (a pair's intra-node one: ``codecs`` has both)."""
        return self.codecs[0]

    @property
    def backward_codec(self) -> Compressor:
        """The codec object of the backward pass's collectives (``codec`` when
        ``backward_compressor`` is None; a pair's intra-node one)."""
        return self.backward_codecs[0]

    def compressor_for(self, backward: bool) -> tuple[str | dict | tuple, tuple[Compressor, ...]]:
        """``(compressor argument, codec objects)`` of one direction's collectives."""
        if backward and self.backward_compressor is not None:
            return self.backward_compressor, self.backward_codecs
        return self.compressor, self.codecs

    @functools.cached_property
    def p2p_codecs(self) -> tuple[Compressor, Compressor]:
        """The point-to-point codec objects: (forward, backward)."""
        return get_compressor(self.p2p_forward), get_compressor(self.p2p_backward)


def _levels(spec: Any, algorithm: str) -> tuple[Compressor, ...]:
    """A compressor argument's codec objects, checked as the Communicator checks them
    (``level_codecs``): ValueError for an unknown codec, a pair with an algorithm other
    than ``hierarchical``, or a tuple that is not a pair."""
    codec, inter = level_codecs(get_compressor, spec, algorithm, HIERARCHICAL_COLLECTIVES[0])
    return (codec, inter) if is_pair(spec) and inter is not None else (codec,)


def in_backward() -> bool:
    """Whether the calling thread is inside an autograd backward pass: the direction a
    coccl group's collective takes (``CocclOptions.backward_compressor``), decided when
    torch calls the group, on the thread that calls it.

    True (torch's ``_current_graph_task_id() != -1``) inside a node's backward (a custom
    ``autograd.Function``'s, DTensor's redistribute of a gradient), a tensor, module or
    post-accumulate-grad hook, a callback queued for the pass's end (DDP's and FSDP2's
    gradient reductions, ``coccl.torch.allreduce_hook``), ``torch.autograd.grad``, also
    with ``create_graph=True``, and a ``torch.compile``'d backward (torch 2.13 runs
    AOTAutograd's backward graph and compiled autograd's inside the engine's pass, so
    their ops, collectives too, run with the pass's id). False outside, and in a thread
    that the pass did not start (a collective issued from one's own worker thread).

    Where that is not the traffic's direction:

    * activation checkpointing (``torch.utils.checkpoint``, both variants) recomputes the
      forward inside the backward pass, so the recomputed forward's collectives take
      the backward codec, and its activations differ from the first forward's. For the
      forward codec in the recomputation, give the non-reentrant checkpoint
      ``context_fn=lambda: (contextlib.nullcontext(),
      coccl.torch.options(group, backward_compressor=None))`` (the reentrant one takes
      no context).
    * gradients reduced after ``backward()`` returns (an optimizer's or a trainer's
      reduction of norm-layer gradients) take the forward codec: wrap such a call in
      ``coccl.torch.options(group, compressor=...)``.
    * CUDA graphs replay what was captured: a graph captured inside a backward pass
      replays the backward codec, one captured outside it the forward codec, whatever
      pass replays it.
    """
    return torch._C._current_graph_task_id() != -1


# (group or None for every coccl group, field changes), innermost last. Process-wide, not
# per thread or context: autograd runs CUDA backward passes on threads of its own.
_OVERRIDES: list[tuple[Any, dict[str, Any]]] = []


@contextlib.contextmanager
def options(group: Any = None, **changes: Any) -> Iterator[None]:
    """Override a coccl group's options for the calls made inside the block.

    Collective like the calls themselves: every rank must make the same overrides.
    ``compressor`` without ``backward_compressor`` sets the block's codec in both
    directions (``backward_compressor=None``); ``backward_compressor=None`` alone makes
    the backward pass's calls in the block take ``compressor``.

    Args:
        group: the coccl group to override (``None``: every coccl group).
        **changes: ``CocclOptions`` fields, e.g. ``compressor="identity"``.

    Example:
        >>> with coccl.torch.options(tp_group, compressor="int8", algorithm="ring"):
        ...     dist.all_reduce(x, group=tp_group)
    """
    # validates names and values now (a pair against "hierarchical": the group's own
    # algorithm is checked with it at the call, as any combination of the two)
    pair = is_pair(changes.get("compressor")) or is_pair(changes.get("backward_compressor"))
    dataclasses.replace(CocclOptions(algorithm="hierarchical" if pair else "auto"), **changes)
    entry = (group, changes)
    _OVERRIDES.append(entry)
    try:
        yield
    finally:
        _OVERRIDES.remove(entry)


def effective(opts: CocclOptions, group: Any) -> CocclOptions:
    """``group``'s options ``opts`` with the ``options()`` overrides in force for it."""
    for target, changes in _OVERRIDES:
        if target is None or target is group:
            if "compressor" in changes and "backward_compressor" not in changes:
                changes = {**changes, "backward_compressor": None}  # both directions
            opts = dataclasses.replace(opts, **changes)
    return opts


__all__ = [
    "COMPRESSIBLE",
    "DEFAULT_MIN_COMPRESS_BYTES",
    "DEVICE_BACKENDS",
    "CocclOptions",
    "effective",
    "in_backward",
    "options",
]
