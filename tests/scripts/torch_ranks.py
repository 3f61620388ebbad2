"""One rank of a multi-rank pytest run over torch.distributed with the coccl backend.

Usage (tests/test_torch_backend.py launches it):
    torchrun --nproc-per-node N tests/scripts/torch_ranks.py LOGDIR [pytest args...]
    mpiexec -n N python -m mpi4py tests/scripts/torch_ranks.py LOGDIR [pytest args...]

``coccl.torch.init_process_group()`` makes the default group a coccl group from either
launcher's environment; then every rank runs the same tests in the same order, writing
its report to LOGDIR/rank-R.log, and the ranks agree on the worst exit status.
"""

import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

import coccl.torch


def main() -> int:
    logdir, args = Path(sys.argv[1]), sys.argv[2:]
    # a hung collective fails within the launch's wall-clock limit instead of waiting 30 min
    coccl.torch.init_process_group(timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    log = open(logdir / f"rank-{rank}.log", "w")  # noqa: SIM115
    sys.stdout = sys.stderr = log
    code = int(pytest.main(["-p", "no:cacheprovider", "-q", "-rf", *args]))
    log.flush()
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    # the verdict travels over a plain Gloo group: it must not depend on coccl working
    verdict = dist.new_group(backend="gloo")
    codes: list[int] = [0] * dist.get_world_size()
    dist.all_gather_object(codes, code, group=verdict)
    dist.destroy_process_group()
    if rank == 0:
        print(f"ranks agree: exit status {max(codes)}")
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
