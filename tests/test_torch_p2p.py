"""Point-to-point and all-to-all of the torch.distributed backend "coccl"
(coccl/torch/p2p.py, coccl/torch/alltoall.py): tests/scripts/torch_p2p_cases.py on 4
ranks under torchrun, in one launch (rings of 4 and 3, the codec per direction, the
mismatches, all_to_all_single, a 2-stage GPipe schedule against a plain Gloo group);
tests/scripts/torch_p2p_gpu_cases.py on 2 ranks sharing a GPU where there is one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mpi_launch import ROOT

torch = pytest.importorskip("torch")

RANKS = ROOT / "tests" / "scripts" / "torch_ranks.py"
CASES = "tests/scripts/torch_p2p_cases.py"


def run_cases(cases: str, ranks: int, logdir: Path) -> None:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    try:
        proc = subprocess.run(
            [*torchrun, "--nproc-per-node", str(ranks), str(RANKS), str(logdir), cases],
            cwd=ROOT, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        code, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, out = -1, f"TIMEOUT (a hang is a failure)\n{exc.stdout or ''}{exc.stderr or ''}"
    logs = [f"----- {p.name} -----\n{p.read_text()[-20000:]}" for p in sorted(logdir.glob("*"))]
    assert code == 0, "\n".join([out[-5000:], *logs])


@pytest.mark.launch
def test_p2p_cases_under_torchrun(tmp_path: Path):
    run_cases(CASES, 4, tmp_path)


@pytest.mark.launch
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_p2p_gpu_cases_two_ranks_sharing_a_gpu(tmp_path: Path):
    run_cases("tests/scripts/torch_p2p_gpu_cases.py", 2, tmp_path)
