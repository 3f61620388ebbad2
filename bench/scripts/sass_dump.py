"""The SASS of the codec kernels one operation runs, for reading instruction counts.

    python3 bench/scripts/sass_dump.py hop --count 64M --dtype bfloat16 --out /tmp/sass

Runs ``op`` (as ``codec_kernel_probe.py`` does) once with ``--compressor``, records every
kernel variant compiled on the way (the source and its ``-D`` defines), compiles each
again with nvcc for the current GPU (CuPy's options: ``-std=c++17 --fmad=false
-ftz=true``) and writes ``cuobjdump -sass`` of it to ``--out``, with a histogram of the
static opcodes. A script beside coccl-bench, not part of it.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
from pathlib import Path

import numpy as np

from coccl.bench.cli import datatype, parse_size
from coccl.bench.codec import codec_specs
from coccl.compressors import gpu_build


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("op", choices=("encode", "decode", "decode_accumulate", "hop"))
    ap.add_argument("--count", default="64M")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--compressor", default="taco")
    ap.add_argument("--out", default="sass")
    args = ap.parse_args()

    import cupy as cp

    seen: list[tuple[tuple[Path, ...], dict]] = []
    compile_function = gpu_build.compile_function

    def recording(path, defines, name="coccl_codec"):  # type: ignore[no-untyped-def]
        seen.append((path if isinstance(path, tuple) else (path,), dict(defines)))
        return compile_function(path, defines, name)

    gpu_build.compile_function = recording
    for module in ("gpu_kernels", "intq_gpu", "mx_gpu", "tah_gpu"):  # their own imports
        mod = __import__(f"coccl.compressors.{module}", fromlist=["x"])
        if getattr(mod, "compile_function", None) is compile_function:
            mod.compile_function = recording

    (spec,) = codec_specs(args.compressor)  # 'name:key=value,...' as coccl-bench
    codec = spec.codec
    dtype, count = datatype(args.dtype), parse_size(args.count)
    x = cp.asarray(np.random.default_rng(1).standard_normal(count, np.float32))
    if dtype != np.float32:  # the top half of each float32 (a bfloat16; float16: any bits)
        x = (x.view(cp.uint32) >> 16).astype(cp.uint16).view(dtype)
    first = len(seen)
    payload = codec.encode(x)
    if args.op != "encode":
        first = len(seen)
    if args.op == "decode":
        codec.decode(payload, out=cp.empty_like(x), count=count, dtype=dtype)
    elif args.op == "decode_accumulate":
        acc = cp.zeros(count, cp.float32)
        codec.decode(payload, out=acc, count=count, dtype=dtype, accumulate=True)
    elif args.op == "hop":
        codec.reduce_encode_kernel(x, dtype)(x, payload, cp.empty_like(payload))
    cp.cuda.runtime.deviceSynchronize()
    arch = f"sm_{cp.cuda.Device().compute_capability}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for i, (paths, defines) in enumerate(seen[first:]):
        stem = f"{args.op}-{args.dtype}-{i}"
        src = out / f"{stem}.cu"
        src.write_text("\n".join(p.read_text() for p in paths))
        opts = [f"-D{k}={v}" for k, v in sorted(defines.items())]
        cubin = out / f"{stem}.cubin"
        cmd = ["nvcc", "-cubin", f"-arch={arch}", "-std=c++17", "--fmad=false", "-ftz=true"]
        subprocess.run([*cmd, *opts, "-o", str(cubin), str(src)], check=True)
        sass = subprocess.run(
            ["cuobjdump", "-sass", str(cubin)], check=True, capture_output=True, text=True
        ).stdout
        (out / f"{stem}.sass").write_text(sass)
        ops = collections.Counter(
            m.group(1).split(".")[0]
            for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
        )
        print(f"== {stem}: {' '.join(opts)}")
        print(
            f"   {sum(ops.values())} instructions: "
            + ", ".join(f"{k} {v}" for k, v in ops.most_common(30))
        )


if __name__ == "__main__":
    main()
