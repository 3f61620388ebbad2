"""Virtual ranks: a coccl AllReduce over n ranks, computed in one process.

``simulate_allreduce(partials, algorithm=..., compressor=...)`` takes the n ranks'
contributions and returns bitwise what every rank of a real n-rank
``Communicator.allreduce`` with the same arguments returns. It runs the same codec
kernels (numba on the host, the CUDA kernels on the GPU) at exactly the quantization
points of the schedule, with the same reduction arithmetic in the same order, so a
tensor-parallel ablation (``coccl.tensor_parallel.VirtualTPGroup``) is a one-process,
one-GPU job.

What a real rank computes, per shard ``k`` of ``aligned_shards(count, n, G)`` (``G`` the
codec's alignment, its group size; shard ``k`` is owned by rank ``k``):

* ``two_shot``: every rank ``j != k`` encodes its own data of shard ``k`` once; the owner
  starts a float32 accumulator (float64 for float64 data) from its own data, exact, and
  adds the decoded payloads of ranks ``0..n-1`` (not ``k``) in rank order; ``avg`` then
  divides once; the owner encodes the reduced shard once and every rank, the owner
  included, decodes that payload. Two quantizations per element, whatever ``n``.
* ``ring``: shard ``k`` starts at rank ``k+1``, which encodes its data; each next rank
  ``k+2, ..., k-1`` (mod ``n``) adds its own data to the decoded payload and encodes the
  sum again; the owner ``k`` adds its own data to the last payload, ``avg`` divides, and
  the result is encoded once and decoded by every rank. ``n`` quantizations per element.
* one rank: its data, divided for ``avg``, encoded and decoded once.

The identity codec's "encode" of an accumulator is the rounding to the data's dtype (a
ring of 16-bit data rounds every partial sum), its decode the exact widening.

**Chunks do not change the result, for a codec that is not payload-scoped.** Every
step above is elementwise (widening, additions in a fixed order, the one division, the
final rounding) or acts on codec groups. The pipeline cuts each shard into chunks of
``chunk_elems`` elements (``schedule_args.chunk_elems`` of the call's ``chunk_bytes``, the
planner's rule), a multiple of ``G``, from the shard's start, itself a multiple of ``G``:
so every chunk is a run of whole groups, except where the shard ends, whose last group
the codec zero-pads exactly as it would in one unchunked payload. A codec whose every
group is encoded from its own values alone (``payload_scoped`` False: identity, int8,
taco, taco_fp, int with nearest rounding, mx with E8M0 scales) sees the same groups with
the same values, so ``chunk_bytes`` is checked and has no effect for it.

A **payload-scoped** codec (``Compressor.payload_scoped``: NVFP4, mx with
``scale="e4m3"``, whose float32 scale ``S`` comes from the largest block of the whole
payload; tah, which codes a share of each payload's tokens at fewer bits) depends on the
cut. For it the simulation encodes exactly the payloads a real rank does, one at a time
over the unpadded spans: two_shot one per (rank, shard, chunk) and one per (shard, chunk)
for the owner's final encode, ring one per (shard, chunk) per hop; an empty shard has no
payload (a real rank sends nothing for it); one rank encodes its whole array as one
payload whatever the chunk (as a real one-rank call does). A real call without
``chunk_bytes`` sizes its chunk by route (host, staged MPI, NCCL: ``communicator.sizing``),
which a simulation cannot know, so on more than one rank ``chunk_bytes`` is required
(ValueError otherwise), and the result is bitwise a real call given the same
``chunk_bytes``. This path is slower: about ``n * n * chunks`` codec launches from a
Python loop. A stochastic codec is refused: a real call salts its random streams with
its rank, call number and encode order.

**Vectorized over ranks and shards (codecs that are not payload-scoped).** The n
contributions are laid out as one ``(n ranks, n shards, per)`` array (``per`` the shard
stride, a multiple of ``G``; the positions past ``count`` are zero), so that one codec
launch encodes or decodes a whole step of every shard at once: a payload of several
shards decodes to the same values as one payload per shard, since groups never straddle
shards and each is encoded alone. Positions past ``count`` stand for the zero padding of
the real last group: accumulators are reset to zero there before every encode. One
simulated AllReduce is about ``2 n + 3`` array operations for ``two_shot`` (one encode and
one decode of all n contributions, then ``2 (n - 1)`` additions in each owner's order) and
3 to 5 per hop for ``ring`` (on the GPU without padding, a gather and the codec's fused
``reduce_encode_kernel``; otherwise a widening, a decode-accumulate and an encode), each
over at most ``n * count`` elements: no per-shard or per-pair Python loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from coccl.algorithms.schedule_args import aligned_shards, chunk_elems, shard_stride
from coccl.compressors import Compressor, get_compressor, require_graph_safe
from coccl.core.arrays import Flat, accumulate_dtype, as_flat
from coccl.core.options import check_chunk_bytes
from coccl.core.reduction import finalize

__all__ = ["SIMULATED_ALGORITHMS", "simulate_allreduce"]

# The schedules whose arithmetic is coccl's own. "native" sums in the transport's order
# (MPI's, NCCL's) and "auto" picks native below a size: neither can be reproduced bitwise.
SIMULATED_ALGORITHMS = ("ring", "two_shot")
SIMULATED_OPS = ("sum", "avg")


def simulate_allreduce(
    partials: Sequence[Any] | Any,
    *,
    algorithm: str = "two_shot",
    compressor: str | dict | Compressor = "identity",
    op: str = "sum",
    chunk_bytes: int | None = None,
) -> Any:
    """What every rank of a real ``Communicator.allreduce`` of ``partials`` returns.

    Args:
        partials: the n ranks' contributions in rank order: a list or tuple of n arrays of
            one shape, dtype and device, or one array whose first dimension indexes the
            ranks. numpy, CuPy or torch (CPU or CUDA) arrays, contiguous.
        algorithm: ``"ring"`` or ``"two_shot"``.
        compressor: a codec name, config dict or Compressor (every codec and option).
        op: ``"sum"`` or ``"avg"``.
        chunk_bytes: the real call's pipeline chunk. Without effect on the result for
            a codec that is not ``payload_scoped``; for one that is (NVFP4, tah), required
            on more than one rank, and the simulation equals a real call given the same
            ``chunk_bytes`` (a real call without one sizes its chunk by route: host,
            staged MPI or NCCL, which the simulation cannot know).

    Returns:
        A new array of the partials' kind, device, dtype and (per-rank) shape. Device
        work runs on the current stream (torch's for torch tensors, CuPy's otherwise).

    Raises:
        ValueError: an algorithm or op that cannot be simulated, no partials, partials of
            different shapes or devices, a bad ``chunk_bytes``, none for a
            ``payload_scoped`` codec on more than one rank, or a ``stochastic`` codec
            (a real call's salts depend on its call number). TypeError: a dtype the codec
            refuses, or partials of different dtypes or kinds.
            GraphCaptureError: the current stream is capturing a CUDA graph and the codec
            is not ``graph_safe``.
    """
    codec = _checked_codec(partials, algorithm, compressor, op, chunk_bytes)
    is_list = isinstance(partials, (list, tuple))
    with _on_current_stream(partials[0] if is_list else partials):
        first = _first(partials)
        codec.check_dtype(first.dtype)
        codec.check_op(op)
        if _capturing(first.obj):
            require_graph_safe(codec, "simulate_allreduce")
        ranks, _owner = _stack(partials, first)  # _owner keeps a copy's memory alive
        data, obj = first.new(first.shape)
        dtype = np.dtype(first.dtype)
        if codec.payload_scoped:
            # the real cut (planner: chunk_elems of the call's chunk_bytes); None: one rank
            chunk = chunk_bytes and chunk_elems(chunk_bytes, dtype.itemsize, codec.alignment)
            _simulate_payloads(ranks, data, codec, dtype, algorithm, op, first.new, chunk)
        else:
            _simulate(ranks, data, codec, dtype, algorithm, op, first.new)
    return obj


# --------------------------------------------------------------------------- inputs
def _checked_codec(
    partials: Sequence[Any] | Any,
    algorithm: str,
    compressor: str | dict | Compressor,
    op: str,
    chunk_bytes: int | None,
) -> Compressor:
    """The codec, after the checks of the arguments that need no data (the same on every
    caller alike): the schedule, op, chunk, a stochastic codec, no partials, and a
    payload-scoped codec without ``chunk_bytes``."""
    if not isinstance(algorithm, str) or algorithm not in SIMULATED_ALGORITHMS:
        raise ValueError(
            f"simulate_allreduce takes algorithm 'ring' or 'two_shot', not {algorithm!r} "
            "('native' and 'auto' reduce in the transport's own order)"
        )
    if not isinstance(op, str) or op not in SIMULATED_OPS:
        raise ValueError(f"simulate_allreduce takes op 'sum' or 'avg', not {op!r}")
    check_chunk_bytes(chunk_bytes)
    codec = get_compressor(compressor)
    if codec.stochastic:
        raise ValueError(
            f"simulate_allreduce cannot reproduce the stochastic codec {codec!r}: a real "
            "call's random streams are salted by its rank, call number and encode order"
        )
    if isinstance(partials, (list, tuple)) and not partials:
        raise ValueError("partials holds no contribution (n must be at least 1)")
    if codec.payload_scoped and chunk_bytes is None and _rank_count(partials) > 1:
        raise ValueError(
            f"simulate_allreduce of the payload-scoped codec {codec!r} needs chunk_bytes: "
            "its groups depend on where payloads are cut, and a real call without "
            "chunk_bytes cuts by route (host, staged MPI, NCCL), which a simulation cannot "
            "know; pass chunk_bytes here and the same chunk_bytes to the real allreduce"
        )
    return codec


def _rank_count(partials: Sequence[Any] | Any) -> int:
    """n, read without touching any data: the list's length or the first dimension."""
    if isinstance(partials, (list, tuple)):
        return len(partials)
    shape = getattr(partials, "shape", None)
    return int(shape[0]) if shape else 0


def _first(partials: Sequence[Any] | Any) -> Flat:
    """Rank 0's contribution as a Flat (its kind, device, dtype and shape make the
    result), after checking that the others match it."""
    if isinstance(partials, (list, tuple)):
        first = as_flat(partials[0], "partials[0]")
        for i, p in enumerate(partials[1:], 1):
            _check_like(as_flat(p, f"partials[{i}]"), first, f"partials[{i}]")
        return first
    whole = as_flat(partials, "partials")
    if not whole.shape or whole.shape[0] < 1:
        raise ValueError("stacked partials need a first dimension of n >= 1 ranks")
    n = whole.shape[0]
    return Flat(whole.data[: whole.size // n], whole.obj, whole.kind, whole.shape[1:], whole.new)


def _stack(partials: Sequence[Any] | Any, first: Flat) -> tuple[Any, Any]:
    """The contributions as one ``(n, count)`` internal array (a copy for a list, a view
    of a stacked array), and the object that owns its memory."""
    if isinstance(partials, (list, tuple)):
        flat, obj = first.new((len(partials) * first.size,))
        ranks = flat.reshape(len(partials), first.size)
        for i, p in enumerate(partials):
            _copy(ranks[i], as_flat(p).data)
        return ranks, obj
    whole = as_flat(partials, "partials")
    n = whole.shape[0]
    return whole.data.reshape(n, whole.size // n), whole.obj


def _check_like(f: Flat, first: Flat, name: str) -> None:
    if f.kind != first.kind or f.xp is not first.xp:
        raise TypeError(f"{name} is a {f.kind} array; partials[0] is a {first.kind} array")
    if f.dtype != first.dtype:
        raise TypeError(f"{name} has dtype {f.dtype.name}; partials[0] has {first.dtype.name}")
    if f.shape != first.shape:
        raise ValueError(f"{name} has shape {f.shape}; partials[0] has {first.shape}")
    if f.device_id != first.device_id:
        raise ValueError(f"{name} is on another device than partials[0]")


@contextlib.contextmanager
def _on_current_stream(like: Any) -> Iterator[None]:
    """Run device work for arrays like ``like`` on their device and the caller's stream.

    For torch CUDA tensors: on torch's current stream (so the result is ordered after the
    work that produced the partials), CuPy's temporaries taken from torch's caching
    allocator (one pool, stream-ordered; inside a CUDA graph capture, the graph's own
    pool, so a captured simulation can be replayed). Entered before any DLPack view is
    made, so torch sees the consumer stream is its own and adds no synchronisation. For
    CuPy arrays: their device and CuPy's current stream. Host arrays: nothing to do.
    """
    module = type(like).__module__.split(".")[0]
    if module == "torch" and like.is_cuda:
        import cupy as cp  # noqa: PLC0415
        import torch  # noqa: PLC0415

        device = like.device.index
        stream = torch.cuda.current_stream(device)
        with (
            cp.cuda.Device(device),
            cp.cuda.ExternalStream(stream.cuda_stream, device),
            cp.cuda.using_allocator(_torch_allocator),
        ):
            yield
    elif module == "cupy":
        with like.device:
            yield
    else:
        yield


def _capturing(like: Any) -> bool:
    """Whether the stream that device work for arrays like ``like`` runs on (the current
    one, see ``_on_current_stream``: CuPy's, torch's for torch tensors) is capturing a CUDA
    graph; host arrays: never."""
    module = type(like).__module__.split(".")[0]
    if (module == "torch" and like.is_cuda) or module == "cupy":
        import cupy as cp  # noqa: PLC0415

        return bool(cp.cuda.get_current_stream().is_capturing())
    return False


def _torch_allocator(nbytes: int) -> Any:
    """A CuPy allocation backed by a torch tensor on the current device (the tensor lives
    as long as the CuPy memory that refers to it)."""
    import cupy as cp  # noqa: PLC0415
    import torch  # noqa: PLC0415

    device = cp.cuda.Device().id
    block = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device}")
    # the device given: no pointer query (a size-0 block has a null pointer)
    memory = cp.cuda.UnownedMemory(block.data_ptr(), nbytes, block, device)
    return cp.cuda.MemoryPointer(memory, 0)


# ------------------------------------------------------------------------ schedules
def _simulate(
    ranks: Any, out: Any, codec: Compressor, dtype: np.dtype, algorithm: str, op: str, new: Any
) -> None:
    """Write into flat ``out`` the AllReduce of the rows of ``ranks`` (n x count)."""
    n, count = ranks.shape
    if count == 0:
        return
    sim = _Simulation(ranks, codec, dtype, new)
    if n == 1:
        sim.load(0)
        sim.finish(op, out)
    elif algorithm == "two_shot":
        sim.two_shot(op, out)
    else:
        sim.ring(op, out)


class _Simulation:
    """Buffers and steps of one simulated AllReduce.

    ``x`` is the padded contributions, ``(n ranks, n * per)`` of the data's dtype (rank
    ``j``'s shard ``k`` at ``[j, k * per : (k + 1) * per]``); ``acc`` holds every shard's
    accumulator side by side (``n * per``, the accumulate dtype), as its owner holds it.
    """

    def __init__(self, ranks: Any, codec: Compressor, dtype: np.dtype, new: Any) -> None:
        n, count = ranks.shape
        self.n, self.count, self.codec, self.dtype, self._new = n, count, codec, dtype, new
        self._owners: list[Any] = []  # the objects that own the buffers' memory
        self.per = shard_stride(count, n, codec.alignment)
        self.length = n * self.per
        if self.length == count:
            self.x = ranks
        else:
            self.x = self.array((n, self.length), dtype)
            self.x.view(_bits(dtype))[:, count:] = 0
            _copy(self.x[:, :count], ranks)
        self.acc = self.array((self.length,), accumulate_dtype(dtype))

    def payload(self, count: int) -> Any:
        """A new payload buffer for ``count`` elements."""
        return self.array((self.codec.encoded_nbytes(count, self.dtype),), np.uint8)

    def array(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return _owned_array(self._new, self._owners, shape, dtype)

    # ------------------------------------------------------------------ blocks
    def blocks(self, rank_of_shard: int) -> list[tuple[int, int, Any]]:
        """Shard ``k`` of rank ``(k + rank_of_shard) % n``, for every shard ``k``, as
        strided views ``(start, stop, view)`` into ``x`` (start/stop: positions in the
        ``n * per`` layout): at most two views, one before and one after the wrap."""
        n, per, x = self.n, self.per, self.x
        s = rank_of_shard % n
        flat = x.reshape(-1)
        item = flat.itemsize
        views = []
        for k0, k1, rank0 in ((0, n - s, s), (n - s, n, 0)):  # ranks s..n-1, then 0..
            if k1 > k0:
                offset = rank0 * n * per + k0 * per
                strides = ((n + 1) * per * item, item)
                view = _as_strided(flat[offset:], (k1 - k0, per), strides)
                views.append((k0 * per, k1 * per, view))
        return views

    def load(self, rank_of_shard: int) -> None:
        """``acc`` of shard k = rank ``(k + rank_of_shard) % n``'s data (widened)."""
        for a, b, view in self.blocks(rank_of_shard):
            self.acc[a:b].reshape(view.shape)[...] = view

    def gather(self, rank_of_shard: int, dst: Any) -> Any:
        """``dst`` of shard k = rank ``(k + rank_of_shard) % n``'s data, contiguous."""
        bits = _bits(self.dtype)
        for a, b, view in self.blocks(rank_of_shard):
            dst[a:b].reshape(view.shape).view(bits)[...] = view.view(bits)
        return dst

    # ------------------------------------------------------------------- steps
    def zero_tail(self) -> None:
        """Positions past ``count`` stand for the real last group's zero padding."""
        if self.length > self.count:
            self.acc[self.count :] = 0

    def encode(self, values: Any, payload: Any) -> None:
        self.codec.encode_into(values, payload, self.dtype)

    def add_decoded(self, payload: Any) -> None:
        """``acc += decode(payload)``: the fused decode-accumulate of a reduction."""
        self.codec.decode_into(payload, self.acc, self.dtype, True)

    def finish(self, op: str, out: Any, payload: Any = None) -> None:
        """``acc`` holds every reduced shard: ``avg``'s division, one encode (into
        ``payload``, or a new buffer), and the decode every rank (owner included) does
        into ``out``."""
        self.zero_tail()
        finalize(self.acc, op, self.n)
        if payload is None:
            payload = self.payload(self.length)
        self.encode(self.acc, payload)
        if self.length == self.count:
            self.codec.decode_into(payload, out, self.dtype, False)
            return
        full = self.array((self.length,), self.dtype)
        self.codec.decode_into(payload, full, self.dtype, False)
        _copy(out, full[: self.count])

    # --------------------------------------------------------------- schedules
    def two_shot(self, op: str, out: Any) -> None:
        """Owner k: its own data, then the decoded payloads of ranks 0..n-1 but k, in
        rank order. Every rank's data is encoded in one launch and decoded in another
        (the owners' own blocks too, unused: one launch instead of n); then rank j's
        decoded blocks are added to every shard but j, for j = 0, 1, ..., n-1, which is
        each owner's order. Adding a decoded value is the codec's decode-accumulate
        (FORMAT.md: the float32 value is added)."""
        n, per, length = self.n, self.per, self.length
        self.load(0)
        payload = self.payload(n * length)
        self.encode(self.x.reshape(-1), payload)
        decoded = self.array((n, length), self.acc.dtype)
        self.codec.decode_into(payload, decoded.reshape(-1), self.dtype, False)
        for j in range(n):
            if j > 0:
                self.acc[: j * per] += decoded[j, : j * per]
            if j < n - 1:
                self.acc[(j + 1) * per :] += decoded[j, (j + 1) * per :]
        self.finish(op, out)

    def ring(self, op: str, out: Any) -> None:
        """Shard k: rank k+1 encodes, ranks k+2 .. k-1 add and re-encode (one hop each,
        all shards at once), the owner k adds last."""
        n = self.n
        src = self.array((self.length,), self.dtype)  # a hop's own data, contiguous
        received, spare = self.payload(self.length), self.payload(self.length)
        # the codec's fused hop kernel (GPU), bitwise its three steps; it sees no padding,
        # so it runs only when there is none
        hop = None
        if self.length == self.count:
            hop = self.codec.reduce_encode_kernel(src, self.dtype)
        self.encode(self.gather(1, src), received)
        for t in range(1, n - 1):
            if hop is not None:
                hop(self.gather(t + 1, src), received, spare)
            else:
                self.load(t + 1)
                self.add_decoded(received)
                self.zero_tail()
                self.encode(self.acc, spare)
            received, spare = spare, received
        self.load(0)
        self.add_decoded(received)
        self.finish(op, out, spare)


# ------------------------------------------------------------ payload-scoped codecs
def _simulate_payloads(
    ranks: Any,
    out: Any,
    codec: Compressor,
    dtype: np.dtype,
    algorithm: str,
    op: str,
    new: Any,
    chunk: int | None,
) -> None:
    """``_simulate`` for a ``payload_scoped`` codec: exactly the payloads a real rank
    encodes, one at a time, over the real (unpadded) spans: per chunk of
    ``aligned_shards``' shard ``k`` (``ScheduleArgs.chunk``: runs of ``chunk`` elements
    from the shard's start, the last one short), two_shot encodes every other rank's data
    once, ring one partial sum per hop, and the owner its reduced chunk; an empty shard is
    skipped (a real rank sends nothing for it); one rank encodes its whole array as one
    payload whatever the chunk (``ring._local``). About ``n * n * chunks`` codec launches."""
    n, count = ranks.shape
    if count == 0:
        return
    owners: list[Any] = []  # the objects that own the buffers' memory
    pieces = _payload_pieces(count, n, codec.alignment, chunk)
    longest = max(b - a for _k, a, b in pieces)
    acc_buf = _owned_array(new, owners, (longest,), accumulate_dtype(dtype))
    nbytes = (codec.encoded_nbytes(longest, dtype),)
    payload_buf = _owned_array(new, owners, nbytes, np.uint8)
    spare_buf = _owned_array(new, owners, nbytes, np.uint8)
    for k, a, b in pieces:
        size, acc = b - a, acc_buf[: b - a]
        payload = payload_buf[: codec.encoded_nbytes(size, dtype)]
        spare = spare_buf[: payload.size]
        if n == 1:
            acc[...] = ranks[0, a:b]
        elif algorithm == "two_shot":  # own data, then every other rank in rank order
            acc[...] = ranks[k, a:b]
            for j in range(n):
                if j != k:
                    codec.encode_into(ranks[j, a:b], payload, dtype)
                    codec.decode_into(payload, acc, dtype, True)
        else:  # ring: ranks k+1 .. k-1 each add and re-encode; the owner adds last
            codec.encode_into(ranks[(k + 1) % n, a:b], payload, dtype)
            for t in range(2, n):
                acc[...] = ranks[(k + t) % n, a:b]
                codec.decode_into(payload, acc, dtype, True)
                codec.encode_into(acc, spare, dtype)
                payload, spare = spare, payload
            acc[...] = ranks[k, a:b]
            codec.decode_into(payload, acc, dtype, True)
        finalize(acc, op, n)
        codec.encode_into(acc, payload, dtype)
        codec.decode_into(payload, out[a:b], dtype, False)


def _payload_pieces(
    count: int, n: int, alignment: int, chunk: int | None
) -> list[tuple[int, int, int]]:
    """``(shard, start, stop)`` of every payload of a step: the chunks of ``chunk``
    elements of each non-empty shard of ``aligned_shards``, from its start (the last one
    short); one rank: the whole array, one payload."""
    if n == 1:
        return [(0, 0, count)]
    step = chunk or count  # chunk: given on more than one rank (simulate_allreduce)
    return [
        (k, a, min(a + step, b))
        for k, (s, b) in enumerate(aligned_shards(count, n, alignment))
        for a in range(s, b, step)
    ]


# ---------------------------------------------------------------------------- helpers
def _owned_array(new: Any, owners: list[Any], shape: tuple[int, ...], dtype: Any) -> Any:
    """A new internal array of ``shape`` (``new``: the partials' allocator), its owning
    object kept in ``owners`` for as long as the array is used."""
    data, obj = new(shape, dtype)
    owners.append(obj)
    return data.reshape(shape)


def _bits(dtype: np.dtype) -> np.dtype:
    """An unsigned integer dtype of ``dtype``'s size: copies move bits, and every array
    library can copy those (CuPy need not know bfloat16)."""
    return np.dtype(f"u{np.dtype(dtype).itemsize}")


def _as_strided(a: Any, shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
    """A view of ``a``'s memory with this shape and these strides (in bytes)."""
    if isinstance(a, np.ndarray):
        return np.lib.stride_tricks.as_strided(a, shape, strides)
    from cupy.lib.stride_tricks import as_strided  # noqa: PLC0415

    return as_strided(a, shape, strides)


def _copy(dst: Any, src: Any) -> None:
    bits = _bits(dst.dtype)
    dst.view(bits)[...] = src.view(bits)
