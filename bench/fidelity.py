"""``coccl-bench fidelity``: the error of one encode/decode roundtrip of each codec, on
given tensors or on built-in synthetic tensors shaped like tensor-parallel traffic.

    coccl-bench fidelity                                   # synthetic tensors
    coccl-bench fidelity --input acts.npy grads.npz --compressor taco,taco:group_size=32
    coccl-bench fidelity --model-quantizations --ranks 8

Each tensor is flattened and encoded, decoded to its own dtype and compared with itself
in float64: relative L2 error ``||y - x|| / ||x||``, largest absolute error, and SNR
``20 log10(||x|| / ||y - x||)`` dB (``inf`` for an exact roundtrip). ``--input`` takes
``.npy`` and ``.npz`` files; every float array of an ``.npz`` counts (named
``file.npz:key``), other arrays are skipped with a note.

``--model-quantizations`` adds what an AllReduce of such tensors would carry by the error
model of ``tests/mpi/test_compressed.py``: ``k`` independent roundtrip errors of relative
size ``e`` give ``sqrt(k) * e``, with ``k = (n-1)/n + 1`` for two-shot (each foreign
contribution quantized once, the reduced shard once more: just under 2) and
``k = (n-1)/2 + 1`` for ring (hop t re-quantizes a partial sum of t+1 contributions) at
``n = --ranks``. The model assumes rank contributions of similar size and independent
errors.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from coccl.core.arrays import FLOAT_DTYPES

from .cli import command, positive_int
from .codec import (
    CodecSpec,
    Columns,
    UsageError,
    check_writable,
    codec_specs,
    provenance_line,
    record_header,
    refuse,
    write_record,
)

SEED = 20240917  # of the synthetic tensors
DEFAULT_CODECS = "identity,int8,taco,taco:ash=False,taco:dual_scale=False,taco:fp8_format=e5m2"

Generator = Callable[[np.random.Generator, tuple[int, int]], np.ndarray]


# ------------------------------------------------------------ synthetic tensors
def _gaussian(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32)


def _heavy_tail(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    return rng.standard_t(3, shape).astype(np.float32)


def _outlier_channels(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    x = rng.standard_normal(shape, dtype=np.float32)
    hidden = shape[1]
    channels = rng.choice(hidden, size=max(1, hidden // 256), replace=False)
    x[:, channels] *= rng.uniform(20.0, 100.0, size=channels.size).astype(np.float32)
    return x


def _lognormal_grad(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    magnitude = rng.lognormal(mean=math.log(1e-3), sigma=2.0, size=shape)
    return (magnitude * rng.choice([-1.0, 1.0], size=shape)).astype(np.float32)


def _sparse(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    x = rng.standard_normal(shape, dtype=np.float32)
    x[rng.random(shape) >= 0.05] = 0.0
    return x


SYNTHETIC: dict[str, tuple[Generator, str]] = {
    "gaussian": (_gaussian, "N(0, 1): dense, centred on zero"),
    "heavy_tail": (_heavy_tail, "Student-t with 3 degrees of freedom"),
    "outlier_channels": (
        _outlier_channels,
        "activations [tokens, hidden], N(0, 1) with 1 in 256 hidden channels 20-100x larger",
    ),
    "lognormal_grad": (
        _lognormal_grad,
        "gradients: random sign x lognormal(log 1e-3, sigma 2), a few values 1e4x the median",
    ),
    "sparse": (_sparse, "95% zeros, the rest N(0, 1)"),
}


def synthetic_tensors(shape: tuple[int, int], seed: int) -> list[tuple[str, np.ndarray]]:
    """The built-in tensors, float32 of ``shape`` ([tokens, hidden]), each from its own
    stream of ``seed``: the same on every run."""
    return [
        (name, make(np.random.default_rng([seed, index]), shape))
        for index, (name, (make, _)) in enumerate(SYNTHETIC.items())
    ]


# ------------------------------------------------------------------ input files
def load_inputs(paths: list[str]) -> tuple[list[tuple[str, np.ndarray]], list[str]]:
    """The float arrays of ``.npy``/``.npz`` files, and notes on arrays skipped.

    Raises:
        UsageError: a file is missing or unreadable, or no file holds a float array.
    """
    tensors: list[tuple[str, np.ndarray]] = []
    notes: list[str] = []
    for path in paths:
        if not Path(path).is_file():
            raise UsageError(f"--input {path}: no such file")
        try:
            loaded = np.load(path, allow_pickle=False)
            if isinstance(loaded, np.lib.npyio.NpzFile):
                with loaded:
                    arrays = [(f"{path}:{key}", loaded[key]) for key in loaded.files]
            else:
                arrays = [(path, loaded)]
        except Exception as exc:  # not a .npy/.npz, pickled objects, truncated...
            raise UsageError(f"--input {path}: cannot read it as .npy or .npz: {exc}") from None
        for name, array in arrays:
            if array.dtype not in FLOAT_DTYPES:
                notes.append(f"{name}: dtype {array.dtype} is not a float type, skipped")
            elif array.size == 0:
                notes.append(f"{name}: empty, skipped")
            else:
                tensors.append((name, array))
    if not tensors:
        raise UsageError("no float array in --input")
    return tensors, notes


# ------------------------------------------------------------------- measuring
@dataclass
class FidelityRow:
    """One roundtrip of one tensor through one codec.

    Attributes:
        tensor: its name. shape: its shape. dtype: its dtype. codec: the label.
        rel_l2: ``||y - x|| / ||x||`` (``||y - x||`` for an all-zero x).
        max_abs: ``max |y - x|``. snr_db: ``20 log10(||x|| / ||y - x||)``.
        rel_l2_two_shot, rel_l2_ring: the AllReduce error model (with
            ``--model-quantizations``, else None).
    """

    tensor: str
    shape: list[int]
    dtype: str
    codec: str
    rel_l2: float
    max_abs: float
    snr_db: float
    rel_l2_two_shot: float | None = None
    rel_l2_ring: float | None = None


def roundtrip_errors(codec: Any, x: np.ndarray) -> tuple[float, float, float]:
    """``(rel_l2, max_abs, snr_db)`` of one encode/decode of flat ``x``, in float64."""
    y = codec.decode(codec.encode(x), count=x.size, dtype=x.dtype)
    ref = x.astype(np.float64)
    diff = y.astype(np.float64) - ref
    err = float(np.linalg.norm(diff))
    norm = float(np.linalg.norm(ref))
    max_abs = float(np.max(np.abs(diff)))
    rel = err / norm if norm > 0 else err
    if math.isnan(err):
        snr = math.nan
    elif err == 0:
        snr = math.inf
    elif norm == 0:
        snr = -math.inf
    else:
        snr = 20.0 * math.log10(norm / err)
    return rel, max_abs, snr


def allreduce_quantizations(algorithm: str, nranks: int) -> float:
    """``k``: independent roundtrip errors, in units of e^2 relative to the result, that
    an AllReduce over ``nranks`` carries (tests/mpi/test_compressed.py's model)."""
    reduce = (nranks - 1) / nranks if algorithm == "two_shot" else (nranks - 1) / 2
    return reduce + 1.0


def measure(
    tensors: list[tuple[str, np.ndarray]], specs: list[CodecSpec], nranks: int | None
) -> tuple[list[FidelityRow], list[str]]:
    """A row per (tensor, codec); notes on pairs a codec refuses. ``nranks`` adds the
    AllReduce model (None: no model)."""
    rows: list[FidelityRow] = []
    notes: list[str] = []
    for name, array in tensors:
        flat = np.ascontiguousarray(array).reshape(-1)
        for spec in specs:
            try:
                spec.codec.check_dtype(flat.dtype)
            except TypeError as exc:
                notes.append(f"{name} x {spec.label}: {exc}")
                continue
            rel, max_abs, snr = roundtrip_errors(spec.codec, flat)
            row = FidelityRow(
                name, list(array.shape), flat.dtype.name, spec.label, rel, max_abs, snr
            )
            if nranks is not None:
                row.rel_l2_two_shot = rel * math.sqrt(allreduce_quantizations("two_shot", nranks))
                row.rel_l2_ring = rel * math.sqrt(allreduce_quantizations("ring", nranks))
            rows.append(row)
    return rows, notes


# ----------------------------------------------------------------- the command
def shape_2d(text: str) -> tuple[int, int]:
    """argparse type: ``2048x1024`` -> ``(2048, 1024)``."""
    try:
        tokens, hidden = (int(part) for part in text.lower().split("x"))
    except ValueError:  # not two integers
        tokens = hidden = 0
    if min(tokens, hidden) < 1:
        raise argparse.ArgumentTypeError(
            f"invalid shape {text!r}: give TOKENSxHIDDEN, e.g. 2048x1024"
        )
    return tokens, hidden


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The codec list, the tensors (files or synthetic), the model, the output."""
    add = parser.add_argument
    # fmt: off
    add("--compressor", type=codec_specs, default=DEFAULT_CODECS,
        help="comma-separated codecs, each NAME or NAME:KEY=VALUE,...")
    add("--input", nargs="+", metavar="FILE",
        help=".npy/.npz files, every float array flattened "
             "(default: the built-in synthetic tensors)")
    add("--shape", type=shape_2d, default="2048x1024",
        help="TOKENSxHIDDEN of the synthetic tensors")
    add("--seed", type=int, default=SEED, help="seed of the synthetic tensors")
    add("--model-quantizations", action="store_true",
        help="also give the AllReduce error model: two-shot and ring at --ranks ranks")
    add("--ranks", type=positive_int, default=4,
        help="ranks of the modelled AllReduce")
    add("--json", metavar="PATH", help="write the results as JSON")
    # fmt: on


def validate(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags taken together, if anything."""
    if args.model_quantizations and args.ranks < 2:
        return f"--ranks must be at least 2 for the AllReduce model, got {args.ranks}"
    return None


@command(
    "fidelity",
    help="relative L2 / max-abs error and SNR of one roundtrip of each codec",
    arguments=add_arguments,
    mpi=False,
    validate=validate,
)
def run(args: argparse.Namespace) -> int:
    """Roundtrip every tensor through every codec; print the table; write the JSON."""
    try:
        check_writable(args.json)
        if args.input:
            tensors, notes = load_inputs(args.input)
        else:
            tensors, notes = synthetic_tensors(args.shape, args.seed), []
    except UsageError as exc:
        return refuse(str(exc))
    nranks = args.ranks if args.model_quantizations else None
    rows, skipped = measure(tensors, args.compressor, nranks)
    meta: dict[str, Any] = {
        **record_header(args),
        "source": "input" if args.input else "synthetic",
        "compressors": {
            spec.label: {
                **spec.codec.get_config(),
                "rel_error_typical": spec.codec.rel_error_typical,
            }
            for spec in args.compressor
        },
    }
    if not args.input:
        meta.update(seed=args.seed, shape=list(args.shape))
        meta["tensors"] = {name: text for name, (_, text) in SYNTHETIC.items()}
    if nranks is not None:
        meta["model"] = {
            "ranks": nranks,
            "quantizations": {a: allreduce_quantizations(a, nranks) for a in ("two_shot", "ring")},
            "rule": "rel_l2 x sqrt(quantizations) (tests/mpi/test_compressed.py)",
        }
    _print(meta, rows, notes + skipped, nranks)
    if args.json:
        write_record(args.json, {**meta, "rows": [asdict(row) for row in rows]})
        print(f"# JSON written to {args.json}", flush=True)
    return 0


def _cells(row: FidelityRow, model: bool) -> list[str]:
    cells = [
        row.tensor,
        "x".join(map(str, row.shape)),
        row.dtype,
        row.codec,
        f"{row.rel_l2:.3e}",
        f"{row.max_abs:.3e}",
        f"{row.snr_db:.1f}",
    ]
    if model:
        cells += [f"{row.rel_l2_two_shot:.3e}", f"{row.rel_l2_ring:.3e}"]
    return cells


def _print(
    meta: dict[str, Any], rows: list[FidelityRow], notes: list[str], nranks: int | None
) -> None:
    model = nranks is not None
    titles = ["tensor", "shape", "dtype", "codec", "rel_l2", "max_abs", "snr_db"]
    if model:
        titles += [f"two_shot@{nranks}", f"ring@{nranks}"]
    cells = [_cells(row, model) for row in rows]
    columns = Columns.fit(titles, cells, left=4)
    print("# coccl-bench fidelity: one encode/decode roundtrip per tensor and codec")
    print("# errors of the decoded tensor (in its dtype) against the input, in float64")
    if meta["source"] == "synthetic":
        tokens, hidden = meta["shape"]
        print(f"# synthetic tensors [{tokens}, {hidden}] float32, seed {meta['seed']}:")
        for name, text in meta["tensors"].items():
            print(f"#   {name}: {text}")
    if model:
        k = meta["model"]["quantizations"]
        print(
            f"# AllReduce model at {nranks} ranks: rel_l2 x sqrt(k), k = {k['two_shot']:.2f} "
            f"(two_shot), {k['ring']:.2f} (ring)"
        )
    print(f"# command: {meta['command']}")
    print(provenance_line(meta))
    for note in notes:
        print(f"# note: {note}")
    print(columns.header())
    for line in cells:
        print(columns.line(line))
