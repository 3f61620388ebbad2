"""Self-launch: ``coccl-bench <command> --np N ...`` re-runs itself on N ranks.

The parent process never initialises MPI. It runs
``mpiexec -n N <python> -m mpi4py -m coccl.bench.cli <the same arguments minus --np>``
and exits with mpiexec's status. ``python -m mpi4py`` makes an exception on one rank
abort the whole job instead of leaving the other ranks waiting in a collective.
The children learn from the environment what the user typed (for the JSON record),
where the user's terminal can show a progress line (mpiexec pipes their output), and how
many ranks they should be: a launcher of another MPI than the one mpi4py loads (say the
mpich wheel's ``mpiexec`` with the system's Open MPI) starts N jobs of one rank each,
and the children say so instead of running N sweeps. ``--mpiexec CMD`` names the
launcher (``mpiexec``, ``srun --mpi=pmix``, ...).
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
NP_ENV = "COCCL_BENCH_NP"  # in children: the rank count --np asked for

# Set by the common launchers in every rank's environment (MPICH/Hydra, Intel MPI,
# Open MPI, PMIx); their presence means this process already is one rank of a job.
_RANK_VARIABLES = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK")


def under_mpiexec() -> bool:
    """Whether this process was started by an MPI launcher."""
    return any(name in os.environ for name in _RANK_VARIABLES)


def mpiexec(command: str | None = None) -> list[str]:
    """The launcher: ``command`` (``mpiexec``, ``srun --mpi=pmix``...) if given, else the
    mpiexec beside this Python (the mpich wheel installs one), else the one on PATH; with
    the flags Open MPI's needs for more ranks than cores, and as root.

    Raises:
        RuntimeError: no mpiexec is found.
    """
    if command:
        words = shlex.split(command)
    else:
        local = Path(sys.executable).parent / "mpiexec"
        found = str(local) if local.exists() else shutil.which("mpiexec")
        if found is None:
            raise RuntimeError("mpiexec not found: pip install mpich (or install an MPI)")
        words = [found]
    try:
        version = subprocess.run(
            [words[0], "--version"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        version = ""
    flags = []
    if "Open MPI" in version or "OpenRTE" in version:
        flags.append("--oversubscribe")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            flags.append("--allow-run-as-root")
    return [*words, *flags]


_LAUNCH_FLAGS = ("--np", "--mpiexec")  # the parent's, not the ranks'


def strip_launch_flags(argv: list[str]) -> list[str]:
    """``argv`` without ``--np N`` / ``--np=N`` and ``--mpiexec CMD`` (what the ranks
    are given)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _LAUNCH_FLAGS:
            skip = True
        elif not arg.startswith(tuple(f"{flag}=" for flag in _LAUNCH_FLAGS)):
            out.append(arg)
    return out


def world_mismatch(world_size: int) -> str | None:
    """In a child of ``--np N``: what is wrong if MPI's world is not N ranks (the
    launcher belongs to another MPI than the library mpi4py loaded), else None."""
    asked = os.environ.get(NP_ENV)
    if asked is None or int(asked) == world_size:
        return None
    launcher = os.environ.get(LAUNCHER_ENV, "mpiexec")
    return (
        f"--np {asked} started ranks that each see an MPI world of {world_size}: the "
        f"launcher ({launcher.split(': ', 1)[-1].split()[0]}) is not from the MPI library "
        "that mpi4py loaded. Name the matching one with --mpiexec (e.g. --mpiexec mpiexec "
        "for the system's), or run under it yourself: mpiexec -n N coccl-bench ..."
    )


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


def relaunch(nprocs: int, argv: list[str], launcher: str | None = None) -> int:
    """Run this command on ``nprocs`` ranks under ``launcher`` (see ``mpiexec``) and
    return its exit status (128 + signal number if it was killed by a signal)."""
    ranks_argv = strip_launch_flags(argv)
    cmd = [
        *mpiexec(launcher), "-n", str(nprocs), sys.executable, "-m", "mpi4py",
        "-m", "coccl.bench.cli", *ranks_argv,
    ]  # fmt: skip
    env = {
        **os.environ,
        COMMAND_ENV: f"{program_name()} {shlex.join(argv)}".strip(),
        LAUNCHER_ENV: f"--np {nprocs}: {shlex.join(cmd)}",
        PROGRESS_ENV: progress_stream(),
        NP_ENV: str(nprocs),
    }
    code = subprocess.run(cmd, env=env).returncode
    return 128 - code if code < 0 else code
