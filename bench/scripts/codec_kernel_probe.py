"""A few launches of one codec kernel and nothing else, for a profiler (ncu).

    ncu -k regex:coccl_codec --launch-skip 3 --launch-count 1 \\
        python3 bench/scripts/codec_kernel_probe.py encode --count 64M

Encodes (``encode``), decodes (``decode``), decodes into a float32 accumulator
(``decode_accumulate``) or runs the fused ring hop (``hop``: payload = encode(x +
decode(payload)), codecs that have one) on ``--count`` random ``--dtype`` elements with
``--compressor``, ``--launches`` times, after one encode that makes the payload. A
script beside coccl-bench, not part of it: coccl's public API and coccl-bench's
``--compressor`` parser.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from coccl.bench.cli import datatype, parse_size
from coccl.bench.codec import codec_specs


def probe_case(compressor: str, dtype_name: str, count_text: str) -> tuple[Any, ...]:
    """(codec, dtype, count, x, payload): ``compressor`` ('name:key=value,...' as
    coccl-bench), ``count_text`` standard normal values of ``dtype_name`` on the current
    GPU (the same seed every time), and their payload."""
    import cupy as cp

    (spec,) = codec_specs(compressor)
    dtype, count = datatype(dtype_name), parse_size(count_text)
    host = np.random.default_rng(1).standard_normal(count, dtype=np.float32).astype(dtype)
    x = cp.asarray(host.view(np.uint8)).view(dtype)
    return spec.codec, dtype, count, x, spec.codec.encode(x)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("op", choices=("encode", "decode", "decode_accumulate", "hop"))
    ap.add_argument("--count", default="64M", help="elements (K/M/G binary)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--compressor", default="taco")
    ap.add_argument("--launches", type=int, default=6)
    args = ap.parse_args()

    import cupy as cp

    codec, dtype, count, x, payload = probe_case(args.compressor, args.dtype, args.count)
    acc = cp.zeros(count, dtype=cp.float32)
    out, sent = cp.empty_like(x), cp.empty_like(payload)
    hop = codec.reduce_encode_kernel(x, dtype)
    if args.op == "hop" and hop is None:
        raise SystemExit(f"{args.compressor} has no fused hop for {dtype.name} on the GPU")
    for _ in range(args.launches):
        if args.op == "encode":
            codec.encode(x, out=payload)
        elif args.op == "decode":
            codec.decode(payload, out=out, count=count, dtype=dtype)
        elif args.op == "hop":
            hop(x, payload, sent)
        else:
            codec.decode(payload, out=acc, count=count, dtype=dtype, accumulate=True)
    cp.cuda.runtime.deviceSynchronize()
    print(f"{args.launches} x {args.compressor} {args.op} of {count} {dtype.name} done")


if __name__ == "__main__":
    main()
