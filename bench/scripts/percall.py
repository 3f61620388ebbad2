"""Per-call cost of a small AllReduce over NCCL, side by side in one run: raw
``ncclAllReduce`` through CuPy, ``torch.distributed.all_reduce`` on an NCCL process group,
and coccl's calls (auto and native with torch tensors, native with CuPy arrays, the
compressed schedules replayed from CUDA graphs), on the same GPUs and sizes.

A call's time is that of ``--calls`` back-to-back calls on one buffer, divided by their
number, the stream synchronized at the end (as nccl-tests times): host cost and device time
together, whichever is longer. Each (size, method) is timed ``--repeats`` times,
interleaved with the other methods, and the median is kept.

    mpiexec -n 2 python3 bench/scripts/percall.py --out percall.json

One GPU per rank; torch with CUDA and NCCL, CuPy with NCCL, mpi4py (for the rendezvous).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from mpi4py import MPI

import coccl
from coccl.bench.table import provenance

SIZES = [8, 64, 512, 4096, 32768, 262144, 1 << 20]


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--out", default="percall.json", help="JSON file written by rank 0")
    p.add_argument("--calls", type=int, default=200, help="calls per timing")
    p.add_argument("--repeats", type=int, default=5, help="timings per point")
    p.add_argument("--dtype", default="float32", help="torch dtype name")
    return p.parse_args()


def methods(comm: Any, raw: Any, t: Any, c: Any, nccl_type: int) -> dict[str, Any]:
    """The calls compared, each an AllReduce of ``t`` (or ``c``) in place; one of them
    takes ``t`` and a copy of it in turn (a replayed graph pointed at other buffers on
    every call)."""
    from cupy.cuda import nccl

    stream = torch.cuda.current_stream().cuda_stream
    count = t.numel()
    buffers = itertools.cycle((t, t.clone()))

    def in_turn() -> None:
        b = next(buffers)
        comm.allreduce(b, b, algorithm="two_shot", compressor="taco")

    calls = {
        "raw ncclAllReduce (CuPy)": lambda: raw.allReduce(
            t.data_ptr(), t.data_ptr(), count, nccl_type, nccl.NCCL_SUM, stream
        ),
        "torch.distributed.all_reduce": lambda: dist.all_reduce(t),
        "coccl auto (torch)": lambda: comm.allreduce(t, t),
        "coccl native (torch)": lambda: comm.allreduce(t, t, algorithm="native"),
        "coccl two_shot taco (torch)": lambda: comm.allreduce(
            t, t, algorithm="two_shot", compressor="taco"
        ),
        "coccl ring taco (torch)": lambda: comm.allreduce(
            t, t, algorithm="ring", compressor="taco"
        ),
        "coccl two_shot taco, 2 buffers in turn": in_turn,
    }
    if c is not None:
        calls["coccl native (CuPy)"] = lambda: comm.allreduce(c, c, algorithm="native")
    return calls


def main() -> None:
    args = parse()
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    addr = world.bcast(socket.gethostname() if rank == 0 else None)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1" if addr == socket.gethostname() else addr)
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=rank, world_size=size, device_id=device)
    comm = coccl.init(world, backend="nccl")
    import cupy as cp
    from cupy.cuda import nccl

    uid = world.bcast(nccl.get_unique_id() if rank == 0 else None)
    raw = nccl.NcclCommunicator(size, uid, rank)
    dtype = getattr(torch, args.dtype)
    nccl_type = {torch.float32: 7, torch.bfloat16: 9, torch.float16: 6}[dtype]
    itemsize = torch.empty(0, dtype=dtype).element_size()

    rows: list[dict[str, Any]] = []
    for nbytes in SIZES:
        count = max(1, nbytes // itemsize)
        t = torch.ones(count, dtype=dtype, device="cuda")
        c = None if dtype == torch.bfloat16 else cp.ones(count, dtype=str(dtype)[6:])
        calls = methods(comm, raw, t, c, nccl_type)
        times: dict[str, list[float]] = {name: [] for name in calls}
        for fn in calls.values():  # warm up: plans, captures, NCCL connections
            for _ in range(5):
                fn()
        torch.cuda.synchronize()
        for _ in range(args.repeats):
            for name, fn in calls.items():
                world.Barrier()
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(args.calls):
                    fn()
                torch.cuda.synchronize()
                cp.cuda.Device().synchronize()
                times[name].append((time.perf_counter() - start) / args.calls)
        point = []
        for name, samples in times.items():
            slowest = world.allreduce(statistics.median(samples), op=MPI.MAX)
            point.append({"bytes": count * itemsize, "method": name, "us_per_call": slowest * 1e6})
        base = next(r["us_per_call"] for r in point if r["method"].startswith("torch"))
        for row in point:
            row["vs_torch_distributed"] = row["us_per_call"] / base
            if rank == 0:
                print(
                    f"{row['bytes']:>8} B  {row['method']:<30} {row['us_per_call']:8.1f} us "
                    f"{row['vs_torch_distributed']:5.2f}x torch.distributed",
                    flush=True,
                )
        rows += point
    if rank == 0:
        flags = " ".join(f"--{k} {v}" for k, v in vars(args).items())
        environment = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "COCCL_"))}
        record = {
            "command": f"mpiexec -n {size} python3 bench/scripts/percall.py {flags}",
            **provenance(__file__),
            "gpu": torch.cuda.get_device_name(),
            "ranks": size,
            "dtype": args.dtype,
            "link": comm.link,
            "environment": environment,
            "rows": rows,
        }
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
