"""The error bound of a checked row: how far a collective's result may be from the exact
(float64) one before ``coccl-bench`` calls it wrong, as nccl-tests' ``#wrong`` does.

A row's result ``y`` is compared with the exact reduction ``s`` of the ranks' inputs
``x_1 .. x_n`` by ``rel_err = ||y - s|| / ||s||`` (L2 over the whole output of a rank).
Its bound has three parts, each stated for the data the bench feeds in (independent
random normal inputs per rank, see ``collective.rank_data``):

* **Rounding of the reduction** (every codec). Summing ``n`` values in any order with
  unit roundoff ``u`` errs by at most ``gamma(n-1) * sum_i |x_i|`` per element
  (``gamma(k) = k u / (1 - k u)``, Higham's bound for recursive summation), so in L2 by
  at most ``gamma(n-1) * sqrt(n) * E`` with ``E = sqrt(sum_i ||x_i||^2)``, the
  contributions' energy (Cauchy-Schwarz). ``u`` is the data type's own unit roundoff:
  an uncompressed schedule forwards partial sums in the data type. Rigorous for any
  data. ``prod`` errs by ``gamma(n-1)`` relative per element; ``max``/``min`` and
  AllGather's copies are exact.
* **Quantization** (lossy codecs). One encode/decode roundtrip of a vector ``v`` errs by
  at most ``b ||v||``, ``b = codec.rel_error_bound`` (rigorous, per group of the codec
  in its normal range, hence for the whole vector). A schedule quantizes each element
  ``q`` times: ring AllReduce ``n`` (``n-1`` hops of partial sums, then the reduced
  shard), two-shot AllReduce 2, ring ReduceScatter ``n-1``, two-shot ReduceScatter 1,
  AllGather 1. The ``q`` errors come from independent data and add in quadrature, not
  linearly: quantization ``j`` acts on a partial sum ``P_j`` of some contributions, and
  ``sum_j ||P_j||^2 <= q E^2`` when the contributions are uncorrelated. The bound is
  ``b sqrt(q) (1 + b)^q E / ||s||``, the factor ``(1 + b)^q`` for the earlier errors each
  quantized input carries. It is *not* a worst case over all inputs: errors that line up
  (inputs chosen against the codec) can add linearly, up to ``q b (1+b)^q n^(1/2) E``.
  On the bench's data the measured error sits well below it, because a typical
  roundtrip errs by ``codec.rel_error_typical``, 2.4x (taco) to 6.9x (int8) less than
  ``b``, and ``sum_j ||P_j||^2`` is ``(n+1)/2 E^2`` for a ring, not ``n E^2``.
  ``tests/test_bench_bounds.py`` checks the bound on simulated schedules at small counts,
  where the errors fluctuate most.
* **The result's own rounding** to the data type (``u`` relative), and ``avg``'s
  division (``u``).

The ratio ``E / ||s||`` is about 1 for independent inputs; it is what keeps the bound
honest when a small count happens to cancel (``||s||`` small against its inputs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from coccl.compressors import Compressor

# Unit roundoff (half the gap between 1 and the next value) of each float type.
_UNIT_ROUNDOFF = {
    np.dtype(np.float64): 2.0**-53,
    np.dtype(np.float32): 2.0**-24,
    np.dtype(np.float16): 2.0**-11,
    np.dtype(ml_dtypes.bfloat16): 2.0**-8,
}


@dataclass(frozen=True)
class Reference:
    """What the bound needs to know of a rank's exact result.

    Attributes:
        norm: ``||s||``, the L2 norm of the exact result (float64).
        energy: ``E = sqrt(sum_i ||x_i||^2)`` over the contributions to that result
            (each rank's input restricted to the elements of ``s``).
    """

    norm: float
    energy: float


def quantizations(collective: str, algorithm: str, nranks: int, stated: str | None = None) -> int:
    """How many times a schedule encodes each element on its way to the result
    (0 for ``native``: the transport's own collective takes no codec). ``hierarchical``
    depends on the node layout: its count is what ``Communicator.describe`` states
    (``stated``, its ``quantizations``: "4 per element (...)")."""
    if algorithm == "native":
        return 0
    if algorithm == "hierarchical":
        if not stated or not stated.split()[0].isdigit():
            raise ValueError("hierarchical needs the quantization count describe() states")
        return int(stated.split()[0])
    if collective == "allgather":
        return 1
    if algorithm == "ring":
        return max(nranks if collective == "allreduce" else nranks - 1, 1)
    if algorithm == "two_shot":
        return 2 if collective == "allreduce" else 1
    raise ValueError(f"no quantization count for algorithm {algorithm!r}")


def unit_roundoff(dtype: np.dtype) -> float:
    """``u`` of a float type (0 for integers: their sums are exact, wrapping included)."""
    if dtype.kind in "iu":
        return 0.0
    try:
        return _UNIT_ROUNDOFF[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"no unit roundoff known for dtype {dtype}") from None


def gamma(k: int, u: float) -> float:
    """Higham's ``gamma(k) = k u / (1 - k u)``: the relative error of ``k`` roundings."""
    if k * u >= 1:
        return math.inf
    return k * u / (1 - k * u)


def roundtrip_bound(codec: Compressor, dtype: np.dtype) -> float:
    """The largest ``||decode(encode(x)) - x|| / ||x||`` of one roundtrip to ``dtype``
    (``codec.rel_error_bound`` and the decoded values' rounding to the type; 0 for a
    lossless codec)."""
    if codec.lossless:
        return 0.0
    u = unit_roundoff(dtype)
    return codec.rel_error_bound * (1 + u) + u


def rel_error_bound(
    collective: str,
    algorithm: str,
    codec: Compressor,
    op: str,
    dtype: np.dtype,
    nranks: int,
    ref: Reference,
    stated: str | None = None,
) -> float:
    """The largest ``||y - s|| / ||s||`` a correct run may show (see the module docstring).

    Args:
        collective: ``allreduce``, ``reduce_scatter`` or ``allgather``.
        algorithm: the schedule that ran (``ring``, ``two_shot``, ``native``), not ``auto``.
        codec: the compressor that ran.
        op: the reduction op (ignored for AllGather).
        dtype: the data type.
        nranks: the rank count.
        ref: the exact result's norm and its contributions' energy on this rank.
        stated: the quantization count ``describe()`` states (``hierarchical``; with a
            codec per level, ``codec`` is the one of the larger bound).

    Returns:
        The bound (0.0 where the result must be exact; ``inf`` if nothing can be said,
        e.g. an exact result of zero that a lossy codec approximates).
    """
    u = unit_roundoff(dtype)
    lossy = not codec.lossless
    if collective == "allgather" and not lossy:
        return 0.0  # copies
    if ref.norm == 0:
        return 0.0 if ref.energy == 0 else math.inf
    if collective == "allgather":
        rounding = 0.0
    elif op in ("max", "min"):
        rounding = 0.0  # one of the inputs, exactly
    elif op == "prod":
        rounding = gamma(nranks - 1, u)
    else:
        rounding = gamma(nranks - 1, u) * math.sqrt(nranks) * ref.energy / ref.norm
    quantization = 0.0
    if lossy:
        q = quantizations(collective, algorithm, nranks, stated)
        b = codec.rel_error_bound
        quantization = b * math.sqrt(q) * (1 + b) ** q * ref.energy / ref.norm
    rel = rounding + quantization
    if op == "avg" and collective != "allgather":
        rel += u  # the division by n, once
    return rel * (1 + u) + u  # the result's rounding to the data type
