"""Every ``COCCL_*`` environment variable, defined, documented and validated in one place.

Values are read when asked for (not at import), so a test or a launcher can set them
before the first collective. A malformed value raises ``ValueError`` naming the variable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# name -> (default, help). Defaults are the measured ones (bench/NOTES.md says how).
_VARS: dict[str, tuple[str, str]] = {
    "COCCL_CHUNK_BYTES": (
        "4194304",
        "pipeline chunk size in bytes of input data; each chunk is one payload on the wire "
        "(unset: 4 MiB; device data staged through pinned host memory: 8 MiB, or, for "
        "compressed data, 4M elements once each rank's shard holds four of them; device "
        "data over NCCL: up to 16M elements, as many as keep two rounds within the "
        "staging limit)",
    ),
    "COCCL_PIPELINE_DEPTH": ("4", "how many chunk rounds may be in flight at once (>= 1)"),
    "COCCL_STAGING_LIMIT_BYTES": (
        "268435456",
        "upper bound on the extra device + pinned host memory a collective's pipeline uses",
    ),
    "COCCL_TIMEOUT_S": (
        "",
        "if set, a collective waiting longer than this many seconds for a peer raises CocclError",
    ),
    "COCCL_MPI_CUDA_AWARE": (
        "auto",
        "'1' to hand device buffers to MPI directly, '0' to stage through pinned host memory",
    ),
    "COCCL_CPU_THREADS": (
        "",
        "threads for the numba CPU codec kernels (default: cores / local ranks)",
    ),
}


def describe() -> dict[str, str]:
    """Return ``{name: help}`` for every variable coccl reads."""
    return {name: help_ for name, (_, help_) in _VARS.items()}


def _raw(name: str) -> str:
    return os.environ.get(name, _VARS[name][0]).strip()


def _int(name: str, minimum: int) -> int:
    raw = _raw(name)
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    return value


@dataclass(frozen=True)
class Settings:
    """A snapshot of the environment, validated."""

    chunk_bytes: int
    chunk_bytes_set: bool  # COCCL_CHUNK_BYTES given explicitly
    pipeline_depth: int
    staging_limit_bytes: int
    timeout_s: float | None
    mpi_cuda_aware: bool | None  # None: ask the MPI library
    cpu_threads: int | None


def settings() -> Settings:
    """Read and validate every ``COCCL_*`` variable now."""
    timeout_raw = _raw("COCCL_TIMEOUT_S")
    timeout: float | None = None
    if timeout_raw:
        try:
            timeout = float(timeout_raw)
        except ValueError:
            raise ValueError(f"COCCL_TIMEOUT_S={timeout_raw!r} is not a number") from None
        if not timeout > 0:
            raise ValueError(f"COCCL_TIMEOUT_S={timeout_raw!r} must be > 0")
    aware_raw = _raw("COCCL_MPI_CUDA_AWARE").lower()
    if aware_raw not in ("auto", "0", "1"):
        raise ValueError(f"COCCL_MPI_CUDA_AWARE={aware_raw!r} must be auto, 0 or 1")
    threads_raw = _raw("COCCL_CPU_THREADS")
    return Settings(
        chunk_bytes=_int("COCCL_CHUNK_BYTES", 1),
        chunk_bytes_set=bool(os.environ.get("COCCL_CHUNK_BYTES", "").strip()),
        pipeline_depth=_int("COCCL_PIPELINE_DEPTH", 1),
        staging_limit_bytes=_int("COCCL_STAGING_LIMIT_BYTES", 1 << 20),
        timeout_s=timeout,
        mpi_cuda_aware=None if aware_raw == "auto" else aware_raw == "1",
        cpu_threads=_int("COCCL_CPU_THREADS", 1) if threads_raw else None,
    )
