"""Point-to-point on a coccl group: torch's ``send``, ``recv``, ``isend``, ``irecv`` and
``batch_isend_irecv`` through the group's Communicator, with a codec per direction.

Direction: a message from a lower group rank to a higher one is *forward* traffic (a
pipeline's activations, sent to the next stage) and travels with
``CocclOptions.p2p_forward``; a message to a lower rank is *backward* traffic (their
gradients) with ``p2p_backward``. The receiver picks its codec by the same rule (a
message from a lower rank is forward), so both ends of a message use the same one; the
Communicator checks that they do, with the count, dtype and tag, and a message whose two
ends differ raises ``CocclError`` on both. Both are exact (``"identity"``) by default;
``coccl.torch.options(group, p2p_forward=...)`` overrides them for the calls of a block.
The rule is the traffic's direction where the stages lie in rank order, one per rank
(GPipe, 1F1B); with several stages per rank (interleaved and looped schedules) the
activations from the last rank's stage to the first rank's next stage go to a lower rank
and travel as backward traffic (their gradients as forward): nothing in a message says
which it is, so such a pipeline gives both directions one codec.

A lossy codec applies to floating tensors (float32, float16, bfloat16, float64) of at
least ``min_compress_bytes``, as the group's ``compressor`` does; other messages
(``torch.distributed.pipelining``'s metadata objects, integer tensors, small ones) travel
exact, and dtypes the Communicator does not carry (bool, float8...) as their bytes.

Pairing: messages between two ranks pair in the order they are posted, one sequence per
(peer, direction), on both sides (the Communicator's rule); the tag is not used for
matching but checked: both ends of a message must give the same tag. A receive from any
source has no peer to pair with and is refused.

Progress: every call posts its message and returns; the Communicator's progress engine
moves every message of the group in flight whenever this rank posts, waits for or
tests any of them, so sends and receives in both directions at once (a ring of
``batch_isend_irecv`` exchanges) never wait on one another. Messages of host tensors
also move in the background while the rank does something else (a barrier, another
group's collective, compute), as Gloo's do; those of CUDA tensors at the calls only.

CUDA tensors on a group whose Communicator has NCCL on their GPU (one rank per GPU) go
to it as they are and travel over NCCL, the codec's kernels on the device: the message
is ordered after the work enqueued on the stream current at the post, and a received
tensor before the work enqueued on the stream current at ``Work.wait()`` (or at the
``is_completed()`` that first sees it done) from then on. Elsewhere (staged MPI: ranks
sharing a GPU) they travel through host copies: a send copies the tensor to the host
after the caller's current stream; a receive lands in host memory and is copied into the
tensor on the stream current at ``Work.wait()`` (or ``is_completed()``). Non-contiguous
tensors are copied in and out as host tensors are.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch

# torch dtypes a coccl Communicator carries (for point-to-point, others travel as bytes).
CARRIED = frozenset(
    {torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8,
     torch.int16, torch.int32, torch.int64}
)  # fmt: skip
_FLOATS = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.float64})
KINDS = ("send", "recv")


def direction(kind: str, rank: int, peer: int) -> str:
    """``"forward"`` for a message from a lower group rank to a higher one, else
    ``"backward"``, seen from either end (``kind`` is this rank's end)."""
    sender, receiver = (rank, peer) if kind == "send" else (peer, rank)
    return "forward" if sender < receiver else "backward"


def choose(opts: Any, kind: str, rank: int, peer: int, tensor: torch.Tensor) -> tuple[str, Any]:
    """The codec of one message and its statistics key (``send_forward:compressed``...).

    Args:
        opts: the group's ``CocclOptions`` with the overrides in force.
        kind: ``"send"`` or ``"recv"``, this rank's end.
        rank, peer: this rank and the other end, group ranks.
        tensor: the message's tensor.
    """
    where = direction(kind, rank, peer)
    forward = where == "forward"
    config = opts.p2p_forward if forward else opts.p2p_backward
    codec = opts.p2p_codecs[0 if forward else 1]
    if codec.lossless:
        return f"{kind}_{where}:exact", config
    nbytes = tensor.numel() * tensor.element_size()
    if tensor.dtype in _FLOATS and nbytes >= opts.min_compress_bytes:
        return f"{kind}_{where}:compressed", config
    return f"{kind}_{where}:exact", "identity"


class Pending:
    """Messages in flight (one call's, or a coalesced batch's): ``wait()`` and ``test()``
    as the Communicator's handles, then, once all are done, the copies into the caller's
    tensors (``finish``), exactly once.

    Args:
        handles: objects with ``wait()`` and ``test()`` (P2PHandles, or other Pendings).
        finish: what runs once they are all complete (None: nothing).
    """

    def __init__(self, handles: Sequence[Any], finish: Callable[[], Any] | None = None) -> None:
        self._handles = list(handles)
        self._finish = finish

    def wait(self) -> None:
        """Block until every message is complete (CocclError on a failure or timeout)."""
        for h in self._handles:
            h.wait()
        self._finished()

    def test(self) -> bool:
        """Whether every message is complete, without blocking."""
        if not all(h.test() for h in self._handles):
            return False
        self._finished()
        return True

    def _finished(self) -> None:
        finish, self._finish = self._finish, None
        if finish is not None:
            finish()


def post(
    comm: Any,
    opts: Any,
    kind: str,
    tensors: list[torch.Tensor],
    peer: int,
    tag: int,
    counts: Counter[str],
) -> Pending:
    """Post one send or receive of ``tensors[0]`` to or from group rank ``peer`` on
    ``comm`` and return its ``Pending``; bad arguments raise before any byte moves.

    Args:
        comm: the group's Communicator.
        opts: the group's ``CocclOptions`` with the overrides in force.
        kind: ``"send"`` or ``"recv"``.
        tensors: torch's list of one tensor.
        peer: the other end's group rank.
        tag: torch's tag, which both ends must give alike.
        counts: the group's statistics, counted by ``choose``'s key.
    """
    if not isinstance(tensors, (list, tuple)) or len(tensors) != 1:
        raise ValueError(f"a coccl {kind} takes a list of one tensor, got {tensors!r}")
    tensor = tensors[0]
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"a coccl {kind} takes a torch tensor, got {type(tensor).__name__}")
    key, compressor = choose(opts, kind, comm.rank, peer, tensor)
    direct = tensor.is_cuda and tensor.is_contiguous()
    if direct and comm.p2p_over_nccl(tensor.device.index):
        wire, finish = _on_device(tensor, kind)
    else:
        direct = False
        wire, finish = _wire(tensor, kind)
    options = {"compressor": compressor, "tag": tag, "chunk_bytes": opts.chunk_bytes}
    if kind == "send":
        handle = comm.isend(wire, peer, **options)
    else:
        handle = comm.irecv(wire, peer, **options)
    counts[key] += 1
    if finish is not None and not direct:
        counts[f"copied:{kind}"] += 1
    return Pending([handle], finish)


def _on_device(tensor: torch.Tensor, kind: str) -> tuple[torch.Tensor, Callable[[], Any] | None]:
    """The tensor the Communicator moves over NCCL for contiguous CUDA ``tensor`` (itself,
    or its bytes for a dtype it does not carry), and for a receive what orders it before
    the stream current when it is found complete (the Communicator orders it on the
    stream current at the post)."""
    t = tensor.detach()
    buf = t if t.dtype in CARRIED else t.reshape(-1).view(torch.uint8)
    if kind == "send":
        return buf, None
    posted = torch.cuda.current_stream(t.device)

    def order() -> None:
        now = torch.cuda.current_stream(t.device)
        if now != posted:
            now.wait_stream(posted)

    return buf, order


def _wire(tensor: torch.Tensor, kind: str) -> tuple[torch.Tensor, Callable[[], Any] | None]:
    """The tensor the Communicator moves for ``tensor`` (a host copy of a CUDA tensor, a
    contiguous copy of a strided one, bytes of a dtype it does not carry), and for a
    receive what copies the message into ``tensor`` once it is complete (None: it lands
    there itself)."""
    t = tensor.detach()
    if t.is_cuda:
        buf = t.cpu() if kind == "send" else torch.empty(t.shape, dtype=t.dtype)
    elif not t.is_contiguous():
        buf = t.contiguous() if kind == "send" else torch.empty(t.shape, dtype=t.dtype)
    else:
        buf = t
    finish = None if kind == "send" or buf is t else functools.partial(t.copy_, buf)
    if buf.dtype not in CARRIED:
        buf = buf.reshape(-1).view(torch.uint8)
    return buf, finish


__all__ = ["CARRIED", "KINDS", "Pending", "choose", "direction", "post"]
