"""The collective sweeps: ``coccl-bench allreduce | reduce_scatter | allgather``.

At each message size, the native baseline and every (algorithm, compressor) asked for run
on the same rank-seeded data: one first call (bytes on the wire), the warm-up calls, then
``iters`` timed calls out of place and ``iters`` in place, as nccl-tests does; then the
check: each rank compares its two outputs with an exact float64 reduction that it
computes itself from every rank's data (as mpi4py's tests do), against the error bound
of what ran (``coccl.bench.bounds``). An output beyond its bound counts in ``#wrong``,
and a sweep with any exits with status 1. A collective is a small ``Spec`` (counts,
bus-bandwidth factor, the call); data, buffers and the sweep are the same code for all
three.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

import coccl
from coccl.algorithms import ALGORITHMS
from coccl.compressors import Compressor

from . import bounds, launch, timing
from .cases import Case, NothingToRun, make_cases, skip_notes
from .cli import DTYPES, comma_list, command, datatype, parse_size, positive_int
from .codec import _split_specs, codec_specs
from .table import (
    MAX_WIDTH,
    Layout,
    Progress,
    Row,
    TablePlan,
    auto_notes,
    format_summary,
    human_size,
    layout,
    provenance,
    write_json,
)

OPS = ("sum", "avg", "max", "min", "prod")
ALL = "all"  # -d all, -o all: every datatype, every op
SEED = 20240917  # of the rank-seeded input data
EXIT_USAGE = 2  # as argparse: the request itself cannot run
EXIT_WRONG = 1  # some output erred beyond its bound (nccl-tests fails such a run too)


class UsageError(Exception):
    """A request that every rank refuses alike (unknown compressor, unsupported dtype...)."""


# --------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class Spec:
    """What distinguishes one collective (nccl-tests' per-collective struct).

    ``count`` is the elements of the buffer nccl-tests' size counts (AllReduce: each
    rank's; ReduceScatter: each rank's input; AllGather: each rank's output), so
    ``size = count * itemsize`` and ``algbw = size / time`` for all three (the JSON's
    count; the table prints nccl-tests' count, per rank where ``sharded``).

    Attributes:
        name: the ``Communicator`` method and the subcommand.
        reduces: takes an op (AllGather does not).
        sharded: counts must be multiples of the rank count (each rank owns count/n).
        bus_factor: ``busbw = algbw * bus_factor(nranks)``.
    """

    name: str
    reduces: bool
    sharded: bool
    bus_factor: Callable[[int], float]

    def call(self, comm: Any, x: Any, out: Any, op: str, **options: Any) -> Any:
        """Run the collective (``options``: algorithm, compressor, chunk_bytes)."""
        if self.reduces:
            return getattr(comm, self.name)(x, out, op=op, **options)
        return getattr(comm, self.name)(x, out, **options)


ALLREDUCE = Spec("allreduce", reduces=True, sharded=False, bus_factor=lambda n: 2 * (n - 1) / n)
REDUCE_SCATTER = Spec(
    "reduce_scatter", reduces=True, sharded=True, bus_factor=lambda n: (n - 1) / n
)
ALLGATHER = Spec("allgather", reduces=False, sharded=True, bus_factor=lambda n: (n - 1) / n)


def sweep_sizes(minbytes: int, maxbytes: int, factor: int) -> list[int]:
    """``minbytes``, ``minbytes * factor``, ... up to ``maxbytes`` (nccl-tests' -b -e -f)."""
    sizes, size = [], minbytes
    while size <= maxbytes:
        sizes.append(size)
        if factor < 2 or size < 1:
            break
        size *= factor
    return sizes


def sweep_counts(
    spec: Spec, sizes: list[int], itemsize: int, nranks: int
) -> tuple[list[int], list[int]]:
    """The element counts of ``sizes``, rounded down to valid counts (multiples of the
    rank count for ReduceScatter/AllGather) without repeats; and the sizes skipped
    because they hold less than one element (per rank)."""
    unit = nranks if spec.sharded else 1
    counts: list[int] = []
    skipped: list[int] = []
    for size in sizes:
        count = size // itemsize // unit * unit
        if count == 0:
            skipped.append(size)
        elif count not in counts:
            counts.append(count)
    return counts, skipped


# ---------------------------------------------------------------------------- data
def rank_data(rank: int, count: int, dtype: np.dtype) -> np.ndarray:
    """Rank ``rank``'s input of ``count`` elements, the same on every rank that makes it.

    Floats are standard normal; integers small (-2..2, unsigned 0..2), so that sums and
    products over many ranks stay exact in the type.
    """
    rng = np.random.default_rng([SEED, rank, count])
    if dtype.kind in "iu":
        return rng.integers(0 if dtype.kind == "u" else -2, 3, size=count, dtype=dtype)
    draw = np.float64 if dtype == np.float64 else np.float32
    return rng.standard_normal(count, dtype=draw).astype(dtype)


def exact_reduction(
    parts: Iterable[np.ndarray], op: str, dtype: np.dtype, nranks: int
) -> np.ndarray:
    """``op`` over ``parts`` in float64 (int64 for integers, then wrapped to ``dtype``
    as MPI and NCCL wrap; ``avg`` of integers truncates toward zero, as ncclAvg does).
    ``parts`` may be a generator: one part is held at a time."""
    acc_type = np.int64 if dtype.kind in "iu" else np.float64
    acc: np.ndarray | None = None
    for part in parts:
        values = part.astype(acc_type)
        if acc is None:
            acc = values
        elif op in ("sum", "avg"):
            acc += values
        elif op == "max":
            np.maximum(acc, values, out=acc)
        elif op == "min":
            np.minimum(acc, values, out=acc)
        else:
            acc *= values
    if acc is None:
        raise ValueError("exact_reduction needs at least one part")
    if op == "avg" and acc_type is np.float64:
        acc /= nranks
    elif op == "avg":
        acc = np.sign(acc) * (np.abs(acc) // nranks)
    return acc.astype(dtype).astype(np.float64) if acc_type is np.int64 else acc


@dataclass
class Buffers:
    """One rank's buffers at one size.

    Attributes:
        x: this rank's input (never written).
        out: the out-of-place output.
        ip_in, ip_out: the in-place input and output, laid out as in nccl-tests (one
            buffer; ReduceScatter's output and AllGather's input at this rank's offset).
        ref: the exact expected output of this rank (float64), or None (no check).
        ref_norms: what the error bound needs of ``ref`` (None without a check).
    """

    x: Any
    out: Any
    ip_in: Any
    ip_out: Any
    ref: np.ndarray | None
    ref_norms: bounds.Reference | None

    def restore(self) -> None:
        """Put ``x`` back into ``ip_in`` (an in-place call overwrote it)."""
        self.ip_in[...] = self.x


def reference(
    spec: Spec, count: int, dtype: np.dtype, op: str, rank: int, nranks: int
) -> tuple[np.ndarray, bounds.Reference]:
    """This rank's exact expected output (float64), computed from every rank's input one
    rank at a time, and its norm and contributions' energy for the error bound."""
    shard = count // nranks
    if spec.name == "allgather":
        ref = np.concatenate([rank_data(r, shard, dtype) for r in range(nranks)])
        ref = ref.astype(np.float64)
        norm = float(np.linalg.norm(ref))
        return ref, bounds.Reference(norm=norm, energy=norm)
    window = slice(rank * shard, (rank + 1) * shard) if spec.sharded else slice(None)
    energy2 = 0.0

    def parts() -> Iterator[np.ndarray]:  # one rank's input at a time, not n of them
        nonlocal energy2
        for r in range(nranks):
            part = rank_data(r, count, dtype)[window]
            energy2 += float(np.sum(np.square(part, dtype=np.float64)))
            yield part

    ref = exact_reduction(parts(), op, dtype, nranks)
    norm = float(np.linalg.norm(ref))
    return ref, bounds.Reference(norm=norm, energy=math.sqrt(energy2))


def make_buffers(
    spec: Spec, count: int, dtype: np.dtype, op: str, rank: int, nranks: int, xp: Any, check: bool
) -> Buffers:
    """This rank's input (and, with ``check``, the reference computed from every rank's
    input) and the out-of-place and in-place buffers, on ``xp``'s device."""
    shard = count // nranks
    n_in = shard if spec.name == "allgather" else count
    ref, norms = reference(spec, count, dtype, op, rank, nranks) if check else (None, None)
    x = xp.asarray(rank_data(rank, n_in, dtype))
    if spec.name == "allreduce":
        out, work = xp.empty_like(x), xp.empty_like(x)
        return Buffers(x, out, work, work, ref, norms)
    if spec.name == "reduce_scatter":
        out, work = xp.empty(shard, dtype=x.dtype), xp.empty_like(x)
        return Buffers(x, out, work, work[rank * shard : (rank + 1) * shard], ref, norms)
    out, work = xp.empty(count, dtype=x.dtype), xp.empty(count, dtype=x.dtype)
    return Buffers(x, out, work[rank * shard : (rank + 1) * shard], work, ref, norms)


def rel_error(y: Any, ref: np.ndarray) -> float:
    """``||y - ref|| / ||ref||`` in float64 (``||y - ref||`` when ``ref`` is all zero)."""
    host = y.get() if hasattr(y, "get") else np.asarray(y)
    diff = float(np.linalg.norm(host.astype(np.float64) - ref))
    norm = float(np.linalg.norm(ref))
    return diff / norm if norm > 0 else diff


def ran_algorithm(m: Measurement) -> str:
    """The algorithm a measurement ran (what ``auto`` resolved to)."""
    return str(m.ran["algorithm"])


def worst(errors: list[float | None]) -> float | None:
    """The worst error: NaN if any is NaN (``max`` would drop it), None if none."""
    present = [e for e in errors if e is not None]
    if any(math.isnan(e) for e in present):
        return math.nan
    return max(present, default=None)


# ------------------------------------------------------------------------ measuring
@dataclass
class Measurement:
    """One (algorithm, compressor) at one size, combined over ranks.

    Attributes:
        time, time_inplace: the timed calls, summarised over iterations and ranks.
        bytes_sent: payload bytes all ranks sent in one out-of-place call.
        rel_err: the worst error of any rank, out of place or in place (None: no check).
        rel_err_bound: the tightest error bound of any rank (None: no check).
        wrong: outputs (two per rank) beyond their rank's bound (None: no check).
        peak_staging_bytes: the largest peak pool memory of any rank.
        ran: what the call ran (``Communicator.describe``).
    """

    time: timing.TimeStats
    time_inplace: timing.TimeStats
    bytes_sent: int
    rel_err: float | None
    rel_err_bound: float | None
    wrong: int | None
    peak_staging_bytes: int
    ran: dict[str, Any]


@dataclass
class Sweep:
    """What every measurement of one run shares."""

    spec: Spec
    comm: Any  # coccl.Communicator
    mpi: Any  # mpi4py communicator, to combine figures over ranks
    xp: Any  # numpy or cupy
    dtype: np.dtype
    op: str
    iters: int
    warmup: int
    check: bool
    chunk_bytes: int | None
    sync: Callable[[], None]
    average: str = timing.AVERAGES[timing.DEFAULT_AVERAGE]  # how ranks' times combine
    overlap_min: int = 0  # measure overlap efficiency from this size on (0: never)
    overlap_iters: int | None = None  # timed runs of each half (None: from iters, 3-5)

    def caller(self, algorithm: str, codec: Any, x: Any, out: Any) -> Callable[[], Any]:
        """A no-argument function that runs the collective once on ``x`` into ``out``."""

        def call() -> Any:
            return self.spec.call(
                self.comm,
                x,
                out,
                self.op,
                algorithm=algorithm,
                compressor=codec,
                chunk_bytes=self.chunk_bytes,
            )

        return call

    def describe(self, bufs: Buffers, algorithm: str, codec: Compressor) -> dict[str, Any]:
        """What a call on ``bufs`` runs (``Communicator.describe``: ``auto`` resolved, the
        chunk size, the route...), moving no byte."""
        options = {"op": self.op} if self.spec.reduces else {}
        ran = self.comm.describe(
            self.spec.name,
            bufs.x,
            bufs.out,
            algorithm=algorithm,
            compressor=codec,
            chunk_bytes=self.chunk_bytes,
            **options,
        )
        return dict(ran)

    def measure(self, bufs: Buffers, algorithm: str, codec: Compressor) -> Measurement:
        """A first call, the warm-up, timed loops of out-of-place and in-place calls, then
        the check of the outputs (as nccl-tests: the check's host work comes after the
        timing, so no timed call follows it; on the H200 the calls right after it ran up
        to 2.5x as slow, bench/NOTES.md)."""
        from mpi4py import MPI  # noqa: PLC0415

        oop = self.caller(algorithm, codec, bufs.x, bufs.out)
        inplace = self.caller(algorithm, codec, bufs.ip_in, bufs.ip_out)
        barrier = self.comm.barrier
        self.comm.reset_stats()
        timing.timed_call(oop, barrier, self.sync)  # also absorbs one-time costs (JIT)
        sent = self.comm.stats()["bytes_sent"]
        for _ in range(self.warmup):
            oop()
        times = timing.time_calls(oop, self.iters, barrier, self.sync)
        bufs.restore()
        timing.timed_call(inplace, barrier, self.sync)
        times_ip = timing.time_calls(inplace, self.iters, barrier, self.sync, bufs.restore)
        # The checked in-place output is one call's (in a timed loop each call reduced the
        # last one's result); ``out`` holds the last out-of-place call's.
        bufs.restore()
        inplace()
        self.sync()
        # After the calls, so that it tells what the cached plan holds (a CUDA graph...).
        ran = self.describe(bufs, algorithm, codec)
        rel_err = bound = wrong = None
        if bufs.ref is not None and bufs.ref_norms is not None:
            errors = [rel_error(bufs.out, bufs.ref), rel_error(bufs.ip_out, bufs.ref)]
            local_bound = bounds.rel_error_bound(
                self.spec.name,
                ran["algorithm"],
                bound_codec(ran),
                self.op,
                self.dtype,
                self.mpi.Get_size(),
                bufs.ref_norms,
                ran.get("quantizations"),
            )
            local_wrong = sum(not error <= local_bound for error in errors)  # NaN: wrong
            rel_err = worst(self.mpi.allgather(worst(errors)))
            bound = float(self.mpi.allreduce(local_bound, op=MPI.MIN))
            wrong = int(self.mpi.allreduce(local_wrong, op=MPI.SUM))
        stats = self.comm.stats()
        peak = sum(stats[f"peak_{kind}_bytes"] for kind in ("host", "pinned", "device"))
        return Measurement(
            time=timing.summarize(self.mpi, times, self.average),
            time_inplace=timing.summarize(self.mpi, times_ip, self.average),
            bytes_sent=int(self.mpi.allreduce(sent, op=MPI.SUM)),
            rel_err=rel_err,
            rel_err_bound=bound,
            wrong=wrong,
            peak_staging_bytes=int(self.mpi.allreduce(peak, op=MPI.MAX)),
            ran=ran,
        )

    def bytes_sent_once(self, bufs: Buffers, algorithm: str, codec: Any) -> int:
        """Payload bytes all ranks send in one out-of-place call."""
        from mpi4py import MPI  # noqa: PLC0415

        self.comm.reset_stats()
        self.caller(algorithm, codec, bufs.x, bufs.out)()
        self.sync()
        return int(self.mpi.allreduce(self.comm.stats()["bytes_sent"], op=MPI.SUM))

    def row(
        self,
        count: int,
        algorithm: str,
        compressor: str,
        m: Measurement,
        native: Measurement | None,
        identity_bytes: int | None,
    ) -> Row:
        """The table row of a measurement (sizes, bandwidths, ratio, speedup);
        ``identity_bytes``: what identity sends with the algorithm that ran."""
        size = count * self.dtype.itemsize
        factor = self.spec.bus_factor(self.mpi.Get_size())
        algbw, algbw_ip = size / m.time.time / 1e9, size / m.time_inplace.time / 1e9
        if ran_algorithm(m) == "native":
            ratio: float | None = 1.0
        else:  # None when nothing went on the wire (one rank)
            ratio = m.bytes_sent / identity_bytes if identity_bytes else None

        def us(values: dict[str, float]) -> dict[str, float]:
            return {name: seconds * 1e6 for name, seconds in values.items()}

        return Row(
            size=size,
            count=count,
            type=self.dtype.name,
            redop=self.op if self.spec.reduces else "none",
            algorithm=algorithm,
            compressor=compressor,
            time_us=m.time.time * 1e6,
            algbw=algbw,
            busbw=algbw * factor,
            time_us_inplace=m.time_inplace.time * 1e6,
            algbw_inplace=algbw_ip,
            busbw_inplace=algbw_ip * factor,
            time_us_iters=us(m.time.iters),
            time_us_iters_inplace=us(m.time_inplace.iters),
            time_us_ranks=us(m.time.ranks),
            time_us_ranks_inplace=us(m.time_inplace.ranks),
            ratio=ratio,
            rel_err=m.rel_err,
            rel_err_bound=m.rel_err_bound,
            wrong=m.wrong,
            native_time_us=None if native is None else native.time.time * 1e6,
            speedup=None if native is None else native.time.time / m.time.time,
            peak_staging_bytes=m.peak_staging_bytes,
            ran=m.ran,
        )

    def run_size(
        self,
        count: int,
        variants: list[tuple[str, str]],
        codecs: dict[str, Any],
        native_ok: bool,
        progress: Callable[[str], None],
    ) -> list[Row]:
        """Measure the native baseline and every variant at ``count`` elements."""
        rank, nranks = self.mpi.Get_rank(), self.mpi.Get_size()
        bufs = make_buffers(
            self.spec, count, self.dtype, self.op, rank, nranks, self.xp, self.check
        )
        identity = codecs["identity"]
        progress("native")
        native = self.measure(bufs, "native", identity) if native_ok else None
        measured: dict[tuple[str, str], Measurement] = {}
        for algorithm, name in variants:
            progress(f"{algorithm}/{name}")
            if algorithm == "native" and native is not None:
                measured[algorithm, name] = native
            else:
                measured[algorithm, name] = self.measure(bufs, algorithm, codecs[name])
        identity_bytes: dict[str, int] = {}  # ring/two_shot -> what identity sends

        def sent_by_identity(algorithm: str) -> int:
            if algorithm not in identity_bytes:
                m = measured.get((algorithm, "identity"))
                identity_bytes[algorithm] = (
                    m.bytes_sent if m else self.bytes_sent_once(bufs, algorithm, identity)
                )
            return identity_bytes[algorithm]

        rows = []
        if native is not None and ("native", "identity") not in measured:
            # the baseline the speedups are over, shown as a row of its own
            rows.append(self.row(count, "native", "identity", native, native, None))
        for (alg, name), m in measured.items():
            ran = ran_algorithm(m)
            sent = None if ran == "native" else sent_by_identity(ran)
            rows.append(self.row(count, alg, name, m, native, sent))
        if self.overlap_min and count * self.dtype.itemsize >= self.overlap_min:
            for row in rows:
                algorithm, codec_id = row.ran_label.split("/")
                if algorithm in ("ring", "two_shot") and codec_id != "identity":
                    progress(f"overlap {row.algorithm}/{row.compressor}")
                    profile = self.overlap(bufs, algorithm, codecs[row.compressor])
                    row.overlap_efficiency = profile["overlap_efficiency"]
                    row.overlap_times_us = {
                        name: round(profile[f"{name}_s"] * 1e6, 1)
                        for name in ("pipelined", "codec_only", "transport_only")
                    }
        return rows

    def overlap(self, bufs: Buffers, algorithm: str, codec: Any) -> dict[str, float]:
        """The pipelined call's overlap profile (see Communicator.overlap_profile)."""
        profile = self.comm.overlap_profile(
            self.spec.name,
            bufs.x,
            algorithm=algorithm,
            compressor=codec,
            chunk_bytes=self.chunk_bytes,
            iters=self.overlap_iters or max(3, min(self.iters, 5)),
            op=self.op,
        )
        return {k: float(v) for k, v in profile.items()}


# ---------------------------------------------------------------------- the commands
def datatype_list(text: str) -> list[np.dtype]:
    """argparse type: ``-d float32,bfloat16`` -> dtypes; ``all``: every one coccl takes."""
    names = DTYPES if text.strip() == ALL else comma_list(text)
    return list(dict.fromkeys(datatype(name) for name in names))


def op_list(text: str) -> list[str]:
    """argparse type: ``-o sum,max`` -> ops; ``all``: every one (``OPS``)."""
    ops = list(OPS) if text.strip() == ALL else comma_list(text)
    unknown = [op for op in ops if op not in OPS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"invalid op {','.join(unknown)!r}: choose from {', '.join(OPS)} or all"
        )
    return ops


def add_size_arguments(add: Callable[..., Any]) -> None:
    """nccl-tests' size and timing flags, shared by every sweep (collectives, exchanges)."""
    # fmt: off
    # Unlike nccl-tests (one size, 32M), the default is a first sweep: 1K to 16M, x4.
    add("-b", "--minbytes", type=parse_size, default="1K",
        help="smallest size in bytes (each rank's buffer), K/M/G suffixes are binary")
    add("-e", "--maxbytes", type=parse_size, default="16M", help="largest size in bytes")
    add("-f", "--stepfactor", type=positive_int, default=4,
        help="size multiplier from one step to the next")
    add("-n", "--iters", type=positive_int, default=20, help="timed calls per size")
    add("-w", "--warmup_iters", type=int, default=5, help="warm-up calls per size")
    add("-a", "--average", type=int, choices=tuple(timing.AVERAGES),
        default=timing.DEFAULT_AVERAGE,
        help="how the ranks' median times combine into a row's: 0 rank 0, 1 average, "
             "2 minimum, 3 maximum (nccl-tests' default is 1; a call is as fast as "
             "its slowest rank)")
    # fmt: on


def add_codec_arguments(add: Callable[..., Any], example: str) -> None:
    """coccl's flags shared by every sweep: codecs, chunking, device, output, overlap."""
    # fmt: off
    add("--compressor", type=compressor_labels, default=["identity"],
        help=f"comma-separated compressors to compare, each name or name:key=value,... "
             f"e.g. {example}")
    add("--chunk-bytes", type=parse_size, default=None,
        help="pipeline chunk size (default: COCCL_CHUNK_BYTES, or coccl's choice)")
    add("--device", choices=("cpu", "gpu"), default="cpu",
        help="cpu: numpy buffers; gpu: CuPy buffers on GPU (local rank %% GPUs)")
    add("--json", metavar="PATH", help="write the results as JSON (bench/SCHEMA.md)")
    add("--no-progress", action="store_true", help="no progress line on the terminal")
    add("--overlap-min", type=parse_size, default=0,
        help="from this size on, also measure each compressed row's overlap "
             "efficiency: max(codec-only, transport-only) / pipelined time (default: 0, off)")
    add("--overlap-iters", type=positive_int, default=None,
        help="timed runs of each of the three (median taken; default: -n, within 3-5)")
    # fmt: on


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """nccl-tests' flags, then coccl's. ``--help`` adds each default (cli.py)."""
    add = parser.add_argument
    add_size_arguments(add)
    # fmt: off
    add("-c", "--check", type=int, choices=(0, 1), default=1,
        help="1: check every output against an exact float64 reduction and the error "
             "bound of what ran (rel_err, #wrong; exit status 1 if any is wrong)")
    add("-d", "--datatype", type=datatype_list, default=[np.dtype(np.float32)],
        help="float32 (float), float16 (half), bfloat16, float64 (double), int8, ..., "
             "uint64; comma-separated for several, or all (pairs a type cannot run "
             "are skipped with a note)")
    add("-o", "--op", type=op_list, default=["sum"],
        help=f"reduction op ({', '.join(OPS)}); comma-separated for several, or all")
    add("--backend", type=comma_list, default=["auto"],
        help="comma-separated coccl.init backends (auto, mpi, nccl), one sweep each: "
             "the transport of device data")
    add("--algorithm", type=comma_list, default=["ring", "two_shot"],
        help="comma-separated algorithms to compare (ring, two_shot, native, auto, "
             "hierarchical: nodes of COCCL_LOCAL_SIZE ranks or each host's)")
    add("--plot", metavar="PATH", help="draw busbw and latency against size (PNG)")
    # fmt: on
    add_codec_arguments(
        add,
        "identity,taco,int:bits=4,hadamard=32; with --algorithm hierarchical also an "
        "(intra, inter) pair joined by +, e.g. int8+int:bits=4,hadamard=32",
    )


def validate_sizes(args: argparse.Namespace) -> str | None:
    """What is wrong with the shared size and chunk flags, if anything."""
    if args.minbytes < 1:
        return f"-b/--minbytes must be at least 1 byte, got {args.minbytes}"
    if args.minbytes > args.maxbytes:
        return f"-b/--minbytes {args.minbytes} is larger than -e/--maxbytes {args.maxbytes}"
    if args.warmup_iters < 0:
        return f"-w/--warmup_iters must be >= 0, got {args.warmup_iters}"
    if args.chunk_bytes is not None and args.chunk_bytes < 1:
        return "--chunk-bytes must be at least 1"
    return None


def validate(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags taken together, if anything."""
    problem = validate_sizes(args)
    if problem:
        return problem
    unknown = [b for b in args.backend if b not in ("auto", "mpi", "nccl")]
    if unknown:
        return f"--backend {','.join(unknown)}: choose from auto, mpi, nccl"
    unknown = [a for a in args.algorithm if a not in ALGORITHMS]
    if unknown:
        return f"--algorithm {','.join(unknown)}: choose from {', '.join(ALGORITHMS)}"
    return None


def _register(spec: Spec, perf: str) -> None:
    @command(
        spec.name,
        help=f"{spec.name} sweep (as nccl-tests' {perf})",
        arguments=add_arguments,
        validate=validate,
    )
    def sweep(args: argparse.Namespace) -> int:
        return run(spec, args)


_register(ALLREDUCE, "all_reduce_perf")
_register(REDUCE_SCATTER, "reduce_scatter_perf")
_register(ALLGATHER, "all_gather_perf")


def run(spec: Spec, args: argparse.Namespace) -> int:
    """One sweep per backend, on every rank; rank 0 prints the tables and writes the
    files (one JSON with every row; one plot per backend). Returns ``EXIT_WRONG`` if an
    output erred beyond its bound (every rank alike), else 0."""
    from mpi4py import MPI  # noqa: PLC0415

    mpi = MPI.COMM_WORLD
    rows: list[Row] = []
    skipped: list[dict[str, str]] = []
    meta: dict[str, Any] = {}
    for backend in args.backend:
        try:
            job = _prepare(spec, args, mpi, backend)
        except (UsageError, NothingToRun, coccl.CocclError) as exc:
            return _refuse(mpi, None, str(exc))
        skipped += [{**skip, "backend": job.comm.backend} for skip in job.skipped]
        try:
            here = _metadata(job.cases[0].sweep, args, job.device)
            swept = _sweep(job.cases, args, job.codecs, job.notes, here)
        finally:
            job.comm.close()
        rows += swept
        if not meta:
            meta = here
        if mpi.Get_rank() == 0 and args.plot:
            from .plot import plot_sweep  # noqa: PLC0415

            path = _per_backend(args.plot, backend, len(args.backend))
            plot_sweep(path, here, swept)
            print(f"# plot written to {path}", flush=True)
    if mpi.Get_rank() == 0 and args.json:
        meta["backend"] = ",".join(dict.fromkeys(row.backend for row in rows)) or meta["backend"]
        meta["skipped"] = skipped
        write_json(args.json, meta, rows)
        print(f"# JSON written to {args.json}", flush=True)
    return EXIT_WRONG if any(row.wrong for row in rows) else 0


@dataclass
class _Job:
    """One backend's sweep, ready to run."""

    comm: Any  # coccl.Communicator
    cases: list[Case]  # the (datatype, op) cases, each with the pairs that run
    skipped: list[dict[str, str]]  # the pairs left out (cases.make_cases)
    notes: list[str]  # for the preamble
    device: dict[str, Any]  # _select_device's description
    codecs: dict[str, Any]  # name -> compressor


def _prepare(spec: Spec, args: argparse.Namespace, mpi: Any, backend: str) -> _Job:
    """One backend's communicator and cases (the communicator closed again if the
    request cannot run)."""
    comm = None
    try:
        xp, sync, device = _select_device(mpi, args.device)
        comm = coccl.init(mpi, backend=backend)
        codecs = _codecs(args.compressor)
        variants, left_out = _variants(args.algorithm, args.compressor)
        base = Sweep(
            spec,
            comm,
            mpi,
            xp,
            args.datatype[0],
            args.op[0] if spec.reduces else "sum",
            args.iters,
            args.warmup_iters,
            bool(args.check),
            args.chunk_bytes,
            sync,
            timing.AVERAGES[args.average],
            args.overlap_min,
            args.overlap_iters,
        )
        cases, skips = make_cases(base, args.datatype, args.op, variants, codecs)
        _preflight(mpi, args)
    except BaseException:
        if comm is not None:
            comm.close()
        raise
    ops = args.op if spec.reduces else ["none"]
    skips = [
        {"type": dtype.name, "redop": op, **pair}
        for dtype in args.datatype
        for op in ops
        for pair in left_out
    ] + skips  # fmt: skip
    notes = skip_notes(skips)
    notes += [
        f"{case.label}: no native baseline, no speedup ({case.native_problem})"
        for case in cases
        if not case.native_ok
    ]
    return _Job(comm, cases, skips, notes, device, codecs)


def _per_backend(path: str, backend: str, nbackends: int) -> str:
    """``path`` itself for one backend, else ``name-BACKEND.png``."""
    if nbackends == 1:
        return path
    stem, dot, suffix = path.rpartition(".")
    return f"{stem}-{backend}.{suffix}" if dot else f"{path}-{backend}"


def _sweep(
    cases: list[Case],
    args: argparse.Namespace,
    codecs: dict[str, Any],
    notes: list[str],
    meta: dict[str, Any],
) -> list[Row]:
    """Every case of one backend into one table (as nccl-tests' ``-d all``)."""
    first = cases[0].sweep
    nranks, rank0 = first.mpi.Get_size(), first.mpi.Get_rank() == 0
    sizes = sweep_sizes(args.minbytes, args.maxbytes, args.stepfactor)
    too_small: dict[str, list[int]] = {}
    for case in cases:
        dtype = case.sweep.dtype
        case.counts, skipped = sweep_counts(first.spec, sizes, dtype.itemsize, nranks)
        if skipped:
            too_small[dtype.name] = skipped
    per_rank = " per rank" if first.spec.sharded else ""
    for name, skipped in too_small.items():
        what = f"one {name} element" if len(args.datatype) > 1 else "one element"
        listed = ", ".join(f"{size} B" for size in skipped)
        notes.append(f"skipped sizes below {what}{per_rank}: {listed}")
    # Work of a size ~ calls x (bytes + a fixed cost per call): what the progress counts.
    work = []
    for case in cases:
        steps = len(case.variants) + 1
        calls = (2 * first.iters + first.warmup + 2) * steps
        itemsize = case.sweep.dtype.itemsize
        work += [(case, count, (count * itemsize + 65536) * calls, steps) for count in case.counts]
    where = "none" if args.no_progress or not rank0 else launch.progress_stream()
    stream = sys.stdout if where == "stdout" else sys.stderr
    progress = Progress(sum(w[2] for w in work), enabled=where != "none", stream=stream)
    say = _Say(rank0, progress)
    table = layout(_table_plan(cases, codecs, args.overlap_min))
    _print_preamble(say, first, meta, notes, table)
    rows: list[Row] = []
    done = 0.0
    several = len(cases) > 1
    for case, count, step, steps in work:
        size = human_size(count * case.sweep.dtype.itemsize)
        label = f"{first.spec.name} {case.label} {size}" if several else f"{first.spec.name} {size}"
        tick = _ticker(progress, done, step / steps, label)
        for row in case.sweep.run_size(count, case.variants, codecs, case.native_ok, tick):
            row.backend = first.comm.backend
            rows.append(row)
            say(table.row(row))
        done += step
    for line in [*auto_notes(rows), *format_summary(rows, first.check)]:
        say(line)
    return rows


# What an ``auto`` pair may resolve to (algorithms/auto.py): the transport's collective or
# a schedule. auto keeps a codec that was named; one it changed would still be shown
# (``taco>identity``), only wider than its column.
_AUTO_ALGORITHMS = ("native", "ring", "two_shot")


def _table_plan(cases: list[Case], codecs: dict[str, Any], overlap_min: int) -> TablePlan:
    """What the table of a sweep's cases must hold: the largest size and count, the
    widest type and op, every label of a row (the native row's included)."""
    first = cases[0].sweep
    sizes = [count * case.sweep.dtype.itemsize for case in cases for count in case.counts]
    algorithms, compressors = [], []
    lossy = overlap = baseline = False
    for case in cases:
        if case.native_ok:
            algorithms.append("native")
            compressors.append("identity")
            baseline = baseline or any(alg != "native" for alg, _ in case.variants)
        for algorithm, name in case.variants:
            labels = [f"auto>{choice}" for choice in _AUTO_ALGORITHMS]
            algorithms += labels if algorithm == "auto" else [algorithm]
            compressors.append(name)
            compressed = not lossless(codecs[name])
            lossy = lossy or compressed
            schedule = algorithm in ("ring", "two_shot", "auto")
            overlap = overlap or (schedule and compressed)
    max_size = max(sizes, default=0)
    return TablePlan(
        max_size=max_size,
        max_count=max((count for case in cases for count in case.counts), default=0),
        type=max((case.sweep.dtype.name for case in cases), key=len),
        redop=max((case.label.split()[1] for case in cases), key=len),
        algorithms=algorithms,
        compressors=compressors,
        check=first.check,
        lossy=lossy,
        baseline=baseline,
        overlap=overlap and overlap_min > 0 and max_size >= overlap_min,
        count_per=first.comm.size if first.spec.sharded else 1,
    )


def _ticker(progress: Progress, start: float, step: float, label: str) -> Callable[[str], None]:
    """``tick(what)``: one more measurement of a size starts (``step`` work each)."""
    started = 0

    def tick(what: str) -> None:
        nonlocal started
        progress.update(start + step * started, f"{label} {what}")
        started += 1

    return tick


# ---------------------------------------------------------------------- set-up steps
def _select_device(mpi: Any, device: str) -> tuple[Any, Callable[[], None], dict[str, Any]]:
    """``(xp, sync, description)``. For ``gpu`` the rank's GPU (local rank % GPUs) is
    made current before ``coccl.init``, so that coccl and CuPy agree on it."""
    if device == "cpu":
        return np, timing.no_sync, {"gpu": None}
    problem = ""
    try:
        import cupy as cp  # noqa: PLC0415

        ndev = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no CuPy, no driver
        ndev, problem = 0, f": {type(exc).__name__}: {exc}"
    missing = mpi.allreduce(int(ndev == 0))
    if missing:
        raise UsageError(
            f"--device gpu needs CuPy and a CUDA GPU; {missing} rank(s) have none{problem}"
        )
    from mpi4py import MPI  # noqa: PLC0415

    local = mpi.Split_type(MPI.COMM_TYPE_SHARED)
    device_id = local.Get_rank() % ndev
    local.Free()
    cp.cuda.Device(device_id).use()
    name = cp.cuda.runtime.getDeviceProperties(device_id)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    return cp, timing.device_sync(), {"gpu": name, "gpu_id": device_id}


# An (intra, inter) codec pair of ``--algorithm hierarchical`` is two labels joined by
# "+": a "+" followed by a codec's name (an option's exponent, "1e+6", has a digit there;
# no name and no "name:key=value" holds a "+").
_PAIR_JOIN = re.compile(r"\s*\+(?=\s*[A-Za-z_])")


def compressor_labels(text: str) -> list[str]:
    """argparse type: the ``--compressor`` list as labels, each ``name`` or
    ``name:key=value,...`` (``int:bits=4,hadamard=32``: a ``key=value`` after a
    ``name:key=value`` is one more option of it; ``coccl.bench.codec``'s syntax), or two
    of them joined by ``+``, an ``(intra, inter)`` pair (``int8+int:bits=4,group_size=32``:
    the options after ``+`` are the inter codec's). The codecs are built (and a bad one
    refused, by rank 0) when the sweep starts."""
    entries: list[list[str]] = []
    for i, segment in enumerate(_PAIR_JOIN.split(text)):
        if not segment.strip():
            raise argparse.ArgumentTypeError(f"invalid list {text!r}: '+' joins two codecs")
        labels = [
            f"{name}:{','.join(opts)}" if opts else name for name, opts in _split_specs(segment)
        ]
        if i:  # the segment's first codec is the inter codec of the entry before the "+"
            if not entries or len(entries[-1]) != 1:
                raise argparse.ArgumentTypeError(
                    f"invalid list {text!r}: '+' joins two codecs, an (intra, inter) pair"
                )
            entries[-1].append(labels.pop(0))
        entries += [[label] for label in labels]
    return list(dict.fromkeys("+".join(entry) for entry in entries))


def is_pair(label: str) -> bool:
    """Whether a ``--compressor`` label is an ``(intra, inter)`` pair."""
    return len(_PAIR_JOIN.split(label)) == 2


def codec_of(label: str) -> Compressor | tuple[Compressor, Compressor]:
    """The codec of a ``--compressor`` label, or a pair's ``(intra, inter)`` codecs
    (UsageError if one cannot be built)."""
    try:
        codecs = [codec_specs(part)[0].codec for part in _PAIR_JOIN.split(label)]
    except argparse.ArgumentTypeError as exc:
        raise UsageError(str(exc)) from None
    return (codecs[0], codecs[1]) if len(codecs) == 2 else codecs[0]


def lossless(codec: Compressor | tuple[Compressor, ...]) -> bool:
    """Whether a codec, or both of a pair, lose nothing."""
    return all(c.lossless for c in (codec if isinstance(codec, tuple) else (codec,)))


def bound_codec(ran: Mapping[str, Any]) -> Compressor:
    """The codec whose error bound a measured call obeys (``Communicator.describe``'s
    ``ran``): the one that ran, or of a hierarchical call's two levels the lossier."""
    levels = [coccl.get_compressor(ran["compressor"])]
    if "inter compressor" in ran:
        levels.append(coccl.get_compressor(ran["inter compressor"]))
    return max(levels, key=lambda c: (not c.lossless, c.rel_error_bound))


def config_of(label: str) -> dict[str, Any] | list[dict[str, Any]]:
    """The JSON record's config of a ``--compressor`` label (a pair's: both)."""
    codec = codec_of(label)
    if isinstance(codec, tuple):
        return [c.get_config() for c in codec]
    return codec.get_config()


def _codecs(names: list[str]) -> dict[str, Any]:
    """Each named compressor (and identity, the reference of the ratio), built once."""
    return {name: codec_of(name) for name in dict.fromkeys(["identity", *names])}


def _variants(
    algorithms: list[str], compressors: list[str]
) -> tuple[list[tuple[str, str]], list[dict[str, str]]]:
    """The (algorithm, compressor) pairs to run, and those left out (``algorithm``,
    ``compressor``, ``reason``)."""
    variants, left_out = [], []
    for algorithm in algorithms:
        for name in compressors:
            reason = None
            if algorithm == "native" and name != "identity":
                reason = "native takes identity only"
            elif algorithm != "hierarchical" and is_pair(name):
                reason = "a codec pair is for hierarchical"
            if reason is None:
                variants.append((algorithm, name))
            else:
                left_out.append({"algorithm": algorithm, "compressor": name, "reason": reason})
    if not variants:
        raise UsageError("no (algorithm, compressor) pair left to run")
    return variants, left_out


def _preflight(mpi: Any, args: argparse.Namespace) -> None:
    """Rank 0 checks that it can write its outputs before a long sweep starts."""
    problem = None
    if mpi.Get_rank() == 0:
        for path in (args.json, args.plot):
            parent = os.path.dirname(os.path.abspath(path)) if path else None
            if parent and not os.path.isdir(parent):
                problem = f"cannot write {path}: {parent} is not a directory"
        if args.plot and problem is None:
            try:
                import matplotlib  # noqa: F401, PLC0415
            except ImportError:
                problem = "--plot needs matplotlib (pip install matplotlib)"
    problem = mpi.bcast(problem, root=0)
    if problem:
        raise UsageError(problem)


def _refuse(mpi: Any, comm: Any, message: str) -> int:
    """End a request that every rank refuses alike: rank 0 says why and every rank
    returns 2. MPI is finalized here so that ``python -m mpi4py`` ends the job quietly
    rather than aborting it as it does for an error on one rank."""
    from mpi4py import MPI  # noqa: PLC0415

    if mpi.Get_rank() == 0:
        print(f"coccl-bench: error: {message}", file=sys.stderr, flush=True)
    if comm is not None:
        comm.close()
    mpi.Barrier()
    sys.stdout.flush()
    MPI.Finalize()
    return EXIT_USAGE


# -------------------------------------------------------------------------- output
# The settings that change a measurement: coccl's own, and the MPI library's tuning
# (Open MPI's MCA parameters, MPICH's control variables), e.g. Open MPI's shared-memory
# single-copy mechanism, which moves staged GPU results by a large factor (bench/NOTES.md).
_RECORDED_PREFIXES = ("COCCL_", "OMPI_MCA_", "MPIR_CVAR_")
# Set by the launchers for their ranks (coccl-bench's own; Open MPI's mpiexec: its daemon's
# address, session directories, job ids), not settings that change a result.
_LAUNCHER_PREFIXES = (
    "COCCL_BENCH_",
    "OMPI_MCA_orte_",
    "OMPI_MCA_ess",
    "OMPI_MCA_initial_wdir",
    "OMPI_MCA_pmix",
    "OMPI_MCA_shmem_RUNTIME_QUERY_hint",
)


def recorded_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` a result depends on (the launchers' own excluded)."""
    return {
        k: v
        for k, v in env.items()
        if k.startswith(_RECORDED_PREFIXES) and not k.startswith(_LAUNCHER_PREFIXES)
    }


def _metadata(sweep: Sweep, args: argparse.Namespace, device: dict[str, Any]) -> dict[str, Any]:
    """The JSON record's header (a collective call; only rank 0's is filled in)."""
    from mpi4py import MPI  # noqa: PLC0415

    mpi = sweep.mpi
    here = provenance(coccl.__file__)
    ranks = mpi.gather(
        {
            "rank": mpi.Get_rank(),
            "hostname": here["hostname"],
            "pid": os.getpid(),
            "cpu": here["cpu"],
            **device,
        },
        root=0,
    )
    if mpi.Get_rank() != 0:
        return {}
    command_line, launcher = launch.invocation(args.argv)
    return {
        "collective": sweep.spec.name,
        "nranks": mpi.Get_size(),
        "backend": sweep.comm.backend,
        "device": args.device,
        "command": command_line,
        "launcher": launcher,
        **here,
        "gpu": device["gpu"],
        "datatype": ",".join(dtype.name for dtype in args.datatype),
        "op": ",".join(args.op) if sweep.spec.reduces else "none",
        "iters": sweep.iters,
        "warmup_iters": sweep.warmup,
        "check": int(sweep.check),
        "average": sweep.average,
        "chunk_bytes": sweep.chunk_bytes,
        "bus_factor": sweep.spec.bus_factor(mpi.Get_size()),
        "algorithms": args.algorithm,
        "compressors": {name: config_of(name) for name in args.compressor},
        "coccl_version": coccl.__version__,
        "mpi_library": MPI.Get_library_version().splitlines()[0].strip(),
        "environment": recorded_environment(os.environ),
        "ranks": ranks,
        "skipped": [],  # filled in at the end, over every backend
    }


class _Say:
    """Rank 0's printer: a line to stdout, the progress line erased first."""

    def __init__(self, enabled: bool, progress: Progress) -> None:
        self.enabled = enabled
        self.progress = progress

    def __call__(self, text: str) -> None:
        if self.enabled:
            self.progress.clear()
            print(text, flush=True)


# How the table names the columns it leaves out to fit (the JSON fields they show).
_COLUMN_NAMES = {
    "algbw": "algbw (out-of-place)",
    "algbw_inplace": "algbw (in-place)",
    "busbw_inplace": "busbw (in-place)",
    "time_us_inplace": "time (in-place)",
}


def _print_preamble(
    say: _Say, sweep: Sweep, meta: dict[str, Any], notes: list[str], table: Layout
) -> None:
    if not say.enabled:
        return
    chunk = sweep.chunk_bytes if sweep.chunk_bytes is not None else "default"
    dirty = " (with uncommitted changes)" if meta["commit_dirty"] else ""
    average = next(k for k, v in timing.AVERAGES.items() if v == sweep.average)
    say(
        f"# coccl-bench {meta['collective']}: nranks {meta['nranks']}, backend "
        f"{meta['backend']}, device {meta['device']}, datatype {meta['datatype']}, "
        f"op {meta['op']}"
    )
    say(
        f"# algorithm {','.join(meta['algorithms'])}, compressor "
        f"{','.join(meta['compressors'])}, chunk_bytes {chunk}"
    )
    say(
        f"# iters {sweep.iters}, warmup {sweep.warmup}, check {int(sweep.check)}; time = "
        f"median of each rank's calls, ranks combined by {sweep.average} (-a {average})"
    )
    say(f"# command: {meta['command']}")
    say(f"# commit {meta['commit']}{dirty}, {meta['date']}")
    for r in meta["ranks"]:
        where = f"gpu {r['gpu_id']} {r['gpu']}" if r.get("gpu") else f"cpu {r['cpu']}"
        say(f"#  Rank {r['rank']:2d} Pid {r['pid']:7d} on {r['hostname']} {where}")
    for note in notes:
        say(f"# note: {note}")
    if table.hidden:
        names = ", ".join(_COLUMN_NAMES.get(key, key) for key in table.hidden)
        say(f"# note: left out to fit {MAX_WIDTH} characters (in the JSON): {names}")
    say("#")
    say(table.header())
