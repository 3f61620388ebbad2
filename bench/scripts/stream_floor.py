"""The floor of a decode's byte mix: a kernel that only streams a codec's payload bytes
in and its output bytes out (no arithmetic), timed beside a copy of the same bytes, as
``coccl-bench codec`` times a decode. A decode that reads 0.5 B and writes 2-4 B an
element is mostly writes; if this kernel's ``of copy`` sits where the decodes sit, the
decodes are at the mix's floor, not short of instructions. ``--reads spread`` (the
default) spreads the payload's reads through the writes as a decode does; ``phased``
reads it all first. A script beside coccl-bench.

    python3 bench/scripts/stream_floor.py --counts 16M,64M,256M \\
        --compressor taco,int:bits=4,hadamard=32,mx --json floor.json
"""

from __future__ import annotations

import argparse
import json

from coccl.bench.cli import datatype, parse_size
from coccl.bench.codec import codec_specs, gpu_device, rotation_sets
from coccl.bench.table import provenance

# SPREAD 0 ("phased"): thread i writes the i-th 16 bytes of out and reads payload word i
# first (its value goes into the word written, so the load is not dead), grid-stride over
# the output's words: every read happens in the first n_in / n_out of the run and the rest
# is pure writes. SPREAD 1 ("spread"): the output in tiles of THREADS words (4 KiB, one
# block's store), tile t reading payload words [t P, t P + P) with P = ceil(n_in / tiles),
# so every tile reads its share of the payload and writes its output, as a decode's tiles
# do; no division in the loop (a division per word would bound the kernel, not memory).
_SOURCE = r"""
extern "C" __global__ void stream_mix(const uint4* __restrict__ in, long long n_in,
                                      uint4* __restrict__ out, long long n_out) {
#if SPREAD
  const long long tiles = (n_out + blockDim.x - 1) / blockDim.x;
  const long long per = (n_in + tiles - 1) / tiles;
  for (long long t = blockIdx.x; t < tiles; t += gridDim.x) {
    const long long i = t * blockDim.x + threadIdx.x, j = t * per + threadIdx.x;
    uint4 v = make_uint4((unsigned)i, 0u, 0u, 0u);
    if (threadIdx.x < per && j < n_in) v = in[j];
    if (i < n_out) out[i] = v;
  }
#else
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_out; i += stride) {
    uint4 v = make_uint4((unsigned)i, 0u, 0u, 0u);
    if (i < n_in) v = in[i];
    out[i] = v;
  }
#endif
}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compressor", default="taco")
    ap.add_argument("--counts", default="16M,64M,256M")
    ap.add_argument("-d", "--dtypes", default="bfloat16,float32")
    ap.add_argument("-n", "--iters", type=int, default=15)
    ap.add_argument("--reads", choices=("spread", "phased"), default="spread")
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    device = gpu_device()
    cp = device.xp
    spread = int(args.reads == "spread")
    kernel = cp.RawKernel(_SOURCE, "stream_mix", options=(f"-DSPREAD={spread}",))
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    rows = []
    for spec in codec_specs(args.compressor):
        for count in (parse_size(c) for c in args.counts.split(",")):
            for dtype in (datatype(d) for d in args.dtypes.split(",")):
                payload = spec.codec.encoded_nbytes(count, dtype)
                output = count * dtype.itemsize
                sets = rotation_sets(payload + output)
                calls = []
                for _ in range(sets):
                    src = cp.ones(-(-payload // 16) * 16, cp.uint8)
                    dst = cp.empty(-(-output // 16) * 16, cp.uint8)
                    grid = (sms * 8,)
                    argv = (src, cp.int64(src.size // 16), dst, cp.int64(dst.size // 16))
                    calls.append(lambda a=argv, g=grid: kernel(g, (256,), a))
                mix_s = device.median_seconds(calls, args.iters, 3)
                del calls
                device.release()
                moved = payload + output
                copy_s = device.median_seconds(
                    device.copy_calls(-(-moved // 2), sets), args.iters, 3
                )
                device.release()
                row = {
                    "reads": args.reads,
                    "codec": spec.label,
                    "dtype": dtype.name,
                    "count": count,
                    "payload_bytes": payload,
                    "output_bytes": output,
                    "mix_ms": mix_s * 1e3,
                    "copy_ms": copy_s * 1e3,
                    "of_copy": copy_s / mix_s,
                }
                rows.append(row)
                print(
                    f"{args.reads:6s} {spec.label:24s} {dtype.name:9s} {count:10d}"
                    f"  stream {mix_s * 1e6:8.1f} us  copy {copy_s * 1e6:8.1f} us"
                    f"  of copy {copy_s / mix_s:.3f}",
                    flush=True,
                )
    flags = " ".join(f"--{k.replace('_', '-')} {v!r}" for k, v in vars(args).items())
    command = "python3 bench/scripts/stream_floor.py " + flags
    record = {**provenance(__file__), "command": command, "rows": rows}
    with open(args.json, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
