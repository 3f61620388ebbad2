"""Shared pytest configuration.

tests/mpi/ holds tests that run on several ranks; plain ``pytest`` does not collect them
directly: tests/test_mpi.py launches them under ``mpiexec -n N python -m mpi4py`` for
N = 1, 2, 3, 4 (see tests/mpi_launch.py).

A test that starts processes of its own is marked ``launch`` (every ``mpi`` test is, here),
so that the quick subset, ``pytest -m "not slow and not launch"``, starts none.
"""

import os

import pytest

collect_ignore = [] if os.environ.get("COCCL_UNDER_MPIEXEC") else ["mpi"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """An ``mpi`` test launches mpiexec: it is a ``launch`` test too."""
    for item in items:
        if item.get_closest_marker("mpi") and not item.get_closest_marker("launch"):
            item.add_marker(pytest.mark.launch)


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
