"""``--plot PATH``: a sweep's bus bandwidth and small-message latency as one PNG.

Left: busbw (out of place) against size, one line per algorithm x compressor and the
native baseline dashed. Right: time against size up to 1 MiB, where latency, not
bandwidth, decides. Uses matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .table import Row, series_name, several_cases

LATENCY_MAX_BYTES = 1 << 20


def _series(rows: list[Row]) -> dict[str, list[Row]]:
    """Rows grouped by ``algorithm/compressor`` (and type and op where they vary), in
    order of appearance, by size."""
    series: dict[str, list[Row]] = {}
    several = several_cases(rows)
    for row in rows:
        series.setdefault(series_name(row, several), []).append(row)
    return {name: sorted(rs, key=lambda r: r.size) for name, rs in series.items()}


def _native(rows: list[Row], bus_factor: float) -> tuple[list[int], list[float], list[float]]:
    """The baseline's (sizes, busbw, time_us), from the native time of each size."""
    by_size = {r.size: r.native_time_us for r in rows if r.native_time_us}
    sizes = sorted(by_size)
    times = [by_size[s] for s in sizes]
    busbw = [s / (t * 1e-6) / 1e9 * bus_factor for s, t in zip(sizes, times, strict=True)]
    return sizes, busbw, times


def _size_label(nbytes: float) -> str:
    """Axis tick: ``512``, ``4K``, ``16M`` (binary, as the -b/-e flags)."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g}{unit}"
    return f"{nbytes:g}"


def plot_sweep(path: str | Path, meta: dict[str, Any], rows: list[Row]) -> None:
    """Write the PNG of a sweep.

    Args:
        path: the PNG to write.
        meta: the record's header (collective, nranks, datatype, device, bus_factor...).
        rows: the sweep's rows.
    """
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.ticker import FuncFormatter  # noqa: PLC0415

    fig, (bw_ax, lat_ax) = plt.subplots(1, 2, figsize=(13, 5))
    series = _series(rows)
    has_native_row = any(rs[0].algorithm == "native" for rs in series.values())
    for name, rs in series.items():
        native = rs[0].algorithm == "native"
        style = {"color": "black", "linestyle": "--"} if native else {}
        sizes = [r.size for r in rs]
        bw_ax.plot(sizes, [r.busbw for r in rs], marker="o", ms=3, label=name, **style)
        small = [r for r in rs if r.size <= LATENCY_MAX_BYTES]
        if small:
            lat_ax.plot(
                [r.size for r in small],
                [r.time_us for r in small],
                marker="o",
                ms=3,
                label=name,
                **style,
            )
    if not has_native_row:
        sizes, busbw, times = _native(rows, float(meta.get("bus_factor", 1.0)))
        bw_ax.plot(sizes, busbw, "k--", marker="s", ms=3, label="native (baseline)")
        small = [(s, t) for s, t in zip(sizes, times, strict=True) if s <= LATENCY_MAX_BYTES]
        if small:
            lat_ax.plot(
                *zip(*small, strict=True), "k--", marker="s", ms=3, label="native (baseline)"
            )

    bw_ax.set(xscale="log", xlabel="size (bytes)", ylabel="busbw (GB/s)", title="Bus bandwidth")
    lat_ax.set(
        xscale="log",
        yscale="log",
        xlabel="size (bytes)",
        ylabel="time (us)",
        title=f"Latency (sizes <= {LATENCY_MAX_BYTES >> 20} MiB)",
    )
    for ax in (bw_ax, lat_ax):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _size_label(v)))
        ax.grid(True, which="both", alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=8)
    fig.suptitle(
        f"coccl {meta.get('collective', '?')}: {meta.get('nranks', '?')} ranks, "
        f"{meta.get('datatype', '?')}, {meta.get('device', '?')}/{meta.get('backend', '?')}"
        f" ({meta.get('date', '')}, {str(meta.get('commit', 'unknown'))[:10]})"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
