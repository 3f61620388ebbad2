"""What the ranks' agreement on each call costs: a host AllReduce of 1 KiB timed as a
cached call (no check), as a new call (its plan built: one exchange of digests), and as a
cached call with COCCL_CHECK_CALLS=1 (the exchange on every call); medians of many calls.

    mpiexec -n 2 python -m mpi4py bench/scripts/check_cost.py --out cpu-check-cost.json
"""

import argparse
import json
import os
import statistics
import time

import numpy as np
from mpi4py import MPI

import coccl
from coccl.bench.table import provenance


def per_call(fn, calls: int) -> float:
    MPI.COMM_WORLD.Barrier()
    start = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - start) / calls


def new_plans(comm, args) -> float:
    """Median per-call time of calls that each have a count of their own."""
    counts = iter(range(1000, 1000 + args.calls * args.repeats))

    def call(i: int) -> None:
        comm.allreduce(np.ones(next(counts), np.float32), algorithm="native")

    return statistics.median(per_call(call, args.calls // 4) for _ in range(args.repeats))


def main() -> None:
    p = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default="cpu-check-cost.json", help="JSON written by rank 0")
    p.add_argument("--calls", type=int, default=2000, help="calls per timing")
    p.add_argument("--repeats", type=int, default=5, help="timings per case")
    args = p.parse_args()
    x = np.ones(256, np.float32)
    results = {}
    for check in ("0", "1"):
        os.environ["COCCL_CHECK_CALLS"] = check
        with coccl.init(backend="mpi") as comm:
            comm.allreduce(x, algorithm="native")
            samples = [
                per_call(lambda i: comm.allreduce(x, x, algorithm="native"), args.calls)
                for _ in range(args.repeats)
            ]
            results[f"cached call, COCCL_CHECK_CALLS={check}"] = statistics.median(samples)
            if check == "0":  # every call a new count: a plan built, one agreement each
                results["new call (plan built, agreement)"] = new_plans(comm, args)
    world = MPI.COMM_WORLD
    slowest = {k: world.allreduce(v, op=MPI.MAX) * 1e6 for k, v in results.items()}
    if world.Get_rank() == 0:
        for k, v in slowest.items():
            print(f"{k:<40} {v:8.1f} us per call")
        record = {
            "what": "per-call cost of the ranks' agreement (1 KiB host AllReduce, native)",
            "command": f"mpiexec -n {world.Get_size()} python -m mpi4py "
            "bench/scripts/check_cost.py",
            **provenance(__file__),
            "machine": f"{os.cpu_count()} cores, MPI: {MPI.Get_library_version().splitlines()[0]}",
            "ranks": world.Get_size(),
            "us_per_call": slowest,
        }
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
