"""A failing rank ends the whole job with a non-zero exit and its error on stderr, never
a hang; with COCCL_TIMEOUT_S a missing or mismatched peer is named."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpi_launch import mpiexec

SCRIPT = Path(__file__).parent / "scripts" / "failing_rank.py"


def run_job(mode: str, algorithm: str = "ring", timeout_s: str = "", limit: float = 120):
    env = {**os.environ, "COCCL_TIMEOUT_S": timeout_s}
    cmd = [*mpiexec(), "-n", "3", sys.executable, "-m", "mpi4py", str(SCRIPT), mode, algorithm]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


@pytest.mark.mpi
def test_raising_rank_aborts_the_job():
    code, out, elapsed = run_job("raise")
    assert code != 0
    assert "rank 1 failed on purpose" in out
    assert "finished" not in out


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["ring", "two_shot", "native"])
def test_absent_peer_times_out_before_any_byte_moves(algorithm):
    """A rank that never makes the call: the others time out agreeing on the call's plan."""
    code, out, elapsed = run_job("absent", algorithm, timeout_s="3")
    assert code != 0
    assert "CocclError" in out and "timed out after 3 s" in out
    assert "same allreduce call" in out
    assert elapsed < 55, "the job must end on the timeout, not when the peer gives up"


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["ring", "two_shot", "native"])
def test_peer_absent_mid_call_times_out_and_breaks_the_communicator(algorithm):
    """A rank that skips a call whose plan exists: the others time out in the middle of
    the collective (naming the step and the peer for coccl's schedules, MPI's own
    collective for native), and the communicator then refuses every call."""
    code, out, elapsed = run_job("late", algorithm, timeout_s="3")
    assert code != 0
    assert "first error" in out and "timed out after 3 s" in out
    if algorithm == "native":
        assert "MPI_Allreduce" in out
    else:
        assert "chunk" in out and "rank 1" in out
    assert "unusable after an earlier failure" in out
    assert elapsed < 55


@pytest.mark.mpi
@pytest.mark.parametrize("algorithm", ["ring", "two_shot"])
def test_mismatched_count_is_an_error_naming_it(algorithm):
    code, out, _ = run_job("mismatch", algorithm, timeout_s="10")
    assert code != 0
    assert "CocclError" in out and "do not make the same allreduce call" in out
    assert "count: rank 0 100000, rank 1 50000" in out
