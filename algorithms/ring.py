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

from coccl.core.rounds import Round

from .footprint import Footprint
from .schedule_args import ScheduleArgs, Span, aligned_shards, even_shards
from .steps import (
    Pending,
    StepBuilder,
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
    """A round holds one payload in and one out; an AllReduce's chunk passes through
    ``2 (n - 1)`` steps (``n - 1`` for either half), staged AllGather payloads stay pinned
    while they wait to be forwarded, and the last ReduceScatter step holds a second
    accumulator."""
    steps = 2 * (n - 1) if collective == "allreduce" else n - 1
    kept = max(0, n - 2) if collective != "reduce_scatter" else 0
    return Footprint(
        messages=2, steps=steps, waiting=steps - 1, staged_kept=kept, second_accumulator=True
    )


def fuses_hop(collective: str, n: int) -> bool:
    """Whether every reduction is the codec's fused hop, so no accumulator is held: an
    AllReduce on several ranks (every hop, the last one included, is that kernel; one
    rank reduces locally into an accumulator)."""
    return collective == "allreduce" and n > 1


def _reduce_encode(
    plan: ScheduleArgs, acc: Any, own: Any, received: Any, out: Any, salt: int = 0, at: int = 0
) -> None:
    """One hop of the ring: out = encode(own + decode(received)); with error feedback
    this rank records what the encode of the partial sum lost, at ``own``'s offset."""
    plan.load(acc, own)
    plan.reduce(acc, received)
    plan.encode(acc, out, salt)
    plan.feed_back(at, acc, out)


class _ReduceScatterSteps:
    """The ring ReduceScatter's ``size - 1`` steps, as round builders per chunk. After a
    chunk's last step, ``results[c]`` holds the owner's encoded reduced chunk when
    ``want_payload`` (for the AllGather)."""

    def __init__(
        self, plan: ScheduleArgs, x: Any, shards: list[Span], dst_of: Any, want_payload: bool
    ) -> None:
        self.plan, self.x, self.shards = plan, x, shards
        self.dst_of, self.want_payload = dst_of, want_payload
        self.nch = plan.nchunks(shards)
        self.received: dict[int, Pending] = {}  # chunk -> partial sum from the last step
        self.results: dict[int, Pending] = {}

    def builders(self) -> list[StepBuilder]:
        return [partial(self.round, t) for t in range(self.plan.size - 1)]

    def round(self, t: int, c: int) -> Round | None:
        plan, x = self.plan, self.x
        n, r = plan.size, plan.rank
        right, left = (r + 1) % n, (r - 1) % n
        send_shard, recv_shard = (r - t - 1) % n, (r - t - 2) % n
        rnd = new_round(plan, f"ring reduce-scatter step {t + 1}/{n - 1} chunk {c + 1}/{self.nch}")
        a, b = plan.chunk(self.shards[send_shard], c)
        if b > a:
            if t == 0:
                item = send_own(plan, rnd, x[a:b], at=a)
                rnd.pre = run_all(*encodes([item]))
                rnd.sends.append((right, payload_of(item)))
            else:
                partial_sum = self.received.pop(c).hand_to(rnd)
                out_block = plan.payload(b - a)
                rnd.holds.append(out_block)
                if plan.hop is not None:  # one fused kernel, no accumulator
                    rnd.pre = partial(plan.hop, x[a:b], partial_sum, out_block.data)
                else:
                    acc_block, acc = plan.accumulator(b - a)
                    rnd.holds.append(acc_block)
                    rnd.pre = partial(
                        _reduce_encode, plan, acc, x[a:b], partial_sum, out_block.data,
                        plan.next_salt(), a,
                    )  # fmt: skip
                rnd.sends.append((right, out_block.data))
        a, b = plan.chunk(self.shards[recv_shard], c)
        if b > a:
            block = plan.payload(b - a)
            rnd.holds.append(block)
            rnd.recvs.append((left, block.data))
            if t < n - 2:
                self.received[c] = Pending(rnd, block.data, block.retain())
            else:  # the last step brings this rank's own shard: finish it
                dst = self.dst_of(a, b)
                result = result_payload(plan, dst, self.want_payload, rnd)
                if result is not None:
                    self.results[c] = result
                if plan.hop is not None and plan.op == "sum" and result and result.block:
                    # AllReduce: the reduced chunk is encoded for the AllGather and the
                    # owner decodes it; with no avg division between, that is one hop
                    # that also writes the decoded chunk
                    rnd.post = partial(plan.hop, x[a:b], block.data, result.data, dst)
                else:
                    acc_block, acc = plan.accumulator(b - a)
                    rnd.holds.append(acc_block)
                    rnd.post = partial(
                        reduce_chunk, plan, acc, x[a:b], [block.data], dst, result, a
                    )
        return rnd if rnd.sends or rnd.recvs else None


class _AllGatherSteps:
    """The ring AllGather's ``size - 1`` steps, as round builders per chunk: forward
    encoded shards unchanged, decode each into ``out``. ``own`` maps chunk -> this rank's
    encoded chunk of its own shard (filled by earlier steps of the same chunk)."""

    def __init__(self, plan: ScheduleArgs, shards: list[Span], out: Any, own: dict[int, Pending]):
        self.plan, self.shards, self.out, self.own = plan, shards, out, own
        self.nch = plan.nchunks(shards)
        self.received: dict[int, Pending] = {}

    def builders(self) -> list[StepBuilder]:
        return [partial(self.round, t) for t in range(self.plan.size - 1)]

    def round(self, t: int, c: int) -> Round | None:
        plan = self.plan
        n, r = plan.size, plan.rank
        right, left = (r + 1) % n, (r - 1) % n
        send_shard, recv_shard = (r - t) % n, (r - t - 1) % n
        rnd = new_round(plan, f"ring all-gather step {t + 1}/{n - 1} chunk {c + 1}/{self.nch}")
        a, b = plan.chunk(self.shards[send_shard], c)
        if b > a:
            source = self.own.pop(c) if t == 0 else self.received.pop(c)
            rnd.sends.append((right, source.hand_to(rnd)))
        a, b = plan.chunk(self.shards[recv_shard], c)
        if b > a:
            dst = self.out[a:b]
            view = plan.zero_copy(dst)  # identity: receive straight into the output
            if view is not None:
                data, keep = view, None
            else:
                block = plan.payload(b - a)
                rnd.holds.append(block)
                data, keep = block.data, block
                rnd.post = partial(plan.decode, data, dst)
            rnd.recvs.append((left, data))
            if t < n - 2:  # the next step forwards it unchanged
                rnd.forwards = True
                self.received[c] = Pending(rnd, data, keep.retain() if keep else None)
        return rnd if rnd.sends or rnd.recvs else None


def allreduce(plan: ScheduleArgs, x: Any, out: Any) -> Iterator[Round]:
    """Ring AllReduce of flat ``x`` into flat ``out`` (same size; may be the same array):
    each chunk's ReduceScatter steps, then its AllGather steps, chunks in waves."""
    shards = aligned_shards(x.size, plan.size, plan.codec.alignment)
    if plan.size == 1:
        yield from _local(plan, x, out, True)
        return
    rs = _ReduceScatterSteps(plan, x, shards, lambda a, b: out[a:b], True)
    ag = _AllGatherSteps(plan, shards, out, rs.results)
    yield from waves(rs.nch, rs.builders() + ag.builders(), plan.depth)


def _local(plan: ScheduleArgs, x: Any, out: Any, want_payload: bool) -> Iterator[Round]:
    """A single rank: one round of local compute, no messages. For AllReduce
    (``want_payload``) the result still goes through one encode/decode, as on n ranks."""
    rnd = new_round(plan, "local")
    if x.size:
        acc_block, acc = plan.accumulator(x.size)
        rnd.holds.append(acc_block)
        result = result_payload(plan, out, want_payload, rnd)
        if result is not None and result.block is not None:
            result.block.release()  # nobody else consumes it
        rnd.pre = partial(reduce_chunk, plan, acc, x, [], out, result, 0)
    yield rnd


def reduce_scatter(plan: ScheduleArgs, x: Any, out: Any) -> Iterator[Round]:
    """Ring ReduceScatter: ``x`` holds ``size * n`` elements, ``out`` gets shard ``rank``."""
    n_out = out.size
    shards = even_shards(n_out, plan.size)
    base = shards[plan.rank][0]
    if plan.size == 1:
        yield from _local(plan, x, out, False)
        return
    rs = _ReduceScatterSteps(plan, x, shards, lambda a, b: out[a - base : b - base], False)
    yield from waves(rs.nch, rs.builders(), plan.depth)


def allgather(plan: ScheduleArgs, x: Any, out: Any) -> Iterator[Round]:
    """Ring AllGather: ``x`` holds n elements, ``out`` gets ``size * n``, rank r's at r*n.
    Each chunk is first encoded once (and decoded into this rank's own slot, so the owner
    holds bitwise what the others decode), then forwarded; chunks in waves."""
    shards = even_shards(x.size, plan.size)
    own: dict[int, Pending] = {}
    steps = [partial(own_round, plan, x, out, shards, own, plan.size > 1)]
    nch = plan.nchunks(shards)
    if plan.size > 1:
        steps += _AllGatherSteps(plan, shards, out, own).builders()
    yield from waves(nch, steps, plan.depth)


__all__ = ["allgather", "allreduce", "reduce_scatter"]
