"""How a collective is cut into chunks and how many chunk rounds run at once.

Every rule that sizes a pipeline lives here: the default chunk of each route (host data,
device data staged over MPI, device data over NCCL), the
bound on the pool memory a window of rounds holds, and the depth that keeps that bound
under ``COCCL_STAGING_LIMIT_BYTES``. Every rank applies the same rules to the same
arguments and settings (``coccl.init`` checks that the settings agree), so every rank cuts
the same chunks. bench/NOTES.md holds the measurements behind the constants. How a chunk
size in bytes becomes elements (``chunk_elems``) lives in ``algorithms.schedule_args``,
beside the chunk geometry, since the virtual-rank simulator (an algorithm) cuts with it too.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from coccl import algorithms
from coccl.compressors import Compressor
from coccl.core.arrays import accumulate_dtype
from coccl.core.pool import size_class

# Below this chunk size, CPU compute runs on the polling thread itself: a worker thread's
# wake-up would cost more than the overlap it buys.
INLINE_CHUNK_BYTES = 64 << 10
# Default chunk of device data sent over MPI through pinned host staging (not CUDA-aware):
# 8 MiB, or (compressed data) chunks of 4M elements once each rank's shard holds four.
STAGED_CHUNK_BYTES = 8 << 20
STAGED_LARGE_CHUNK_ELEMS = 4 << 20
# The bound on a pipeline's extra memory when COCCL_STAGING_LIMIT_BYTES is unset: pinned
# host memory and its device copies when data is staged over MPI; device memory only over
# NCCL, where few, large messages are fastest (see nccl_chunk_bytes) and an H200 has 141 GB.
STAGING_LIMIT_BYTES = 256 << 20
NCCL_STAGING_LIMIT_BYTES = 1 << 30
# Over NCCL a plan whose graph copies the caller's buffers (coccl.engine.graphs) is replayed
# below these message sizes (bytes per rank, by link class) and runs eagerly from them on.
# Such a replay saves the host's enqueueing of every round but copies the input in and the
# result out; an eager call costs about max(host, device) time, since the host never waits
# inside it, and where the two are close every late launch on either rank stalls both. So
# those replays stop where the device clearly outlasts the host (bench/NOTES.md has the
# measurements).
REPLAY_MAX_BYTES = {"nvlink": 128 << 20, "shm": 64 << 20, "socket": 64 << 20, "net": 64 << 20}

ROUTES = ("host", "staged", "cuda_aware", "nccl")


def staged_chunk_bytes(shard: int, itemsize: int, compressed: bool) -> int:
    """The default chunk of a collective staged through pinned host memory whose
    per-rank shard holds ``shard`` elements.

    Each chunk costs the polling thread host work that does not overlap MPI's own copies,
    so fewer, larger chunks overlap better, as long as every shard still holds enough
    chunks to pipeline: 8 MiB, and chunks of 4M elements for compressed data once every
    shard holds four of them. Uncompressed data keeps 8 MiB: it has no codec cost per
    chunk to save, and larger payloads would make the staging limit cut the depth to 1.
    """
    if compressed and shard >= 4 * STAGED_LARGE_CHUNK_ELEMS:
        return max(STAGED_CHUNK_BYTES, STAGED_LARGE_CHUNK_ELEMS * itemsize)
    return STAGED_CHUNK_BYTES


def p2p_chunk_bytes(
    wire: str, *, settings_chunk: int, chunk_set: bool, compressed: bool, itemsize: int, count: int
) -> int:
    """The chunk of a point-to-point message that gives none, over ``wire`` ("mpi" or
    "nccl"), for a message of ``count`` elements. Both ends cut alike from the fields of
    the signature they agree on, so the rule never depends on what one end alone knows
    (whether its data is on the host or the device):

    * COCCL_CHUNK_BYTES set (``chunk_set``): it;
    * over MPI, compressed: ``staged_chunk_bytes`` with the message as the shard. Each
      chunk costs the progress engine host work and a staging round trip that do not
      overlap the wire, and a compressed chunk's payload is a fraction of its input: with
      chunks of COCCL_CHUNK_BYTES the staged pipeline's time exceeded the sum of its
      codec-only and transport-only halves (bench/NOTES.md);
    * over MPI, uncompressed: COCCL_CHUNK_BYTES (staged device data moved slower in
      chunks of the staged rule's 8 MiB, bench/NOTES.md);
    * over NCCL: the whole message if uncompressed (no codec work to overlap, and NCCL's
      point-to-point is fastest on large messages), else COCCL_CHUNK_BYTES.
    """
    if chunk_set:
        return settings_chunk
    if wire == "mpi":
        return staged_chunk_bytes(count, itemsize, True) if compressed else settings_chunk
    if not compressed:
        return max(settings_chunk, count * itemsize)
    return settings_chunk


def window_bytes(
    n: int,
    codec: Compressor,
    dtype: Any,
    chunk_elems: int,
    algorithm: str,
    collective: str,
    staged: bool,
    depth: int,
    accumulates: bool = True,
) -> int:
    """An upper bound on the pool bytes a pipeline window of ``depth`` rounds holds, on
    ``n`` ranks with chunks of ``chunk_elems`` elements. Per round: its payloads (their
    pinned copies too when ``staged``), an accumulator and a result payload, and the
    payloads waiting between a chunk's steps, as the schedule declares them
    (``algorithms.footprint``). ``accumulates`` False: the schedule holds no accumulator
    (an AllReduce summing with the codec's fused hop, ``needs_accumulator``).
    bench/NOTES.md compares this bound with measured peaks."""
    payload = size_class(codec.encoded_nbytes(chunk_elems, dtype))
    acc = size_class(chunk_elems * accumulate_dtype(dtype).itemsize) if accumulates else 0
    fp = algorithms.footprint(algorithm, collective, n)
    per_round = (fp.messages + 1 + fp.waiting) * payload + acc
    if staged:
        per_round += fp.messages * payload  # pinned host copies of every message
        per_round += fp.staged_kept * payload  # kept for the forwards
    second_accs = depth // max(1, fp.steps) + 1 if fp.second_accumulator else 0
    return depth * per_round + second_accs * acc


def needs_accumulator(algorithm: str, collective: str, op: str, fused_hop: bool, n: int) -> bool:
    """Whether a schedule holds float32 accumulators: all but one that sums only with the
    codec's fused hop (``fused_hop``: the codec has one for the call's data), as the
    schedule declares (``algorithms.fuses_hop``)."""
    hops = algorithms.fuses_hop(algorithm, collective, n)
    return not (hops and op == "sum" and fused_hop)


def nccl_chunk_bytes(
    n: int,
    codec: Compressor,
    dtype: Any,
    algorithm: str,
    collective: str,
    shard: int,
    limit: int,
    floor: int,
    accumulates: bool = True,
) -> int:
    """The default chunk of a collective over NCCL whose per-rank shard holds ``shard``
    elements: the whole shard, halved until one round's window fits ``limit``, never
    below ``floor`` bytes (COCCL_CHUNK_BYTES).

    Few, large messages are fastest over NCCL: its point-to-point bandwidth keeps rising
    with the message size well past the sizes a pipeline would cut, while the codec
    kernels run much faster than the link moves bytes, so cutting a shard to overlap them
    with the wire gains less than the smaller messages lose (bench/NOTES.md)."""
    itemsize = np.dtype(dtype).itemsize
    elems = -(-max(1, shard) // codec.alignment) * codec.alignment
    while elems * itemsize > floor and (
        window_bytes(n, codec, dtype, elems, algorithm, collective, False, 1, accumulates) > limit
    ):
        half = -(-(elems // 2) // codec.alignment) * codec.alignment
        if half >= elems:
            break
        elems = half
    return max(elems * itemsize, floor)


def pipeline_depth(requested: int, limit: int, window: Callable[[int], int]) -> int:
    """``requested`` (COCCL_PIPELINE_DEPTH), lowered if needed so the pools' blocks in use
    stay within ``limit``: ``window(depth)`` bounds them (``window_bytes`` with the call's
    other arguments bound), so staging memory is set by chunk size and depth, never by
    message size. A chunk whose one round needs more than the limit runs at depth 1."""
    depth = requested
    while depth > 1 and window(depth) > limit:
        depth -= 1
    return depth


def local_cpu_threads(local_ranks: int, requested: int | None) -> int:
    """Threads for the CPU codec kernels: COCCL_CPU_THREADS, else this node's cores divided
    among its ranks. Oversubscribed numba threads spin against each other and against
    MPI's polling, which slows collectives by orders of magnitude (bench/NOTES.md)."""
    if requested is not None:
        return requested
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // max(1, local_ranks))


def default_chunk_bytes(
    route: str,
    *,
    settings_chunk: int,
    chunk_set: bool,
    host_pipelined: bool,
    limit: int,
    n: int,
    codec: Compressor,
    dtype: Any,
    count: int,
    algorithm: str,
    collective: str,
    accumulates: bool = True,
) -> int:
    """The chunk of a call that gives none, by route (see ``ROUTES``):

    * ``host``: COCCL_CHUNK_BYTES; but with no spare core per rank for the codec thread
      (``host_pipelined`` False, decided alike on every rank) and no chunk size set, one
      chunk: chunks could only run one after the other on the polling thread, so
      pipelining would add per-chunk cost and overlap nothing (bench/NOTES.md);
    * ``staged``: ``staged_chunk_bytes``; ``cuda_aware`` (CUDA-aware MPI): COCCL_CHUNK_BYTES;
    * ``nccl``: ``nccl_chunk_bytes``, whether or not the schedule is replayed.

    ``count`` is the call's element count (AllGather: each rank's input); ``accumulates``:
    see ``needs_accumulator``.
    """
    itemsize = np.dtype(dtype).itemsize
    shard = count if collective == "allgather" else -(-count // n)
    if route == "host":
        if chunk_set or host_pipelined:
            return settings_chunk
        return max(settings_chunk, count * itemsize, 1)
    if route == "staged" and not chunk_set:
        return staged_chunk_bytes(shard, itemsize, not codec.lossless)
    if route == "nccl" and not chunk_set:
        return nccl_chunk_bytes(
            n, codec, dtype, algorithm, collective, shard, limit, settings_chunk, accumulates
        )
    return settings_chunk


def staging_limit(route: str, setting: int | None) -> int:
    """The pool memory bound of a call on ``route``: COCCL_STAGING_LIMIT_BYTES when set
    (``setting``), else ``NCCL_STAGING_LIMIT_BYTES`` over NCCL, ``STAGING_LIMIT_BYTES``
    elsewhere."""
    if setting is not None:
        return setting
    return NCCL_STAGING_LIMIT_BYTES if route == "nccl" else STAGING_LIMIT_BYTES


def replay_max_bytes(link: str) -> int:
    """The message size (bytes per rank) from which a plan over NCCL on ``link`` runs
    eagerly (``REPLAY_MAX_BYTES``; an unknown link class: the least of them)."""
    return REPLAY_MAX_BYTES.get(link, min(REPLAY_MAX_BYTES.values()))


def replays(link: str, nbytes: int, follows: bool = False) -> bool:
    """Whether a plan over NCCL on ``link`` whose input holds ``nbytes`` is replayed from a
    CUDA graph: at every size if the graph follows the caller's buffers (``follows``: a
    lossy codec's, coccl.engine.graphs), below ``replay_max_bytes`` if it copies them."""
    return follows or nbytes < replay_max_bytes(link)
