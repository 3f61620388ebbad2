"""Point-to-point: a message cut into chunks as a collective's, each chunk one payload.

The sender encodes chunk i in round i's ``pre``; the receiver decodes it in round i's
``post``. Rounds do not depend on each other, so with a pipeline depth of two or more the
encode of chunk i+1 runs while chunk i is on the wire, and the decode of chunk i while
chunk i+1 arrives. The identity codec sends from the caller's array and receives into
the caller's array directly.

``exchange`` is the grouped form (torch's ``batch_isend_irecv``): round i posts chunk i
of every send and receive of the group together, so a ring of exchanges in both
directions cannot deadlock on the order in which ranks post them. Several messages to
one peer pair in the order given, on both sides.

Tags: round i takes the plan's i-th tag, as every schedule's rounds do, so both ends of a
message (which build their plans alike) number its chunks alike. The Communicator picks
the plan's first tag so that messages that may be in flight at once never share a tag.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

from coccl.core.rounds import Round

from .schedule_args import ScheduleArgs, Span
from .steps import encodes, new_round, payload_of, run_all, send_own

KINDS = ("send", "recv")


def check_ops(plan: ScheduleArgs, ops: Sequence[tuple[str, Any, int]]) -> None:
    """ValueError unless every op is ("send" | "recv", a flat array, a rank of the plan)."""
    for i, op in enumerate(ops):
        if not isinstance(op, tuple) or len(op) != 3:
            raise ValueError(f"op {i} must be a tuple (kind, array, peer), got {op!r}")
        kind, _, peer = op
        if kind not in KINDS:
            raise ValueError(f"op {i}: kind must be 'send' or 'recv', got {kind!r}")
        _check_peer(plan, peer, f"op {i}: ")


def _check_peer(plan: ScheduleArgs, peer: Any, where: str = "") -> None:
    if isinstance(peer, bool) or not isinstance(peer, int) or not 0 <= peer < plan.size:
        raise ValueError(f"{where}peer must be a rank in 0..{plan.size - 1}, got {peer!r}")


def send(plan: ScheduleArgs, x: Any, peer: int) -> Iterator[Round]:
    """Send flat ``x`` to rank ``peer``, one round per chunk."""
    _check_peer(plan, peer)
    return exchange(plan, [("send", x, peer)])


def recv(plan: ScheduleArgs, out: Any, peer: int) -> Iterator[Round]:
    """Receive ``out.size`` elements from rank ``peer`` into flat ``out``."""
    _check_peer(plan, peer)
    return exchange(plan, [("recv", out, peer)])


def exchange(plan: ScheduleArgs, ops: Sequence[tuple[str, Any, int]]) -> Iterator[Round]:
    """Sends and receives posted together: round c carries chunk c of every op.

    Args:
        plan: the call's plan (rank, size, codec, dtype, chunking, pool, tags).
        ops: ``(kind, array, peer)`` with kind "send" (the array is sent) or "recv" (the
            array receives); flat arrays of ``plan.dtype``.

    Raises:
        ValueError: an op that is not (kind, array, peer) with a known kind and rank.
    """
    check_ops(plan, ops)
    return _rounds(plan, list(ops))


def _rounds(plan: ScheduleArgs, ops: list[tuple[str, Any, int]]) -> Iterator[Round]:
    spans: list[Span] = [(0, arr.size) for _, arr, _ in ops]
    nch = plan.nchunks(spans)
    for c in range(nch):
        rnd = new_round(plan, f"point-to-point chunk {c + 1}/{nch}")
        pres, posts = [], []
        for (kind, arr, peer), span in zip(ops, spans, strict=True):
            a, b = plan.chunk(span, c)
            if b == a:
                continue
            if kind == "send":
                item = send_own(plan, rnd, arr[a:b])
                pres.extend(encodes([item]))
                rnd.sends.append((peer, payload_of(item)))
            else:
                posts.append(receive_chunk(plan, rnd, peer, arr[a:b]))
        rnd.pre = run_all(*pres)
        rnd.post = run_all(*posts)
        yield rnd


def receive_chunk(plan: ScheduleArgs, rnd: Round, peer: int, dst: Any, stage: bool = False) -> Any:
    """Add to ``rnd`` the receive of one chunk from ``peer`` into ``dst``: directly for
    the identity codec (returns None) unless ``stage``, else into a pooled payload that
    the returned callable decodes (run it in ``post``)."""
    view = None if stage else plan.zero_copy(dst)
    if view is not None:
        rnd.recvs.append((peer, view))
        return None
    block = plan.payload(dst.size)
    rnd.holds.append(block)
    rnd.recvs.append((peer, block.data))
    return partial(plan.decode, block.data, dst)


__all__ = ["KINDS", "check_ops", "exchange", "receive_chunk", "recv", "send"]
