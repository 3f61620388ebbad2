"""``coccl-bench fidelity``: the error of one encode/decode roundtrip of each codec,
on given tensors or on built-in synthetic tensors shaped like tensor-parallel traffic.

    coccl-bench fidelity                                   # synthetic tensors
    coccl-bench fidelity --input acts.npy grads.npz --compressor taco,taco:group_size=32
    coccl-bench fidelity --tensors gpt-tensors.npz --compressor tah:row=256,int:bits=4
    coccl-bench fidelity --model-quantizations --ranks 8

Each tensor is flattened and encoded, decoded to its own dtype and compared with itself
in float64: relative L2 error ``||y - x|| / ||x||``, largest absolute error, cosine
similarity ``<x, y> / (||x|| ||y||)``, SNR ``20 log10(||x|| / ||y - x||)`` dB (``inf``
for an exact roundtrip), and the payload's bytes per element. Against the codec's stated
bound: ``bound`` is the whole tensor's (``bounds.roundtrip_bound``), and ``bound_ratio``
the worst group's error over its own bound ``b ||x_g|| + sqrt(n) floor`` (``floor`` the
codec's ``payload_floor`` of the tensor), the groups being the codec's ``alignment``
runs from the start of the flat tensor (1 or less: within the contract; ``groups_over``
counts the groups above it).

``--input`` takes ``.npy`` and ``.npz`` files; every float array of an ``.npz`` counts
(named ``file.npz:key``), other arrays are skipped with a note. ``--tensors`` takes
``.npz`` files whose every float array is a named case (named by its key alone, unique
over the files), as ``examples/capture_tensors.py`` writes them: an entry ``__meta__``
holding a JSON object (a 0-d string array) is not a case but the capture's record,
kept in the output as ``captures[file]``; its ``tensors`` (name or ``prefix.*`` -> what
the array stands for) goes to the output's ``tensors``.

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
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from coccl.core.arrays import FLOAT_DTYPES

from . import bounds
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
META_KEY = "__meta__"  # a --tensors file's record of how it was made, not a case

Named = list[tuple[str, np.ndarray]]


def _read_arrays(path: str, flag: str) -> Named:
    """``(key, array)`` of every array of a ``.npz`` (``("", array)`` for a ``.npy``).

    Raises:
        UsageError: the file is missing, or not a ``.npy``/``.npz`` without pickles.
    """
    if not Path(path).is_file():
        raise UsageError(f"{flag} {path}: no such file")
    try:
        loaded = np.load(path, allow_pickle=False)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                return [(key, loaded[key]) for key in loaded.files]
        return [("", loaded)]
    except Exception as exc:  # not a .npy/.npz, pickled objects, truncated...
        raise UsageError(f"{flag} {path}: cannot read it as .npy or .npz: {exc}") from None


def _keep_floats(arrays: Named, tensors: Named, notes: list[str]) -> None:
    """Append the non-empty float arrays to ``tensors``; say why the others are not."""
    for name, array in arrays:
        if array.dtype not in FLOAT_DTYPES:
            notes.append(f"{name}: dtype {array.dtype} is not a float type, skipped")
        elif array.size == 0:
            notes.append(f"{name}: empty, skipped")
        else:
            tensors.append((name, array))


def load_inputs(paths: list[str]) -> tuple[Named, list[str]]:
    """The float arrays of ``.npy``/``.npz`` files, and notes on arrays skipped.

    Raises:
        UsageError: a file is missing or unreadable, or no file holds a float array.
    """
    tensors: Named = []
    notes: list[str] = []
    for path in paths:
        arrays = _read_arrays(path, "--input")
        _keep_floats([(f"{path}:{k}" if k else path, a) for k, a in arrays], tensors, notes)
    if not tensors:
        raise UsageError("no float array in --input")
    return tensors, notes


def _capture_meta(path: str, array: np.ndarray) -> dict[str, Any]:
    """The JSON object of a ``__meta__`` entry (UsageError if it is not one)."""
    try:
        if array.dtype.kind != "U" or array.ndim != 0:
            raise ValueError(f"a 0-d string array expected, got {array.dtype} {array.shape}")
        meta = json.loads(str(array))
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:  # JSONDecodeError is one
        raise UsageError(f"--tensors {path}: {META_KEY} is not a JSON object: {exc}") from None
    return meta


def load_tensors(paths: list[str]) -> tuple[Named, list[str], dict[str, Any]]:
    """The float arrays of ``.npz`` files, each a case named by its key; notes on arrays
    skipped; and ``{"tensors": descriptions, "captures": {file: __meta__}}``.

    Raises:
        UsageError: a file is missing, unreadable or not an ``.npz``, a name repeats
            across files, a ``__meta__`` is not a JSON object, or no float array.
    """
    tensors: Named = []
    notes: list[str] = []
    info: dict[str, Any] = {"tensors": {}, "captures": {}}
    seen: dict[str, str] = {}
    for path in paths:
        arrays = _read_arrays(path, "--tensors")
        if arrays and arrays[0][0] == "":
            raise UsageError(f"--tensors {path}: an .npy holds no names; give an .npz")
        cases = []
        for key, array in arrays:
            if key == META_KEY:
                meta = _capture_meta(path, array)
                info["captures"][path] = meta
                info["tensors"].update(meta.get("tensors", {}))
                continue
            if key in seen:
                raise UsageError(f"--tensors: {key!r} is in both {seen[key]} and {path}")
            seen[key] = path
            cases.append((key, array))
        _keep_floats(cases, tensors, notes)
    if not tensors:
        raise UsageError("no float array in --tensors")
    return tensors, notes, info


# ------------------------------------------------------------------- measuring
@dataclass
class Errors:
    """One roundtrip's errors (see the module docstring).

    Attributes:
        rel_l2: ``||y - x|| / ||x||`` (``||y - x||`` for an all-zero x).
        max_abs: ``max |y - x|``. cosine: ``<x, y> / (||x|| ||y||)`` (nan for a zero
            vector). snr_db: ``20 log10(||x|| / ||y - x||)``.
        bound: the codec's whole-tensor bound on ``rel_l2``.
        bound_ratio: the largest group error over that group's bound (0: exact).
        groups_over: how many groups exceed their bound.
    """

    rel_l2: float
    max_abs: float
    cosine: float
    snr_db: float
    bound: float
    bound_ratio: float
    groups_over: int


def _snr_db(norm: float, err: float) -> float:
    if math.isnan(err):
        return math.nan
    if err == 0:
        return math.inf
    if norm == 0:
        return -math.inf
    return 20.0 * math.log10(norm / err)


def _group_norms(v: np.ndarray, group: int) -> np.ndarray:
    """L2 norm of each run of ``group`` elements of float64 ``v`` (the last one short)."""
    padded = np.zeros(-(-v.size // group) * group)
    padded[: v.size] = v
    return np.linalg.norm(padded.reshape(-1, group), axis=1)


def group_bound_ratios(codec: Any, x: np.ndarray, diff: np.ndarray) -> np.ndarray:
    """Each group's ``||e_g|| / (b ||x_g|| + sqrt(n_g) floor)``, ``b`` the roundtrip
    bound for ``x``'s dtype and ``floor`` the codec's for ``x`` as one payload
    (``payload_floor``): at most 1 by the codec's contract (0 where ``e_g`` is 0)."""
    group = max(1, int(codec.alignment))
    err = _group_norms(diff, group)
    sizes = np.full(err.size, float(group))
    if x.size % group:
        sizes[-1] = x.size % group
    x64 = x.astype(np.float64)
    finite = np.abs(x64[np.isfinite(x64)])
    floor = codec.payload_floor(float(finite.max()) if finite.size else 0.0)
    limit = bounds.roundtrip_bound(codec, x.dtype) * _group_norms(x64, group)
    limit = limit + np.sqrt(sizes) * floor
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(err == 0, 0.0, err / limit)  # a nonzero error over a 0 limit: inf


def roundtrip_errors(codec: Any, x: np.ndarray) -> Errors:
    """The errors of one encode/decode of flat ``x``, in float64."""
    y = codec.decode(codec.encode(x), count=x.size, dtype=x.dtype)
    ref = x.astype(np.float64)
    out = y.astype(np.float64)
    diff = out - ref
    err = float(np.linalg.norm(diff))
    norm = float(np.linalg.norm(ref))
    out_norm = float(np.linalg.norm(out))
    with np.errstate(divide="ignore", invalid="ignore"):
        cosine = float(np.dot(ref, out) / (norm * out_norm))
    ratios = group_bound_ratios(codec, x, diff)
    return Errors(
        rel_l2=err / norm if norm > 0 else err,
        max_abs=float(np.max(np.abs(diff))),
        cosine=cosine,
        snr_db=_snr_db(norm, err),
        bound=bounds.roundtrip_bound(codec, x.dtype),
        bound_ratio=float(np.max(ratios)),
        groups_over=int(np.count_nonzero(~(ratios <= 1.0))),
    )


@dataclass
class FidelityRow:
    """One roundtrip of one tensor through one codec.

    Attributes:
        tensor: its name. shape: its shape. dtype: its dtype. codec: the label.
        bytes_per_element: the payload's size over the element count.
        rel_l2, max_abs, cosine, snr_db, bound, bound_ratio, groups_over: :class:`Errors`.
        rel_l2_two_shot, rel_l2_ring: the AllReduce error model (with
            ``--model-quantizations``, else None).
    """

    tensor: str
    shape: list[int]
    dtype: str
    codec: str
    bytes_per_element: float
    rel_l2: float
    max_abs: float
    cosine: float
    snr_db: float
    bound: float
    bound_ratio: float
    groups_over: int
    rel_l2_two_shot: float | None = None
    rel_l2_ring: float | None = None


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
            errors = roundtrip_errors(spec.codec, flat)
            per_element = spec.codec.encoded_nbytes(flat.size, flat.dtype) / flat.size
            row = FidelityRow(
                tensor=name,
                shape=list(array.shape),
                dtype=flat.dtype.name,
                codec=spec.label,
                bytes_per_element=per_element,
                **asdict(errors),
            )
            if nranks is not None:
                rel = errors.rel_l2
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
    add("--tensors", nargs="+", metavar="FILE.npz",
        help=".npz files, each float array a case named by its key "
             "(examples/capture_tensors.py writes them)")
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
    if args.input and args.tensors:
        return "--input and --tensors exclude each other"
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
    info: dict[str, Any] = {}
    try:
        check_writable(args.json)
        if args.tensors:
            tensors, notes, info = load_tensors(args.tensors)
        elif args.input:
            tensors, notes = load_inputs(args.input)
        else:
            tensors, notes = synthetic_tensors(args.shape, args.seed), []
    except UsageError as exc:
        return refuse(str(exc))
    nranks = args.ranks if args.model_quantizations else None
    rows, skipped = measure(tensors, args.compressor, nranks)
    source = "tensors" if args.tensors else "input" if args.input else "synthetic"
    meta: dict[str, Any] = {
        **record_header(args),
        "source": source,
        "compressors": {
            spec.label: {
                **spec.codec.get_config(),
                "rel_error_typical": spec.codec.rel_error_typical,
            }
            for spec in args.compressor
        },
    }
    if source == "synthetic":
        meta.update(seed=args.seed, shape=list(args.shape))
        meta["tensors"] = {name: text for name, (_, text) in SYNTHETIC.items()}
    elif source == "tensors":
        meta.update(info)
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
        f"{row.bytes_per_element:.4f}",
        f"{row.rel_l2:.3e}",
        f"{row.max_abs:.3e}",
        f"{row.cosine:.6f}",
        f"{row.snr_db:.1f}",
        f"{row.bound:.3e}",
        f"{row.bound_ratio:.3f}",
        str(row.groups_over),
    ]
    if model:
        cells += [f"{row.rel_l2_two_shot:.3e}", f"{row.rel_l2_ring:.3e}"]
    return cells


def _print(
    meta: dict[str, Any], rows: list[FidelityRow], notes: list[str], nranks: int | None
) -> None:
    model = nranks is not None
    titles = ["tensor", "shape", "dtype", "codec", "B/elem", "rel_l2", "max_abs", "cosine"]
    titles += ["snr_db", "bound", "bound_ratio", "over"]
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
    for path, capture in meta.get("captures", {}).items():
        print(f"# {path}: {capture.get('what', 'a capture')}")
        print(f"#   made by: {capture.get('command', '?')} (commit {capture.get('commit', '?')})")
    for name, text in meta["tensors"].items() if meta["source"] == "tensors" else ():
        print(f"#   {name}: {text}")
    print(
        "# B/elem: payload bytes per element; bound: the codec's rel_l2 bound; bound_ratio: "
        "the worst group's error over its bound; over: groups above it"
    )
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
