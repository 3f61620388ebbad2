"""The taco hop kernels side by side inside replayed ring taco AllReduces on 2 GPUs over
NCCL: one communicator captures its plans with the EPL hop (``hop_epl`` 64, from every
count), another with the 32-elements-per-lane hop (``hop_epl`` 0), and NCCL's own
AllReduce runs beside them; bfloat16, 16 / 64 / 256 MiB. Each timing is 20 back-to-back
calls, 9 timings interleaved, the median kept, the slowest rank's.

    mpiexec -n 2 python3 bench/scripts/hop_ab.py hop-ab.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable

import cupy as cp
import ml_dtypes
import numpy as np
from cupy.cuda import nccl
from mpi4py import MPI

import coccl
from coccl.bench.table import provenance
from coccl.compressors import gpu_kernels as gk  # its tuning hooks only

SIZES = [16 << 20, 64 << 20, 256 << 20]
NCCL_BFLOAT16 = 9


def main() -> None:
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()
    uid = world.bcast(nccl.get_unique_id() if rank == 0 else None)
    raw = nccl.NcclCommunicator(world.Get_size(), uid, rank)
    bf16 = np.dtype(ml_dtypes.bfloat16)
    stream = cp.cuda.Stream(non_blocking=True)
    bufs = {}
    for size in SIZES:
        host = np.random.default_rng(rank).standard_normal(size // 2, dtype=np.float32)
        x = cp.asarray(host.astype(bf16).view(np.uint16)).view(bf16)
        bufs[size] = (x, cp.empty_like(x))
    calls: dict[tuple[str, int], Callable[[], None]] = {}
    comms = []
    for epl in (64, 0):
        gk.set_tuning(hop_epl=epl, hop_epl_from=0)
        comm = coccl.init(world, backend="nccl")
        comms.append(comm)
        for size, (x, y) in bufs.items():

            def call(comm: coccl.Communicator = comm, x: cp.ndarray = x, y: cp.ndarray = y) -> None:
                with stream:
                    comm.allreduce(x, y, algorithm="ring", compressor="taco")

            for _ in range(3):  # eager, captured with this tuning, replayed
                call()
            calls[(f"ring taco hop_epl={epl}", size)] = call
    for size, (x, y) in bufs.items():

        def native(x: cp.ndarray = x, y: cp.ndarray = y) -> None:
            raw.allReduce(x.data.ptr, y.data.ptr, x.size, NCCL_BFLOAT16, nccl.NCCL_SUM, stream.ptr)

        native()
        calls[("nccl allreduce", size)] = native
    cp.cuda.Device().synchronize()
    times: dict[tuple[str, int], list[float]] = {k: [] for k in calls}
    for _ in range(9):
        for key, fn in calls.items():
            world.Barrier()
            cp.cuda.Device().synchronize()
            start = time.perf_counter()
            for _ in range(20):
                fn()
            cp.cuda.Device().synchronize()
            times[key].append((time.perf_counter() - start) / 20 * 1e6)
    rows = []
    for (name, size), samples in times.items():
        us = world.allreduce(statistics.median(samples), op=MPI.MAX)
        rows.append({"method": name, "bytes": size, "us": us, "samples_rank0": samples})
        if rank == 0:
            print(f"{size:>11} {name:<26} {us:8.1f} us", flush=True)
    if rank == 0:
        record = {
            "command": f"mpiexec -n 2 python3 bench/scripts/hop_ab.py {sys.argv[1]}",
            **provenance(__file__),
            "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
            "rows": rows,
        }
        with open(sys.argv[1], "w") as f:
            json.dump(record, f, indent=1)
    for comm in comms:
        comm.close()


if __name__ == "__main__":
    main()
