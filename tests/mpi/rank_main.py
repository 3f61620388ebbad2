"""Entry point of one rank of a multi-rank pytest run (see tests/mpi_launch.py).

Usage: mpiexec -n N python -m mpi4py tests/mpi/rank_main.py LOGDIR [pytest args...]

Every rank runs the same tests in the same order; each writes its report to
LOGDIR/rank-R.log and its JUnit report to LOGDIR/rank-R.xml. At the end the ranks agree on
one exit status (the worst), so the job succeeds only if every rank passed. A file with
nothing to run here (pytest's status 5, e.g. torch absent and the module skipped) counts
as passed, as in a plain pytest run.
"""

import sys
from pathlib import Path

import pytest
from mpi4py import MPI


def main() -> int:
    logdir, args = Path(sys.argv[1]), sys.argv[2:]
    rank = MPI.COMM_WORLD.Get_rank()
    log = open(logdir / f"rank-{rank}.log", "w")  # noqa: SIM115
    sys.stdout = sys.stderr = log
    report = f"--junitxml={logdir / f'rank-{rank}.xml'}"  # each file's cases (test_mpi.py)
    code = int(pytest.main(["-p", "no:cacheprovider", "-q", "-rf", report, *args]))
    if code == pytest.ExitCode.NO_TESTS_COLLECTED:
        code = 0
    log.flush()
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    worst = MPI.COMM_WORLD.allreduce(code, op=MPI.MAX)
    if rank == 0:
        print(f"ranks agree: exit status {worst}")
    return worst


if __name__ == "__main__":
    sys.exit(main())
