"""Self-launch: ``coccl-bench <command> --np N ...`` re-runs itself on N ranks.

The parent process never initialises MPI. It runs
``mpiexec -n N <python> -m mpi4py -m coccl.bench.cli <the same arguments minus --np>``
and exits with mpiexec's status. ``python -m mpi4py`` makes an exception on one rank
abort the whole job instead of leaving the other ranks waiting in a collective.
The children learn from the environment what the user typed (for the JSON record) and
where the user's terminal can show a progress line (mpiexec pipes their output).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

COMMAND_ENV = "COCCL_BENCH_COMMAND"  # in children: the command line the user typed
LAUNCHER_ENV = "COCCL_BENCH_LAUNCHER"  # in children: the mpiexec command that started them
PROGRESS_ENV = "COCCL_BENCH_PROGRESS"  # in children: "stdout", "stderr" or "none"

# Set by the common launchers in every rank's environment (MPICH/Hydra, Intel MPI,
# Open MPI, PMIx); their presence means this process already is one rank of a job.
_RANK_VARIABLES = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK")


def under_mpiexec() -> bool:
    """Whether this process was started by an MPI launcher."""
    return any(name in os.environ for name in _RANK_VARIABLES)


def mpiexec() -> list[str]:
    """The mpiexec beside this Python (the mpich wheel installs one), else the one on
    PATH, with the flags Open MPI needs for more ranks than cores, and as root.

    Raises:
        RuntimeError: no mpiexec is found.
    """
    local = Path(sys.executable).parent / "mpiexec"
    exe = str(local) if local.exists() else shutil.which("mpiexec")
    if exe is None:
        raise RuntimeError("mpiexec not found: pip install mpich (or install an MPI)")
    try:
        version = subprocess.run(
            [exe, "--version"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        version = ""
    flags = []
    if "Open MPI" in version or "OpenRTE" in version:
        flags.append("--oversubscribe")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            flags.append("--allow-run-as-root")
    return [exe, *flags]


def strip_np(argv: list[str]) -> list[str]:
    """``argv`` without ``--np N`` / ``--np=N`` (what the ranks are given)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--np":
            skip = True
        elif not arg.startswith("--np="):
            out.append(arg)
    return out


def progress_stream() -> str:
    """Where a progress line may go: ``"stdout"`` when stdout is a terminal (then the
    table is there too, and one stream keeps the two in order: mpiexec forwards stdout
    and stderr separately and may reorder them), ``"stderr"`` when only stderr is,
    else ``"none"``. Children of ``--np`` are told what their parent's terminal is."""
    inherited = os.environ.get(PROGRESS_ENV)
    if inherited in ("stdout", "stderr", "none"):
        return inherited
    if sys.stdout.isatty():
        return "stdout"
    return "stderr" if sys.stderr.isatty() else "none"


def program_name() -> str:
    """How the user started this program: ``coccl-bench`` or ``python -m coccl.bench.cli``."""
    if Path(sys.argv[0]).name == "coccl-bench":
        return "coccl-bench"
    return "python -m coccl.bench.cli"


def invocation(argv: list[str]) -> tuple[str, str]:
    """``(command, launcher)`` for the record: the command line the user typed, and how
    the ranks were started (the mpiexec command of ``--np``, or ``"mpiexec"``)."""
    typed = os.environ.get(COMMAND_ENV)
    if typed is not None:
        return typed, os.environ.get(LAUNCHER_ENV, "--np")
    command = f"{program_name()} {shlex.join(argv)}".strip()
    return command, ("mpiexec" if under_mpiexec() else "none (one process)")


def relaunch(nprocs: int, argv: list[str]) -> int:
    """Run this command on ``nprocs`` ranks under mpiexec and return its exit status
    (128 + signal number if mpiexec was killed by a signal)."""
    ranks_argv = strip_np(argv)
    cmd = [
        *mpiexec(), "-n", str(nprocs), sys.executable, "-m", "mpi4py",
        "-m", "coccl.bench.cli", *ranks_argv,
    ]  # fmt: skip
    env = {
        **os.environ,
        COMMAND_ENV: f"{program_name()} {shlex.join(argv)}".strip(),
        LAUNCHER_ENV: f"--np {nprocs}: {shlex.join(cmd)}",
        PROGRESS_ENV: progress_stream(),
    }
    code = subprocess.run(cmd, env=env).returncode
    return 128 - code if code < 0 else code
