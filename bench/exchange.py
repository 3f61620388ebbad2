"""The exchange sweeps: ``coccl-bench sendrecv`` and ``coccl-bench alltoall`` (as
nccl-tests' ``sendrecv_perf`` and ``alltoall_perf``).

At each size every compressor runs through coccl (``Communicator.batch_p2p`` around a
ring: each rank sends to ``rank + 1`` and receives from ``rank - 1``; or
``Communicator.alltoall`` with equal splits) beside the transport's own uncompressed
exchange of the same run, the ``native`` row: ``MPI_Sendrecv`` / ``MPI_Alltoall`` of host
buffers (device data copied to the host and back, as the collective sweeps' native
baseline over staged MPI), or, when coccl's device data travels over NCCL, one NCCL group
of ``ncclSend``/``ncclRecv`` on a communicator of the bench's own. Each point: a first
call, the warm-up, then loops of ``-n`` back-to-back calls (``coccl.bench.timing``); then
the check of the last output against what was sent (identity: bitwise; a lossy codec:
within its roundtrip bound, ``bounds.roundtrip_bound``).

Overlap efficiency (``--overlap-min``, sendrecv's compressed rows): the definition of the
collective sweeps (``Communicator.overlap_profile``), ``max(codec-only, transport-only) /
pipelined``, medians of interleaved runs, the slowest rank's. The profiler of the
collectives runs a collective's plan and cannot take a point-to-point message, so the two
halves are built here: codec-only encodes every chunk of the message into its payload and
decodes every payload into the output (the compute of both ends of the rank's two
messages, chunked as the message is, no transfer); transport-only is the same exchange
with ``WireOnlyCodec`` (the codec's payload sizes and chunks, its staging copies, no
encoding or decoding), as the collectives' transport-only run.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import coccl
from coccl.algorithms.schedule_args import chunk_elems
from coccl.communicator.overlap import WireOnlyCodec
from coccl.communicator.sizing import p2p_chunk_bytes

from . import bounds, launch, timing
from .cli import command, datatype, parse_size
from .collective import (
    EXIT_USAGE,
    EXIT_WRONG,
    UsageError,
    _codecs,
    _select_device,
    add_codec_arguments,
    add_size_arguments,
    is_pair,
    rank_data,
    recorded_environment,
    sweep_sizes,
    validate_sizes,
)
from .table import human_size, provenance, write_json


@dataclass(frozen=True)
class ExchangeSpec:
    """What distinguishes one exchange sweep.

    Attributes:
        name: the subcommand.
        perf: the nccl-tests program it follows.
        blocks: the buffer is ``nranks`` equal blocks (all-to-all): counts are
            multiples of the rank count.
        bus_factor: ``busbw = algbw * bus_factor(nranks)`` (nccl-tests': sendrecv 1,
            alltoall (n-1)/n).
    """

    name: str
    perf: str
    blocks: bool
    bus_factor: Callable[[int], float]


SENDRECV = ExchangeSpec("sendrecv", "sendrecv_perf", False, lambda n: 1.0)
ALLTOALL = ExchangeSpec("alltoall", "alltoall_perf", True, lambda n: (n - 1) / n)


@dataclass
class ExchangeRow:
    """One (size, compressor) point; the JSON's row (bench/SCHEMA.md)."""

    size: int
    count: int
    type: str
    algorithm: str  # "native" (the transport's own exchange) or "coccl"
    compressor: str
    time_us: float
    algbw: float
    busbw: float
    time_us_iters: dict[str, float]
    time_us_ranks: dict[str, float]
    ratio: float | None
    rel_err: float | None
    rel_err_bound: float | None
    wrong: int | None
    native_time_us: float | None
    speedup: float | None
    overlap_efficiency: float | None = None
    overlap_times_us: dict[str, float] | None = None
    backend: str = ""


@dataclass
class Job:
    """What every point of one sweep shares."""

    spec: ExchangeSpec
    comm: Any  # coccl.Communicator
    mpi: Any  # mpi4py communicator
    xp: Any  # numpy or cupy
    sync: Callable[[], None]
    args: argparse.Namespace
    native: Any  # _MpiNative or _NcclNative
    codecs: dict[str, Any]
    rows: list[ExchangeRow] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return int(self.mpi.Get_rank())

    @property
    def nranks(self) -> int:
        return int(self.mpi.Get_size())

    def coccl_call(self, x: Any, out: Any, codec: Any, chunk_bytes: int | None) -> Callable:
        """One coccl exchange of ``x`` into ``out`` (ring send/recv, or all-to-all)."""
        comm, n, r = self.comm, self.nranks, self.rank
        if self.spec.blocks:
            return lambda: comm.alltoall(x, out, compressor=codec, chunk_bytes=chunk_bytes)
        ops = [("send", x, (r + 1) % n), ("recv", out, (r - 1) % n)]

        def call() -> None:
            for handle in comm.batch_p2p(ops, compressor=codec, chunk_bytes=chunk_bytes):
                handle.wait()

        return call

    def expected(self, count: int) -> np.ndarray:
        """What this rank must hold after one exchange (host array)."""
        dtype, n, r = self.args.datatype, self.nranks, self.rank
        if not self.spec.blocks:
            return rank_data((r - 1) % n, count, dtype)
        blk = count // n
        return np.concatenate(
            [rank_data(s, count, dtype)[r * blk : (r + 1) * blk] for s in range(n)]
        )

    def time(self, fn: Callable[[], Any], size: int) -> timing.TimeStats:
        """First call, warm-up, timed loops: the rank-combined time of one call of
        ``size`` bytes (``point_iters``)."""
        barrier = self.comm.barrier
        iters, warmup, _ = point_iters(self.args, size)
        timing.timed_call(fn, barrier, self.sync)
        for _ in range(warmup):
            fn()
        times = timing.time_calls(fn, iters, barrier, self.sync)
        return timing.summarize(self.mpi, times, timing.AVERAGES[self.args.average])


def point_iters(args: argparse.Namespace, size: int) -> tuple[int, int, int]:
    """(timed calls per loop, warm-up calls, overlap runs) of a point of ``size`` bytes:
    ``-n``, ``-w`` and ``--overlap-iters`` (default: ``-n`` within 3-5), scaled down
    where ``-n`` calls would move more than ``--iters-bytes`` (at least one timed call
    per loop, three overlap runs), so a sweep to 1 GiB ends in a bounded time."""
    iters, warmup = args.iters, args.warmup_iters
    overlap = args.overlap_iters or max(3, min(iters, 5))
    budget = args.iters_bytes
    if budget and size and iters * size > budget:
        scale = budget / (iters * size)
        iters = max(1, int(iters * scale))
        warmup = int(warmup * scale)
        overlap = max(3, min(overlap, int(overlap * scale)))
    return iters, warmup, overlap


# ------------------------------------------------------------------ native exchanges
class _MpiNative:
    """The MPI library's own exchange (device data through host copies)."""

    def __init__(self, mpi: Any) -> None:
        self.mpi = mpi

    def call(self, x: Any, out: Any, blocks: bool) -> Callable[[], None]:
        from mpi4py import MPI  # noqa: PLC0415

        n, r = self.mpi.Get_size(), self.mpi.Get_rank()
        device = hasattr(x, "get")

        def run() -> None:
            send = x.get() if device else x
            recv = np.empty(out.shape, out.dtype) if device else out
            s, d = [send.view(np.uint8), MPI.BYTE], [recv.view(np.uint8), MPI.BYTE]
            if blocks:
                self.mpi.Alltoall(s, d)
            else:
                self.mpi.Sendrecv(s, (r + 1) % n, 7, d, (r - 1) % n, 7)
            if device:
                out.set(recv)

        return run

    def close(self) -> None:
        pass


class _NcclNative:
    """NCCL's own point-to-point on a communicator of the bench's own: one group of
    ``ncclSend``/``ncclRecv`` (all-to-all: to and from every rank, as nccl-tests)."""

    def __init__(self, mpi: Any) -> None:
        from cupy.cuda import nccl  # noqa: PLC0415

        self.nccl = nccl
        uid = mpi.bcast(nccl.get_unique_id() if mpi.Get_rank() == 0 else None, root=0)
        self.n, self.r = mpi.Get_size(), mpi.Get_rank()
        self.comm = nccl.NcclCommunicator(self.n, uid, self.r)

    def call(self, x: Any, out: Any, blocks: bool) -> Callable[[], None]:
        import cupy as cp  # noqa: PLC0415

        nccl, n, r = self.nccl, self.n, self.r
        xs, os_ = x.view(cp.uint8), out.view(cp.uint8)
        if blocks:
            blk = xs.size // n
            pairs = [
                (p, xs[p * blk : (p + 1) * blk], os_[p * blk : (p + 1) * blk]) for p in range(n)
            ]
        else:
            pairs = [((r + 1) % n, xs, None), ((r - 1) % n, None, os_)]

        def run() -> None:
            stream = cp.cuda.get_current_stream().ptr
            nccl.groupStart()
            for peer, send, recv in pairs:
                if send is not None and send.size:
                    self.comm.send(send.data.ptr, send.size, nccl.NCCL_UINT8, peer, stream)
                if recv is not None and recv.size:
                    self.comm.recv(recv.data.ptr, recv.size, nccl.NCCL_UINT8, peer, stream)
            nccl.groupEnd()

        return run

    def close(self) -> None:
        self.comm.destroy()


# ------------------------------------------------------------------------- a point
def measure_size(job: Job, count: int) -> list[ExchangeRow]:
    """The native row and one row per compressor at ``count`` elements per rank."""
    dtype, xp = job.args.datatype, job.xp
    x = xp.asarray(rank_data(job.rank, count, dtype))
    out = xp.empty(count, dtype=dtype)
    expected = job.expected(count) if job.args.check else None
    size = count * dtype.itemsize
    native = job.time(job.native.call(x, out, job.spec.blocks), size)
    rows = [
        _row(
            job, count, "native", "identity", native, native, 1.0, _check(job, out, expected, None)
        )
    ]
    for name, codec in job.codecs.items():
        if name == "identity" and name not in job.args.compressor:
            continue
        call = job.coccl_call(x, out, codec, job.args.chunk_bytes)
        job.comm.reset_stats()
        stats = job.time(call, size)
        job.comm.reset_stats()
        call()
        job.sync()
        sent = job.mpi.allreduce(job.comm.stats()["bytes_sent"])
        # identity's wire bytes: each rank's whole message (sendrecv), or the blocks
        # for the other ranks (all-to-all: a rank's own block stays on the rank)
        wire = size * job.nranks * job.spec.bus_factor(job.nranks)
        ratio = sent / wire if wire else None
        checked = _check(job, out, expected, codec)
        row = _row(job, count, "coccl", name, stats, native, ratio, checked)
        if job.args.overlap_min and size >= job.args.overlap_min and not codec.lossless:
            if not job.spec.blocks:
                _overlap(job, row, x, out, codec, call)
        rows.append(row)
    return rows


def _row(
    job: Job,
    count: int,
    algorithm: str,
    name: str,
    stats: timing.TimeStats,
    native: timing.TimeStats,
    ratio: float | None,
    checked: tuple[float | None, float | None, int | None],
) -> ExchangeRow:
    size = count * job.args.datatype.itemsize
    algbw = size / stats.time / 1e9 if stats.time > 0 else math.inf

    def us(values: dict[str, float]) -> dict[str, float]:
        return {k: v * 1e6 for k, v in values.items()}

    return ExchangeRow(
        size=size, count=count, type=job.args.datatype.name, algorithm=algorithm,
        compressor=name, time_us=stats.time * 1e6, algbw=algbw,
        busbw=algbw * job.spec.bus_factor(job.nranks), time_us_iters=us(stats.iters),
        time_us_ranks=us(stats.ranks), ratio=ratio, rel_err=checked[0],
        rel_err_bound=checked[1], wrong=checked[2], native_time_us=native.time * 1e6,
        speedup=native.time / stats.time if stats.time > 0 else None,
        backend=job.comm.backend,
    )  # fmt: skip


def _check(
    job: Job, out: Any, expected: np.ndarray | None, codec: Any
) -> tuple[float | None, float | None, int | None]:
    """(worst rel_err over ranks, bound, wrong outputs over ranks); Nones without -c.
    The native exchange and identity must deliver the bytes sent; a lossy codec within
    its roundtrip bound (every chunk is one roundtrip)."""
    if expected is None:
        return None, None, None
    got = out.get() if hasattr(out, "get") else np.asarray(out)
    ref = expected.astype(np.float64)
    norm = float(np.linalg.norm(ref))
    diff = float(np.linalg.norm(got.astype(np.float64) - ref))
    err = diff / norm if norm > 0 else diff
    if codec is None or codec.lossless:
        bound = 0.0
        bad = int(got.view(np.uint8).tobytes() != expected.view(np.uint8).tobytes())
    else:
        bound = bounds.roundtrip_bound(codec, job.args.datatype)
        bad = int(not err <= bound)  # NaN: wrong
    errors = job.mpi.allgather(err)
    worst = math.nan if any(math.isnan(e) for e in errors) else max(errors)
    return worst, bound, int(job.mpi.allreduce(bad))


def _overlap(job: Job, row: ExchangeRow, x: Any, out: Any, codec: Any, pipelined: Callable) -> None:
    """``row``'s overlap efficiency (the module docstring says how the halves run)."""
    dtype = job.args.datatype
    chunk = job.args.chunk_bytes
    if chunk is None:  # the message's own default chunk (both ends cut it alike)
        settings = coccl.config.settings()
        chunk = p2p_chunk_bytes(
            "nccl" if isinstance(job.native, _NcclNative) else "mpi",
            settings_chunk=settings.chunk_bytes,
            chunk_set=settings.chunk_bytes_set,
            compressed=not codec.lossless,
            itemsize=dtype.itemsize,
            count=x.size,
        )
    elems = chunk_elems(chunk, dtype.itemsize, codec.alignment)
    spans = [(a, min(a + elems, x.size)) for a in range(0, x.size, elems)]
    payloads = [job.xp.empty(codec.encoded_nbytes(b - a, dtype), dtype=np.uint8) for a, b in spans]

    def codec_only() -> None:
        for (a, b), payload in zip(spans, payloads, strict=True):
            codec.encode_into(x[a:b], payload, dtype)
        for (a, b), payload in zip(spans, payloads, strict=True):
            codec.decode_into(payload, out[a:b], dtype, False)

    transport_only = job.coccl_call(x, out, WireOnlyCodec(codec), job.args.chunk_bytes)

    runs = {"pipelined": pipelined, "codec_only": codec_only, "transport_only": transport_only}
    samples: dict[str, list[float]] = {k: [] for k in runs}
    iters = point_iters(job.args, x.size * dtype.itemsize)[2]
    for i in range(iters + 1):  # the first round warms up
        for name, fn in runs.items():
            job.sync()
            job.comm.barrier()
            start = time.perf_counter()
            fn()
            job.sync()
            if i:
                samples[name].append(time.perf_counter() - start)
    medians = [statistics.median(samples[k]) for k in runs]
    per_rank = job.mpi.allgather(medians)
    times = {k: max(m[i] for m in per_rank) for i, k in enumerate(runs)}
    row.overlap_efficiency = max(times["codec_only"], times["transport_only"]) / times["pipelined"]
    row.overlap_times_us = {k: round(v * 1e6, 1) for k, v in times.items()}


# ---------------------------------------------------------------------- the command
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """nccl-tests' flags that apply to an exchange, then coccl's."""
    add = parser.add_argument
    add_size_arguments(add)
    # fmt: off
    add("-c", "--check", type=int, choices=(0, 1), default=1,
        help="1: check every output against what was sent (identity bitwise, a lossy "
             "codec within its roundtrip bound; exit status 1 if any is wrong)")
    add("-d", "--datatype", type=datatype, default=np.dtype(np.float32),
        help="the element type (float32, bfloat16, float16, float64, ...)")
    add("--backend", choices=("auto", "mpi", "nccl"), default="auto",
        help="coccl.init's backend: the transport of device data")
    add("--iters-bytes", type=parse_size, default=0,
        help="at sizes where -n calls would move more than this, fewer timed, warm-up "
             "and overlap calls, as many as fit (at least 1 per timed loop, 3 overlap "
             "runs); 0: always -n")
    # fmt: on
    add_codec_arguments(add, "identity,tah:row=4096,taco")


def validate(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags taken together, if anything."""
    pairs = [name for name in args.compressor if is_pair(name)]
    if pairs:
        return f"--compressor {','.join(pairs)}: a codec pair is for the hierarchical reductions"
    return validate_sizes(args)


def run(spec: ExchangeSpec, args: argparse.Namespace) -> int:
    """The sweep on every rank; rank 0 prints the table and writes the JSON."""
    from mpi4py import MPI  # noqa: PLC0415

    mpi = MPI.COMM_WORLD
    comm = native = None
    try:
        xp, sync, device = _select_device(mpi, args.device)
        comm = coccl.init(mpi, backend=args.backend)
        codecs = _codecs(args.compressor)
        for codec in codecs.values():
            codec.check_dtype(args.datatype)  # TypeError: the codec takes no such type
        use_nccl = comm.backend == "nccl" and args.device == "gpu"
        native = _NcclNative(mpi) if use_nccl else _MpiNative(mpi)
    except (UsageError, TypeError, ValueError, coccl.CocclError) as exc:
        if mpi.Get_rank() == 0:
            print(f"coccl-bench: error: {exc}", file=sys.stderr, flush=True)
        if comm is not None:
            comm.close()
        return EXIT_USAGE
    job = Job(spec, comm, mpi, xp, sync, args, native, codecs)
    try:
        meta = _metadata(job, device)
        _sweep(job, meta)
    finally:
        native.close()
        comm.close()
    if job.rank == 0 and args.json:
        write_json(args.json, meta, job.rows)  # type: ignore[arg-type]  # any dataclass rows
        print(f"# JSON written to {args.json}", flush=True)
    return EXIT_WRONG if any(row.wrong for row in job.rows) else 0


_HEADER = (
    f"{'size':>12} {'count':>11} {'type':>8} {'algorithm':>9} {'compressor':>16} "
    f"{'time_us':>10} {'algbw':>8} {'busbw':>8} {'speedup':>7} {'ratio':>6} "
    f"{'rel_err':>9} {'#wrong':>6} {'overlap':>7}"
)


def _line(row: ExchangeRow) -> str:
    def num(value: float | None, spec: str, width: int) -> str:
        return f"{'-':>{width}}" if value is None else f"{value:{width}{spec}}"

    return (
        f"{row.size:>12} {row.count:>11} {row.type:>8} {row.algorithm:>9} "
        f"{row.compressor[:16]:>16} {row.time_us:>10.1f} {row.algbw:>8.2f} {row.busbw:>8.2f} "
        f"{num(row.speedup, '.2f', 7)} {num(row.ratio, '.3f', 6)} {num(row.rel_err, '.2e', 9)} "
        f"{num(row.wrong, 'd', 6)} {num(row.overlap_efficiency, '.2f', 7)}"
    )


def _sweep(job: Job, meta: dict[str, Any]) -> None:
    args, rank0 = job.args, job.rank == 0
    say = (lambda text: print(text, flush=True)) if rank0 else (lambda text: None)
    say(
        f"# coccl-bench {job.spec.name}: nranks {job.nranks}, backend {job.comm.backend}, "
        f"device {args.device}, datatype {args.datatype.name}, native: {meta['native']}"
    )
    say(f"# command: {meta['command']}")
    say(f"# commit {meta['commit']}, {meta['date']}")
    unit = job.nranks if job.spec.blocks else 1
    counts: list[int] = []
    for size in sweep_sizes(args.minbytes, args.maxbytes, args.stepfactor):
        count = size // args.datatype.itemsize // unit * unit
        if count and count not in counts:
            counts.append(count)
    say(_HEADER)
    for count in counts:
        if rank0 and not args.no_progress:
            print(
                f"# {human_size(count * args.datatype.itemsize)} ...", file=sys.stderr, flush=True
            )
        for row in measure_size(job, count):
            job.rows.append(row)
            say(_line(row))
    wrong = sum(row.wrong or 0 for row in job.rows)
    if args.check:
        say(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")


def _metadata(job: Job, device: dict[str, Any]) -> dict[str, Any]:
    """The JSON record's header (a collective call; only rank 0's is complete)."""
    from mpi4py import MPI  # noqa: PLC0415

    args = job.args
    command_line, launcher = launch.invocation(args.argv)
    return {
        "collective": job.spec.name,
        "nranks": job.nranks,
        "backend": job.comm.backend,
        "device": args.device,
        "command": command_line,
        "launcher": launcher,
        **provenance(coccl.__file__),
        "gpu": device["gpu"],
        "datatype": args.datatype.name,
        "iters": args.iters,
        "iters_bytes": args.iters_bytes,
        "warmup_iters": args.warmup_iters,
        "check": int(args.check),
        "average": timing.AVERAGES[args.average],
        "chunk_bytes": args.chunk_bytes,
        "bus_factor": job.spec.bus_factor(job.nranks),
        "native": "nccl" if isinstance(job.native, _NcclNative) else "mpi",
        "pattern": "ring: send to rank + 1, receive from rank - 1"
        if not job.spec.blocks
        else "all-to-all, equal splits",
        "compressors": {name: job.codecs[name].get_config() for name in args.compressor},
        "coccl_version": coccl.__version__,
        "mpi_library": MPI.Get_library_version().splitlines()[0].strip(),
        "environment": recorded_environment(os.environ),
    }


def _register(spec: ExchangeSpec) -> None:
    @command(
        spec.name,
        help=f"{spec.name} sweep (as nccl-tests' {spec.perf}), beside the transport's own",
        arguments=add_arguments,
        validate=validate,
    )
    def sweep(args: argparse.Namespace) -> int:
        return run(spec, args)


_register(SENDRECV)
_register(ALLTOALL)

__all__ = ["ALLTOALL", "SENDRECV", "ExchangeRow", "ExchangeSpec", "run"]
