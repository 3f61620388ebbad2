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
import statistics
from collections import defaultdict
from typing import Any

import numpy as np

from coccl.bench.cli import datatype, parse_size
from coccl.bench.codec import codec_specs

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
    args = ap.parse_args()

    import cupy as cp

    times: dict[str, list[tuple[Any, Any]]] = defaultdict(list)
    _patch(cp, times)
    (spec,) = codec_specs(args.compressor)  # 'name:key=value,...' as coccl-bench
    codec = spec.codec
    dtype, count = datatype(args.dtype), parse_size(args.count)
    host = np.random.default_rng(1).standard_normal(count, dtype=np.float32).astype(dtype)
    x = cp.asarray(host.view(np.uint8)).view(dtype)
    payload = codec.encode(x)
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

    print(f"{args.compressor} {args.op} of {count} {dtype.name}, {args.launches} calls:")
    for label, pairs in times.items():
        per_call = len(pairs) / args.launches
        print(f"  {median_us(pairs):9.1f} us  x{per_call:g} a call  {label}")
    print(f"  {median_us(whole):9.1f} us  the whole call")


if __name__ == "__main__":
    main()
