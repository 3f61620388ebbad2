"""Shared pytest configuration.

tests/mpi/ holds tests that run on several ranks; plain ``pytest`` does not collect them
directly: tests/test_mpi.py launches them under ``mpiexec -n N python -m mpi4py`` for
N = 1, 2, 3, 4 (see tests/mpi_launch.py).
"""

import os

collect_ignore = [] if os.environ.get("COCCL_UNDER_MPIEXEC") else ["mpi"]
