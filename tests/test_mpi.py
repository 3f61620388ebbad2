"""Run the multi-rank test files of tests/mpi/ on 1, 2, 3 and 4 ranks, one case each.

Files named in SLOW carry the ``slow`` marker (``pytest -m "not slow"`` leaves them out).
"""

from pathlib import Path

import pytest

from gpu import GPU
from mpi_launch import run_ranks

SLOW = {"test_soak.py"}
FILES = [
    pytest.param(name, marks=pytest.mark.slow) if name in SLOW else name
    for name in sorted(p.name for p in (Path(__file__).parent / "mpi").glob("test_*.py"))
]


@pytest.mark.mpi
@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
@pytest.mark.parametrize("name", FILES)
def test_on_ranks(name: str, nranks: int, tmp_path: Path) -> None:
    if "gpu" in name and not GPU:
        pytest.skip("needs CuPy and a CUDA GPU")
    code, logs = run_ranks(nranks, [f"tests/mpi/{name}"], tmp_path)
    assert code == 0, f"{name} failed on {nranks} ranks:\n{logs}"
