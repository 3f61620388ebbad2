"""The one-rank mode of ``coccl-bench tp-step``: a predicted TP = 2 step per link class.

On one GPU nothing goes over a link, so the step of two ranks is predicted, and marked
``"kind": "prediction"`` in the record. The model (``MODEL``): a TP = 2 step takes the
compute of one rank's shard (measured here: rank 0's half of every layer, run alone,
its AllReduces left out), plus, for each of its AllReduces, the time the same AllReduce
took between two H200s on that link in a recorded sweep
(``bench/results/h200x2-nccl-links.json``: coccl-bench's in-place AllReduce, linearly
interpolated between the recorded sizes that bracket the message). Nothing overlaps:
Megatron's TP AllReduces sit on the critical path. Left out: the per-call cost of going
through ``torch.distributed`` rather than a Communicator (that file's ``per_call``
rows), and any contention of compute and communication for the GPU.

The codecs' own cost on the step's messages is measured too (``codec_costs``), for the
record: the recorded AllReduce times already include it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from coccl.compressors import get_compressor

from .codec import CodecSpec, Device, measure

LINKS_FILE = Path(__file__).resolve().parent / "results" / "h200x2-nccl-links.json"
LINKS = ("nvlink", "shm", "socket")  # NVLink, a PCIe-class path (host memory), sockets
PREDICT_TP = 2  # the recorded sweeps are of two ranks
MODEL = (
    "TP=2 step = rank 0's shard of the TP=2 blocks measured alone here (compute) + "
    "AllReduces per step x the recorded 2-rank in-place AllReduce time of the message on "
    "the link (linear between the bracketing recorded sizes); no overlap; the "
    "torch.distributed per-call cost left out"
)


@dataclass
class Prediction:
    """One arm's predicted TP = 2 step on one link (``bench/SCHEMA.md``)."""

    kind: str
    link: str
    arm: str
    algorithm: str
    compressor: str
    step_ms: float | None
    compute_ms: float
    comm_ms: float | None
    tokens_per_s: float | None
    speedup: float | None
    allreduce_us: float | None
    rows: list[dict[str, Any]]
    note: str | None


@dataclass
class CodecCost:
    """A codec's measured kernels on one TP message (``bench/SCHEMA.md``)."""

    codec: str
    dtype: str
    count: int
    encode_us: float
    decode_accumulate_us: float
    per_step_us: float


def load_links(path: Path) -> dict[str, Any]:
    """The recorded two-GPU sweeps (``merge_links.py``'s layout: ``rows`` with ``link``).

    Raises:
        ValueError: the file is missing or holds no such rows.
    """
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--links {path}: cannot read the recorded sweeps: {exc}") from None
    rows = record.get("rows") if isinstance(record, dict) else None
    if not rows or not all("link" in r and "time_us_inplace" in r for r in rows):
        raise ValueError(f"--links {path}: no rows with 'link' and 'time_us_inplace'")
    return record


def recorded_time_us(
    rows: list[dict[str, Any]], link: str, dtype: str, algorithm: str, compressor: str, size: int
) -> tuple[float | None, list[dict[str, Any]], str | None]:
    """The in-place AllReduce time of ``size`` bytes on ``link``, linear between the two
    recorded sizes around it (or the recorded size itself); the rows used; why not."""
    points = sorted(
        (r["size"], r["time_us_inplace"], r.get("sweep"))
        for r in rows
        if r["link"] == link
        and r["type"] == dtype
        and r["algorithm"] == algorithm
        and r["compressor"] == compressor
    )
    if not points:
        return None, [], f"no recorded {algorithm} {compressor} {dtype} rows on {link}"
    sizes = [p[0] for p in points]
    if not sizes[0] <= size <= sizes[-1]:
        return None, [], f"{size} B is outside the recorded {sizes[0]}-{sizes[-1]} B on {link}"
    hi = next(i for i, s in enumerate(sizes) if s >= size)
    lo = hi if sizes[hi] == size else hi - 1
    used = [{"size": p[0], "time_us_inplace": p[1], "sweep": p[2]} for p in points[lo : hi + 1]]
    if lo == hi:
        return float(points[hi][1]), used, None
    (s0, t0, _), (s1, t1, _) = points[lo], points[hi]
    return float(t0 + (t1 - t0) * (size - s0) / (s1 - s0)), used, None


def recorded_variant(arm: dict[str, Any], algorithm: str) -> tuple[str, str] | None:
    """The (algorithm, compressor) rows of the recorded sweeps that stand for ``arm``:
    NCCL's own AllReduce for the baseline, the coccl group's schedule and codec for a
    coccl arm; None for a codec with options the sweeps did not run."""
    if arm["compressor"] is None:
        return "native", "identity"
    config = arm["compressor_config"]
    if config != get_compressor(config["id"]).get_config():
        return None
    return algorithm, config["id"]


def predict(
    links: dict[str, Any],
    arms: list[dict[str, Any]],
    algorithm: str,
    dtype: str,
    message_bytes: int,
    calls: int,
    compute_s: float,
    tokens: int,
) -> list[Prediction]:
    """Every arm's predicted TP = 2 step on every link of ``LINKS``; ``speedup`` against
    the baseline's prediction on the same link."""
    out: list[Prediction] = []
    for link in LINKS:
        base_step: float | None = None
        for arm in arms:
            variant = recorded_variant(arm, algorithm)
            if variant is None:
                time_us, used, note = None, [], "the recorded sweeps ran no codec with options"
            else:
                time_us, used, note = recorded_time_us(
                    links["rows"], link, dtype, *variant, message_bytes
                )
            comm_s = None if time_us is None else calls * time_us / 1e6
            step_s = None if comm_s is None else compute_s + comm_s
            if arm["compressor"] is None:
                base_step = step_s
            out.append(
                Prediction(
                    kind="prediction",
                    link=link,
                    arm=arm["arm"],
                    algorithm=variant[0] if variant else algorithm,
                    compressor=variant[1] if variant else arm["compressor"],
                    step_ms=None if step_s is None else step_s * 1e3,
                    compute_ms=compute_s * 1e3,
                    comm_ms=None if comm_s is None else comm_s * 1e3,
                    tokens_per_s=None if step_s is None else tokens / step_s,
                    speedup=base_step / step_s if base_step and step_s else None,
                    allreduce_us=time_us,
                    rows=used,
                    note=note,
                )  # fmt: skip
            )
    return out


def codec_costs(
    device: Device,
    specs: list[CodecSpec],
    dtype: np.dtype,
    count: int,
    calls: int,
    iters: int,
    warmup: int,
) -> list[CodecCost]:
    """Each codec's encode and decode-accumulate of one ``count``-element message, timed
    as ``coccl-bench codec`` times them; ``per_step_us``: ``calls`` messages' worth. On
    two ranks, two-shot encodes and decodes half a message twice per call: about one
    whole encode and decode."""
    costs = []
    for spec in specs:
        ops = ("encode", "decode_accumulate")
        rows = measure(device, spec, dtype, count, iters, warmup, 1.0, ops, copy_at_size=False)
        by_op = {row.op: row.time_ms * 1e3 for row in rows}
        enc, dec = by_op["encode"], by_op["decode_accumulate"]
        costs.append(CodecCost(spec.label, dtype.name, count, enc, dec, calls * (enc + dec)))
    return costs


def as_dicts(items: list[Any]) -> list[dict[str, Any]]:
    return [asdict(item) for item in items]
