"""Shared pytest configuration.

tests/mpi/ holds tests that run on several ranks; plain ``pytest`` does not collect them
directly: tests/test_mpi.py launches them under ``mpiexec -n N python -m mpi4py`` for
N = 1, 2, 3, 4 (see tests/mpi_launch.py).

A test that starts processes of its own is marked ``launch`` (every ``mpi`` test is, here),
so that the quick subset, ``pytest -m "not slow and not launch"``, starts none.
"""

import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

collect_ignore = [] if os.environ.get("COCCL_UNDER_MPIEXEC") else ["mpi"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """An ``mpi`` test launches mpiexec: it is a ``launch`` test too."""
    for item in items:
        if item.get_closest_marker("mpi") and not item.get_closest_marker("launch"):
            item.add_marker(pytest.mark.launch)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Before a session that launches processes, compile the numba kernels into numba's
    on-disk cache once (tests/numba_warmup.py, one worker a core), so that the ranks of
    a fresh clone's first multi-rank tests load them instead of each compiling them. A
    session without ``launch`` tests compiles each kernel once anyway, on first use."""
    if os.environ.get("COCCL_UNDER_MPIEXEC") or not any(
        item.get_closest_marker("launch") for item in session.items
    ):
        return
    script = Path(__file__).with_name("numba_warmup.py")
    with tempfile.TemporaryDirectory() as claims:
        cmd = [sys.executable, str(script), claims]
        procs = [
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for _ in range(min(4, os.cpu_count() or 1))
        ]
        for proc in procs:
            out = proc.communicate(timeout=900)[0]
            if proc.returncode != 0:  # the tests that use the kernel will fail and say why
                warnings.warn(f"numba warm-up failed:\n{out[-4000:]}", stacklevel=1)


# One-rank communicators over MPI.COMM_SELF for the GPU test files (one per module):
# ``ncomm`` over NCCL, ``mcomm`` over MPI (device data staged through the host).
@pytest.fixture(scope="module")
def ncomm():
    from mpi4py import MPI

    import coccl

    with coccl.init(MPI.COMM_SELF, backend="nccl") as c:
        yield c


@pytest.fixture(scope="module")
def mcomm():
    from mpi4py import MPI

    import coccl

    with coccl.init(MPI.COMM_SELF, backend="mpi") as c:
        yield c
