"""What rank 0 writes: the nccl-tests-style table, the JSON record (with where and from
which commit it was measured) and the progress line.

The table keeps nccl-tests' columns and conventions (``#`` before header lines, sizes
in bytes, times in microseconds, bandwidths in GB/s = 1e9 B/s, ``#wrong``) and adds
coccl's where a run has them: the algorithm and codec of the row (when the run has more
than one; ``auto>two_shot`` and ``taco>identity`` say what ``auto`` ran), the compression
ratio, the relative error against an exact reduction, the speedup over the native
baseline of the same run, the overlap efficiency.
Columns that carry nothing for a run are left out, and the least telling ones give way
until a row fits ``MAX_WIDTH`` characters; the JSON record always has every figure.
"""

from __future__ import annotations

import datetime
import json
import math
import platform
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

MAX_WIDTH = 120  # characters of a table line, the "#" or leading space included


@dataclass
class Row:
    """One measured (size, algorithm, compressor) of a sweep.

    Sizes follow nccl-tests: for AllReduce ``size = count * typesize``; for ReduceScatter
    and AllGather ``size`` and ``count`` are the whole buffer of all ranks (each rank
    contributes or receives ``count / nranks`` elements: the count nccl-tests prints, and
    the table's count column, ``TablePlan.count_per``).

    Attributes:
        size: bytes. count: elements. type: dtype name. redop: op (``none`` for AllGather).
        algorithm, compressor: what was asked for (``algorithm`` may be ``auto``).
        time_us, algbw, busbw: out of place: the median time of one call in
            microseconds (each rank's median, ranks combined as ``-a`` says), ``size /
            time`` and the bus bandwidth, in GB/s.
        time_us_inplace, algbw_inplace, busbw_inplace: the same, in place.
        time_us_iters, time_us_iters_inplace: ``{"min", "median", "max"}`` over the
            timed calls: each rank's, ranks combined as ``-a`` says.
        time_us_ranks, time_us_ranks_inplace: ``{"rank0", "avg", "min", "max"}`` of the
            ranks' median times.
        ratio: bytes all ranks sent with this compressor / bytes they sent with
            identity on the same algorithm (1.0 for native; None if nothing was sent).
        rel_err: ``||y - ref|| / ||ref||`` against an exact float64 reduction, worst
            over ranks and over out-of-place and in-place (None when not checked).
        rel_err_bound: the error a correct run may reach (``coccl.bench.bounds``), the
            tightest of any rank's (None when not checked).
        wrong: how many of the checked outputs (each rank's out-of-place and in-place
            result) erred beyond their rank's bound (None when not checked).
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
        ran: what the call ran (``Communicator.describe``): ``algorithm`` (``auto``
            resolved), ``compressor`` (its config), ``reason``, ``chunk_bytes``,
            ``transport``, ... (None only for rows made without a communicator).
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
    time_us_iters: dict[str, float]
    time_us_iters_inplace: dict[str, float]
    time_us_ranks: dict[str, float]
    time_us_ranks_inplace: dict[str, float]
    ratio: float | None
    rel_err: float | None
    rel_err_bound: float | None
    wrong: int | None
    native_time_us: float | None
    speedup: float | None
    peak_staging_bytes: int
    overlap_efficiency: float | None = None
    overlap_times_us: dict[str, float] | None = None
    backend: str = ""  # the communicator's backend (mpi, nccl) that ran the row
    ran: dict[str, Any] | None = None

    @property
    def ran_label(self) -> str:
        """``algorithm/codec`` that actually ran (the requested pair if unknown)."""
        if self.ran is None:
            return f"{self.algorithm}/{self.compressor}"
        return f"{self.ran['algorithm']}/{self.ran['compressor']['id']}"

    @property
    def algorithm_label(self) -> str:
        """The table's algorithm: as asked, or ``auto>two_shot`` (what auto ran)."""
        if self.algorithm != "auto" or self.ran is None:
            return self.algorithm
        return f"auto>{self.ran['algorithm']}"

    @property
    def compressor_label(self) -> str:
        """The table's codec: as asked (``int:bits=4``), or ``taco>identity`` when auto
        ran another."""
        # the label's (first) codec name: labels are name:options, or intra+inter pairs
        if self.ran is None or self.ran["compressor"]["id"] == re.split("[:+]", self.compressor)[0]:
            return self.compressor
        return f"{self.compressor}>{self.ran['compressor']['id']}"


# ------------------------------------------------------------------------- the table
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


def _sci(value: float | None) -> str:
    if value is None:
        return "N/A"
    return f"{value:.2e}" if math.isfinite(value) else str(value)


@dataclass(frozen=True)
class Column:
    """One table column: ``key`` names it (as the JSON field it shows), ``title`` and
    ``unit`` are its two header lines, ``group`` the title above a run of columns."""

    key: str
    title: str
    unit: str
    width: int
    cell: Callable[[Row], str]
    group: str = ""


@dataclass(frozen=True)
class TablePlan:
    """What a sweep will print, known before its first row: the column widths and which
    optional columns carry something.

    Attributes:
        max_size, max_count: the largest size and count of the sweep.
        type, redop: the data type's name and the op (``none`` for AllGather); the
            longest of each where a sweep has several.
        algorithms, compressors: every label a row may show in the algorithm and codec
            columns (``Row.algorithm_label``, ``Row.compressor_label``), ``auto``'s
            possible choices included.
        check: outputs are checked (``-c 1``).
        lossy: some codec of the run is lossy (then ratio and rel_err say something).
        baseline: the native baseline runs, next to some other pair (speedup).
        overlap: some row measures its overlap efficiency.
        count_per: the count column is ``Row.count // count_per``: the rank count for
            ReduceScatter and AllGather, whose count nccl-tests prints per rank.
    """

    max_size: int
    max_count: int
    type: str
    redop: str
    algorithms: Sequence[str]
    compressors: Sequence[str]
    check: bool = True
    lossy: bool = False
    baseline: bool = True
    overlap: bool = False
    count_per: int = 1


# The columns that give way, in this order, until a line fits MAX_WIDTH: the in-place
# bandwidths first (they repeat the out-of-place ones for coccl's schedules, which run the
# same code on aliased buffers, and the in-place time stays), then algbw (derived from
# what stays: size / time), then the rest.
_GIVE_WAY = ("algbw_inplace", "busbw_inplace", "algbw", "time_us_inplace", "ratio", "speedup")


@dataclass(frozen=True)
class Layout:
    """The columns a sweep prints and the ones it left out (they are in the JSON)."""

    columns: tuple[Column, ...]
    hidden: tuple[str, ...]

    @property
    def width(self) -> int:
        return 1 + sum(c.width + 1 for c in self.columns) - 1

    def _line(self, cells: list[str]) -> str:
        return " ".join(cell.rjust(c.width) for cell, c in zip(cells, self.columns, strict=True))

    def header(self) -> str:
        """Three ``#`` lines: column groups, titles, units."""
        titles = self._line([c.title for c in self.columns])
        units = self._line([c.unit for c in self.columns])
        groups = [" "] * len(titles)
        offset = 0
        spans: dict[str, list[int]] = {}
        for c in self.columns:
            if c.group:
                spans.setdefault(c.group, [offset, offset + c.width])[1] = offset + c.width
            offset += c.width + 1
        for title, (first, end) in spans.items():
            groups[first:end] = title.center(end - first)[: end - first]
        lines = ("".join(groups), titles, units)
        return "\n".join("#" + line.rstrip() for line in lines)

    def row(self, row: Row) -> str:
        """One table line (aligned under ``header``; the ``#`` column is a space)."""
        return " " + self._line([c.cell(row) for c in self.columns])


def _count_cell(plan: TablePlan) -> Callable[[Row], str]:
    """The count column's cell: nccl-tests' count (``TablePlan.count_per``)."""
    return lambda r: str(r.count // plan.count_per)


def layout(plan: TablePlan, max_width: int = MAX_WIDTH) -> Layout:
    """The columns of a sweep: nccl-tests' always; the algorithm and codec when the run
    has more than one; the others when they carry something; then the ones of
    ``_GIVE_WAY`` left out, in turn, while a line is wider than ``max_width``."""

    def width(title: str, *values: str) -> int:
        return max(len(title), *(len(v) for v in values)) if values else len(title)

    def col(
        key: str, title: str, unit: str, w: int, cell: Callable[[Row], str], group: str = ""
    ) -> Column:
        return Column(key, title, unit, max(w, len(title), len(unit)), cell, group)

    oop, ip = "out-of-place", "in-place"
    columns = [
        col("size", "size", "(B)", len(str(plan.max_size)), lambda r: str(r.size)),
        col("count", "count", "(elements)", len(str(plan.max_count)), _count_cell(plan)),
        col("type", "type", "", len(plan.type), lambda r: r.type),
        col("redop", "redop", "", len(plan.redop), lambda r: r.redop),
    ]
    if len(set(plan.algorithms)) > 1:
        w = width("", *plan.algorithms)
        columns.append(col("algorithm", "algorithm", "", w, lambda r: r.algorithm_label))
    if len(set(plan.compressors)) > 1:
        w = width("", *plan.compressors)
        columns.append(col("compressor", "codec", "", w, lambda r: r.compressor_label))
    for group, suffix in ((oop, ""), (ip, "_inplace")):
        columns += [
            col(f"time_us{suffix}", "time", "(us)", 8,
                lambda r, s=suffix: _num(getattr(r, f"time_us{s}"), 2, 8), group),
            col(f"algbw{suffix}", "algbw", "(GB/s)", 6,
                lambda r, s=suffix: _num(getattr(r, f"algbw{s}"), 2, 6), group),
            col(f"busbw{suffix}", "busbw", "(GB/s)", 6,
                lambda r, s=suffix: _num(getattr(r, f"busbw{s}"), 2, 6), group),
        ]  # fmt: skip
    if plan.lossy:
        columns.append(col("ratio", "ratio", "", 5, lambda r: _num(r.ratio, 3, 5)))
    if plan.check and plan.lossy:
        columns.append(col("rel_err", "rel_err", "", 8, lambda r: _sci(r.rel_err)))
    if plan.check:
        columns.append(
            col("wrong", "#wrong", "", 6, lambda r: "N/A" if r.wrong is None else str(r.wrong))
        )
    if plan.baseline:
        columns.append(col("speedup", "speedup", "", 7, lambda r: _num(r.speedup, 2, 7)))
    if plan.overlap:
        columns.append(
            col("overlap_efficiency", "overlap", "", 7, lambda r: _num(r.overlap_efficiency, 2, 7))
        )
    hidden: list[str] = []
    result = Layout(tuple(columns), ())
    for key in _GIVE_WAY:
        if result.width <= max_width:
            break
        if any(c.key == key for c in columns):
            columns = [c for c in columns if c.key != key]
            hidden.append(key)
            result = Layout(tuple(columns), tuple(hidden))
    return result


def several_cases(rows: list[Row]) -> bool:
    """Whether ``rows`` hold more than one (type, redop) (``-d all``, ``-o all``)."""
    return len({(row.type, row.redop) for row in rows}) > 1


def series_name(row: Row, several: bool) -> str:
    """``algorithm/compressor``, after ``type redop`` where a sweep has ``several``."""
    name = f"{row.algorithm}/{row.compressor}"
    return f"{row.type} {row.redop} {name}" if several else name


def format_summary(rows: list[Row], check: bool) -> list[str]:
    """The footer, as nccl-tests': the out-of-bounds count (``OK`` or ``FAILED``) and
    the average out-of-place bus bandwidth of each (algorithm, compressor)."""
    if check:
        wrong = sum(row.wrong or 0 for row in rows)
        verdict = f"{wrong} {'FAILED' if wrong else 'OK'}"
    else:
        verdict = "not checked (-c 0)"
    sums: dict[str, list[float]] = {}
    several = several_cases(rows)
    for row in rows:
        sums.setdefault(series_name(row, several), []).append(row.busbw)
    parts = [f"{name} {sum(v) / len(v):.3f}" for name, v in sums.items()]
    return [
        f"# Out of bounds values : {verdict}",
        "# Avg bus bandwidth (out-of-place, GB/s): " + (", ".join(parts) or "no rows"),
    ]


def auto_notes(rows: list[Row]) -> list[str]:
    """One line per run of sizes over which an ``auto`` pair ran the same thing:
    ``# auto/taco 1024..4194304 B: ran native/identity (reason)``; the reason is the
    one ``Communicator.describe`` gave, or a pointer to the JSON where it varies."""
    notes: list[str] = []
    runs: dict[str, list[tuple[int, int, str, list[str]]]] = {}
    several = several_cases(rows)
    for row in rows:
        if row.algorithm != "auto" or row.ran is None:
            continue
        spans = runs.setdefault(series_name(row, several), [])
        what, why = row.ran_label, str(row.ran.get("reason", ""))
        if spans and spans[-1][2] == what:
            first, _, _, reasons = spans[-1]
            spans[-1] = (first, row.size, what, [*reasons, why])
        else:
            spans.append((row.size, row.size, what, [why]))
    for name, spans in runs.items():
        for first, last, what, reasons in spans:
            sizes = f"{first} B" if first == last else f"{first}..{last} B"
            why = reasons[0] if len(set(reasons)) == 1 else "reasons by size in the JSON"
            notes.append(f"# {name} {sizes}: ran {what}" + (f" ({why})" if why else ""))
    return notes


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
