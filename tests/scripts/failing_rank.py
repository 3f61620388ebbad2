"""A job where one rank fails: used by tests/test_failures.py.

Usage: python -m mpi4py failing_rank.py MODE [ALGORITHM]
  raise     rank 1 raises before the collective; the others enter it
  absent    rank 1 never makes the call (the others time out agreeing on its plan)
  late      every rank makes the call once; rank 1 skips the second (the others time out
            in the middle of the collective, or of MPI's own for algorithm native), then
            call again, which the broken communicator refuses
  mismatch  rank 1 passes a different count
"""

import sys
import time

import numpy as np
from mpi4py import MPI

import coccl

mode = sys.argv[1]
algorithm = sys.argv[2] if len(sys.argv) > 2 else "ring"
comm = coccl.init(MPI.COMM_WORLD, backend="mpi")
count = 100_000
x = np.ones(count, dtype=np.float32)
if mode == "late":
    comm.allreduce(x, algorithm=algorithm, compressor="identity")
if comm.rank == 1:
    if mode == "raise":
        raise RuntimeError("rank 1 failed on purpose")
    if mode in ("absent", "late"):
        time.sleep(60)
        sys.exit(0)
    if mode == "mismatch":
        x = x[:50_000]
try:
    comm.allreduce(x, algorithm=algorithm, compressor="identity")
except coccl.CocclError as exc:
    print(f"rank {comm.rank} first error: {exc}", flush=True)
    if mode != "late":
        raise
    comm.allreduce(x, algorithm=algorithm, compressor="identity")  # refused: raises
print(f"rank {comm.rank} finished", flush=True)
