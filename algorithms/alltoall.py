"""All-to-all: rank r's block for rank d is encoded once and sent to d, which decodes it
into its slot for r (MoE's token dispatch and combine, a DP two-hop reduce's exchange).

Layout as ``torch.distributed.all_to_all_single``: ``x`` holds ``size`` blocks, block d
(``send_counts[d]`` elements, in rank order) for rank d; ``out`` holds ``size`` slots,
slot s (``recv_counts[s]`` elements) receiving rank s's block. Without counts the split
is equal: ``x.size / size`` elements each way. Rank r's ``send_counts[d]`` must equal
rank d's ``recv_counts[r]``; ``split_mismatches`` states that rule over every rank's
counts, for the Communicator to check once per signature.

A codec's groups restart at every block: a block is its own payload (or its own chunks'
payloads: chunks are ``plan.chunk_elems`` long, a multiple of the codec's alignment, so
chunking never changes which elements share a group). A rank's own block goes through
the same encode and decode as the others: slot s of ``out`` is ``decode(encode(block))``
whichever rank s is, so a lossy codec treats every block alike and the result does not
depend on where the data came from.

One round per chunk index: round c sends chunk c of every non-empty block and receives
chunk c of every non-empty slot, so at most ``depth`` chunks of each peer's block are
staged at once. The identity codec sends from ``x`` and receives into ``out`` directly.
In place (``out`` is ``x``) needs the same counts both ways; every block is then staged
(encoded in ``pre``, decoded in ``post``), since a slot is written while the block in the
same place may still be on the wire.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np

from coccl.core.arrays import overlap_offset
from coccl.core.rounds import Round

from .footprint import Footprint
from .p2p import receive_chunk
from .schedule_args import ScheduleArgs, Span
from .steps import encode_own, encodes, new_round, payload_of, run_all, send_own


def check_counts(counts: Any, total: int, size: int, name: str) -> list[int]:
    """``counts`` as a list of ints, or ValueError: ``size`` non-negative integers
    summing to ``total`` (the elements of the array they split)."""
    try:
        values = list(counts)
    except TypeError:
        raise ValueError(f"{name} must be a sequence of {size} integers, got {counts!r}") from None
    if len(values) != size:
        raise ValueError(f"{name} has {len(values)} entries; it needs one per rank ({size})")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 0:
            raise ValueError(f"{name} must hold non-negative integers, got {v!r}")
    values = [int(v) for v in values]
    if sum(values) != total:
        raise ValueError(f"{name} sums to {sum(values)}, but the array holds {total} elements")
    return values


def check_split(
    send_counts: Any, recv_counts: Any, x_count: int, out_count: int, size: int
) -> tuple[list[int], list[int]]:
    """One rank's all-to-all split, checked (ValueError): both counts given or neither;
    without counts, equal blocks (``x_count`` a multiple of ``size``, ``out_count`` equal
    to ``x_count``)."""
    if (send_counts is None) != (recv_counts is None):
        raise ValueError("give both send_counts and recv_counts, or neither (equal splits)")
    if send_counts is None:
        if x_count % size:
            raise ValueError(
                f"an equal all-to-all split needs a multiple of {size} elements, got {x_count}"
            )
        if out_count != x_count:
            raise ValueError(f"out holds {out_count} elements; an equal split needs {x_count}")
        return [x_count // size] * size, [x_count // size] * size
    return (
        check_counts(send_counts, x_count, size, "send_counts"),
        check_counts(recv_counts, out_count, size, "recv_counts"),
    )


def split_mismatches(
    send_counts: Sequence[Sequence[int]], recv_counts: Sequence[Sequence[int]]
) -> list[str]:
    """Where ranks disagree on an all-to-all split: ``send_counts[r]`` and
    ``recv_counts[r]`` are rank r's (checked) vectors; rank r's ``send_counts[d]`` must
    equal rank d's ``recv_counts[r]``. Returns one sentence per mismatch, none if all
    agree (the Communicator raises CocclError on every rank with them)."""
    size = len(send_counts)
    return [
        f"rank {r} sends {send_counts[r][d]} elements to rank {d}, "
        f"which expects {recv_counts[d][r]} from it"
        for r, d in itertools.product(range(size), range(size))
        if send_counts[r][d] != recv_counts[d][r]
    ]


def footprint(collective: str, n: int) -> Footprint:
    """A round sends a chunk to and receives one from each of the ``n - 1`` others (its
    own block's chunk is the round's one more payload): one step, nothing waiting."""
    return Footprint(messages=2 * max(1, n - 1), steps=1, waiting=0)


def fuses_hop(collective: str, n: int) -> bool:
    """An all-to-all reduces nothing: no accumulator either way."""
    return True


def _spans(counts: list[int]) -> list[Span]:
    ends = list(itertools.accumulate(counts))
    return [(end - n, end) for n, end in zip(counts, ends, strict=True)]


def buffers_overlap(x: Any, out: Any) -> str:
    """How flat contiguous ``x`` and ``out`` share memory: "same" (exactly the same
    bytes), "partial" (any other overlap) or "" (disjoint)."""
    offset = overlap_offset(x, x.nbytes, out, out.nbytes)
    if offset is None:
        return ""
    return "same" if offset == 0 and x.nbytes == out.nbytes else "partial"


def alltoall(
    plan: ScheduleArgs,
    x: Any,
    out: Any,
    send_counts: Sequence[int] | None = None,
    recv_counts: Sequence[int] | None = None,
) -> Iterator[Round]:
    """All-to-all of flat ``x`` into flat ``out`` (see the module docstring).

    Raises:
        ValueError: counts that do not split ``x``/``out`` (``check_split``), or ``out``
            overlapping ``x`` other than exactly in place with equal counts both ways.
    """
    sends, recvs = check_split(send_counts, recv_counts, x.size, out.size, plan.size)
    overlap = buffers_overlap(x, out)
    if overlap == "partial" or (overlap == "same" and sends != recvs):
        raise ValueError(
            "all-to-all out overlaps x: in place needs out to be x and send_counts equal "
            "to recv_counts"
        )
    return _rounds(plan, x, out, _spans(sends), _spans(recvs), stage=overlap == "same")


def _rounds(
    plan: ScheduleArgs, x: Any, out: Any, blocks: list[Span], slots: list[Span], stage: bool
) -> Iterator[Round]:
    n, r = plan.size, plan.rank
    nch = max(plan.nchunks(blocks), plan.nchunks(slots))
    peers = [(r + i) % n for i in range(1, n)]  # spread simultaneous sends, as two-shot
    for c in range(nch):
        rnd = new_round(plan, f"all-to-all chunk {c + 1}/{nch}")
        pres = []
        for d in peers:
            a, b = plan.chunk(blocks[d], c)
            if b > a:
                rnd.sends.append((d, _send(plan, rnd, x[a:b], stage, pres, a)))
        posts = [_own_block(plan, rnd, x, out, blocks[r], slots[r], c, stage)]
        for s in peers:
            a, b = plan.chunk(slots[s], c)
            if b > a:
                posts.append(receive_chunk(plan, rnd, s, out[a:b], stage))
        rnd.pre = run_all(*pres)
        rnd.post = run_all(*posts)
        if rnd.exchanges or rnd.post is not None:
            yield rnd


def _send(plan: ScheduleArgs, rnd: Round, src: Any, stage: bool, pres: list[Any], at: int) -> Any:
    """The payload that sends chunk ``src`` (at offset ``at`` of ``x``: error feedback);
    its encode, if any, joins ``pres``. Staged (in place), the identity codec copies into
    a pooled payload too, so ``src`` may be rewritten once ``pre`` ran."""
    if not stage:
        item = send_own(plan, rnd, src, at)
        pres.extend(encodes([item]))
        return payload_of(item)
    block = plan.payload(src.size)
    rnd.holds.append(block)
    pres.append(partial(encode_own, plan, src, block.data, plan.next_salt(), at))
    return block.data


def _own_block(
    plan: ScheduleArgs,
    rnd: Round,
    x: Any,
    out: Any,
    block: Span,
    slot: Span,
    c: int,
    in_place: bool,
) -> Any:
    """Chunk c of this rank's block to itself, encoded and decoded into its own slot like
    every other block (the identity codec: a copy, or nothing in place)."""
    a, b = plan.chunk(block, c)
    if b == a:
        return None
    start = slot[0] + (a - block[0])
    src, dst = x[a:b], out[start : start + (b - a)]
    if plan.codec.lossless and src.dtype == dst.dtype:
        return None if in_place else partial(_copy, dst, src)
    payload = plan.payload(b - a)
    rnd.holds.append(payload)
    encode = partial(encode_own, plan, src, payload.data, plan.next_salt(), a)
    return run_all(encode, partial(plan.decode, payload.data, dst))


def _copy(dst: Any, src: Any) -> None:
    dst[...] = src


__all__ = ["alltoall", "buffers_overlap", "check_counts", "check_split", "split_mismatches"]
