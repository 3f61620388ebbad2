"""The Communicator: coccl's public face for collectives.

It validates every argument before any byte moves (on every rank alike), picks the
schedule, and runs it over the transport with the chunk pipeline. Host (numpy, CPU torch)
data always travels over MPI; device data travels over the communicator's backend:
NCCL, or MPI (directly if CUDA-aware, else through pinned host staging).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import numpy as np

from coccl import algorithms
from coccl.arrays import Flat, accumulate_dtype, as_flat, dtype_name
from coccl.compressors import Compressor, get_compressor
from coccl.config import settings
from coccl.device import DeviceContext
from coccl.errors import CocclError
from coccl.mpi_transport import MpiTransport
from coccl.overlap import NullTransport, WireOnlyCodec
from coccl.pipeline import (
    CpuExecutor,
    GpuExecutor,
    InlineExecutor,
    run_polling,
    run_streamed,
)
from coccl.pool import BufferPool, host_pool, size_class
from coccl.reduction import check_op

BACKENDS = ("auto", "mpi", "nccl")
# Below this chunk size, CPU compute runs on the polling thread itself: a worker thread's
# wake-up would cost more than the overlap it buys.
INLINE_CHUNK_BYTES = 64 << 10
# Default chunk of device data sent over MPI through pinned host staging (not CUDA-aware):
# 8 MiB, or (compressed data) chunks of 4M elements once each rank's shard holds four.
STAGED_CHUNK_BYTES = 8 << 20
STAGED_LARGE_CHUNK_ELEMS = 4 << 20


def staged_chunk_bytes(shard: int, itemsize: int, compressed: bool) -> int:
    """The default chunk of a staged collective whose per-rank shard holds ``shard``
    elements.

    Each chunk costs the polling thread host work (launches, copies, bookkeeping) that
    does not overlap MPI's own copies, so fewer, larger chunks overlap better, as long as
    every shard still holds enough chunks to pipeline. Measured on 4 ranks sharing an
    H200 (bench/NOTES.md): 8 MiB is best at 64 MiB (two chunks per shard; smaller chunks
    were slower), and at 256 MiB float32 chunks of 16 MiB (4M elements, four per shard)
    lifted the overlap from 0.88 to 0.95 (ring) and 0.89 to 0.97 (two-shot). 16-bit data
    reaches 4M elements at 8 MiB already, the size it was measured at. Uncompressed data
    keeps 8 MiB: it has no codec cost per chunk to save, and its payloads, four times a
    compressed chunk's, would make the staging limit cut the pipeline to depth 1 (float32
    ring identity at 256 MiB: 0.86 GB/s at 16 MiB chunks against 1.54–1.84 at 8 MiB).
    """
    if compressed and shard >= 4 * STAGED_LARGE_CHUNK_ELEMS:
        return max(STAGED_CHUNK_BYTES, STAGED_LARGE_CHUNK_ELEMS * itemsize)
    return STAGED_CHUNK_BYTES


# Largest default chunk over NCCL, in elements; nccl_chunk_bytes halves it until a window of
# two rounds fits the staging limit.
NCCL_MAX_CHUNK_ELEMS = 16 << 20


def window_bytes(
    n: int,
    codec: Compressor,
    dtype: np.dtype,
    chunk_elems: int,
    algorithm: str,
    collective: str,
    staged: bool,
    depth: int,
) -> int:
    """An upper bound on the pool bytes a pipeline window of ``depth`` rounds holds, on
    ``n`` ranks with chunks of ``chunk_elems`` elements. Per round: its payloads (their
    pinned copies too when ``staged``), an accumulator and a result payload; the payloads
    waiting between a chunk's steps, about one per step per round of depth (a chunk's
    next step runs ``depth`` waves later; ``staged``, a ring AllGather payload waiting to
    be forwarded keeps its pinned copy too); and a ring's last ReduceScatter step, which
    holds a second accumulator, once per pass of the window over the steps.
    bench/NOTES.md compares this bound with measured peaks."""
    payload = size_class(codec.encoded_nbytes(chunk_elems, dtype))
    acc = size_class(chunk_elems * accumulate_dtype(dtype).itemsize)
    if algorithm == "ring":
        messages = 2
        steps = 2 * (n - 1) if collective == "allreduce" else n - 1
        waiting = steps - 1
    else:
        messages, steps, waiting = 2 * max(1, n - 1), 2, 1
    per_round = (messages + 1 + waiting) * payload + acc
    if staged:
        per_round += messages * payload  # pinned host copies of every message
        if algorithm == "ring" and collective != "reduce_scatter":
            per_round += max(0, n - 2) * payload  # kept for the forwards
    second_accs = depth // max(1, steps) + 1 if algorithm == "ring" else 0
    return depth * per_round + second_accs * acc


def nccl_chunk_bytes(
    n: int,
    codec: Compressor,
    dtype: np.dtype,
    algorithm: str,
    collective: str,
    limit: int,
    floor: int,
) -> int:
    """The default chunk of a collective over NCCL: NCCL_MAX_CHUNK_ELEMS elements, halved
    until a window of two rounds fits ``limit`` (so the pipeline keeps a round in flight
    while the next is enqueued), never below ``floor`` bytes (COCCL_CHUNK_BYTES).

    Every round costs ~100-150 us of host work (launches, events, an NCCL group), which
    over NVLink is longer than its transfer, so fewer rounds are faster until the limit
    stops them: on two H200s a 1 GiB AllReduce with taco ran at 24-31 GB/s with 4 MiB
    chunks, 71-260 GB/s with this default (bench/NOTES.md)."""
    itemsize = np.dtype(dtype).itemsize
    elems = NCCL_MAX_CHUNK_ELEMS
    while elems * itemsize > floor and (
        window_bytes(n, codec, dtype, elems, algorithm, collective, False, 2) > limit
    ):
        elems //= 2
    return max(elems * itemsize, floor)


# overlap_profile's three runs: (name of the time, variant of _collective)
_PROFILE_RUNS = (
    ("pipelined", "normal"),
    ("codec_only", "codec_only"),
    ("transport_only", "transport_only"),
)


class Communicator:
    """A group of ranks that run collectives together (build it with ``coccl.init``).

    Attributes:
        rank: this process's rank.
        size: the number of ranks.
        backend: ``"mpi"`` or ``"nccl"``, the transport for device arrays (host arrays
            always travel over MPI).
    """

    def __init__(self, mpi_comm: Any, backend: str, nccl: Any = None) -> None:
        env = settings()
        self._settings = env
        self._mpi = MpiTransport(mpi_comm, cuda_aware=env.mpi_cuda_aware)
        self._nccl = nccl
        self.rank: int = self._mpi.rank
        self.size: int = self._mpi.size
        self.backend: str = backend
        self._host_pool = host_pool()
        self._cpu: CpuExecutor | None = None
        self._devices: dict[int, DeviceContext] = {}
        self._codecs: dict[str, Compressor] = {}
        self._cpu_threads = _cpu_threads(mpi_comm, env.cpu_threads)
        _set_numba_threads(self._cpu_threads)
        self._closed = False

    # ---------------------------------------------------------------- lifecycle
    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"rank={self.rank}, size={self.size}"
        return f"Communicator({state}, backend={self.backend!r})"

    def close(self) -> None:
        """Free the communicator's MPI duplicate, NCCL communicator and worker thread."""
        if self._closed:
            return
        self._closed = True
        if self._cpu is not None:
            self._cpu.close()
        if self._nccl is not None:
            self._nccl.close()
        self._mpi.close()

    def barrier(self) -> None:
        """Block until every rank has called ``barrier``."""
        self._check_open()
        self._mpi.barrier()

    # -------------------------------------------------------------- collectives
    def allreduce(
        self,
        x: Any,
        out: Any = None,
        *,
        op: str = "sum",
        algorithm: str = "auto",
        compressor: str | dict | Compressor = "identity",
        chunk_bytes: int | None = None,
    ) -> Any:
        """Reduce ``x`` across ranks; every rank gets the (bitwise identical) result.

        Args:
            x: contiguous numpy/CuPy/numba-device array or torch tensor, any shape.
            out: optional output of ``x``'s size, dtype and device; may be ``x``.
            op: ``"sum"``, ``"avg"``, or with the identity codec ``"max"``, ``"min"``,
                ``"prod"``.
            algorithm: ``"ring"``, ``"two_shot"``, ``"native"`` or ``"auto"``.
            compressor: a codec name, config dict or Compressor.
            chunk_bytes: pipeline chunk size (default ``COCCL_CHUNK_BYTES``).

        Returns:
            ``out``, or a new array of ``x``'s kind, shape, dtype and device.
        """
        return self._collective("allreduce", x, out, op, algorithm, compressor, chunk_bytes)

    def reduce_scatter(
        self,
        x: Any,
        out: Any = None,
        *,
        op: str = "sum",
        algorithm: str = "auto",
        compressor: str | dict | Compressor = "identity",
        chunk_bytes: int | None = None,
    ) -> Any:
        """Reduce ``x`` (``size * n`` elements) and keep shard ``rank`` (``n`` elements),
        as ``ncclReduceScatter``. A new result has shape ``(x.shape[0] // size,
        *x.shape[1:])`` when the first dimension divides, else ``(n,)``."""
        return self._collective("reduce_scatter", x, out, op, algorithm, compressor, chunk_bytes)

    def allgather(
        self,
        x: Any,
        out: Any = None,
        *,
        algorithm: str = "auto",
        compressor: str | dict | Compressor = "identity",
        chunk_bytes: int | None = None,
    ) -> Any:
        """Gather every rank's ``x`` (``n`` elements) into ``size * n`` elements, rank
        ``r``'s at offset ``r * n``, as ``ncclAllGather``. A new result has shape
        ``(size * x.shape[0], *x.shape[1:])`` (``(size,)`` for a 0-d ``x``)."""
        return self._collective("allgather", x, out, "sum", algorithm, compressor, chunk_bytes)

    # ---------------------------------------------------------------- internals
    def _check_open(self) -> None:
        if self._closed:
            raise CocclError("this communicator is closed")

    def _result_shape(self, collective: str, src: Flat) -> tuple[int, ...]:
        shape, n = src.shape, self.size
        if collective == "allreduce":
            return shape
        if collective == "reduce_scatter":
            if shape and shape[0] % n == 0:
                return (shape[0] // n, *shape[1:])
            return (src.size // n,)
        return (n * shape[0], *shape[1:]) if shape else (n,)

    def _output(self, collective: str, src: Flat, out: Any) -> Flat:
        count = (
            src.size
            if collective == "allreduce"
            else (src.size // self.size if collective == "reduce_scatter" else src.size * self.size)
        )
        if out is None:
            data, obj = src.new(self._result_shape(collective, src))
            return Flat(data, obj, src.kind, tuple(getattr(obj, "shape", ())), src.new)
        dst = as_flat(out, "out")
        if dst.dtype != src.dtype:
            raise TypeError(f"out has dtype {dtype_name(dst.dtype)}, x has {dtype_name(src.dtype)}")
        if dst.size != count:
            raise ValueError(f"out has {dst.size} elements; {collective} needs {count}")
        if dst.xp is not src.xp or dst.device_id != src.device_id:
            raise ValueError("out must be on the same device as x")
        return dst

    def _collective(
        self,
        collective: str,
        x: Any,
        out: Any,
        op: str,
        algorithm: str,
        compressor: Any,
        chunk_bytes: int | None,
        variant: str = "normal",
    ) -> Any:
        # --- every check before any byte moves -------------------------------------
        self._check_open()
        op = check_op(op)
        algorithm = algorithms.check_algorithm(algorithm)
        codec = self._codec(compressor)
        src = as_flat(x, "x")
        codec.check_dtype(src.dtype)
        if collective != "allgather":
            codec.check_op(op)
        if algorithm == "native" and not codec.lossless:
            raise ValueError(
                "algorithm 'native' is the transport's own collective and takes "
                f"compressor='identity', not {codec.codec_id!r}"
            )
        if collective == "reduce_scatter" and src.size % self.size:
            raise ValueError(
                f"reduce_scatter needs a multiple of the rank count ({self.size}) elements, "
                f"x has {src.size}"
            )
        chunk = self._settings.chunk_bytes if chunk_bytes is None else chunk_bytes
        chunk_default = chunk_bytes is None and not self._settings.chunk_bytes_set
        host_unpipelined = chunk_default and self._cpu_threads < 2
        if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
            raise ValueError(f"chunk_bytes must be a positive integer, got {chunk_bytes!r}")
        dst = self._output(collective, src, out)
        on_device = src.xp is not np
        if host_unpipelined and not on_device:
            # Host data with no spare core per rank for the codec thread: chunks could only
            # run one after the other on the polling thread, so pipelining would add
            # per-chunk cost and overlap nothing. One chunk (bench/NOTES.md measures it).
            chunk = max(int(chunk), src.size * src.dtype.itemsize, 1)
        transport = self._nccl if (on_device and self._nccl is not None) else self._mpi
        staged = on_device and transport is self._mpi and not self._mpi.cuda_aware
        if staged and chunk_default:
            shard = src.size if collective == "allgather" else -(-src.size // self.size)
            chunk = staged_chunk_bytes(shard, src.dtype.itemsize, not codec.lossless)

        if algorithm == "auto":
            algorithm, codec = algorithms.choose(
                collective,
                src.size * src.dtype.itemsize,
                codec,
                transport.name,
                on_device,
                self.size,
            )
            if algorithm == "native" and not transport.has_native(collective, src.dtype, op):
                algorithm = "ring"
        elif algorithm == "native" and not transport.has_native(collective, src.dtype, op):
            raise TypeError(
                f"the {transport.name} transport has no native {collective} of "
                f"{dtype_name(src.dtype)} with op {op!r}; use algorithm='ring' or 'two_shot'"
            )
        if transport.name == "nccl" and chunk_default and algorithm != "native":
            chunk = nccl_chunk_bytes(
                self.size,
                codec,
                src.dtype,
                algorithm,
                collective,
                self._settings.staging_limit_bytes,
                int(chunk),
            )
        # --- run -------------------------------------------------------------------
        if variant == "codec_only":
            transport = NullTransport(self.rank, self.size)
        elif variant == "transport_only":
            codec = WireOnlyCodec(codec)
        job = (collective, src, dst, op, algorithm, codec, int(chunk), transport)
        if on_device:
            ctx = self._device(src.device_id)
            with ctx.device:
                caller = ctx.enter()
                try:
                    self._run(*job, ctx, staged)
                finally:
                    ctx.leave(caller)
        else:
            self._run(*job, None, False)
        return dst.obj

    def overlap_profile(
        self,
        collective: str,
        x: Any,
        *,
        algorithm: str,
        compressor: str | dict | Compressor,
        chunk_bytes: int | None = None,
        iters: int = 5,
        op: str = "sum",
    ) -> dict[str, float]:
        """Time one pipelined collective against its two halves, in this process.

        Runs the call three ways with the same schedule and chunks: pipelined (normal),
        codec-only (messages complete at once, nothing moves) and transport-only (the
        real payload sizes, no encoding or decoding). Collective: every rank must call
        it. Times are the median of ``iters`` runs, the slowest rank's.

        Returns:
            ``{"pipelined_s", "codec_only_s", "transport_only_s", "overlap_efficiency"}``
            with ``overlap_efficiency = max(codec_only, transport_only) / pipelined``.
        """
        import time  # noqa: PLC0415

        if collective not in ("allreduce", "reduce_scatter", "allgather"):
            raise ValueError(f"unknown collective {collective!r}")
        if algorithm not in ("ring", "two_shot"):
            raise ValueError("overlap_profile takes algorithm='ring' or 'two_shot'")
        if not isinstance(iters, int) or iters < 1:
            raise ValueError(f"iters must be a positive integer, got {iters!r}")
        samples: dict[str, list[float]] = {name: [] for name, _ in _PROFILE_RUNS}
        # Interleaved (pipelined, codec-only, transport-only, pipelined, ...), so a drift
        # of the machine's speed during the measurement weighs on the three alike.
        for i in range(iters + 1):  # the first round warms up
            for name, variant in _PROFILE_RUNS:
                self._mpi.barrier()
                start = time.perf_counter()
                self._collective(
                    collective, x, None, op, algorithm, compressor, chunk_bytes, variant
                )
                _synchronize(x)
                if i:
                    samples[name].append(time.perf_counter() - start)
        times: dict[str, float] = {}
        for name, values in samples.items():
            local = float(np.median(values))
            times[f"{name}_s"] = self._mpi.comm.allreduce(local, op=_mpi_max())
        longest_half = max(times["codec_only_s"], times["transport_only_s"])
        times["overlap_efficiency"] = longest_half / times["pipelined_s"]
        return times

    def _codec(self, spec: Any) -> Compressor:
        """``get_compressor(spec)``, remembered for names: a codec is immutable, and
        building one per call is a measurable part of a small collective's latency."""
        if isinstance(spec, str):
            codec = self._codecs.get(spec)
            if codec is None:
                codec = self._codecs[spec] = get_compressor(spec)
            return codec
        return get_compressor(spec)

    def _device(self, device_id: int | None) -> DeviceContext:
        assert device_id is not None  # only called for device data
        if device_id not in self._devices:
            self._devices[device_id] = DeviceContext.create(device_id)
        return self._devices[device_id]

    def _executor(self, ctx: DeviceContext | None, chunk_nbytes: int) -> Any:
        if ctx is not None:
            return GpuExecutor(ctx.compute)
        if chunk_nbytes <= INLINE_CHUNK_BYTES:
            return InlineExecutor()
        if self._cpu is None:
            self._cpu = CpuExecutor(self._cpu_threads)
        return self._cpu

    def pools(self) -> list[BufferPool]:
        """Every buffer pool this communicator uses (for memory statistics)."""
        pools = [self._host_pool, *self._mpi.pools()]
        pools += [ctx.pool for ctx in self._devices.values()]
        if self._nccl is not None:
            pools += self._nccl.pools()
        return pools

    def stats(self) -> dict[str, int]:
        """Counters for benchmarks: payload bytes this rank sent point to point (native
        collectives not counted), and the peak extra memory the pipeline's pools held in
        use (host, pinned host, device), since the last ``reset_stats``."""
        transports = [self._mpi] + ([self._nccl] if self._nccl is not None else [])
        peaks = {"host": 0, "pinned": 0, "device": 0}
        for pool in self.pools():
            peaks[pool.kind] += pool.peak_in_use_bytes
        return {
            "bytes_sent": sum(t.bytes_sent for t in transports),
            **{f"peak_{kind}_bytes": value for kind, value in peaks.items()},
            "pool_allocated_bytes": sum(p.allocated_bytes for p in self.pools()),
        }

    def reset_stats(self) -> None:
        """Zero the counters of ``stats``."""
        for t in [self._mpi] + ([self._nccl] if self._nccl is not None else []):
            t.bytes_sent = 0
        for pool in self.pools():
            pool.reset_peak()

    def _run(
        self,
        collective: str,
        src: Flat,
        dst: Flat,
        op: str,
        algorithm: str,
        codec: Compressor,
        chunk_bytes: int,
        transport: Any,
        ctx: DeviceContext | None,
        staged: bool,
    ) -> None:
        """Run one collective; ``staged``: device data through pinned host copies (the
        codec-only and transport-only runs of ``overlap_profile`` pass the real call's
        value, so that all three size their pipeline alike)."""
        # device work is enqueued on coccl's compute stream (host data: no stream)
        stream = ctx.compute if ctx is not None else contextlib.nullcontext()
        if algorithm == "native":
            with stream:
                algorithms.native.run(transport, collective, src.data, dst.data, op)
            return
        align = codec.alignment
        chunk_elems = max(align, (chunk_bytes // src.dtype.itemsize) // align * align)
        plan = algorithms.Plan(
            rank=self.rank,
            size=self.size,
            codec=codec,
            dtype=src.dtype,
            op=op,
            chunk_elems=chunk_elems,
            pool=self._host_pool if ctx is None else ctx.pool,
            what=f"{collective} ({algorithm}, {codec.codec_id})",
        )
        if op in ("sum", "avg"):
            plan.hop = codec.reduce_encode_kernel(src.data, src.dtype)
        depth = self._depth(plan, algorithm, collective, staged)
        plan.lag = depth
        rounds = algorithms.schedule(algorithm, collective)(plan, src.data, dst.data)
        if transport.name == "nccl":
            run_streamed(
                rounds,
                transport,
                ctx,
                depth=depth,
                timeout_s=self._settings.timeout_s,
                what=plan.what,
            )
            return
        executor = self._executor(ctx, min(chunk_elems, src.size) * src.dtype.itemsize)
        with stream:
            run_polling(
                rounds,
                transport,
                executor,
                depth=depth,
                timeout_s=self._settings.timeout_s,
                what=plan.what,
            )

    def _depth(self, plan: algorithms.Plan, algorithm: str, collective: str, staged: bool) -> int:
        """The pipeline depth, lowered if needed so the pools' blocks in use stay within
        COCCL_STAGING_LIMIT_BYTES (``window_bytes`` bounds them): staging memory is set by
        chunk size and depth, never by message size. A chunk whose one round needs more
        than the limit runs at depth 1. tests/mpi/test_compressed.py (host),
        test_gpu_collectives.py (staged device) and test_nccl_gpu_collectives.py check
        it."""
        limit = self._settings.staging_limit_bytes
        depth = self._settings.pipeline_depth
        while depth > 1 and (
            window_bytes(
                self.size,
                plan.codec,
                plan.dtype,
                plan.chunk_elems,
                algorithm,
                collective,
                staged,
                depth,
            )
            > limit
        ):
            depth -= 1
        return depth


def _synchronize(x: Any) -> None:
    """Wait for the device work of a call on ``x``'s device (no-op for host data)."""
    if as_flat(x, "x").xp is not np:
        import cupy as cp  # noqa: PLC0415

        cp.cuda.get_current_stream().synchronize()


def _mpi_max() -> Any:
    from mpi4py import MPI  # noqa: PLC0415

    return MPI.MAX


def _cpu_threads(mpi_comm: Any, requested: int | None) -> int:
    """Threads for the CPU codec kernels: COCCL_CPU_THREADS, else this node's cores
    divided among its ranks. Oversubscribed numba threads spin against each other and
    against MPI's polling (seen: 100x slower collectives with 4 ranks on 2 cores)."""
    if requested is not None:
        return requested
    from mpi4py import MPI  # noqa: PLC0415

    local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
    local_size = local.Get_size()
    local.Free()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // local_size)


def _set_numba_threads(threads: int) -> None:
    import numba  # noqa: PLC0415

    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))


def init(mpi_comm: Any = None, backend: str = "auto") -> Communicator:
    """Create a Communicator over an MPI communicator (default ``MPI.COMM_WORLD``).

    Args:
        mpi_comm: an ``mpi4py.MPI.Comm``.
        backend: ``"mpi"``, ``"nccl"`` or ``"auto"`` (NCCL when every rank has a GPU of
            its own, else MPI). Host arrays always travel over MPI.

    Raises:
        ValueError: unknown backend. TypeError: ``mpi_comm`` is not an MPI communicator.
        CocclError: the NCCL backend cannot run here (no CuPy/GPU, or ranks share a GPU).
    """
    from mpi4py import MPI  # noqa: PLC0415

    if mpi_comm is None:
        mpi_comm = MPI.COMM_WORLD
    if not isinstance(mpi_comm, MPI.Comm):
        raise TypeError(f"mpi_comm must be an mpi4py.MPI.Comm, got {type(mpi_comm).__name__}")
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; coccl takes {', '.join(BACKENDS)}")
    from coccl import nccl_transport  # noqa: PLC0415

    resolved, device_id, reason = nccl_transport.decide(mpi_comm, backend)
    if backend == "nccl" and resolved != "nccl":
        raise CocclError(f"backend='nccl' cannot run here: {reason}")
    nccl = None
    if resolved == "nccl":
        nccl = nccl_transport.NcclTransport(mpi_comm, device_id)
    return Communicator(mpi_comm, resolved, nccl)
