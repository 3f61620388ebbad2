"""Every ``COCCL_*`` environment variable, defined, documented and validated in one place.

Values are read when a communicator is created (not at import), so a test or a launcher
can set them before ``coccl.init``. A malformed value raises ``ValueError`` naming the
variable; sizes take K/M/G suffixes (binary, as ``coccl-bench -b``: ``4M`` = 4194304). A
``COCCL_*`` name that is no setting (a typo) gets a warning naming the closest one.
Settings that shape a collective's schedule (chunking, depth, staging limit) must be the
same on every rank: ``coccl.init`` compares them and refuses a mismatch
(``SCHEDULE_SETTINGS``). ``COCCL_LOG`` sends the ``coccl`` logger to stderr, each line
prefixed ``host:pid:rank`` as NCCL_DEBUG's are.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import socket
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

# Rounds of one call in flight at most: more buys no overlap (each round already overlaps
# the next chunk's codec work) and only grows the staging window.
MAX_PIPELINE_DEPTH = 64

# name -> (default, help). Defaults are the measured ones (bench/NOTES.md says how).
_VARS: dict[str, tuple[str, str]] = {
    "COCCL_CHUNK_BYTES": (
        "4194304",
        "pipeline chunk size in bytes of input data; each chunk is one payload on the wire "
        "(unset: 4 MiB for host data; device data staged through pinned host memory: "
        "8 MiB, or, for compressed data, 4M elements once each rank's shard holds four of "
        "them; device data over NCCL: see coccl.communicator.sizing)",
    ),
    "COCCL_PIPELINE_DEPTH": (
        "4",
        f"how many chunk rounds may be in flight at once (1 to {MAX_PIPELINE_DEPTH})",
    ),
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
        "a logging level (debug, info, warning) for the 'coccl' logger, written to stderr "
        "with host:pid:rank before each line; debug says which path each new call takes "
        "and why",
    ),
    "COCCL_LOCAL_SIZE": (
        "",
        "ranks per node for the two-level (hierarchical) schedules, the same on every rank "
        "(unset: the ranks that share a host); lets one machine emulate several nodes",
    ),
}
# The variables given in bytes: a count with an optional K, M or G suffix (parse_size).
SIZE_VARIABLES = ("COCCL_CHUNK_BYTES", "COCCL_STAGING_LIMIT_BYTES", "COCCL_PLAN_CACHE_BYTES")
# Names coccl's own tools set for the processes they start (not settings, never warned
# about): the test launcher's mark, the soak test's length, and every COCCL_BENCH_* name
# coccl-bench gives its ranks (coccl.bench.launch).
TOOL_VARIABLES = ("COCCL_UNDER_MPIEXEC", "COCCL_SOAK_CALLS")
TOOL_PREFIXES = ("COCCL_BENCH_",)

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


_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_SCALE = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """A byte count with an optional binary suffix, as nccl-tests reads it: ``8``,
    ``1K`` = 1024, ``64M``, ``1.5G``, also ``4KiB`` / ``2MB`` (binary too). The one parser
    of sizes: ``COCCL_*`` sizes and ``coccl-bench``'s ``-b``/``-e`` flags.

    Raises:
        ValueError: not a non-negative whole number of bytes.
    """
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(
            f"invalid size {text!r}: use a byte count with an optional K, M or G suffix"
        )
    value = float(match.group(1)) * _SCALE[match.group(2).lower()]
    if value != int(value):
        raise ValueError(f"invalid size {text!r}: not a whole number of bytes")
    return int(value)


def _raw(name: str) -> str:
    """The variable's value; unset or empty means its default."""
    return os.environ.get(name, "").strip() or _VARS[name][0]


def _int(name: str, minimum: int, maximum: int | None = None) -> int:
    raw = _raw(name)
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name}={value} must be <= {maximum}")
    return value


def _size(name: str, minimum: int) -> int:
    raw = _raw(name)
    try:
        value = parse_size(raw)
    except ValueError as exc:
        raise ValueError(f"{name}={raw!r}: {exc}") from None
    if value < minimum:
        raise ValueError(f"{name}={raw!r} must be >= {minimum} bytes")
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
    local_size: int | None  # None: nodes from the hosts


def _timeout() -> float:
    raw = _raw("COCCL_TIMEOUT_S")
    try:
        timeout = float(raw)
    except ValueError:
        raise ValueError(f"COCCL_TIMEOUT_S={raw!r} is not a number") from None
    if not timeout > 0:
        raise ValueError(f"COCCL_TIMEOUT_S={raw!r} must be > 0 (or inf)")
    return timeout


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """One line for each ``COCCL_*`` name in ``environ`` that is neither a setting nor
    one of coccl's tools' own names, naming the closest setting."""
    lines = []
    for name in sorted(environ):
        if not name.startswith("COCCL_") or name in _VARS or name in TOOL_VARIABLES:
            continue
        if name.startswith(TOOL_PREFIXES):
            continue
        close = difflib.get_close_matches(name, list(_VARS), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else "coccl's settings: coccl/config.py"
        lines.append(f"{name} is not a coccl setting and is ignored ({hint})")
    return lines


def settings() -> Settings:
    """Read and validate every ``COCCL_*`` variable now; warn (``UserWarning``, once
    per name) about a ``COCCL_*`` name that is no setting."""
    for line in unknown_variables(os.environ):
        warnings.warn(line, UserWarning, stacklevel=2)
    aware = _choice("COCCL_MPI_CUDA_AWARE", ("auto", "0", "1"))
    threads_raw = _raw("COCCL_CPU_THREADS")
    limit_set = bool(_raw("COCCL_STAGING_LIMIT_BYTES"))
    log_level = _raw("COCCL_LOG").lower()
    if log_level and not isinstance(logging.getLevelName(log_level.upper()), int):
        raise ValueError(f"COCCL_LOG={log_level!r} is not a logging level (debug, info, ...)")
    return Settings(
        chunk_bytes=_size("COCCL_CHUNK_BYTES", 1),
        chunk_bytes_set=bool(os.environ.get("COCCL_CHUNK_BYTES", "").strip()),
        pipeline_depth=_int("COCCL_PIPELINE_DEPTH", 1, MAX_PIPELINE_DEPTH),
        staging_limit_bytes=_size("COCCL_STAGING_LIMIT_BYTES", 1 << 20) if limit_set else None,
        timeout_s=_timeout(),
        mpi_cuda_aware=None if aware == "auto" else aware == "1",
        cpu_threads=_int("COCCL_CPU_THREADS", 1) if threads_raw else None,
        forward_from_pinned=_flag("COCCL_FORWARD_FROM_PINNED"),
        graphs=_flag("COCCL_GRAPHS"),
        plan_cache_bytes=_size("COCCL_PLAN_CACHE_BYTES", 0),
        check_calls=_flag("COCCL_CHECK_CALLS"),
        nccl_gather=_choice("COCCL_NCCL_GATHER", GATHERS),
        link=_choice("COCCL_LINK", LINKS),
        log_level=log_level,
        local_size=_int("COCCL_LOCAL_SIZE", 1) if _raw("COCCL_LOCAL_SIZE") else None,
    )


# The rank a log line names: the launcher's (the process's rank in its world, the same
# for every communicator it makes), else the one set_log_rank was given.
_LAUNCHER_RANKS = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
_log_rank: int | None = None


def set_log_rank(rank: int | None) -> None:
    """The rank that ``coccl`` log lines name where no launcher said it (called when a
    communicator is set up; None: unknown again)."""
    global _log_rank
    _log_rank = rank


def log_rank() -> str:
    """The rank log lines name: the launcher's (``RANK``, ``PMI_RANK``, ...), else the
    one given to ``set_log_rank``, else ``-``."""
    for name in _LAUNCHER_RANKS:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return value
    return "-" if _log_rank is None else str(_log_rank)


class RankFilter(logging.Filter):
    """Adds ``coccl_where`` = ``host:pid:rank`` (as NCCL_DEBUG prefixes its lines) to
    every record the handler writes; the pid is read per record (a fork has its own)."""

    def filter(self, record: logging.LogRecord) -> bool:
        host = socket.gethostname().split(".")[0]
        record.coccl_where = f"{host}:{os.getpid()}:{log_rank()}"
        return True


LOG_FORMAT = "%(coccl_where)s coccl %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    """Send the 'coccl' logger's records at ``level`` and above to stderr (COCCL_LOG),
    each line starting ``host:pid:rank``."""
    if not level:
        return
    logger = logging.getLogger("coccl")
    logger.setLevel(level.upper())
    if not any(getattr(h, "coccl_handler", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        # on the handler, not the logger: a logger's filters skip its children's records
        handler.addFilter(RankFilter())
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
