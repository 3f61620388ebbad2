"""What rank 0 writes: the nccl-tests-style table, the JSON record (with where and from
which commit it was measured) and the progress line.

The table keeps nccl-tests' columns and conventions (``#`` before header lines, sizes
in bytes, times in microseconds, bandwidths in GB/s = 1e9 B/s) and adds coccl's: the
algorithm and compressor of the row, the compression ratio, the relative error against
an exact reduction, and the native baseline of the same run with the speedup over it.
"""

from __future__ import annotations

import datetime
import json
import math
import platform
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO


@dataclass
class Row:
    """One measured (size, algorithm, compressor) of a sweep.

    Sizes and counts follow nccl-tests: for AllReduce ``size = count * typesize``; for
    ReduceScatter and AllGather ``size`` and ``count`` are the whole buffer of all
    ranks (each rank contributes or receives ``count / nranks`` elements).

    Attributes:
        size: bytes. count: elements. type: dtype name. redop: op (``none`` for AllGather).
        algorithm, compressor: what ran.
        time_us, algbw, busbw: out-of-place: the slowest rank's median time in
            microseconds, ``size / time`` and the bus bandwidth, in GB/s.
        time_us_inplace, algbw_inplace, busbw_inplace: the same, in place.
        ratio: bytes all ranks sent with this compressor / bytes they sent with
            identity on the same algorithm (1.0 for native; None if nothing was sent).
        rel_err: ``||y - ref|| / ||ref||`` against an exact float64 reduction, worst
            over ranks and over out-of-place and in-place (None when not checked).
        native_time_us: the native baseline's out-of-place time at this size (None if
            the transport has no native collective for this dtype and op).
        speedup: ``native_time_us / time_us``.
        peak_staging_bytes: peak extra pool memory (host + pinned + device) a rank's
            pipeline held during this row's calls, largest over ranks.
        overlap_efficiency: ``max(codec-only, transport-only) / pipelined`` time from
            ``Communicator.overlap_profile`` (None unless measured: ``--overlap-min``).
        overlap_times_us: that profile's three times (pipelined, codec_only,
            transport_only), slowest rank's medians, in microseconds.
        backend: the transport that ran it (``mpi`` or ``nccl``).
    """

    size: int
    count: int
    type: str
    redop: str
    algorithm: str
    compressor: str
    time_us: float
    algbw: float
    busbw: float
    time_us_inplace: float
    algbw_inplace: float
    busbw_inplace: float
    ratio: float | None
    rel_err: float | None
    native_time_us: float | None
    speedup: float | None
    peak_staging_bytes: int
    overlap_efficiency: float | None = None
    overlap_times_us: dict[str, float] | None = None
    backend: str = ""  # the communicator's backend (mpi, nccl) that ran the row


# (title, unit, width) of each column, in order; the first two lines of the header.
_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("size", "(B)", 12),
    ("count", "(elements)", 12),
    ("type", "", 9),
    ("redop", "", 6),
    ("algorithm", "", 10),
    ("compressor", "", 10),
    ("time", "(us)", 11),
    ("algbw", "(GB/s)", 7),
    ("busbw", "(GB/s)", 7),
    ("time", "(us)", 11),
    ("algbw", "(GB/s)", 7),
    ("busbw", "(GB/s)", 7),
    ("ratio", "", 6),
    ("rel_err", "", 9),
    ("native", "(us)", 11),
    ("speedup", "", 7),
    ("overlap", "", 7),
)
_GROUPS = (("out-of-place", 6, 9), ("in-place", 9, 12))  # (title, first col, end col)


def _line(cells: list[str]) -> str:
    return " ".join(cell.rjust(width) for cell, (_, _, width) in zip(cells, _COLUMNS, strict=True))


def format_header() -> str:
    """Three ``#`` lines: column groups, titles, units."""
    titles = _line([title for title, _, _ in _COLUMNS])
    units = _line([unit for _, unit, _ in _COLUMNS])
    groups = [" "] * len(titles)
    offsets = [0]
    for _, _, width in _COLUMNS:
        offsets.append(offsets[-1] + width + 1)
    for title, first, end in _GROUPS:
        span = offsets[end] - 1 - offsets[first]
        groups[offsets[first] : offsets[first] + span] = title.center(span)
    return "\n".join("#" + line for line in ("".join(groups).rstrip(), titles, units))


def _num(value: float | None, decimals: int, width: int) -> str:
    """Fixed-point with ``decimals``, fewer if it would not fit ``width``."""
    if value is None:
        return "N/A"
    if not math.isfinite(value):
        return str(value)
    for d in range(decimals, -1, -1):
        text = f"{value:.{d}f}"
        if len(text) <= width:
            return text
    return text


def format_row(row: Row) -> str:
    """One table line (aligned under ``format_header``; the ``#`` column is a space)."""
    rel_err = "N/A" if row.rel_err is None else f"{row.rel_err:.2e}"
    cells = [
        str(row.size),
        str(row.count),
        row.type,
        row.redop,
        row.algorithm,
        row.compressor,
        _num(row.time_us, 2, 11),
        _num(row.algbw, 2, 7),
        _num(row.busbw, 2, 7),
        _num(row.time_us_inplace, 2, 11),
        _num(row.algbw_inplace, 2, 7),
        _num(row.busbw_inplace, 2, 7),
        _num(row.ratio, 3, 6),
        rel_err,
        _num(row.native_time_us, 2, 11),
        _num(row.speedup, 2, 7),
        _num(row.overlap_efficiency, 2, 7),
    ]
    return " " + _line(cells)


def format_summary(rows: list[Row]) -> str:
    """The footer: average out-of-place bus bandwidth of each (algorithm, compressor)
    over the sweep, as nccl-tests' "Avg bus bandwidth" line."""
    sums: dict[str, list[float]] = {}
    for row in rows:
        sums.setdefault(f"{row.algorithm}/{row.compressor}", []).append(row.busbw)
    parts = [f"{name} {sum(v) / len(v):.3f}" for name, v in sums.items()]
    return "# Avg bus bandwidth (out-of-place, GB/s): " + (", ".join(parts) or "no rows")


def format_table(rows: list[Row]) -> str:
    """Header, one line per row and the summary footer."""
    return "\n".join([format_header(), *map(format_row, rows), format_summary(rows)])


def cpu_name() -> str:
    """The CPU model (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit(path: str | Path) -> tuple[str, bool | None]:
    """``(commit, dirty)`` of the git checkout holding ``path`` (dirty: tracked files
    differ from the commit); ``("unknown", None)`` outside a checkout or without git."""
    cwd = Path(path).resolve()
    cwd = cwd if cwd.is_dir() else cwd.parent

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return "unknown", None
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.TimeoutExpired):
        return "unknown", None
    return head.stdout.strip(), bool(status.stdout.strip())


def provenance(source: str | Path) -> dict[str, Any]:
    """Date (UTC), commit of the checkout holding ``source``, hostname, CPU and versions:
    the part of a JSON record that says where, when and with what it was measured."""
    commit, dirty = git_commit(source)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "commit_dirty": dirty,
        "hostname": socket.gethostname(),
        "cpu": cpu_name(),
        "python": platform.python_version(),
    }


def _jsonable(value: Any) -> Any:
    """Non-finite floats as strings ("nan", "inf"): strict JSON has no NaN, and a NaN
    error must stay visible rather than turn into a missing value."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def to_record(meta: dict[str, Any], rows: list[Row]) -> dict[str, Any]:
    """The JSON document: ``meta`` (collective, nranks, command, ...) plus ``rows``."""
    return _jsonable({**meta, "rows": [asdict(row) for row in rows]})


def write_json(path: str | Path, meta: dict[str, Any], rows: list[Row]) -> None:
    """Write ``to_record(meta, rows)`` to ``path`` (indented, strict JSON)."""
    text = json.dumps(to_record(meta, rows), indent=2, allow_nan=False)
    Path(path).write_text(text + "\n")


def human_size(nbytes: int) -> str:
    """``512 B``, ``4 KiB``, ``1.5 MiB``..."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:g} {unit}"
        value /= 1024
    return f"{value:g} GiB"  # unreachable


class Progress:
    """A one-line progress indicator on a terminal, redrawn in place with ``\\r``.

    It stays silent for the first ``delay_s`` seconds, so sweeps that finish quickly
    print nothing extra, and redraws at most ten times a second.

    Args:
        total: the amount of work of the whole sweep (any unit, e.g. bytes moved).
        enabled: draw at all (rank 0, a terminal, no ``--no-progress``).
        stream: where to draw (stderr).
        delay_s: seconds before the first draw.
    """

    def __init__(
        self, total: float, enabled: bool, stream: TextIO | None = None, delay_s: float = 2.0
    ) -> None:
        self.total = max(total, 1e-300)
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.delay_s = delay_s
        self.start = time.monotonic()
        self._last = 0.0
        self._shown = False

    def update(self, done: float, label: str) -> None:
        """Show that ``done`` of ``total`` is finished; ``label`` says what runs now."""
        if not self.enabled:
            return
        now = time.monotonic()
        elapsed = now - self.start
        if elapsed < self.delay_s or now - self._last < 0.1:
            return
        self._last = now
        frac = min(1.0, done / self.total)
        bar = "#" * int(frac * 20)
        left = f", ~{elapsed / frac - elapsed:.0f} s left" if frac > 0.02 else ""
        text = f"[{bar:<20}] {frac:4.0%} {label} ({elapsed:.0f} s{left})"
        self.stream.write("\r\033[K" + text[:120])
        self.stream.flush()
        self._shown = True

    def clear(self) -> None:
        """Erase the line (before other output is printed)."""
        if self._shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._shown = False
