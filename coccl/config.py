"""Every ``COCCL_*`` environment variable, defined, documented and validated in one place.

Values are read when a communicator is created (not at import), so a test or a launcher
can set them before ``coccl.init``. A malformed value raises ``ValueError`` naming the
variable. Settings that shape a collective's schedule (chunking, depth, staging limit) must
be the same on every rank: ``coccl.init`` compares them and refuses a mismatch
(``SCHEDULE_SETTINGS``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

# name -> (default, help). Defaults are the measured ones (bench/NOTES.md says how).
_VARS: dict[str, tuple[str, str]] = {
    "COCCL_CHUNK_BYTES": (
        "4194304",
        "pipeline chunk size in bytes of input data; each chunk is one payload on the wire "
        "(unset: 4 MiB for host data; device data staged through pinned host memory: "
        "8 MiB, or, for compressed data, 4M elements once each rank's shard holds four of "
        "them; device data over NCCL: see coccl.communicator.sizing)",
    ),
    "COCCL_PIPELINE_DEPTH": ("4", "how many chunk rounds may be in flight at once (>= 1)"),
    "COCCL_STAGING_LIMIT_BYTES": (
        "",
        "upper bound on the extra device + pinned host memory a collective's pipeline uses "
        "(unset: 256 MiB; over NCCL, where it is device memory only, 1 GiB)",
    ),
    "COCCL_TIMEOUT_S": (
        "600",
        "a collective that waits longer than this many seconds for a peer raises CocclError "
        "and leaves the communicator unusable ('inf': never)",
    ),
    "COCCL_MPI_CUDA_AWARE": (
        "auto",
        "'1' to hand device buffers to MPI directly, '0' to stage through pinned host memory",
    ),
    "COCCL_CPU_THREADS": (
        "",
        "threads for the numba CPU codec kernels (default: cores / local ranks)",
    ),
    "COCCL_FORWARD_FROM_PINNED": (
        "1",
        "staged MPI: '1' forwards a ring AllGather payload from the pinned copy it arrived "
        "in, '0' copies it back from the device first (an A/B switch for benchmarks)",
    ),
    "COCCL_GRAPHS": (
        "1",
        "over NCCL: '1' records a collective's whole schedule as a CUDA graph after its "
        "first call and replays it (with a lossy codec on the caller's buffers, at every "
        "size; otherwise through copies, below coccl.communicator.sizing's REPLAY_MAX_BYTES: "
        "128 MiB on NVLink, 64 MiB on other links); '0' always runs it from the host",
    ),
    "COCCL_PLAN_CACHE_BYTES": (
        "4294967296",
        "upper bound on the device memory that cached plans (the buffers their CUDA graphs "
        "use) hold; the least recently used plans are evicted beyond it",
    ),
    "COCCL_CHECK_CALLS": (
        "0",
        "'1': every call (not only a plan's first) checks that all ranks make the same call "
        "(a debugging aid; costs a small exchange per call)",
    ),
    "COCCL_NCCL_GATHER": (
        "auto",
        "over NCCL, the AllGather phase of a compressed two-shot AllReduce: p2p (grouped "
        "sends and receives), allgather (one ncclAllGather of payload slots), or auto (the "
        "faster one measured on the link, coccl.algorithms.auto)",
    ),
    "COCCL_LINK": (
        "auto",
        "the link class NCCL uses between the ranks, for auto's choice: nvlink, pcie, shm, "
        "net, or auto (detected at init from NCCL_P2P_DISABLE/NCCL_SHM_DISABLE and the GPUs)",
    ),
    "COCCL_LOG": (
        "",
        "a logging level (debug, info, warning) for the 'coccl' logger, written to stderr; "
        "debug says which path each new call takes and why",
    ),
}

# Settings whose value changes which messages a collective sends: every rank must agree.
SCHEDULE_SETTINGS = (
    "chunk_bytes",
    "chunk_bytes_set",
    "pipeline_depth",
    "staging_limit_bytes",
    "graphs",
    "nccl_gather",
)
# The classes of link NCCL can use between ranks, fastest first (coccl.transports.nccl).
LINK_CLASSES = ("nvlink", "pcie", "shm", "socket", "net")
LINKS = ("auto", *LINK_CLASSES)
GATHERS = ("auto", "p2p", "allgather")


def _raw(name: str) -> str:
    """The variable's value; unset or empty means its default."""
    return os.environ.get(name, "").strip() or _VARS[name][0]


def _int(name: str, minimum: int) -> int:
    raw = _raw(name)
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    return value


def _flag(name: str) -> bool:
    raw = _raw(name)
    if raw not in ("0", "1"):
        raise ValueError(f"{name}={raw!r} must be 0 or 1")
    return raw == "1"


def _choice(name: str, choices: tuple[str, ...]) -> str:
    raw = _raw(name).lower()
    if raw not in choices:
        raise ValueError(f"{name}={raw!r} must be one of {', '.join(choices)}")
    return raw


@dataclass(frozen=True)
class Settings:
    """A snapshot of the environment, validated."""

    chunk_bytes: int
    chunk_bytes_set: bool  # COCCL_CHUNK_BYTES given explicitly
    pipeline_depth: int
    staging_limit_bytes: int | None  # None: unset, coccl.communicator.sizing's default
    timeout_s: float  # may be inf
    mpi_cuda_aware: bool | None  # None: ask the MPI library
    cpu_threads: int | None
    forward_from_pinned: bool
    graphs: bool
    plan_cache_bytes: int
    check_calls: bool
    nccl_gather: str
    link: str
    log_level: str


def _timeout() -> float:
    raw = _raw("COCCL_TIMEOUT_S")
    try:
        timeout = float(raw)
    except ValueError:
        raise ValueError(f"COCCL_TIMEOUT_S={raw!r} is not a number") from None
    if not timeout > 0:
        raise ValueError(f"COCCL_TIMEOUT_S={raw!r} must be > 0 (or inf)")
    return timeout


def settings() -> Settings:
    """Read and validate every ``COCCL_*`` variable now."""
    aware = _choice("COCCL_MPI_CUDA_AWARE", ("auto", "0", "1"))
    threads_raw = _raw("COCCL_CPU_THREADS")
    limit_set = bool(_raw("COCCL_STAGING_LIMIT_BYTES"))
    log_level = _raw("COCCL_LOG").lower()
    if log_level and not isinstance(logging.getLevelName(log_level.upper()), int):
        raise ValueError(f"COCCL_LOG={log_level!r} is not a logging level (debug, info, ...)")
    return Settings(
        chunk_bytes=_int("COCCL_CHUNK_BYTES", 1),
        chunk_bytes_set=bool(os.environ.get("COCCL_CHUNK_BYTES", "").strip()),
        pipeline_depth=_int("COCCL_PIPELINE_DEPTH", 1),
        staging_limit_bytes=_int("COCCL_STAGING_LIMIT_BYTES", 1 << 20) if limit_set else None,
        timeout_s=_timeout(),
        mpi_cuda_aware=None if aware == "auto" else aware == "1",
        cpu_threads=_int("COCCL_CPU_THREADS", 1) if threads_raw else None,
        forward_from_pinned=_flag("COCCL_FORWARD_FROM_PINNED"),
        graphs=_flag("COCCL_GRAPHS"),
        plan_cache_bytes=_int("COCCL_PLAN_CACHE_BYTES", 0),
        check_calls=_flag("COCCL_CHECK_CALLS"),
        nccl_gather=_choice("COCCL_NCCL_GATHER", GATHERS),
        link=_choice("COCCL_LINK", LINKS),
        log_level=log_level,
    )


def configure_logging(level: str) -> None:
    """Send the 'coccl' logger's records at ``level`` and above to stderr (COCCL_LOG)."""
    if not level:
        return
    logger = logging.getLogger("coccl")
    logger.setLevel(level.upper())
    if not any(getattr(h, "coccl_handler", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("coccl %(levelname)s %(name)s: %(message)s"))
        handler.coccl_handler = True  # type: ignore[attr-defined]
        logger.addHandler(handler)


# The variable behind each of SCHEDULE_SETTINGS, for messages that name it.
SETTING_VARIABLES = {
    "chunk_bytes": "COCCL_CHUNK_BYTES",
    "chunk_bytes_set": "COCCL_CHUNK_BYTES (set or not)",
    "pipeline_depth": "COCCL_PIPELINE_DEPTH",
    "staging_limit_bytes": "COCCL_STAGING_LIMIT_BYTES",
    "graphs": "COCCL_GRAPHS",
    "nccl_gather": "COCCL_NCCL_GATHER",
}
# Launchers' variables that give the job's rank count: a 1-rank MPI world under one of
# them is a launch mistake (mpi4py built against another MPI, torchrun without mpiexec).
LAUNCHER_SIZES = (
    ("WORLD_SIZE", "torchrun / torch.distributed"),
    ("OMPI_COMM_WORLD_SIZE", "Open MPI's mpiexec"),
    ("PMI_SIZE", "MPICH's mpiexec (Hydra)"),
    ("PMIX_SIZE", "a PMIx launcher"),
    ("SLURM_STEP_NUM_TASKS", "Slurm's srun"),
)
# Launchers' variables that give this process's rank under mpiexec (coccl.torch reads
# torch's environment from MPI when one of them is set).
MPI_LAUNCHER_RANKS = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
