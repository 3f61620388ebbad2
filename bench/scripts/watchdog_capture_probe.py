"""Does coccl's watchdog break a caller's CUDA-graph capture? One rank over one-rank NCCL
(one GPU, CuPy and torch): an eager coccl call (which the watchdog tracks), then at once a
torch.cuda.graph capture in each mode, with a pause inside it so that the watchdog polls
meanwhile; 8 captures a mode, each replayed. Prints how many captures failed and whether
the watchdog thread is alive. Run against a library whose watchdog thread keeps the
default capture mode and one that sets thread-local, it is the A/B in bench/NOTES.md.

    python3 bench/scripts/watchdog_capture_probe.py
"""

import threading
import time

import cupy as cp
import torch
from mpi4py import MPI

import coccl

with coccl.init(MPI.COMM_SELF, backend="nccl") as c:
    x = cp.ones(1 << 20, cp.float32)
    t = torch.zeros(1 << 20, device="cuda")
    for mode in ("global", "thread_local", "relaxed"):
        bad = 0
        for trial in range(8):
            c.allreduce(x, compressor="taco")  # eager: tracked by the watchdog
            g = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(g, capture_error_mode=mode):
                    t.add_(1)
                    time.sleep(0.12)  # the watchdog polls meanwhile
                    t.mul_(2)
                g.replay()
                torch.cuda.synchronize()
            except Exception as e:
                bad += 1
                print(mode, trial, "capture failed:", repr(e)[:300], flush=True)
        alive = [th.name for th in threading.enumerate() if "watchdog" in th.name]
        print(mode, "failed", bad, "of 8; watchdog threads alive:", alive, flush=True)
    try:
        c.allreduce(x, compressor="taco")
        cp.cuda.Device().synchronize()
        print("after: a call works")
    except Exception as e:
        print("after: call raised", repr(e)[:300])
