"""Where the host time of a staged-GPU collective goes: run under ``mpiexec -n N``.

Rank 0 profiles (cProfile) a few calls of each schedule and prints the functions with
the most own time: the codec's kernel launches and argument handling, the pipeline's
bookkeeping, the waits on MPI.

    mpiexec -n 4 python3 bench/scripts/host_profile.py --size 256M --chunk 4M

``--contention`` instead times the codec alone (encode, then decode-accumulate of the
same payload, one chunk at a time over the message), with every rank doing it at once
and then with rank 0 alone: if it is much faster alone, the ranks contend for the GPU
(time-sliced contexts), not for the host.

A script beside coccl-bench, not part of it: it uses coccl's public API only.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from typing import Any

import numpy as np
from mpi4py import MPI

import coccl
from coccl.bench.cli import datatype, parse_size
from coccl.bench.codec import codec_specs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="256M", help="message size (bytes)")
    ap.add_argument("--chunk", default="4M", help="pipeline chunk size (bytes)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--algorithms", default="ring,two_shot")
    ap.add_argument("--compressor", default="taco")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--top", type=int, default=25, help="functions listed per profile")
    ap.add_argument("--contention", action="store_true", help="see the docstring")
    args = ap.parse_args()

    import cupy as cp

    world = MPI.COMM_WORLD
    cp.cuda.Device(0).use()
    comm = coccl.init(world, backend="mpi")
    dtype = datatype(args.dtype)
    count = parse_size(args.size) // dtype.itemsize
    chunk = parse_size(args.chunk)
    x = cp.asarray(np.random.default_rng(world.rank).standard_normal(count).astype(dtype))
    if args.contention:
        contention(world, x, args, chunk)
    else:
        profile(world, comm, x, args, chunk)
    comm.close()


def profile(world: MPI.Comm, comm: Any, x: Any, args: argparse.Namespace, chunk: int) -> None:
    """cProfile of ``--calls`` AllReduce calls of each algorithm, printed by rank 0."""
    import cupy as cp

    for algorithm in args.algorithms.split(","):

        def call(algorithm: str = algorithm) -> None:
            comm.allreduce(x, algorithm=algorithm, compressor=args.compressor, chunk_bytes=chunk)
            cp.cuda.get_current_stream().synchronize()

        call()  # warm-up
        world.Barrier()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            call()
        prof.disable()
        world.Barrier()
        if world.rank == 0:
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(args.top)
            print(f"===== {algorithm} {args.compressor} x{args.calls}", flush=True)
            print("\n".join(text.getvalue().splitlines()[: args.top + 12]), flush=True)


def contention(world: MPI.Comm, x: Any, args: argparse.Namespace, chunk: int) -> None:
    """The codec's work on the message, chunk by chunk, every rank at once and then rank 0
    alone: wall time, this thread's CPU time, and when the last launch returned."""
    import cupy as cp

    (spec,) = codec_specs(args.compressor)  # 'name:key=value,...' as coccl-bench
    codec = spec.codec
    per_chunk = max(chunk // x.dtype.itemsize, 1)
    acc = cp.zeros(min(per_chunk, x.size), dtype=cp.float32)

    def codec_work() -> None:
        for start in range(0, x.size, per_chunk):
            part = x[start : start + per_chunk]
            payload = codec.encode(part)
            codec.decode(payload, out=acc[: part.size], count=part.size, dtype=x.dtype,
                         accumulate=True)  # fmt: skip

    for label, active in (("all ranks", True), ("rank 0 alone", world.rank == 0)):
        world.Barrier()
        walls, cpus, issues = [], [], []
        if active:
            for i in range(args.calls + 1):  # the first one warms up
                w0, c0 = time.perf_counter(), time.thread_time()
                codec_work()
                issued = time.perf_counter() - w0  # the host's share: all work enqueued
                cp.cuda.get_current_stream().synchronize()
                if i:
                    walls.append(time.perf_counter() - w0)
                    cpus.append(time.thread_time() - c0)
                    issues.append(issued)
        world.Barrier()
        if world.rank == 0:
            print(
                f"{args.compressor} codec work, {label:12s}: wall {1e3 * min(walls):6.2f} ms "
                f"min {1e3 * statistics.median(walls):6.2f} median, host CPU "
                f"{1e3 * statistics.median(cpus):6.2f} ms median, issued after "
                f"{1e3 * statistics.median(issues):6.2f} ms median",
                flush=True,
            )


if __name__ == "__main__":
    main()
