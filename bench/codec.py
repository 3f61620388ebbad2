"""``coccl-bench codec``: encode, decode and decode-accumulate throughput of each codec,
against the device's measured copy bandwidth.

    coccl-bench codec --device cpu --counts 16M -d float32,bfloat16 --compressor identity,int8,taco
    coccl-bench codec --device gpu --counts 64M,256M --compressor taco,taco:group_size=32
    coccl-bench codec --device gpu --tuning --launch-cost --fp8-check

Each (codec, dtype, count) times up to four operations on fresh random data (normal, never
zeros): ``encode`` (input -> payload), ``decode`` (payload -> output of the dtype),
``decode_accumulate`` (payload added into a float32 accumulator: the fused decode-reduce
of a ReduceScatter) and ``hop`` (a ring ReduceScatter's fused hop, payload = encode(own +
decode(payload)), for the codecs that have one on the device: taco and int8 on the GPU). A
time is the median of ``-n`` single calls after ``-w`` warm-up calls (at least one per
buffer set, which also absorbs numba's compilation); the calls rotate over buffer sets
that together exceed ``ROTATE_BYTES``, more than a last-level cache or a GPU's L2, so that
each call streams from memory. On the CPU a call is timed with ``time.perf_counter``; on
the GPU with CUDA events around the kernel launches.

Bandwidth counts bytes read + written: encode = input + payload, decode = payload +
output, decode_accumulate = payload + the float32 accumulator read and written, hop = own
+ the payload read + the payload written. The
reference is a plain copy of a large buffer (bytes read + written as well): numpy's
``copyto`` on the CPU (one thread, while numba's kernels use all of them, so a fraction
above 1 is possible there), a device-to-device memcpy on the GPU; ``fraction`` is the
codec's GB/s over the copy's. Beside each row, ``copy_ms`` times a copy of the same bytes
(half of ``nbytes`` read, half written) at the same size, the same way and in the same
run, and ``size_fraction`` is ``copy_ms / time_ms``: what a small call is worth against
what the device can move at that size (its launch and tail included), where ``fraction``
compares it with the large copy's bandwidth.

With ``-c 1`` (the default) each (codec, dtype, count) is also checked, after its
timings, on its first ``CHECK_COUNT`` elements (fresh data): the roundtrip's relative L2
error must be within the codec's bound (``bounds.roundtrip_bound``), and on the GPU the
payload and the decoded values must be those of the host's kernels, byte for byte (one
wire format). A failed check is reported in the table's footer and makes the exit
status 1. The GPU-only parts (``--tuning``, ``--launch-cost``, ``--fp8-check``) are in
``codec_gpu.py``.

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
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from coccl.compressors import Compressor, get_compressor

from . import bounds, launch
from .cli import comma_list, command, datatype, parse_size, positive_int
from .table import cpu_name, provenance

EXIT_USAGE = 2  # as argparse: the request itself cannot run
SEED = 20240917  # of the random input data
ROTATE_BYTES = 256 << 20  # each op's buffer sets together hold at least this much
MAX_SETS = 8
HOST_COPY_BYTES = 256 << 20
DEFAULT_COUNTS = {"cpu": "16M", "gpu": "64M,256M"}
OPS = ("encode", "decode", "decode_accumulate", "hop")
CHECK_COUNT = (1 << 22) + 5  # elements a check encodes: many kernel blocks, a partial group
CHECK_SEED = 7
EXIT_FAILED = 1  # a check failed, or a measurement raised
NOTE = (
    "GBps = nbytes / time: bytes read + written (encode: input + payload; decode: payload + "
    "output; decode_accumulate: payload + float32 accumulator read and written). fraction = "
    "GBps / copy_GBps; size_fraction = copy_ms / time_ms, copy_ms a copy of nbytes / 2 bytes "
    "timed the same way in the same run. hop: own + payload in, payload out. dtype is the "
    "data type the payload stands for; decode_accumulate "
    "always adds into float32. time_ms: median of one call. bench/SCHEMA.md has every field."
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
        try:
            codec = get_compressor(label)
        except Exception as exc:  # unknown name, malformed option, bad value
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


class Device(Protocol):
    """Where a codec runs and how its calls are timed (``HostDevice``, and
    ``codec_gpu.CudaDevice``)."""

    name: str
    xp: Any

    def describe(self) -> dict[str, Any]: ...
    def random(self, count: int, dtype: np.dtype, seed: int) -> Any: ...
    def empty(self, count: int, dtype: np.dtype) -> Any: ...
    def to_host(self, a: Any) -> np.ndarray: ...
    def median_seconds(self, calls: list[Call], iters: int, warmup: int) -> float: ...
    def copy_gbps(self, iters: int) -> dict[str, float]: ...
    def copy_calls(self, nbytes: int, sets: int) -> list[Call]: ...
    def kernel_attributes(self, codec: Compressor) -> dict[str, Any] | None: ...
    def release(self) -> None: ...


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

    def to_host(self, a: Any) -> np.ndarray:
        return np.asarray(a)

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

    def copy_gbps(self, iters: int) -> dict[str, float]:
        """numpy copy of ``HOST_COPY_BYTES``, bytes read + written, in GB/s."""
        src = np.ones(HOST_COPY_BYTES // 4, dtype=np.float32)
        dst = np.empty_like(src)
        seconds = self.median_seconds([partial(np.copyto, dst, src)], iters, 1)
        return {"copy_GBps": 2 * src.nbytes / seconds / 1e9}

    def copy_calls(self, nbytes: int, sets: int) -> list[Call]:
        """``sets`` copies of ``nbytes`` bytes, each between buffers of its own."""
        pairs = [(np.empty(nbytes, np.uint8), np.ones(nbytes, np.uint8)) for _ in range(sets)]
        return [partial(np.copyto, dst, src) for dst, src in pairs]

    def kernel_attributes(self, codec: Compressor) -> dict[str, Any] | None:
        return None  # numba's kernels have no such figures

    def release(self) -> None:
        """Give cached memory back (nothing to do on the host)."""


def gpu_device() -> Device:
    """``codec_gpu.CudaDevice`` on the current GPU.

    Raises:
        UsageError: no CuPy, no driver or no GPU.
    """
    try:
        import cupy as cp  # noqa: PLC0415

        ndev = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no CuPy, no driver, no device
        raise UsageError(
            f"--device gpu needs CuPy and a CUDA GPU: {type(exc).__name__}: {exc}"
        ) from None
    if ndev == 0:
        raise UsageError("--device gpu needs a CUDA GPU; none is visible")
    from .codec_gpu import CudaDevice  # noqa: PLC0415

    return CudaDevice(cp)


# ----------------------------------------------------------------- measuring
@dataclass
class CodecRow:
    """One timed operation (full precision; ``bench/SCHEMA.md``).

    Attributes:
        codec: the ``--compressor`` label. op: encode, decode or decode_accumulate.
        dtype: the data type the payload stands for. count: elements.
        nbytes: bytes one call reads and writes. time_ms: the median call.
        GBps: ``nbytes / time / 1e9``. fraction: GBps / copy_GBps.
        copy_ms: a copy of ``nbytes / 2`` bytes timed the same way in the same run (None
            when not measured). size_fraction: ``copy_ms / time_ms``.
        group_size: the codec's group size (None for identity).
        kernel: registers, local and shared memory of the GPU kernel (None on the CPU
            and for lossless codecs).
        config: the launch tuning of a ``--tuning`` row, or ``launch cost timed`` for a
            ``--launch-cost`` row (None for the default timings).
    """

    codec: str
    op: str
    dtype: str
    count: int
    nbytes: int
    time_ms: float
    GBps: float
    fraction: float
    group_size: int | None
    kernel: dict[str, Any] | None = None
    config: str | None = None
    copy_ms: float | None = None
    size_fraction: float | None = None


@dataclass
class CheckRow:
    """The check of one (codec, dtype, count) on its first ``count`` elements.

    Attributes:
        codec, dtype: as in the timed rows. count: elements checked.
        rel_err: the roundtrip's ``||decode(encode(x)) - x|| / ||x||``.
        bound: what the codec allows (``bounds.roundtrip_bound``).
        payload_mismatches: GPU only: payload bytes that differ from the host's
            encoding of the same data (None on the CPU).
        decode_mismatches: GPU only: decoded values that differ from the host's
            decoding of the same payload (None on the CPU).
        ok: within the bound, and no mismatch.
    """

    codec: str
    dtype: str
    count: int
    rel_err: float
    bound: float
    payload_mismatches: int | None
    decode_mismatches: int | None
    ok: bool


def rotation_sets(set_bytes: int) -> int:
    """How many buffer sets of ``set_bytes`` to rotate over: enough to hold
    ``ROTATE_BYTES`` together, at least 2 and at most ``MAX_SETS``."""
    return max(2, min(MAX_SETS, -(-ROTATE_BYTES // max(set_bytes, 1))))


def measure(
    device: Device,
    spec: CodecSpec,
    dtype: np.dtype,
    count: int,
    iters: int,
    warmup: int,
    copy_gbps: float,
    ops: Sequence[str] = OPS,
    config: str | None = None,
    copy_at_size: bool = True,
) -> list[CodecRow]:
    """Time ``ops`` (encode, decode, decode_accumulate, hop) of ``count`` elements of
    ``dtype``, each beside a copy of the same bytes when ``copy_at_size``. The decodes and
    the hop need payloads, so encode is always run, untimed if not asked for; ``hop`` is
    left out where the codec has no fused hop for the device's arrays."""
    codec = spec.codec
    payload_bytes = codec.encoded_nbytes(count, dtype)
    data_bytes = count * dtype.itemsize
    sets = rotation_sets(data_bytes + payload_bytes)
    group_size = codec.get_config().get("group_size")
    copies: dict[int, float] = {}  # bytes copied -> seconds

    def copy_seconds(nbytes: int) -> float:
        if nbytes not in copies:
            copies[nbytes] = device.median_seconds(device.copy_calls(nbytes, sets), iters, warmup)
            device.release()
        return copies[nbytes]

    def timed(op: str, calls: list[Call], moved: int) -> CodecRow:
        seconds = device.median_seconds(calls, iters, warmup)
        gbps = moved / seconds / 1e9
        kernel = device.kernel_attributes(codec)
        copy = copy_seconds(-(-moved // 2)) if copy_at_size else None
        return CodecRow(
            spec.label,
            op,
            dtype.name,
            count,
            moved,
            seconds * 1e3,
            gbps,
            gbps / copy_gbps,
            group_size,
            kernel,
            config,
            None if copy is None else copy * 1e3,
            None if copy is None else copy / seconds,
        )

    rows = []
    payloads = [device.empty(payload_bytes, np.dtype(np.uint8)) for _ in range(sets)]
    xs = [device.random(count, dtype, seed) for seed in range(sets)]
    calls = [partial(codec.encode_into, x, p, dtype) for x, p in zip(xs, payloads, strict=True)]
    if "encode" in ops:  # its warm-up calls encode every set, so each payload is valid
        rows.append(timed("encode", calls, data_bytes + payload_bytes))
    else:
        for call in calls:
            call()
    del xs, calls
    if "decode" in ops:
        outs = [device.empty(count, dtype) for _ in range(sets)]
        calls = [
            partial(codec.decode_into, p, o, dtype, False)
            for p, o in zip(payloads, outs, strict=True)
        ]
        rows.append(timed("decode", calls, payload_bytes + data_bytes))
        del outs, calls
    if "decode_accumulate" in ops:
        accs = [device.random(count, np.dtype(np.float32), 100 + i) for i in range(sets)]
        calls = [
            partial(codec.decode_into, p, a, dtype, True)
            for p, a in zip(payloads, accs, strict=True)
        ]
        rows.append(timed("decode_accumulate", calls, payload_bytes + 8 * count))
        del accs, calls
    hop = codec.reduce_encode_kernel(device.empty(1, dtype), dtype) if "hop" in ops else None
    if hop is not None:
        owns = [device.random(count, dtype, 200 + i) for i in range(sets)]
        outs = [device.empty(payload_bytes, np.dtype(np.uint8)) for _ in range(sets)]
        calls = [partial(hop, *args) for args in zip(owns, payloads, outs, strict=True)]
        rows.append(timed("hop", calls, data_bytes + 2 * payload_bytes))
        del owns, outs, calls
    del payloads
    device.release()
    return rows


def _mismatches(a: np.ndarray, b: np.ndarray) -> int:
    """Elements of ``a`` and ``b`` (same dtype and size) whose bytes differ."""
    width = np.dtype(f"V{a.dtype.itemsize}")
    return int(np.count_nonzero(a.view(width) != b.view(width)))


def check(device: Device, spec: CodecSpec, dtype: np.dtype, count: int) -> CheckRow:
    """Encode and decode the first ``CHECK_COUNT`` of ``count`` fresh elements on the
    device; compare with the input (and, on a GPU, with the host's kernels)."""
    codec, n = spec.codec, min(count, CHECK_COUNT)
    x = device.random(n, dtype, CHECK_SEED)
    payload = codec.encode(x)
    y = device.to_host(codec.decode(payload, count=n, dtype=dtype))
    x_host = device.to_host(x)
    exact = x_host.astype(np.float64)
    norm = float(np.linalg.norm(exact))
    diff = float(np.linalg.norm(y.astype(np.float64) - exact))
    rel_err = diff / norm if norm > 0 else diff
    bound = bounds.roundtrip_bound(codec, dtype)
    payload_bad = decode_bad = None
    if device.name != "cpu":
        host_payload = codec.encode(x_host)
        payload_bad = int(np.count_nonzero(device.to_host(payload) != host_payload))
        decode_bad = _mismatches(y, codec.decode(host_payload, count=n, dtype=dtype))
    ok = rel_err <= bound and not payload_bad and not decode_bad
    row = CheckRow(spec.label, dtype.name, n, rel_err, bound, payload_bad, decode_bad, ok)
    device.release()
    return row


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
    """The codecs, dtypes and counts to measure, the device, the timing, the checks, the
    GPU-only parts, the output."""
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
    add("-c", "--check", type=int, choices=(0, 1), default=1,
        help="1: check each codec's roundtrip against its error bound, and on the GPU its "
             "payloads and decodes against the host's kernels (exit status 1 if one fails)")
    add("--tuning", action="store_true",
        help="gpu: also time taco's encode under each launch configuration of "
             "codec_gpu.ENCODE_CONFIGS, at the largest count and a quarter of it")
    add("--launch-cost", action="store_true",
        help="gpu: also time encode and decode_accumulate with the host's launch cost "
             "inside the time (the GPU idle at the start event)")
    add("--fp8-check", type=parse_size, nargs="?", const=1 << 32, default=None,
        metavar="PATTERNS",
        help="gpu: check the hardware FP8 conversion against the software one over the "
             "first PATTERNS float32 bit patterns (all 2^32 if no number is given)")
    add("--json", metavar="PATH", help="write the results as JSON (bench/SCHEMA.md)")
    # fmt: on


def validate(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags taken together, if anything."""
    if args.warmup_iters < 0:
        return f"-w/--warmup_iters must be >= 0, got {args.warmup_iters}"
    gpu_only = {"--tuning": args.tuning, "--launch-cost": args.launch_cost}
    gpu_only["--fp8-check"] = args.fp8_check is not None
    for flag, given in gpu_only.items():
        if given and args.device != "gpu":
            return f"{flag} measures the GPU kernels: add --device gpu"
    if args.fp8_check is not None and args.fp8_check < 1:
        return "--fp8-check needs at least one bit pattern"
    for spec in args.compressor:
        for dtype in args.datatype:
            try:
                spec.codec.check_dtype(dtype)
            except TypeError as exc:
                return f"--compressor {spec.label} -d {dtype.name}: {exc}"
    return None


@dataclass
class Results:
    """Everything a run measures (the JSON record's lists, bench/SCHEMA.md)."""

    rows: list[CodecRow] = field(default_factory=list)
    checks: list[CheckRow] = field(default_factory=list)
    launch_cost_rows: list[CodecRow] = field(default_factory=list)
    tuning_rows: list[CodecRow] = field(default_factory=list)
    fp8_checks: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def failed(self) -> int:
        """Failed checks (roundtrips and FP8 conversions)."""
        return sum(not c.ok for c in self.checks) + sum(not c["ok"] for c in self.fp8_checks)

    def record(self, meta: dict[str, Any]) -> dict[str, Any]:
        return {**meta, **{k: [_plain(v) for v in vs] for k, vs in vars(self).items()}}


def _plain(value: Any) -> Any:
    return value if isinstance(value, (dict, str)) else asdict(value)


@command(
    "codec",
    help="encode/decode/decode-accumulate throughput of each codec against the copy bandwidth",
    arguments=add_arguments,
    mpi=False,
    validate=validate,
)
def run(args: argparse.Namespace) -> int:
    """Measure every (codec, dtype, count), check it, run the GPU-only parts asked for;
    print the tables; write the JSON record (after each part, so that a run cut short
    still leaves what it measured)."""
    try:
        check_writable(args.json)
        device = gpu_device() if args.device == "gpu" else HostDevice()
    except UsageError as exc:
        return refuse(str(exc))
    counts = args.counts or count_list(DEFAULT_COUNTS[args.device])
    meta = {**record_header(args), **device.describe(), "device": device.name}
    copy = device.copy_gbps(max(args.iters, 5))
    meta.update(
        **copy,
        iters=args.iters,
        warmup_iters=args.warmup_iters,
        check=args.check,
        compressors={spec.label: spec.codec.get_config() for spec in args.compressor},
        note=NOTE,
    )
    _print_preamble(meta)
    results = Results()

    def save() -> None:
        if args.json:
            write_record(args.json, results.record(meta))

    timing = _Timing(
        device, args.iters, args.warmup_iters, copy["copy_GBps"], _columns(args.compressor, counts)
    )
    _sweep(timing, args, counts, results)
    save()
    if args.launch_cost:
        _launch_cost(timing, args, counts, results)
        save()
    if args.tuning:
        _tuning(timing, args, counts, results)
        save()
    if args.fp8_check is not None:
        _fp8_check(device, args.fp8_check, results)
        save()
    _print_checks(results, bool(args.check))
    if args.json:
        print(f"# JSON written to {args.json}", flush=True)
    return EXIT_FAILED if results.errors or results.failed else 0


def _attempt(results: Results, what: str, device: Device, work: Callable[[], None]) -> None:
    """Run ``work``; an exception is reported and recorded, and the run goes on."""
    try:
        work()
    except Exception as exc:  # noqa: BLE001
        results.errors.append(f"{what}: {type(exc).__name__}: {exc}")
        print(f"# error: {results.errors[-1]}", flush=True)
        device.release()


@dataclass(frozen=True)
class _Timing:
    """What every timed (codec, dtype, count) of a run shares."""

    device: Device
    iters: int
    warmup: int
    copy_gbps: float
    columns: Columns

    def rows(
        self,
        sink: list[CodecRow],
        spec: CodecSpec,
        dtype: np.dtype,
        count: int,
        ops: Sequence[str] = OPS,
        config: str | None = None,
    ) -> None:
        """Measure ``ops``, print each row and append it to ``sink``."""
        for row in measure(
            self.device, spec, dtype, count, self.iters, self.warmup, self.copy_gbps, ops, config
        ):
            sink.append(row)
            print(self.columns.line(_cells(row)), flush=True)


def _sweep(timing: _Timing, args: argparse.Namespace, counts: list[int], results: Results) -> None:
    """Measure, print and check every (count, codec, dtype)."""
    print(timing.columns.header(), flush=True)
    for count in counts:
        for spec in args.compressor:
            for dtype in args.datatype:
                what = f"{spec.label} {dtype.name} {count}"
                work = partial(timing.rows, results.rows, spec, dtype, count)
                _attempt(results, what, timing.device, work)
                if args.check:
                    checked = partial(_append_check, results, timing.device, spec, dtype, count)
                    _attempt(results, f"check {what}", timing.device, checked)


def _append_check(
    results: Results, device: Device, spec: CodecSpec, dtype: np.dtype, count: int
) -> None:
    results.checks.append(check(device, spec, dtype, count))


def _launch_cost(
    timing: _Timing, args: argparse.Namespace, counts: list[int], results: Results
) -> None:
    """The lossy codecs' encode and decode_accumulate timed with the launch inside."""
    print("#\n# --launch-cost: the GPU idle at the start event, the host's launch timed too")
    print(timing.columns.header(), flush=True)
    device = timing.device
    device.hide_launch = False  # type: ignore[attr-defined]
    try:
        for count in counts:
            for spec in (s for s in args.compressor if not s.codec.lossless):
                for dtype in args.datatype:
                    work = partial(
                        timing.rows, results.launch_cost_rows, spec, dtype, count,
                        ("encode", "decode_accumulate"), "launch cost timed",
                    )  # fmt: skip
                    _attempt(results, f"launch cost {spec.label} {dtype.name}", device, work)
    finally:
        device.hide_launch = True  # type: ignore[attr-defined]


def _tuning(timing: _Timing, args: argparse.Namespace, counts: list[int], results: Results) -> None:
    """taco's encode under each launch configuration (``codec_gpu.ENCODE_CONFIGS``), at the
    largest count and a quarter of it."""
    from .codec_gpu import ENCODE_CONFIGS, config_label  # noqa: PLC0415

    device = timing.device
    largest = max(counts)
    tuned = [s for s in args.compressor if s.codec.codec_id == "taco"]
    for config in ENCODE_CONFIGS:
        label = config_label(config)
        print(f"#\n# --tuning: {label}")
        print(timing.columns.header(), flush=True)
        for spec in tuned:
            for dtype in args.datatype:
                for count in dict.fromkeys((largest, max(largest // 4, 1))):
                    work = partial(
                        _tuned_rows, timing, device, config, results, spec, dtype, count, label
                    )
                    _attempt(results, f"tuning {label} {spec.label} {dtype.name}", device, work)


def _tuned_rows(
    timing: _Timing,
    device: Device,
    config: dict[str, Any],
    results: Results,
    spec: CodecSpec,
    dtype: np.dtype,
    count: int,
    label: str,
) -> None:
    with device.tuning(config):  # type: ignore[attr-defined]
        timing.rows(results.tuning_rows, spec, dtype, count, ("encode",), label)


def _fp8_check(device: Device, patterns: int, results: Results) -> None:
    """The hardware FP8 conversion against the software one, both formats."""
    print("#\n# --fp8-check: hardware vs software FP8 conversion", flush=True)
    for fmt in ("e4m3", "e5m2"):
        _attempt(
            results, f"fp8 check {fmt}", device, partial(_fp8_row, device, fmt, patterns, results)
        )


def _fp8_row(device: Device, fmt: str, patterns: int, results: Results) -> None:
    from .codec_gpu import fp8_conversion_check  # noqa: PLC0415

    found = fp8_conversion_check(device, fmt, patterns)  # type: ignore[arg-type]
    results.fp8_checks.append(asdict(found))
    print(
        f"#  {fmt}: {found.mismatches} mismatches over {found.patterns} patterns, "
        f"{found.sample_mismatches} against the host on {found.sample} random ones "
        f"({found.seconds:.1f} s): {'OK' if found.ok else 'FAILED'}",
        flush=True,
    )


def _print_checks(results: Results, checked: bool) -> None:
    """The checks' table and the verdict line (nccl-tests' ``Out of bounds values``)."""
    if checked and results.checks:
        gpu = results.checks[0].payload_mismatches is not None
        titles = ["codec", "dtype", "count", "rel_err", "bound"]
        titles += ["payload", "decode"] if gpu else []
        cells = []
        for c in results.checks:
            line = [c.codec, c.dtype, str(c.count), f"{c.rel_err:.2e}", f"{c.bound:.2e}"]
            line += [str(c.payload_mismatches), str(c.decode_mismatches)] if gpu else []
            cells.append([*line, "OK" if c.ok else "FAILED"])
        columns = Columns.fit([*titles, "check"], cells, left=2)
        where = "; payload bytes and decoded values unlike the host's" if gpu else ""
        print(f"#\n# checks: roundtrip rel_err within the codec's bound{where}")
        print(columns.header())
        for line in cells:
            print(columns.line(line))
    if checked or results.fp8_checks:
        failed = results.failed
        print(f"# Out of bounds values : {failed} {'FAILED' if failed else 'OK'}")
    else:
        print("# Out of bounds values : not checked (-c 0)")
    if results.errors:
        print(f"# errors: {len(results.errors)} (in the JSON)", flush=True)
    sys.stdout.flush()


_TITLES = ("codec", "op", "dtype", "count", "time(ms)", "GB/s", "fraction", "copy(ms)", "of copy")


def _figure(value: float, decimals: int) -> str:
    """``decimals`` places, or 3 significant digits for a value that would read 0."""
    return f"{value:.{decimals}f}" if value >= 10.0**-decimals else f"{value:.3g}"


def _cells(row: CodecRow) -> list[str]:
    return [
        row.codec,
        row.op,
        row.dtype,
        str(row.count),
        _figure(row.time_ms, 3),
        _figure(row.GBps, 2),
        _figure(row.fraction, 3),
        "-" if row.copy_ms is None else _figure(row.copy_ms, 3),
        "-" if row.size_fraction is None else _figure(row.size_fraction, 3),
    ]


def _columns(specs: list[CodecSpec], counts: list[int]) -> Columns:
    widest = ["decode_accumulate", "bfloat16", str(max(counts)), "99999.999", "9999.99", "0.000"]
    widest += ["99999.999", "0.000"]
    return Columns.fit(_TITLES, [[spec.label, *widest] for spec in specs], left=3)


def _print_preamble(meta: dict[str, Any]) -> None:
    where = f"gpu {meta['gpu']}" if meta["device"] == "gpu" else f"cpu {meta['cpu']}"
    threads = f", {meta['threads']} numba threads" if meta["device"] == "cpu" else ""
    copy = "numpy copy of 256 MiB" if meta["device"] == "cpu" else "memcpy of 1 GiB"
    print(f"# coccl-bench codec: {where}{threads} on {meta['hostname']}")
    print(
        f"# iters {meta['iters']}, warmup {meta['warmup_iters']}, check {meta['check']}; "
        f"time = median of one call, buffers rotating over >= {ROTATE_BYTES >> 20} MiB"
    )
    kernel = ""
    if "copy_kernel_GBps" in meta:
        kernel = f"; copy kernel {meta['copy_kernel_GBps']:.2f} GB/s"
    print(f"# copy bandwidth {meta['copy_GBps']:.2f} GB/s ({copy}, bytes read + written){kernel}")
    print(
        "# GB/s = bytes read + written / time: encode input + payload, decode payload + "
        "output, decode_accumulate payload + float32 accumulator x 2, hop own + payload x 2; "
        "fraction = GB/s / copy; of copy = a copy of the same bytes at the same size "
        "(copy(ms)) / time"
    )
    print(f"# command: {meta['command']}")
    print(provenance_line(meta), flush=True)
