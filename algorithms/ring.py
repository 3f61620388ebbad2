"""Ring schedules: ReduceScatter in ``size - 1`` steps, each receiving an encoded partial
sum from the left, adding the local contribution (fused decode-accumulate), re-encoding
it and sending it right; AllGather forwarding each encoded reduced shard unchanged for
``size - 1`` steps while every rank decodes every shard. AllReduce is the two in turn.

Bandwidth-optimal for the identity codec; a lossy codec quantizes each element once per
hop (``size`` times in all), which the error model in the tests accounts for.

Every step is cut into chunks; each (step, chunk) is one pipeline round, so chunk c+1 is
encoded while chunk c is on the wire.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

from coccl.pipeline import Round

from .plan import Plan, Span, aligned_shards, even_shards
from .steps import (
    Pending,
    encodes,
    new_round,
    payload_of,
    reduce_chunk,
    result_payload,
    run_all,
    send_own,
)


def _reduce_encode(plan: Plan, acc: Any, own: Any, received: Any, out: Any) -> None:
    """One hop of the ring: out = encode(own + decode(received))."""
    plan.load(acc, own)
    plan.reduce(acc, received)
    plan.encode(acc, out)


def _reduce_scatter_rounds(
    plan: Plan, x: Any, shards: list[Span], dst_of: Any, want_payload: bool
) -> Iterator[Round | dict[int, Pending]]:
    """Ring ReduceScatter rounds; yields the rounds, then (last) a dict chunk -> Pending
    of the owner's encoded reduced chunks when ``want_payload`` (for the AllGather)."""
    n, r = plan.size, plan.rank
    right, left = (r + 1) % n, (r - 1) % n
    nch = plan.nchunks(shards)
    received: dict[int, Pending] = {}  # chunk -> partial sum received at the previous step
    results: dict[int, Pending] = {}
    for t in range(n - 1):
        send_shard, recv_shard = (r - t - 1) % n, (r - t - 2) % n
        for c in range(nch):
            rnd = new_round(plan, f"ring reduce-scatter step {t + 1}/{n - 1} chunk {c + 1}/{nch}")
            a, b = plan.chunk(shards[send_shard], c)
            if b > a:
                if t == 0:
                    item = send_own(plan, rnd, x[a:b])
                    rnd.pre = run_all(*encodes([item]))
                    rnd.sends.append((right, payload_of(item)))
                else:
                    partial_sum = received.pop(c).hand_to(rnd)
                    acc_block, acc = plan.accumulator(b - a)
                    out_block = plan.payload(b - a)
                    rnd.holds += [acc_block, out_block]
                    rnd.pre = partial(
                        _reduce_encode, plan, acc, x[a:b], partial_sum, out_block.data
                    )
                    rnd.sends.append((right, out_block.data))
            a, b = plan.chunk(shards[recv_shard], c)
            if b > a:
                block = plan.payload(b - a)
                rnd.holds.append(block)
                rnd.recvs.append((left, block.data))
                if t < n - 2:
                    received[c] = Pending(rnd, block.data, block.retain())
                else:  # the last step brings this rank's own shard: finish it
                    acc_block, acc = plan.accumulator(b - a)
                    rnd.holds.append(acc_block)
                    dst = dst_of(a, b)
                    result = result_payload(plan, dst, want_payload, rnd)
                    if result is not None:
                        results[c] = result
                    rnd.post = partial(reduce_chunk, plan, acc, x[a:b], [block.data], dst, result)
            if rnd.sends or rnd.recvs:
                yield rnd
    yield results


def _allgather_rounds(
    plan: Plan, shards: list[Span], out: Any, own: dict[int, Pending]
) -> Iterator[Round]:
    """Ring AllGather rounds: forward encoded shards unchanged, decode each into ``out``.
    ``own`` maps chunk -> this rank's encoded chunk of its own shard."""
    n, r = plan.size, plan.rank
    right, left = (r + 1) % n, (r - 1) % n
    nch = plan.nchunks(shards)
    received: dict[int, Pending] = {}
    for t in range(n - 1):
        send_shard, recv_shard = (r - t) % n, (r - t - 1) % n
        for c in range(nch):
            rnd = new_round(plan, f"ring all-gather step {t + 1}/{n - 1} chunk {c + 1}/{nch}")
            a, b = plan.chunk(shards[send_shard], c)
            if b > a:
                source = own.pop(c) if t == 0 else received.pop(c)
                rnd.sends.append((right, source.hand_to(rnd)))
            a, b = plan.chunk(shards[recv_shard], c)
            if b > a:
                dst = out[a:b]
                view = plan.zero_copy(dst)  # identity: receive straight into the output
                if view is not None:
                    data, keep = view, None
                else:
                    block = plan.payload(b - a)
                    rnd.holds.append(block)
                    data, keep = block.data, block
                    rnd.post = partial(plan.decode, data, dst)
                rnd.recvs.append((left, data))
                if t < n - 2:
                    received[c] = Pending(rnd, data, keep.retain() if keep else None)
            if rnd.sends or rnd.recvs:
                yield rnd


def allreduce(plan: Plan, x: Any, out: Any) -> Iterator[Round]:
    """Ring AllReduce of flat ``x`` into flat ``out`` (same size; may be the same array)."""
    shards = aligned_shards(x.size, plan.size, plan.codec.alignment)
    if plan.size == 1:
        yield from _local(plan, x, out, True)
        return
    results: dict[int, Pending] = {}
    for item in _reduce_scatter_rounds(plan, x, shards, lambda a, b: out[a:b], True):
        if isinstance(item, dict):
            results = item
        else:
            yield item
    yield from _allgather_rounds(plan, shards, out, results)


def _local(plan: Plan, x: Any, out: Any, want_payload: bool) -> Iterator[Round]:
    """A single rank: one round of local compute, no messages. For AllReduce
    (``want_payload``) the result still goes through one encode/decode, as on n ranks."""
    rnd = new_round(plan, "local")
    if x.size:
        acc_block, acc = plan.accumulator(x.size)
        rnd.holds.append(acc_block)
        result = result_payload(plan, out, want_payload, rnd)
        if result is not None and result.block is not None:
            result.block.release()  # nobody else consumes it
        rnd.pre = partial(reduce_chunk, plan, acc, x, [], out, result)
    yield rnd


def reduce_scatter(plan: Plan, x: Any, out: Any) -> Iterator[Round]:
    """Ring ReduceScatter: ``x`` holds ``size * n`` elements, ``out`` gets shard ``rank``."""
    n_out = out.size
    shards = even_shards(n_out, plan.size)
    base = shards[plan.rank][0]
    if plan.size == 1:
        yield from _local(plan, x, out, False)
        return
    for item in _reduce_scatter_rounds(
        plan, x, shards, lambda a, b: out[a - base : b - base], False
    ):
        if not isinstance(item, dict):
            yield item


def allgather(plan: Plan, x: Any, out: Any) -> Iterator[Round]:
    """Ring AllGather: ``x`` holds n elements, ``out`` gets ``size * n``, rank r's at r*n."""
    shards = even_shards(x.size, plan.size)
    own = yield from _own_payloads(plan, x, out, shards, keep=plan.size > 1)
    if plan.size > 1:
        yield from _allgather_rounds(plan, shards, out, own)


def _own_payloads(plan: Plan, x: Any, out: Any, shards: list[Span], keep: bool) -> Iterator[Round]:
    """Encode this rank's chunks once (a round each) and decode them into its own slot of
    ``out``, so the owner holds bitwise what the others decode. Returns chunk -> Pending
    (payloads kept for the sends when ``keep``)."""
    base = shards[plan.rank][0]
    own: dict[int, Pending] = {}
    for c in range(plan.nchunks(shards)):
        a, b = plan.chunk(shards[plan.rank], c)
        rnd = new_round(plan, f"encode own chunk {c + 1}")
        src, dst = x[a - base : b - base], out[a:b]
        item = send_own(plan, rnd, src)
        payload = payload_of(item)
        if encodes([item]):
            block = rnd.holds[-1]
            rnd.pre = run_all(item, partial(plan.decode, payload, dst))
            if keep:
                own[c] = Pending(rnd, payload, block.retain())
        else:  # identity: copy unless x already is out's own slot (in place)
            if not _same_memory(src, dst):
                rnd.pre = partial(_copy, dst, src)
            own[c] = Pending(None, payload, None)
        yield rnd
    return own


def _copy(dst: Any, src: Any) -> None:
    dst[...] = src


def _same_memory(a: Any, b: Any) -> bool:
    if hasattr(a, "__array_interface__"):
        return a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    return a.data.ptr == b.data.ptr


__all__ = ["allgather", "allreduce", "reduce_scatter"]
