"""Where the host time of a staged-GPU collective goes: run under ``mpiexec -n N``.

Rank 0 profiles (cProfile) a few codec-only and pipelined calls of each schedule and
prints the functions with the most own time; the codec-only run has no transport, so its
profile is the codec's host cost per round (kernel launches, argument handling, the
pipeline's bookkeeping).

    mpiexec -n 4 python3 bench/host_profile.py --size 256M --chunk 4M
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats

import numpy as np
from mpi4py import MPI

import coccl
from coccl.bench.cli import datatype, parse_size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="256M")
    ap.add_argument("--chunk", default="4M")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--algorithms", default="ring,two_shot")
    ap.add_argument("--compressor", default="taco")
    ap.add_argument("--calls", type=int, default=5)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument(
        "--contention",
        action="store_true",
        help="instead of profiling: time codec-only calls (wall and this thread's CPU "
        "time) with every rank running them at once, then with rank 0 alone",
    )
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
        contention(world, comm, x, args, chunk)
        comm.close()
        return
    for algorithm in args.algorithms.split(","):
        for variant in ("codec_only", "normal"):

            def call(algorithm: str = algorithm, variant: str = variant) -> None:
                comm._collective(
                    "allreduce", x, None, "sum", algorithm, args.compressor, chunk, variant
                )
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
                stats = pstats.Stats(prof, stream=text).sort_stats("tottime")
                stats.print_stats(args.top)
                print(f"===== {algorithm} {args.compressor} {variant} x{args.calls}", flush=True)
                print("\n".join(text.getvalue().splitlines()[: args.top + 12]), flush=True)
    comm.close()


def contention(
    world: MPI.Comm, comm: coccl.Communicator, x: object, args: object, chunk: int
) -> None:
    """Codec-only calls need no peer, so rank 0 can run them alone: if they are much
    faster alone, the ranks contend for the GPU (time-sliced contexts), not the host."""
    import time

    import cupy as cp

    for algorithm in args.algorithms.split(","):
        for label, active in (("all ranks", True), ("rank 0 alone", world.rank == 0)):
            world.Barrier()
            walls, cpus, issues = [], [], []
            if active:
                for i in range(args.calls + 1):
                    w0, c0 = time.perf_counter(), time.thread_time()
                    comm._collective(
                        "allreduce", x, None, "sum", algorithm, args.compressor, chunk, "codec_only"
                    )
                    issued = time.perf_counter() - w0  # the host's share: all work enqueued
                    cp.cuda.get_current_stream().synchronize()
                    if i:
                        walls.append(time.perf_counter() - w0)
                        cpus.append(time.thread_time() - c0)
                        issues.append(issued)
            world.Barrier()
            if world.rank == 0:
                print(
                    f"{algorithm:8s} {args.compressor} codec-only, {label:12s}: wall "
                    f"{1e3 * min(walls):6.2f} ms min {1e3 * sorted(walls)[len(walls) // 2]:6.2f} "
                    f"median, host CPU {1e3 * sorted(cpus)[len(cpus) // 2]:6.2f} ms median, "
                    f"issued after {1e3 * sorted(issues)[len(issues) // 2]:6.2f} ms median",
                    flush=True,
                )


if __name__ == "__main__":
    main()
