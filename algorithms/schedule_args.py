"""What every schedule needs: the shard and chunk geometry, pooled buffers, and the
codec-and-op arithmetic of one collective call.

Shard ``k`` of ``size`` shards is owned by rank ``k``. Every rank computes the same
geometry from the same arguments, so both ends of a message always agree on its size and
no sizes travel on the wire.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coccl.compressors import Compressor
from coccl.compressors.intq import STREAM_CALL_BITS, stream_salt
from coccl.core.arrays import accumulate_dtype
from coccl.core.pool import Block, BufferPool
from coccl.core.reduction import combine, finalize
from coccl.core.rounds import TAG_MODULUS

Span = tuple[int, int]


def shard_stride(count: int, size: int, align: int) -> int:
    """Elements between the starts of ``aligned_shards``' shards: a rank's share of
    ``count``, rounded up to a multiple of ``align``."""
    per = -(-count // size) if size else 0
    return -(-per // align) * align


def aligned_shards(count: int, size: int, align: int) -> list[Span]:
    """Split ``count`` elements into ``size`` contiguous shards whose boundaries fall on
    multiples of ``align`` (the codec's group size), so no group straddles two owners.
    Trailing shards may be short or empty (count 0, 1, fewer than ranks...)."""
    per = shard_stride(count, size, align)
    return [(min(k * per, count), min((k + 1) * per, count)) for k in range(size)]


def chunk_elems(chunk_bytes: int, itemsize: int, alignment: int) -> int:
    """Elements per chunk: ``chunk_bytes`` of input, a multiple of the codec's alignment
    (its group size), so that chunking never changes which elements share a group. The
    one rule: the planner sizes every call with it, and the virtual-rank simulator cuts a
    payload-scoped codec's payloads with it."""
    return max(alignment, (chunk_bytes // itemsize) // alignment * alignment)


def even_shards(n: int, size: int) -> list[Span]:
    """NCCL's ReduceScatter/AllGather layout: shard ``k`` is ``[k*n, (k+1)*n)``."""
    return [(k * n, (k + 1) * n) for k in range(size)]


def stream_call(number: int, *, p2p: bool = False) -> int:
    """The call field of a stochastic codec's salts: a collective's ``number`` among its
    communicator's stochastic collectives (issued in the same order on every rank) in
    the lower half of the field, a point-to-point send's among this rank's stochastic
    sends in the upper half; so no two calls of one communicator draw alike until a
    count passes ``2^27``."""
    half = 1 << (STREAM_CALL_BITS - 1)
    return (half if p2p else 0) | (number % half)


@dataclass
class ScheduleArgs:
    """One collective call's arguments, as the schedules see them.

    Attributes:
        rank, size: this rank and the rank count.
        codec: the compressor on the wire.
        dtype: the data's dtype (what payloads stand for).
        op: the reduction op (ignored by AllGather).
        chunk_elems: elements per chunk, a multiple of the codec's alignment.
        pool: pooled buffers on the data's device (payloads and accumulators).
        label: the collective's name, for round labels and errors.
        depth: the pipeline depth; in schedules whose chunks each pass through a chain
            of steps, consecutive steps run this many chunks apart, so the rounds in the
            pipeline's window do not wait on each other.
        hop: the codec's fused ring-hop kernel for this call's data
            (``Compressor.reduce_encode_kernel``; sums only), or None.
        gather: two-shot's AllGather phase goes through the transport's AllGather of
            payload slots instead of point-to-point sends (streamed transports only).
        call: the call field of a stochastic codec's salts (``stream_call``).
        stream_rank: the rank in the salts (-1: ``rank``; a sub-group's plan keeps its
            global rank, so two sub-groups never draw alike).
        residual: error feedback (``coccl.Feedback``): a flat accumulate-type array of
            ``x``'s size into which every encode this rank makes adds what it lost, at
            the positions of ``x`` it encodes (``feed_back``), or None.
    """

    rank: int
    size: int
    codec: Compressor
    dtype: np.dtype
    op: str
    chunk_elems: int
    pool: BufferPool
    label: str
    depth: int = 4
    hop: Any = None
    gather: bool = False
    call: int = 0
    stream_rank: int = -1
    residual: Any = None
    _tags: itertools.count = field(default_factory=itertools.count)
    _salts: itertools.count = field(default_factory=itertools.count)

    @property
    def acc_dtype(self) -> np.dtype:
        return accumulate_dtype(self.dtype)

    # ------------------------------------------------------------------ geometry
    def nchunks(self, shards: list[Span]) -> int:
        longest = max((b - a for a, b in shards), default=0)
        return -(-longest // self.chunk_elems)

    def chunk(self, shard: Span, c: int) -> Span:
        start = min(shard[0] + c * self.chunk_elems, shard[1])
        return start, min(start + self.chunk_elems, shard[1])

    def next_tag(self) -> int:
        """The tag of the next potential round (counted even if the round is empty, so
        every rank numbers rounds alike)."""
        return next(self._tags) % TAG_MODULUS

    def next_salt(self) -> int:
        """The salt of the next encode a schedule issues (0 for a deterministic codec).

        A stochastic codec's every encode of a call draws its own random stream:
        ``stream_salt(rank, call, chunk, step)`` with the encode's number in the call, in
        the order the schedule builds its rounds (the same on every run), split into the
        chunk (high ten bits) and step (low ten bits) fields; the sub-plans of a
        two-level schedule share the counter, as they share the tags. Drawn when a round
        is built, never when its kernels run, whose order the engine may change."""
        if not self.codec.stochastic:
            return 0
        index = next(self._salts) % (1 << 20)
        rank = self.rank if self.stream_rank < 0 else self.stream_rank
        return stream_salt(rank=rank, call=self.call, chunk=index >> 10, step=index & 1023)

    # ------------------------------------------------------------------- buffers
    def payload(self, count: int) -> Block:
        return self.pool.get(self.codec.encoded_nbytes(count, self.dtype))

    def accumulator(self, count: int) -> tuple[Block, Any]:
        block = self.pool.get(count * self.acc_dtype.itemsize)
        return block, block.as_array(self.acc_dtype, count)

    def zero_copy(self, arr: Any) -> Any:
        """``arr``'s own bytes when they are exactly its payload (identity codec, same
        dtype): then it is sent from, or received into, directly."""
        if self.codec.lossless and arr.dtype == self.dtype:
            return arr.view(np.uint8)
        return None

    # ---------------------------------------------------------------- arithmetic
    def encode(self, src: Any, payload: Any, salt: int = 0) -> None:
        """``payload = encode(src)``; ``salt`` (``next_salt``) for a stochastic codec."""
        if self.codec.stochastic:
            self.codec.encode_into(src, payload, self.dtype, salt=salt)
        else:
            self.codec.encode_into(src, payload, self.dtype)

    def decode(self, payload: Any, dst: Any) -> None:
        self.codec.decode_into(payload, dst, self.dtype, False)

    def load(self, acc: Any, src: Any) -> None:
        """Start an accumulator from this rank's own contribution."""
        acc[...] = src

    def reduce(self, acc: Any, payload: Any) -> None:
        """``acc = acc (op) decode(payload)``: the fused decode-accumulate for sums."""
        if self.op in ("sum", "avg"):
            self.codec.decode_into(payload, acc, self.dtype, True)
        else:  # max/min/prod: identity only (checked before any byte moved)
            combine(acc, payload.view(self.dtype), self.op)

    def finalize(self, acc: Any) -> None:
        finalize(acc, self.op, self.size)

    # ------------------------------------------------------------ error feedback
    def feed_back(self, at: int, value: Any, payload: Any) -> None:
        """``residual[at:] += value - decode(payload)``: what the encode of ``value`` (the
        elements of ``x`` from ``at`` on, or a partial sum over them) into ``payload``
        lost, decoded in the accumulate type as a receiver decodes it. Negating around a
        decode-accumulate keeps it to exact operations besides the sum itself."""
        if self.residual is None:
            return
        res = self.residual[at : at + value.size]
        res += value.astype(res.dtype, copy=False)
        res *= -1
        self.codec.decode_into(payload, res, self.dtype, True)
        res *= -1

    def feed_back_result(self, at: int, acc: Any, dst: Any) -> None:
        """``residual[at:] += scale * (acc - dst)``: what the encode of a reduced chunk
        ``acc`` lost, ``dst`` holding what every rank decoded; ``scale`` is the rank
        count for ``avg`` (``acc`` was divided by it), so the loss is in sum terms."""
        if self.residual is None:
            return
        res = self.residual[at : at + acc.size]
        lost = acc - dst.astype(acc.dtype, copy=False)
        if self.op == "avg":
            lost *= self.size
        res += lost
