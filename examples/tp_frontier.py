"""The bytes-against-loss frontier of the TP wire codecs (issue #33), from a convergence
report of ``tp_convergence_gpu.py frontier``.

Each TP arm at each TP size is a point: its wire bytes per element (x) against its paired
final-loss delta to the plain model (y, with the 95% interval). The bytes are the codec's
own payload size (``Compressor.encoded_nbytes``) of one TP AllReduce of the run's setup
(batch x seq x d_model elements), forward over bfloat16 (the row-parallel layers'
activations under autocast) and backward over float32 (the column-parallel layers' input
gradients); a training step has as many elements of each, so an arm's mean is the plain
average of the two. The plain model (no TP, no wire) is drawn at what an uncompressed TP
AllReduce would carry (2 and 4 bytes: identity's payload), its delta 0 by definition.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from coccl.compressors import get_compressor

FORWARD_DTYPE = np.dtype(ml_dtypes.bfloat16)  # g's partial products under autocast
BACKWARD_DTYPE = np.dtype(np.float32)  # f's partial input gradients


def message_elements(setup: dict[str, Any]) -> int:
    """The elements of one TP AllReduce of ``setup`` (a Setup as a dict)."""
    return setup["batch"] * setup["seq"] * setup["d_model"]


def wire_bytes(arm: dict[str, Any], count: int) -> dict[str, float]:
    """Payload bytes per element of a ``count``-element TP AllReduce of ``arm`` (a report's
    ``arms`` entry): ``forward``, ``backward`` and their ``mean`` (equal element counts)."""
    forward = arm["compressor"] or {"id": "identity"}
    backward = arm.get("backward_compressor") or forward
    fwd = get_compressor(forward).encoded_nbytes(count, FORWARD_DTYPE) / count
    bwd = get_compressor(backward).encoded_nbytes(count, BACKWARD_DTYPE) / count
    return {"forward": fwd, "backward": bwd, "mean": (fwd + bwd) / 2}


def frontier(report: dict[str, Any], target_pct: float, ci_below_pct: float) -> list[dict]:
    """One point per arm and TP size of ``report``'s summary, fewest mean bytes first:
    bytes per element, the paired delta % vs uncompressed and its 95% interval, and
    whether it meets the target (delta <= ``target_pct`` and the interval's upper end
    below ``ci_below_pct``)."""
    count = message_elements(report["setup"])
    points = []
    for arm, entry in report["summary"].items():
        for tp, s in ((k, v) for k, v in entry.items() if k.startswith("tp") and k[2:].isdigit()):
            delta, ci = s["delta_pct_vs_uncompressed"], s["delta_pct_vs_uncompressed_ci"]
            known = _finite(delta) and ci is not None and _finite(ci[1])
            points.append(
                {
                    "arm": arm,
                    "tp": int(tp[2:]),
                    **report["arms"][arm],
                    "bytes_per_element": wire_bytes(report["arms"][arm], count),
                    "n": s["n"],
                    "delta_pct": delta,
                    "ci": ci,
                    "meets_target": bool(
                        arm != "uncompressed"
                        and known
                        and delta <= target_pct
                        and ci[1] < ci_below_pct
                    ),
                }
            )
    return sorted(points, key=lambda p: (p["bytes_per_element"]["mean"], p["tp"], p["arm"]))


def fewest_bytes(points: list[dict]) -> dict[str, str | None]:
    """Per TP size, the arm with the fewest mean bytes per element that meets the target."""
    best: dict[str, str | None] = {f"tp{p['tp']}": None for p in points if p["tp"] > 1}
    for p in points:  # fewest bytes first
        if p["meets_target"] and best.get(f"tp{p['tp']}") is None:
            best[f"tp{p['tp']}"] = p["arm"]
    return best


def print_frontier(report: dict[str, Any], log: Callable[[str], None]) -> None:
    log(f"\n{'arm':<20}{'TP':>4}{'n':>3}{'B/elem fwd':>12}{'bwd':>6}{'mean':>7}  delta % [95%]")
    for p in report["frontier"]:
        b, ci = p["bytes_per_element"], p["ci"] or [None, None]
        delta = "-" if not _finite(p["delta_pct"]) else f"{p['delta_pct']:+.3f}"
        interval = "[" + ", ".join("-" if not _finite(c) else f"{c:+.3f}" for c in ci) + "]"
        mark = "  meets the target" if p["meets_target"] else ""
        log(
            f"{p['arm']:<20}{p['tp']:>4}{p['n']:>3}{b['forward']:>12.4f}{b['backward']:>6.3f}"
            f"{b['mean']:>7.3f}  {delta} {interval}{mark}"
        )
    for tp, arm in fewest_bytes(report["frontier"]).items():
        log(f"fewest bytes within the target at {tp}: {arm or 'none'}")


def plot_frontier(
    report: dict[str, Any], path: Path, target_pct: float, ci_below_pct: float
) -> None:
    """Mean wire bytes per element (x) against the delta % with its 95% interval (y), one
    marker per TP size, each point named by its arm; the target lines dashed."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    markers = {1: "*", 2: "D", 4: "o", 8: "s"}
    fig, ax = plt.subplots(figsize=(10, 6.5))
    for tp in sorted({p["tp"] for p in report["frontier"]}):
        mine = [p for p in report["frontier"] if p["tp"] == tp and _finite(p["delta_pct"])]
        if not mine:
            continue
        x = [p["bytes_per_element"]["mean"] for p in mine]
        y = [p["delta_pct"] for p in mine]
        err = [
            [d - (p["ci"][0] if _finite(p["ci"][0]) else d) for d, p in zip(y, mine, strict=True)],
            [(p["ci"][1] if _finite(p["ci"][1]) else d) - d for d, p in zip(y, mine, strict=True)],
        ]
        label = "uncompressed (TP = 1, no wire)" if tp == 1 else f"TP = {tp}"
        ax.errorbar(x, y, yerr=err, fmt=markers.get(tp, "^"), capsize=3, label=label, ms=7)
        for i, (xi, yi, p) in enumerate(zip(x, y, mine, strict=True)):
            # alternate above and below: arms of equal bytes (e.g. the two directions'
            # swaps) sit at one x
            offset = (5, 4) if i % 2 == 0 else (5, -10)
            ax.annotate(p["arm"], (xi, yi), textcoords="offset points", xytext=offset, fontsize=7)
    ax.axhline(0.0, color="k", lw=1)
    ax.axhline(target_pct, color="tab:green", ls="--", lw=1, label=f"+{target_pct}% (target)")
    ax.axhline(ci_below_pct, color="tab:red", ls="--", lw=1, label=f"+{ci_below_pct}% (interval)")
    ax.set(
        xlabel="wire bytes per element (mean of forward bfloat16 and backward float32)",
        ylabel="final val loss vs uncompressed (%, paired by seed, 95% interval)",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    gpus = ", ".join(report["gpu"]) or "?"
    ns = sorted({p["n"] for p in report["frontier"] if p["n"]})
    seeds = f"{ns[0]}-{ns[-1]} seeds a point" if len(ns) > 1 else f"{len(report['seeds'])} seeds"
    fig.suptitle(f"coccl TP wire codecs: bytes against loss, {seeds} ({gpus})", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and bool(np.isfinite(v))
