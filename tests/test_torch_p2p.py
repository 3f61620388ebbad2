"""Point-to-point and all-to-all of the torch.distributed backend "coccl"
(coccl/torch/p2p.py, coccl/torch/alltoall.py): tests/scripts/torch_p2p_cases.py on 4
ranks under torchrun, in one launch (rings of 4 and 3, the codec per direction, the
mismatches, all_to_all_single, a 2-stage GPipe schedule against a plain Gloo group)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mpi_launch import ROOT

pytest.importorskip("torch")

RANKS = ROOT / "tests" / "scripts" / "torch_ranks.py"
CASES = "tests/scripts/torch_p2p_cases.py"


@pytest.mark.launch
def test_p2p_cases_under_torchrun(tmp_path: Path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    try:
        proc = subprocess.run(
            [*torchrun, "--nproc-per-node", "4", str(RANKS), str(tmp_path), CASES],
            cwd=ROOT, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        code, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, out = -1, f"TIMEOUT (a hang is a failure)\n{exc.stdout or ''}{exc.stderr or ''}"
    logs = [f"----- {p.name} -----\n{p.read_text()[-20000:]}" for p in sorted(tmp_path.glob("*"))]
    assert code == 0, "\n".join([out[-5000:], *logs])
