"""The GPU time of each kernel launch inside one codec call, by CUDA events around each.

    python3 bench/scripts/launch_times.py encode --count 256M --compressor tah:row=4096

Runs ``--op`` (encode, decode, decode_accumulate) of ``--compressor`` on ``--count``
random ``--dtype`` elements ``--launches`` times after one warm-up call, with every
kernel the codec's GPU module compiles wrapped so that each launch is bracketed by a pair
of CUDA events on the current stream; prints the median time of each kernel (keyed by
its ``-D`` defines that name the variant) and of the whole call. For where a call's time
goes when a profiler is not at hand; the events add a few microseconds to the whole call,
not to a kernel's own time. A script beside coccl-bench: it patches the codec modules'
``compile_function`` and is not part of the library.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import defaultdict
from typing import Any

from codec_kernel_probe import probe_case  # this script's folder: sys.path[0]

from coccl.bench.table import provenance

_MODULES = ("tah_gpu", "intq_gpu", "mx_gpu", "gpu_kernels")
_NAMING = ("TAH_OP", "OP", "ACC", "XT", "EPL", "THREADS")


def _patch(cp: Any, times: dict[str, list[tuple[Any, Any]]]) -> None:
    import importlib

    for name in _MODULES:
        mod = importlib.import_module(f"coccl.compressors.{name}")
        original = getattr(mod, "compile_function", None)
        if original is None:
            continue

        def compile_timed(
            path: Any,
            defines: dict[str, Any],
            *a: Any,
            _o: Any = original,
            _m: str = name,
            **k: Any,
        ) -> Any:
            fn = _o(path, defines, *a, **k)
            label = _m + " " + " ".join(f"{d}={defines[d]}" for d in _NAMING if d in defines)

            def launch(grid: Any, block: Any, args: Any, **kw: Any) -> Any:
                start, stop = cp.cuda.Event(), cp.cuda.Event()
                start.record()
                result = fn(grid, block, args, **kw)
                stop.record()
                times[label].append((start, stop))
                return result

            launch.attributes = getattr(fn, "attributes", {})  # type: ignore[attr-defined]
            return launch

        mod.compile_function = compile_timed  # type: ignore[attr-defined]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("op", choices=("encode", "decode", "decode_accumulate"))
    ap.add_argument("--count", default="64M", help="elements (K/M/G binary)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--compressor", default="tah:row=4096")
    ap.add_argument("--launches", type=int, default=10)
    ap.add_argument("--json", help="append the rows to this JSON file (provenance, rows)")
    args = ap.parse_args()

    import cupy as cp

    times: dict[str, list[tuple[Any, Any]]] = defaultdict(list)
    _patch(cp, times)
    codec, dtype, count, x, payload = probe_case(args.compressor, args.dtype, args.count)
    out = cp.zeros(count, dtype=cp.float32 if args.op == "decode_accumulate" else dtype)

    def call() -> None:
        if args.op == "encode":
            codec.encode(x, out=payload)
        else:
            acc = args.op == "decode_accumulate"
            codec.decode(payload, out=out, count=count, dtype=dtype, accumulate=acc)

    call()
    cp.cuda.runtime.deviceSynchronize()
    times.clear()
    whole = []
    for _ in range(args.launches):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        call()
        stop.record()
        whole.append((start, stop))
    cp.cuda.runtime.deviceSynchronize()

    def median_us(pairs: list[tuple[Any, Any]]) -> float:
        return statistics.median(cp.cuda.get_elapsed_time(a, b) * 1e3 for a, b in pairs)

    case = {"compressor": args.compressor, "op": args.op, "count": count, "dtype": dtype.name}
    rows = [
        {
            **case,
            "kernel": label,
            "launches_per_call": len(pairs) / args.launches,
            "median_us": median_us(pairs),
        }
        for label, pairs in times.items()
    ]
    rows.append(
        {**case, "kernel": "whole call", "launches_per_call": None, "median_us": median_us(whole)}
    )
    print(f"{args.compressor} {args.op} of {count} {dtype.name}, {args.launches} calls:")
    for row in rows:
        per = row["launches_per_call"]
        print(
            f"  {row['median_us']:9.1f} us  {'' if per is None else f'x{per:g} a call'}  "
            f"{row['kernel']}"
        )
    if args.json:
        _append_json(args.json, rows)


def _append_json(path: str, rows: list[dict[str, Any]]) -> None:
    command = " ".join(["python3", *sys.argv])
    doc = {**provenance(__file__), "command": command, "rows": []}
    if os.path.exists(path):
        with open(path) as f:
            doc = json.load(f)
        doc["commands"] = [*doc.get("commands", [doc["command"]]), command]
    doc["rows"].extend(rows)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
