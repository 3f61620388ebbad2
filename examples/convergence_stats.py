"""Statistics of a convergence experiment: per-arm mean and spread of the final
validation loss, and deltas against a reference arm with 95% intervals.

Arms that share a seed share the initial weights and the data order, so the runs are
paired: the delta of an arm is the mean over seeds of ``100 (L_arm,s / L_ref,s - 1)``,
and its interval is Student's t interval of those paired differences (``n - 1`` degrees
of freedom). The unpaired (Welch) interval of the difference of the means, relative to
the reference mean, is given beside it for comparison; the paired one is the one
reported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

# Two-sided 95% quantiles of Student's t (t_0.975) for 1..30 degrees of freedom.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_Z975 = 1.959964


def t975(df: float) -> float:
    """Student's t_0.975 for ``df`` degrees of freedom (a table to 30, then the
    Cornish-Fisher expansion, within 1e-3 of the exact value)."""
    if not df >= 1:
        return math.nan
    if df <= 30 and float(df).is_integer():
        return _T975[int(df) - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (NaN for fewer than two values)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def paired_delta_pct(arm: Mapping[Any, float], ref: Mapping[Any, float]) -> dict[str, Any]:
    """The paired delta of ``arm`` against ``ref`` (both: seed -> final loss), in percent.

    Returns:
        ``{"n", "delta_pct", "sd_pct", "ci": [low, high]}`` over the seeds both have.
    """
    seeds = sorted(set(arm) & set(ref))
    diffs = [100.0 * (arm[s] / ref[s] - 1.0) for s in seeds]
    mean, sd = mean_sd(diffs)
    half = t975(len(diffs) - 1) * sd / math.sqrt(len(diffs)) if len(diffs) > 1 else math.nan
    return {"n": len(diffs), "delta_pct": mean, "sd_pct": sd, "ci": [mean - half, mean + half]}


def welch_delta_pct(arm: Sequence[float], ref: Sequence[float]) -> dict[str, Any]:
    """The unpaired delta of the means, ``100 (mean_arm / mean_ref - 1)``, with Welch's
    95% interval of the difference of the means, relative to ``mean_ref``."""
    (ma, sa), (mr, sr) = mean_sd(arm), mean_sd(ref)
    na, nr = len(arm), len(ref)
    if na < 2 or nr < 2:
        return {"delta_pct": 100.0 * (ma / mr - 1.0), "ci": [math.nan, math.nan]}
    va, vr = sa**2 / na, sr**2 / nr
    se = math.sqrt(va + vr)
    df = (va + vr) ** 2 / (va**2 / (na - 1) + vr**2 / (nr - 1)) if se > 0 else float(na + nr - 2)
    half = t975(df) * se
    scale = 100.0 / mr
    delta = ma - mr
    return {"delta_pct": scale * delta, "ci": [scale * (delta - half), scale * (delta + half)]}
