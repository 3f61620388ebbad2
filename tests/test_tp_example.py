"""Smoke run of examples/tp_gpt.py: 3 steps of the tiny GPT with TP = 2 under mpiexec,
against the PyTorch-only baseline of the same seed, data and steps."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mpi_launch import ROOT, mpiexec

pytest.importorskip("torch")

SCRIPT = ROOT / "examples" / "tp_gpt.py"
COMMON = ["--steps", "3", "--tiny", "--seed", "5", "--threads", "1"]


def run_example(cmd: list[str], tmp_path: Path, name: str) -> dict:
    out = tmp_path / f"{name}.json"
    proc = subprocess.run(
        [*cmd, *COMMON, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(out.read_text())
    # the same JSON is the last line of stdout
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == result
    return result


@pytest.mark.mpi
def test_tp2_identity_matches_baseline(tmp_path: Path) -> None:
    tp_cmd = [*mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", str(SCRIPT)]
    tp = run_example(
        [*tp_cmd, "--tp-compressor", "identity", "--tp-algorithm", "ring"], tmp_path, "tp"
    )
    base = run_example([sys.executable, str(SCRIPT), "--baseline"], tmp_path, "base")

    assert tp["mode"] == "tp" and tp["tp"] == 2
    assert tp["compressor"] == {"id": "identity"}
    assert tp["replicated_identical"] is True
    assert tp["replicated_params"] > 0
    assert tp["model"] == base["model"]
    assert [h["step"] for h in tp["history"]] == [h["step"] for h in base["history"]]
    # same initial weights, data and arithmetic up to float rounding
    assert tp["val_loss"] == pytest.approx(base["val_loss"], rel=1e-4)
    assert tp["train_loss"] == pytest.approx(base["train_loss"], rel=1e-4)


@pytest.mark.mpi
def test_tp2_compressed_replicas_stay_identical(tmp_path: Path) -> None:
    """With a lossy codec the loss moves a little, but replicas must not."""
    import coccl  # noqa: PLC0415

    if "taco" not in coccl.available_compressors():
        pytest.skip("taco not registered")
    tp_cmd = [*mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", str(SCRIPT)]
    tp = run_example(
        [*tp_cmd, "--tp-compressor", "taco", "--tp-algorithm", "two_shot"], tmp_path, "taco"
    )
    assert tp["compressor"]["id"] == "taco"
    assert tp["replicated_identical"] is True
    assert 0.0 < tp["val_loss"] < 6.0  # finite and near ln(256) = 5.5 after 3 steps


@pytest.mark.mpi
def test_virtual_tp2_equals_real_tp2(tmp_path: Path) -> None:
    """--virtual-tp 2 (one process) trains bitwise like two real ranks under mpiexec."""
    args = ["--tp-compressor", "taco", "--tp-algorithm", "two_shot", "--log-every", "1"]
    tp_cmd = [*mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", str(SCRIPT)]
    real = run_example([*tp_cmd, *args], tmp_path, "real")
    virtual = run_example([sys.executable, str(SCRIPT), "--virtual-tp", "2", *args], tmp_path, "v")
    assert virtual["mode"] == "virtual" and virtual["tp"] == 2
    assert virtual["history"] == real["history"]
    assert virtual["train_loss"] == real["train_loss"]
