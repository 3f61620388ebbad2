"""Launch a pytest run on N ranks under ``mpiexec ... python -m mpi4py``.

``python -m mpi4py`` aborts the whole job when a rank raises outside pytest's control,
and a wall-clock limit turns any hang into a failure. Each rank writes its own log;
on failure every rank's log is shown.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def mpiexec() -> list[str]:
    """The mpiexec beside this Python (the mpich wheel installs one), else on PATH; with
    the flags Open MPI needs to run several ranks on a small machine or as root."""
    local = Path(sys.executable).parent / "mpiexec"
    exe = str(local) if local.exists() else shutil.which("mpiexec")
    if exe is None:
        raise RuntimeError("mpiexec not found: pip install mpich (or install an MPI)")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    flags = []
    if "Open MPI" in version or "OpenRTE" in version:
        flags = ["--oversubscribe"]
        if os.geteuid() == 0:
            flags.append("--allow-run-as-root")
    return [exe, *flags]


def run_ranks(
    nranks: int, args: list[str], logdir: Path, timeout: float = 900, env: dict | None = None
) -> tuple[int, str]:
    """Run ``tests/mpi/rank_main.py`` (pytest on every rank) and return (code, logs)."""
    logdir.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "COCCL_UNDER_MPIEXEC": "1", **(env or {})}
    cmd = [
        *mpiexec(),
        "-n",
        str(nranks),
        sys.executable,
        "-m",
        "mpi4py",
        str(ROOT / "tests" / "mpi" / "rank_main.py"),
        str(logdir),
        *args,
    ]
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout
        )
        code, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        code = -1
        out = (
            f"TIMEOUT after {timeout} s (a hang is a failure)\n{exc.stdout or ''}{exc.stderr or ''}"
        )
    logs = [out]
    for log in sorted(logdir.glob("rank-*.log")):
        logs.append(f"----- {log.name} -----\n{log.read_text()[-20000:]}")
    return code, "\n".join(logs)
