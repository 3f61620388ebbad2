"""Where a large AllReduce's time goes over NCCL on 2 GPUs: NCCL's own AllReduce, the
point-to-point exchanges a 2-rank ring makes (eager and replayed from a CUDA graph), the
device copies a replayed call adds, and coccl's schedules (replayed and eager), side by
side in one run, per size.

Each method is timed as ``--calls`` back-to-back calls divided by their number, the
devices synchronized at the end; ``--repeats`` timings interleaved with the other methods,
the median kept, the slowest rank's. Run it under different NCCL settings to compare them
(the JSON records every NCCL_* and COCCL_* variable):

    mpiexec -n 2 python3 bench/scripts/p2p_probe.py --out p2p.json --sizes 64M,256M
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import cupy as cp
import ml_dtypes
import numpy as np
from cupy.cuda import nccl
from mpi4py import MPI

import coccl
from coccl.bench.cli import parse_size
from coccl.bench.table import provenance

NCCL_TYPES = {"float32": nccl.NCCL_FLOAT32, "bfloat16": 9}


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--out", default="p2p.json", help="JSON file written by rank 0")
    p.add_argument("--sizes", default="64M,256M", help="AllReduce sizes in bytes")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(NCCL_TYPES))
    p.add_argument("--calls", type=int, default=20, help="calls per timing")
    p.add_argument("--repeats", type=int, default=5, help="timings per point")
    p.add_argument(
        "--schedules",
        default="ring:identity,ring:taco,two_shot:taco",
        help="coccl algorithm:compressor[:chunk bytes] schedules, each timed replayed and "
        "eager (no chunk: coccl's default)",
    )
    p.add_argument(
        "--trace",
        default="",
        help="';'-separated methods whose kernels torch.profiler records (3 calls each, at "
        "the first size) into the --out file's name with .trace-rank<r>.json",
    )
    return p.parse_args()


def trace(calls: dict[str, Callable[[], None]], names: list[str], path: str) -> None:
    """A Chrome trace of 3 calls of each method in ``names`` (every kernel and copy on
    this rank's GPU, CUDA graphs' nodes included), each call in a named range."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for name in names:
            for i in range(3):
                cp.cuda.Device().synchronize()
                with record_function(f"{name} #{i}"):
                    calls[name]()
                cp.cuda.Device().synchronize()
    prof.export_chrome_trace(path)


def graph_of(fn: Callable[[], None], stream: Any) -> Any:
    """``fn``'s work on ``stream`` captured as a CUDA graph (after one eager run)."""
    with stream:
        fn()
    stream.synchronize()
    stream.begin_capture(cp.cuda.runtime.streamCaptureModeRelaxed)
    try:
        with stream:
            fn()
    finally:
        graph = stream.end_capture()
    graph.upload(stream)
    return graph


def methods(
    size: int, dtype: str, raw: Any, comms: dict[str, Any], schedules: list[str], rank: int
) -> dict[str, Callable[[], None]]:
    """The operations compared for an AllReduce of ``size`` bytes of ``dtype``."""
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    count = size // np_dtype.itemsize
    half = count // 2
    peer = 1 - rank
    stream = cp.cuda.Stream(non_blocking=True)
    host = np.random.default_rng(rank).standard_normal(count, dtype=np.float32)
    x = cp.asarray(host.astype(np_dtype))
    y = cp.empty_like(x)
    recv = cp.empty_like(x[:half])
    kind = NCCL_TYPES[dtype]
    s = stream.ptr

    def allreduce() -> None:
        raw.allReduce(x.data.ptr, y.data.ptr, count, kind, nccl.NCCL_SUM, s)

    def exchange(nbytes_half: int) -> Callable[[], None]:
        n = nbytes_half // np_dtype.itemsize

        def run() -> None:
            nccl.groupStart()
            raw.send(x.data.ptr + rank * half * np_dtype.itemsize, n, kind, peer, s)
            raw.recv(recv.data.ptr, n, kind, peer, s)
            nccl.groupEnd()

        return run

    one = exchange(half * np_dtype.itemsize)

    def two_phases() -> None:
        one()
        one()

    def copy() -> None:
        cp.cuda.runtime.memcpyAsync(
            y.data.ptr, x.data.ptr, size, cp.cuda.runtime.memcpyDeviceToDevice, s
        )

    graph = graph_of(two_phases, stream)
    calls: dict[str, Callable[[], None]] = {
        "nccl allreduce": allreduce,
        "p2p exchange of size/2": one,
        "p2p two exchanges of size/2": two_phases,
        "p2p two exchanges, graph": lambda: graph.launch(stream),
        "p2p exchange of size/8": exchange(half * np_dtype.itemsize // 4),
        "p2p exchange of 0.265 size (a taco shard)": exchange(int(0.53 * half) * np_dtype.itemsize),
        "device copy of size": copy,
    }
    for name, comm in comms.items():
        for pair in schedules:
            algorithm, codec, *chunk = pair.split(":")
            chunk_bytes = parse_size(chunk[0]) if chunk else None

            def call(
                comm: Any = comm, algorithm: str = algorithm, codec: str = codec,
                chunk_bytes: int | None = chunk_bytes,
            ) -> None:  # fmt: skip
                with stream:
                    comm.allreduce(
                        x, y, algorithm=algorithm, compressor=codec, chunk_bytes=chunk_bytes
                    )

            label = f"coccl {algorithm} {codec}" + (f" chunk {chunk[0]}" if chunk else "")
            calls[f"{label}, {name}"] = call
    return calls


def main() -> None:
    args = parse()
    world = MPI.COMM_WORLD
    rank, nranks = world.Get_rank(), world.Get_size()
    assert nranks == 2, "the probe models a 2-rank ring"
    cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()
    uid = world.bcast(nccl.get_unique_id() if rank == 0 else None)
    raw = nccl.NcclCommunicator(nranks, uid, rank)
    environment = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "COCCL_"))}
    comms = {}
    for name, graphs in (("replayed", "1"), ("eager", "0")):
        os.environ["COCCL_GRAPHS"] = graphs
        comms[name] = coccl.init(world, backend="nccl")
    os.environ.pop("COCCL_GRAPHS")
    if "COCCL_GRAPHS" in environment:
        os.environ["COCCL_GRAPHS"] = environment["COCCL_GRAPHS"]
    schedules = [s for s in args.schedules.split(",") if s]
    rows: list[dict[str, Any]] = []
    for size in (parse_size(s) for s in args.sizes.split(",")):
        calls = methods(size, args.dtype, raw, comms, schedules, rank)
        times: dict[str, list[float]] = {name: [] for name in calls}
        for fn in calls.values():  # warm up: connections, plans, captures
            for _ in range(3):
                fn()
        cp.cuda.Device().synchronize()
        if args.trace and not rows:
            base = args.out.removesuffix(".json")
            trace(calls, args.trace.split(";"), f"{base}.trace-rank{rank}.json")
        for _ in range(args.repeats):
            for name, fn in calls.items():
                world.Barrier()
                cp.cuda.Device().synchronize()
                start = time.perf_counter()
                for _ in range(args.calls):
                    fn()
                cp.cuda.Device().synchronize()
                times[name].append((time.perf_counter() - start) / args.calls)
        for name, samples in times.items():
            us = world.allreduce(statistics.median(samples), op=MPI.MAX) * 1e6
            rows.append({"bytes": size, "dtype": args.dtype, "method": name, "us": us})
            if rank == 0:
                print(f"{size:>11} B  {name:<44} {us:9.1f} us", flush=True)
    if rank == 0:
        flags = " ".join(f"--{k} {v}" for k, v in vars(args).items())
        record = {
            "command": f"mpiexec -n 2 python3 bench/scripts/p2p_probe.py {flags}",
            **provenance(__file__),
            "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
            "link": comms["replayed"].link,
            "environment": environment,
            "rows": rows,
        }
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
    for comm in comms.values():
        comm.close()


if __name__ == "__main__":
    main()
