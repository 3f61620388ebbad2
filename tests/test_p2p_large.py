"""tests/mpi/large_p2p.py on 2 ranks: point-to-point messages beyond 2**31 bytes."""

from pathlib import Path

import pytest

from mpi_launch import run_ranks


@pytest.mark.mpi
@pytest.mark.launch
def test_p2p_beyond_2_31_bytes_on_two_ranks(tmp_path: Path) -> None:
    code, logs = run_ranks(2, ["tests/mpi/large_p2p.py"], tmp_path)
    assert code == 0, f"large_p2p.py failed on 2 ranks:\n{logs}"
