"""Delta AllGather: gather the change since the last call, not the data (SDP4Bit's
weight differences; ZeRO's parameter gather of slowly changing weights).

``replica`` holds ``size`` slots of ``x.size`` elements, the state the caller keeps
between calls (a caller-kept delta state): every rank's last gathered values. Each rank
encodes ``d = x - replica[own slot]`` (in the accumulate type), sends it to every rank,
and every rank, the owner too, adds ``decode(d)`` into that slot. So

- every replica stays bitwise equal: every rank applies the same payloads to the same
  values with the same arithmetic;
- errors do not accumulate: after a call, ``x - replica[own]`` is the quantization error
  of one difference, ``|| . || <= b ||d||``, and the next call's difference includes it,
  so a slowly changing ``x`` is tracked to about ``b / (1 - b)`` of one update's size
  (``b`` the codec's ``rel_error_bound``), not to ``b`` of the data's size.

The first call must be exact (the replica holds nothing yet): with ``exact`` the slots
are gathered directly through the identity codec. A lossless codec gathers ``x`` itself
every call (a difference cannot be more exact than the data).

One round per chunk: ``pre`` forms and encodes chunk c's difference; ``post`` adds the
decoded differences of every slot, the own one included, into the replica.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from functools import partial
from typing import Any

from coccl.compressors import get_compressor
from coccl.core.rounds import Round

from . import two_shot
from .alltoall import buffers_overlap
from .schedule_args import ScheduleArgs, Span, even_shards
from .steps import new_round, run_all


def allgather_delta(
    plan: ScheduleArgs, x: Any, replica: Any, *, exact: bool = False
) -> Iterator[Round]:
    """Add every rank's encoded change ``x - replica[slot]`` into ``replica`` (see the
    module docstring); ``exact``: gather ``x`` itself, exactly (the first call).

    Raises:
        ValueError: ``replica`` not ``size`` times ``x``, or the two overlapping (``x``
            must be the new values, not a view of the replica).
    """
    if replica.size != plan.size * x.size:
        raise ValueError(f"replica holds {replica.size} elements; it needs {plan.size} x {x.size}")
    if buffers_overlap(x, replica):
        raise ValueError("x overlaps the replica: pass the new values in their own array")
    if exact or plan.codec.lossless:
        codec = plan.codec if plan.codec.lossless else get_compressor("identity")
        return two_shot.allgather(dataclasses.replace(plan, codec=codec, gather=False), x, replica)
    return _rounds(plan, x, replica, even_shards(x.size, plan.size))


def _rounds(plan: ScheduleArgs, x: Any, replica: Any, slots: list[Span]) -> Iterator[Round]:
    n, r = plan.size, plan.rank
    peers = [(r + i) % n for i in range(1, n)]
    nch = plan.nchunks(slots)
    for c in range(nch):
        rnd = new_round(plan, f"delta all-gather chunk {c + 1}/{nch}")
        a, b = plan.chunk(slots[r], c)
        own = plan.payload(b - a)
        acc_block, acc = plan.accumulator(b - a)
        rnd.holds += [own, acc_block]
        base = slots[r][0]
        rnd.pre = partial(
            _encode_change, plan, acc, x[a - base : b - base], replica[a:b], own.data,
            plan.next_salt(),
        )  # fmt: skip
        rnd.sends = [(k, own.data) for k in peers]
        posts = [partial(_apply, plan, own.data, replica[a:b])]
        for s in peers:
            a, b = plan.chunk(slots[s], c)
            block = plan.payload(b - a)
            rnd.holds.append(block)
            rnd.recvs.append((s, block.data))
            posts.append(partial(_apply, plan, block.data, replica[a:b]))
        rnd.post = run_all(*posts)
        yield rnd


def _encode_change(
    plan: ScheduleArgs, acc: Any, new: Any, old: Any, payload: Any, salt: int = 0
) -> None:
    """``payload = encode(new - old)``, the difference formed in the accumulate type."""
    acc[...] = new
    acc -= old.astype(acc.dtype) if old.dtype != acc.dtype else old
    plan.encode(acc, payload, salt)


def _apply(plan: ScheduleArgs, payload: Any, slot: Any) -> None:
    """``slot += decode(payload)``: the same arithmetic on every rank."""
    plan.codec.decode_into(payload, slot, plan.dtype, True)


__all__ = ["allgather_delta"]
