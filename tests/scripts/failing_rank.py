"""A job where one rank fails: used by tests/test_failures.py.

Usage: python -m mpi4py failing_rank.py MODE
  raise    rank 1 raises before the collective; the others enter it
  absent   rank 1 never calls the collective (others time out with COCCL_TIMEOUT_S)
  mismatch rank 1 passes a different count
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
if comm.rank == 1:
    if mode == "raise":
        raise RuntimeError("rank 1 failed on purpose")
    if mode == "absent":
        time.sleep(60)
        sys.exit(0)
    if mode == "mismatch":
        count = 50_000
x = np.ones(count, dtype=np.float32)
comm.allreduce(x, algorithm=algorithm, compressor="identity")
print(f"rank {comm.rank} finished", flush=True)
