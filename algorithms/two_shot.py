"""Two-shot schedules (as in COCCL/TACO and QuickReduce): a direct ReduceScatter where
each rank encodes each shard of its data once and sends shard k straight to rank k,
which decodes every contribution and sums them in rank order; then (AllReduce) the owner
encodes its reduced shard once and a direct AllGather sends it to every rank. Exactly
two quantizations per element whatever the rank count (one for ReduceScatter or
AllGather alone), at the price of ``size - 1`` messages per rank per step.

Each chunk is one round per phase; the phases interleave (reduce chunk c+1 while chunk c
is gathered), so compute and transfers overlap.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

from coccl.pipeline import Round

from .plan import Plan, Span, aligned_shards, even_shards
from .ring import _own_round
from .steps import (
    Pending,
    encodes,
    new_round,
    payload_of,
    reduce_chunk,
    result_payload,
    run_all,
    send_own,
    waves,
)


def _peers(plan: Plan) -> list[int]:
    """Other ranks, starting after this one (spreads the load of simultaneous sends)."""
    return [(plan.rank + i) % plan.size for i in range(1, plan.size)]


def _reduce_round(
    plan: Plan, x: Any, shards: list[Span], c: int, dst_of: Any, want_payload: bool
) -> tuple[Round, Pending | None]:
    """Chunk c of the direct ReduceScatter: send our chunk of every other shard to its
    owner; receive every contribution to our shard and reduce them in rank order."""
    n, r = plan.size, plan.rank
    nch = plan.nchunks(shards)
    rnd = new_round(plan, f"two-shot reduce-scatter chunk {c + 1}/{nch}")
    items = []
    for k in _peers(plan):
        a, b = plan.chunk(shards[k], c)
        if b > a:
            item = send_own(plan, rnd, x[a:b])
            items.append(item)
            rnd.sends.append((k, payload_of(item)))
    rnd.pre = run_all(*encodes(items))
    result = None
    a, b = plan.chunk(shards[r], c)
    if b > a:
        payloads = {}
        for j in _peers(plan):
            block = plan.payload(b - a)
            rnd.holds.append(block)
            rnd.recvs.append((j, block.data))
            payloads[j] = block.data
        acc_block, acc = plan.accumulator(b - a)
        rnd.holds.append(acc_block)
        dst = dst_of(a, b)
        result = result_payload(plan, dst, want_payload, rnd)
        in_rank_order = [payloads[j] for j in range(n) if j != r]
        rnd.post = partial(reduce_chunk, plan, acc, x[a:b], in_rank_order, dst, result)
    return rnd, result


def _gather_round(plan: Plan, shards: list[Span], c: int, out: Any, own: Pending | None) -> Round:
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


def allreduce(plan: Plan, x: Any, out: Any) -> Iterator[Round]:
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
            if rnd.sends or rnd.recvs or rnd.post:
                yield rnd
        if c >= 1:
            prev, result = pending.pop(0)
            rnd = _gather_round(plan, shards, prev, out, result)
            if rnd.sends or rnd.recvs:
                yield rnd
            elif result is not None and result.block is not None:
                result.block.release()


def reduce_scatter(plan: Plan, x: Any, out: Any) -> Iterator[Round]:
    """Direct ReduceScatter: ``x`` holds ``size * n`` elements, ``out`` gets shard ``rank``."""
    shards = even_shards(out.size, plan.size)
    base = shards[plan.rank][0]
    for c in range(plan.nchunks(shards)):
        rnd, _ = _reduce_round(plan, x, shards, c, lambda a, b: out[a - base : b - base], False)
        yield rnd


def allgather(plan: Plan, x: Any, out: Any) -> Iterator[Round]:
    """Direct AllGather: ``x`` holds n elements, ``out`` gets ``size * n``."""
    shards = even_shards(x.size, plan.size)
    own: dict[int, Pending] = {}
    steps = [partial(_own_round, plan, x, out, shards, own, plan.size > 1)]
    if plan.size > 1:  # each chunk is encoded, then sent: chunks in waves
        steps.append(lambda c: _gather_round(plan, shards, c, out, own.pop(c, None)))
    yield from waves(plan.nchunks(shards), steps, plan.lag)
