"""``coccl-bench codec``: encode, decode and decode-accumulate throughput of each codec,
against the device's measured copy bandwidth.

    coccl-bench codec --device cpu --counts 16M -d float32,bfloat16 --compressor identity,int8,taco
    coccl-bench codec --device gpu --counts 64M,256M --compressor taco,taco:group_size=32

Each (codec, dtype, count) times three operations on fresh random data (normal, never
zeros): ``encode`` (input -> payload), ``decode`` (payload -> output of the dtype) and
``decode_accumulate`` (payload added into a float32 accumulator: the fused decode-reduce
of a ReduceScatter). A time is the median of ``-n`` single calls after ``-w`` warm-up
calls (at least one per buffer set, which also absorbs numba's compilation); the calls
rotate over buffer sets that together exceed ``ROTATE_BYTES``, more than a last-level
cache or a GPU's L2, so that each call streams from memory. On the CPU a call is timed
with ``time.perf_counter``; on the GPU with CUDA events around the kernel launches.

Bandwidth counts bytes read + written: encode = input + payload, decode = payload +
output, decode_accumulate = payload + the float32 accumulator read and written. The
reference is a plain copy of a large buffer (bytes read + written as well): numpy's
``copyto`` on the CPU (one thread, while numba's kernels use all of them, so a fraction
above 1 is possible there), a device-to-device memcpy on the GPU; ``fraction`` is the
codec's GB/s over the copy's.

This module also holds what ``coccl-bench fidelity`` shares with it: the ``--compressor``
list (``name`` or ``name:key=value,...``), the column printer and the JSON writer.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from coccl.compressors import Compressor, get_compressor

from . import launch
from .cli import comma_list, command, datatype, parse_size, positive_int
from .table import cpu_name, provenance

EXIT_USAGE = 2  # as argparse: the request itself cannot run
SEED = 20240917  # of the random input data
ROTATE_BYTES = 256 << 20  # each op's buffer sets together hold at least this much
MAX_SETS = 8
HOST_COPY_BYTES = 256 << 20
GPU_COPY_BYTES = 1 << 30
DEFAULT_COUNTS = {"cpu": "16M", "gpu": "64M,256M"}
NOTE = (
    "GBps counts bytes read + written (encode: input + payload; decode: payload + output; "
    "decode_accumulate: payload + float32 accumulator read and written). fraction = GBps / "
    "copy_GBps. dtype is the data type the payload stands for; decode_accumulate always adds "
    "into float32. time_ms: median of one call."
)


class UsageError(Exception):
    """A request that cannot run (no GPU, an unreadable input...): exit status 2."""


def refuse(message: str) -> int:
    """Say why the request cannot run, as argparse does, and return exit status 2."""
    print(f"coccl-bench: error: {message}", file=sys.stderr, flush=True)
    return EXIT_USAGE


# --------------------------------------------------------------- the codec list
@dataclass(frozen=True)
class CodecSpec:
    """One ``--compressor`` entry: ``label`` as typed (``taco:group_size=32``), and the
    codec it builds."""

    label: str
    codec: Compressor


def _option_value(text: str) -> bool | int | float | str:
    """``True``/``false`` -> bool, ``32`` -> int, ``0.5`` -> float, else the text."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _split_specs(text: str) -> list[tuple[str, list[str]]]:
    """``"identity,taco:group_size=32,ash=False"`` -> ``[("identity", []), ("taco",
    ["group_size=32", "ash=False"])]``: a ``key=value`` after a ``name:key=value`` is one
    more option of that name."""
    specs: list[tuple[str, list[str]]] = []
    for token in (t.strip() for t in text.split(",")):
        if not token:
            continue
        name, colon, option = token.partition(":")
        if colon:
            specs.append((name.strip(), [option.strip()] if option.strip() else []))
        elif "=" in token:
            if not specs or not specs[-1][1]:
                raise argparse.ArgumentTypeError(
                    f"option {token!r} does not follow a compressor 'name:key=value'"
                )
            specs[-1][1].append(token)
        else:
            specs.append((token, []))
    if not specs:
        raise argparse.ArgumentTypeError(
            f"invalid list {text!r}: give comma-separated compressors, e.g. identity,taco"
        )
    return specs


def codec_specs(text: str) -> list[CodecSpec]:
    """argparse type: the ``--compressor`` list, each ``name`` or ``name:key=value,...``
    (``taco:group_size=32,ash=False``), built into codecs; repeats dropped.

    Raises:
        argparse.ArgumentTypeError: a malformed entry, an unknown name or a bad option.
    """
    out: dict[str, CodecSpec] = {}
    for name, options in _split_specs(text):
        label = f"{name}:{','.join(options)}" if options else name
        kwargs: dict[str, Any] = {}
        for option in options:
            key, eq, value = option.partition("=")
            if not eq or not key.strip():
                raise argparse.ArgumentTypeError(
                    f"compressor {label!r}: expected key=value, got {option!r}"
                )
            kwargs[key.strip()] = _option_value(value.strip())
        try:
            codec = get_compressor(name, **kwargs)
        except Exception as exc:  # unknown name, unknown option, bad value
            raise argparse.ArgumentTypeError(
                f"compressor {label!r} is not available: {exc}"
            ) from None
        out.setdefault(label, CodecSpec(label, codec))
    return list(out.values())


# ------------------------------------------------------------ output helpers
@dataclass(frozen=True)
class Columns:
    """Fixed-width columns: the first ``left`` left-aligned, the others right-aligned; header
    lines start with ``#`` and rows with a space, as nccl-tests prints them."""

    titles: tuple[str, ...]
    widths: tuple[int, ...]
    left: int = 1  # how many leading (text) columns are left-aligned

    @classmethod
    def fit(cls, titles: Sequence[str], samples: Sequence[Sequence[str]], left: int = 1) -> Columns:
        """Columns wide enough for ``titles`` and every cell of ``samples``."""
        widths = [len(t) for t in titles]
        for cells in samples:
            widths = [max(w, len(c)) for w, c in zip(widths, cells, strict=True)]
        return cls(tuple(titles), tuple(widths), left)

    def _join(self, cells: Sequence[str]) -> str:
        parts = [
            cell.ljust(width) if i < self.left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, self.widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    def header(self) -> str:
        return "#" + self._join(self.titles)

    def line(self, cells: Sequence[str]) -> str:
        return " " + self._join(cells)


def _jsonable(value: Any) -> Any:
    """Non-finite floats as strings ("inf", "nan"), as ``table.py`` writes them: strict
    JSON has neither, and an exact roundtrip's infinite SNR must stay visible."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_record(path: str | Path, record: dict[str, Any]) -> None:
    """Write ``record`` to ``path`` as indented strict JSON."""
    text = json.dumps(_jsonable(record), indent=2, allow_nan=False)
    Path(path).write_text(text + "\n")


def check_writable(path: str | None) -> None:
    """Refuse a ``--json`` path whose folder does not exist, before measuring."""
    if path:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise UsageError(f"cannot write {path}: {parent} is not a directory")


def record_header(args: argparse.Namespace) -> dict[str, Any]:
    """``command`` (as typed) and provenance: date, commit, host, CPU, Python."""
    command_line, _ = launch.invocation(getattr(args, "argv", None) or [])
    return {"command": command_line, **provenance(__file__)}


def provenance_line(meta: dict[str, Any]) -> str:
    dirty = " (with uncommitted changes)" if meta.get("commit_dirty") else ""
    return f"# commit {meta['commit']}{dirty}, {meta['date']}"


# ------------------------------------------------------------------- devices
Call = Callable[[], Any]


class HostDevice:
    """numpy buffers, timed with ``perf_counter``; the codecs run numba's CPU kernels."""

    name = "cpu"
    xp: Any = np

    def describe(self) -> dict[str, Any]:
        import numba  # noqa: PLC0415

        return {"cpu": cpu_name(), "threads": numba.get_num_threads()}

    def random(self, count: int, dtype: np.dtype, seed: int) -> np.ndarray:
        rng = np.random.default_rng([SEED, seed, count])
        x = rng.standard_normal(count, dtype=np.float32)
        x *= 3.0
        return x if dtype == np.float32 else x.astype(dtype)

    def empty(self, count: int, dtype: np.dtype) -> np.ndarray:
        return np.empty(count, dtype=dtype)

    def median_seconds(self, calls: list[Call], iters: int, warmup: int) -> float:
        """Median of ``iters`` timed calls, rotating over ``calls``, after ``warmup`` (at
        least one per call) untimed ones."""
        for i in range(max(warmup, len(calls))):
            calls[i % len(calls)]()
        samples = []
        for i in range(iters):
            start = time.perf_counter()
            calls[i % len(calls)]()
            samples.append(time.perf_counter() - start)
        return statistics.median(samples)

    def copy_gbps(self, iters: int) -> float:
        """numpy copy of ``HOST_COPY_BYTES``, bytes read + written, in GB/s."""
        src = np.ones(HOST_COPY_BYTES // 4, dtype=np.float32)
        dst = np.empty_like(src)
        seconds = self.median_seconds([partial(np.copyto, dst, src)], iters, 1)
        return 2 * src.nbytes / seconds / 1e9

    def release(self) -> None:
        """Give cached memory back (nothing to do on the host)."""


class CudaDevice(HostDevice):
    """CuPy buffers on the current GPU, timed with CUDA events (the helpers of
    ``bench/gpu_codec_check.py``)."""

    name = "gpu"

    def __init__(self) -> None:
        try:
            import cupy as cp  # noqa: PLC0415

            ndev = cp.cuda.runtime.getDeviceCount()
        except Exception as exc:  # no CuPy, no driver, no device
            raise UsageError(
                f"--device gpu needs CuPy and a CUDA GPU: {type(exc).__name__}: {exc}"
            ) from None
        if ndev == 0:
            raise UsageError("--device gpu needs a CUDA GPU; none is visible")
        from . import gpu_codec_check  # noqa: PLC0415

        self.xp = cp
        self._check = gpu_codec_check

    def describe(self) -> dict[str, Any]:
        cp = self.xp
        props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        name = props["name"]
        return {
            "cpu": cpu_name(),
            "gpu": name.decode() if isinstance(name, bytes) else str(name),
            "cupy": cp.__version__,
        }

    def random(self, count: int, dtype: np.dtype, seed: int) -> Any:
        if dtype == np.float64:
            return self.xp.random.RandomState(seed).standard_normal(count) * 3.0
        return self._check.random_dev(self.xp, count, dtype, seed)

    def empty(self, count: int, dtype: np.dtype) -> Any:
        return self.xp.empty(count * dtype.itemsize, dtype=np.uint8).view(dtype)

    def median_seconds(self, calls: list[Call], iters: int, warmup: int) -> float:
        return self._check.timed_ms(self.xp, calls, iters, warmup) / 1e3

    def copy_gbps(self, iters: int) -> float:
        """Device-to-device memcpy of ``GPU_COPY_BYTES``, bytes read + written, in GB/s."""
        cp = self.xp
        src = cp.ones(GPU_COPY_BYTES, dtype=cp.uint8)
        dst = cp.empty_like(src)
        stream = cp.cuda.get_current_stream()

        def copy() -> None:
            dst.data.copy_from_device_async(src.data, src.nbytes, stream)

        seconds = self.median_seconds([copy], iters, 1)
        return 2 * GPU_COPY_BYTES / seconds / 1e9

    def release(self) -> None:
        self.xp.get_default_memory_pool().free_all_blocks()


# ----------------------------------------------------------------- measuring
@dataclass
class CodecRow:
    """One timed operation (the row schema of ``bench/results/h200-codec.json``).

    Attributes:
        codec: the ``--compressor`` label. op: encode, decode or decode_accumulate.
        dtype: the data type the payload stands for. count: elements.
        GBps: bytes read + written per second / 1e9. fraction: GBps / copy_GBps.
        group_size: the codec's group size (None for identity). time_ms: median call.
    """

    codec: str
    op: str
    dtype: str
    count: int
    GBps: float
    fraction: float
    group_size: int | None
    time_ms: float


def rotation_sets(set_bytes: int) -> int:
    """How many buffer sets of ``set_bytes`` to rotate over: enough to hold
    ``ROTATE_BYTES`` together, at least 2 and at most ``MAX_SETS``."""
    return max(2, min(MAX_SETS, -(-ROTATE_BYTES // max(set_bytes, 1))))


def measure(
    device: HostDevice,
    spec: CodecSpec,
    dtype: np.dtype,
    count: int,
    iters: int,
    warmup: int,
    copy_gbps: float,
) -> list[CodecRow]:
    """Time encode, decode and decode_accumulate of ``count`` elements of ``dtype``."""
    codec = spec.codec
    payload_bytes = codec.encoded_nbytes(count, dtype)
    data_bytes = count * dtype.itemsize
    sets = rotation_sets(data_bytes + payload_bytes)
    group_size = codec.get_config().get("group_size")

    def timed(op: str, calls: list[Call], moved: int) -> CodecRow:
        seconds = device.median_seconds(calls, iters, warmup)
        gbps = moved / seconds / 1e9
        return CodecRow(
            spec.label,
            op,
            dtype.name,
            count,
            round(gbps, 3),
            round(gbps / copy_gbps, 4),
            group_size,
            round(seconds * 1e3, 4),
        )

    payloads = [device.empty(payload_bytes, np.dtype(np.uint8)) for _ in range(sets)]
    xs = [device.random(count, dtype, seed) for seed in range(sets)]
    # The warm-up calls encode every set, so each payload is valid for the decodes.
    calls = [partial(codec.encode_into, x, p, dtype) for x, p in zip(xs, payloads, strict=True)]
    rows = [timed("encode", calls, data_bytes + payload_bytes)]
    del xs, calls
    outs = [device.empty(count, dtype) for _ in range(sets)]
    calls = [
        partial(codec.decode_into, p, o, dtype, False) for p, o in zip(payloads, outs, strict=True)
    ]
    rows.append(timed("decode", calls, payload_bytes + data_bytes))
    del outs, calls
    accs = [device.random(count, np.dtype(np.float32), 100 + i) for i in range(sets)]
    calls = [
        partial(codec.decode_into, p, a, dtype, True) for p, a in zip(payloads, accs, strict=True)
    ]
    rows.append(timed("decode_accumulate", calls, payload_bytes + 8 * count))
    del accs, calls, payloads
    device.release()
    return rows


# --------------------------------------------------------------- the command
def dtype_list(text: str) -> list[np.dtype]:
    """argparse type: ``float32,bfloat16`` -> dtypes (names as ``-d`` takes them)."""
    return list(dict.fromkeys(datatype(name) for name in comma_list(text)))


def count_list(text: str) -> list[int]:
    """argparse type: ``16M,64M`` -> element counts (K/M/G suffixes are binary)."""
    counts = [parse_size(item) for item in comma_list(text)]
    if any(count < 1 for count in counts):
        raise argparse.ArgumentTypeError(f"invalid counts {text!r}: each must be at least 1")
    return list(dict.fromkeys(counts))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The codecs, dtypes and counts to measure, the device, the timing, the output."""
    add = parser.add_argument
    # fmt: off
    add("--compressor", type=codec_specs, default="identity,int8,taco",
        help="comma-separated codecs, each NAME or NAME:KEY=VALUE,... "
             "(e.g. identity,taco:group_size=32)")
    add("-d", "--datatype", type=dtype_list, default="float32,bfloat16",
        help="comma-separated data types")
    add("--counts", type=count_list, default=None,
        help="comma-separated element counts, K/M/G suffixes are binary "
             f"(default: {DEFAULT_COUNTS['cpu']} on cpu, {DEFAULT_COUNTS['gpu']} on gpu)")
    add("--device", choices=("cpu", "gpu"), default="cpu",
        help="cpu: numpy buffers and the numba kernels; gpu: CuPy buffers and the CUDA kernels")
    add("-n", "--iters", type=positive_int, default=10, help="timed calls per op")
    add("-w", "--warmup_iters", type=int, default=3,
        help="warm-up calls per op, at least one per buffer set")
    add("--json", metavar="PATH", help="write the results as JSON")
    # fmt: on


def validate(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags taken together, if anything."""
    if args.warmup_iters < 0:
        return f"-w/--warmup_iters must be >= 0, got {args.warmup_iters}"
    for spec in args.compressor:
        for dtype in args.datatype:
            try:
                spec.codec.check_dtype(dtype)
            except TypeError as exc:
                return f"--compressor {spec.label} -d {dtype.name}: {exc}"
    return None


@command(
    "codec",
    help="encode/decode/decode-accumulate throughput of each codec against the copy bandwidth",
    arguments=add_arguments,
    mpi=False,
    validate=validate,
)
def run(args: argparse.Namespace) -> int:
    """Measure every (codec, dtype, count); print the table; write the JSON record."""
    try:
        check_writable(args.json)
        device = CudaDevice() if args.device == "gpu" else HostDevice()
    except UsageError as exc:
        return refuse(str(exc))
    counts = args.counts or count_list(DEFAULT_COUNTS[args.device])
    meta = {**record_header(args), **device.describe(), "device": device.name}
    copy_gbps = device.copy_gbps(max(args.iters, 5))
    meta.update(
        copy_GBps=round(copy_gbps, 3),
        iters=args.iters,
        warmup_iters=args.warmup_iters,
        compressors={spec.label: spec.codec.get_config() for spec in args.compressor},
        note=NOTE,
    )
    _print_preamble(meta)
    rows, errors = _sweep(device, args, counts, copy_gbps)
    if args.json:
        record = {**meta, "rows": [asdict(row) for row in rows]}
        write_record(args.json, {**record, "errors": errors} if errors else record)
        print(f"# JSON written to {args.json}", flush=True)
    return 1 if errors else 0


def _sweep(
    device: HostDevice, args: argparse.Namespace, counts: list[int], copy_gbps: float
) -> tuple[list[CodecRow], list[str]]:
    """Measure and print every (count, codec, dtype); a failing one is reported and
    skipped (returned in the errors), the others still run."""
    columns = _columns(args.compressor, counts)
    print(columns.header(), flush=True)
    rows: list[CodecRow] = []
    errors: list[str] = []
    for count in counts:
        for spec in args.compressor:
            for dtype in args.datatype:
                try:
                    measured = measure(
                        device, spec, dtype, count, args.iters, args.warmup_iters, copy_gbps
                    )
                except Exception as exc:  # noqa: BLE001
                    errors.append(f"{spec.label} {dtype.name} {count}: {type(exc).__name__}: {exc}")
                    print(f"# error: {errors[-1]}", flush=True)
                    device.release()
                    continue
                for row in measured:
                    rows.append(row)
                    print(columns.line(_cells(row)), flush=True)
    return rows, errors


_TITLES = ("codec", "op", "dtype", "count", "time(ms)", "GB/s", "fraction")


def _cells(row: CodecRow) -> list[str]:
    return [
        row.codec,
        row.op,
        row.dtype,
        str(row.count),
        f"{row.time_ms:.3f}",
        f"{row.GBps:.2f}",
        f"{row.fraction:.3f}",
    ]


def _columns(specs: list[CodecSpec], counts: list[int]) -> Columns:
    widest = ["decode_accumulate", "bfloat16", str(max(counts)), "99999.999", "9999.99", "0.000"]
    return Columns.fit(_TITLES, [[spec.label, *widest] for spec in specs], left=3)


def _print_preamble(meta: dict[str, Any]) -> None:
    where = f"gpu {meta['gpu']}" if meta["device"] == "gpu" else f"cpu {meta['cpu']}"
    threads = f", {meta['threads']} numba threads" if meta["device"] == "cpu" else ""
    copy = "numpy copy of 256 MiB" if meta["device"] == "cpu" else "memcpy of 1 GiB"
    print(f"# coccl-bench codec: {where}{threads} on {meta['hostname']}")
    print(
        f"# iters {meta['iters']}, warmup {meta['warmup_iters']}; time = median of one call, "
        f"buffers rotating over >= {ROTATE_BYTES >> 20} MiB"
    )
    print(f"# copy bandwidth {meta['copy_GBps']:.2f} GB/s ({copy}, bytes read + written)")
    print(
        "# GB/s = bytes read + written / time: encode input + payload, decode payload + "
        "output, decode_accumulate payload + float32 accumulator x 2; fraction = GB/s / copy"
    )
    print(f"# command: {meta['command']}")
    print(provenance_line(meta), flush=True)
