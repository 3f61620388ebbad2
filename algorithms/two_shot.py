"""Two-shot schedules (as in COCCL/TACO and QuickReduce): a direct ReduceScatter where
each rank encodes each shard of its data once and sends shard k straight to rank k,
which decodes every contribution and sums them in rank order; then (AllReduce) the owner
encodes its reduced shard once and a direct AllGather sends it to every rank. Exactly
two quantizations per element whatever the rank count (one for ReduceScatter or
AllGather alone), at the price of ``size - 1`` messages per rank per step.

Each chunk is one round per phase; the phases interleave (reduce chunk c+1 while chunk c
is gathered), so compute and transfers overlap. On two ranks a sum's one reduction of an
AllReduce is the codec's fused hop where it has one (own + decode(received), encoded for
the AllGather in one kernel, as the ring's hops; bitwise the accumulator's result).

With ``plan.gather`` (a compressed AllReduce over a transport with an AllGather, NCCL),
the AllGather phase is one AllGather of equal payload slots instead of point-to-point
sends: every rank encodes its reduced chunk into its own slot of a block of ``size``
slots (sized for the longest shard's chunk) and decodes the others' slots. On two ranks
the ReduceScatter's exchange is an AllGather too (each rank sends its one peer one
payload), so it goes the same way: each rank encodes its chunk of the other's shard into
its own slot and reads the other's slot. Which is faster depends on the link;
``algorithms.auto`` says which is used where.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

from coccl.core.rounds import Round

from .footprint import Footprint
from .schedule_args import ScheduleArgs, Span, aligned_shards, even_shards
from .steps import (
    Pending,
    encode_own,
    encodes,
    new_round,
    own_round,
    payload_of,
    reduce_chunk,
    result_payload,
    run_all,
    send_own,
    waves,
)


def footprint(collective: str, n: int) -> Footprint:
    """A round sends a payload to and receives one from each of the ``n - 1`` others,
    in two steps (the ReduceScatter and the AllGather), with one payload waiting between
    them."""
    return Footprint(messages=2 * max(1, n - 1), steps=2, waiting=1)


def fuses_hop(collective: str, n: int) -> bool:
    """Whether every reduction is the codec's fused hop, so no accumulator is held: an
    AllReduce on two ranks (its one reduction is that hop)."""
    return collective == "allreduce" and n == 2


def _peers(plan: ScheduleArgs) -> list[int]:
    """Other ranks, starting after this one (spreads the load of simultaneous sends)."""
    return [(plan.rank + i) % plan.size for i in range(1, plan.size)]


def _slot(plan: ScheduleArgs, shards: list[Span], c: int) -> int:
    """The payload slot of chunk c in the AllGather phase: the longest shard's payload,
    rounded up to 256 bytes so every slot starts as aligned as a pool block."""
    longest = max(b - a for a, b in (plan.chunk(shard, c) for shard in shards))
    if longest == 0:
        return 0
    return -(-plan.codec.encoded_nbytes(longest, plan.dtype) // 256) * 256


def _slots(plan: ScheduleArgs, shards: list[Span], c: int, rnd: Round) -> Pending:
    """A block of ``size`` payload slots for chunk c's AllGather, held by ``rnd``; the
    returned Pending's data is this rank's slot, exactly its payload's size."""
    slot = _slot(plan, shards, c)
    block = plan.pool.get(slot * plan.size)
    rnd.holds.append(block)
    a, b = plan.chunk(shards[plan.rank], c)
    start = plan.rank * slot
    own = block.data[start : start + plan.codec.encoded_nbytes(b - a, plan.dtype)]
    return Pending(rnd, own, block.retain())


def _exchange(plan: ScheduleArgs, x: Any, shards: list[Span], c: int, rnd: Round) -> dict[int, Any]:
    """The ReduceScatter's point-to-point exchange of chunk c, set up in ``rnd``: our
    chunk of every other shard encoded and sent to its owner; the payloads received for
    our shard's chunk, by sender (none when that chunk is empty)."""
    items = []
    for k in _peers(plan):
        a, b = plan.chunk(shards[k], c)
        if b > a:
            item = send_own(plan, rnd, x[a:b], at=a)
            items.append(item)
            rnd.sends.append((k, payload_of(item)))
    rnd.pre = run_all(*encodes(items))
    payloads = {}
    a, b = plan.chunk(shards[plan.rank], c)
    if b > a:
        for j in _peers(plan):
            block = plan.payload(b - a)
            rnd.holds.append(block)
            rnd.recvs.append((j, block.data))
            payloads[j] = block.data
    return payloads


def _exchange_by_allgather(
    plan: ScheduleArgs, x: Any, shards: list[Span], c: int, rnd: Round
) -> dict[int, Any]:
    """``_exchange`` on two ranks as one AllGather of two payload slots: our chunk of
    the other's shard encoded into our slot, the other's payload for our shard read from
    its slot. Every rank takes part, even with empty chunks (the AllGather is collective;
    the slot size depends on the shards alone, so it agrees)."""
    slot = _slot(plan, shards, c)
    if slot == 0:
        return {}
    r, peer = plan.rank, 1 - plan.rank
    block = plan.pool.get(2 * slot)
    rnd.holds.append(block)
    mine = block.data[r * slot : (r + 1) * slot]
    rnd.gather = (mine, block.data)
    a, b = plan.chunk(shards[peer], c)
    if b > a:
        payload = mine[: plan.codec.encoded_nbytes(b - a, plan.dtype)]
        rnd.pre = partial(encode_own, plan, x[a:b], payload, plan.next_salt(), a)
    a, b = plan.chunk(shards[r], c)
    if b == a:
        return {}
    return {
        peer: block.data[peer * slot : peer * slot + plan.codec.encoded_nbytes(b - a, plan.dtype)]
    }


def _reduce_round(
    plan: ScheduleArgs, x: Any, shards: list[Span], c: int, dst_of: Any, want_payload: bool
) -> tuple[Round, Pending | None]:
    """Chunk c of the direct ReduceScatter: send our chunk of every other shard to its
    owner; receive every contribution to our shard and reduce them in rank order. With
    ``want_payload`` the reduced chunk is also encoded, for the AllGather (into this
    rank's slot when ``plan.gather``)."""
    n, r = plan.size, plan.rank
    nch = plan.nchunks(shards)
    rnd = new_round(plan, f"two-shot reduce-scatter chunk {c + 1}/{nch}")
    if n == 2 and plan.gather:
        payloads = _exchange_by_allgather(plan, x, shards, c, rnd)
    else:
        payloads = _exchange(plan, x, shards, c, rnd)
    result = None
    a, b = plan.chunk(shards[r], c)
    if b > a:
        dst = dst_of(a, b)
        if want_payload and plan.gather:
            result = _slots(plan, shards, c, rnd)
        else:
            result = result_payload(plan, dst, want_payload, rnd)
        in_rank_order = [payloads[j] for j in range(n) if j != r]
        if n == 2 and plan.hop is not None and plan.op == "sum" and result and result.block:
            # the fused hop also decodes the result into dst: bitwise reduce_chunk's sum
            rnd.post = partial(plan.hop, x[a:b], in_rank_order[0], result.data, dst)
        else:
            acc_block, acc = plan.accumulator(b - a)
            rnd.holds.append(acc_block)
            rnd.post = partial(reduce_chunk, plan, acc, x[a:b], in_rank_order, dst, result, a)
    return rnd, result


def _gather_round(
    plan: ScheduleArgs, shards: list[Span], c: int, out: Any, own: Pending | None
) -> Round:
    """Chunk c of the direct AllGather: send our encoded chunk to every rank; receive
    every other owner's chunk and decode it into ``out``."""
    nch = plan.nchunks(shards)
    rnd = new_round(plan, f"two-shot all-gather chunk {c + 1}/{nch}")
    if own is not None:
        data = own.hand_to(rnd)  # one reference covers every send of this round
        rnd.sends = [(k, data) for k in _peers(plan)]
    posts = []
    for j in _peers(plan):
        a, b = plan.chunk(shards[j], c)
        if b > a:
            dst = out[a:b]
            view = plan.zero_copy(dst)
            if view is not None:
                rnd.recvs.append((j, view))
            else:
                block = plan.payload(b - a)
                rnd.holds.append(block)
                rnd.recvs.append((j, block.data))
                posts.append(partial(plan.decode, block.data, dst))
    rnd.post = run_all(*posts)
    return rnd


def _allgather_round(
    plan: ScheduleArgs, shards: list[Span], c: int, out: Any, own: Pending | None
) -> Round | None:
    """Chunk c of the AllGather phase through the transport's AllGather (``plan.gather``):
    every rank contributes its slot (empty or not: the AllGather is collective), then
    decodes every other owner's slot into ``out``."""
    nch = plan.nchunks(shards)
    slot = _slot(plan, shards, c)
    if slot == 0:
        return None
    rnd = new_round(plan, f"two-shot all-gather chunk {c + 1}/{nch}")
    if own is None:
        own = _slots(plan, shards, c, rnd)
        own.round = None
    block = own.block
    assert block is not None
    own.hand_to(rnd)
    start = plan.rank * slot
    rnd.gather = (block.data[start : start + slot], block.data)
    posts = []
    for j in _peers(plan):
        a, b = plan.chunk(shards[j], c)
        if b > a:
            payload = block.data[j * slot : j * slot + plan.codec.encoded_nbytes(b - a, plan.dtype)]
            posts.append(partial(plan.decode, payload, out[a:b]))
    rnd.post = run_all(*posts)
    return rnd


def allreduce(plan: ScheduleArgs, x: Any, out: Any) -> Iterator[Round]:
    """Two-shot AllReduce of flat ``x`` into flat ``out`` (same size; may be the same)."""
    shards = aligned_shards(x.size, plan.size, plan.codec.alignment)
    nch = plan.nchunks(shards)
    if plan.size == 1:
        from .ring import allreduce as local  # noqa: PLC0415

        yield from local(plan, x, out)
        return
    pending: list[tuple[int, Pending | None]] = []
    for c in range(nch + 1):
        # interleave: reduce chunk c, then gather chunk c-1 (its reduction is in flight)
        if c < nch:
            rnd, result = _reduce_round(plan, x, shards, c, lambda a, b: out[a:b], True)
            pending.append((c, result))
            if rnd.exchanges or rnd.post:
                yield rnd
        if c >= 1:
            prev, result = pending.pop(0)
            if plan.gather:
                gathered = _allgather_round(plan, shards, prev, out, result)
                if gathered is not None:
                    yield gathered
                continue
            rnd = _gather_round(plan, shards, prev, out, result)
            if rnd.sends or rnd.recvs:
                yield rnd
            elif result is not None and result.block is not None:
                result.block.release()


def reduce_scatter(plan: ScheduleArgs, x: Any, out: Any) -> Iterator[Round]:
    """Direct ReduceScatter: ``x`` holds ``size * n`` elements, ``out`` gets shard ``rank``."""
    shards = even_shards(out.size, plan.size)
    base = shards[plan.rank][0]
    for c in range(plan.nchunks(shards)):
        rnd, _ = _reduce_round(plan, x, shards, c, lambda a, b: out[a - base : b - base], False)
        yield rnd


def allgather(plan: ScheduleArgs, x: Any, out: Any) -> Iterator[Round]:
    """Direct AllGather: ``x`` holds n elements, ``out`` gets ``size * n``."""
    shards = even_shards(x.size, plan.size)
    own: dict[int, Pending] = {}
    steps = [partial(own_round, plan, x, out, shards, own, plan.size > 1)]
    if plan.size > 1:  # each chunk is encoded, then sent: chunks in waves
        steps.append(lambda c: _gather_round(plan, shards, c, out, own.pop(c, None)))
    yield from waves(plan.nchunks(shards), steps, plan.depth)
