"""Codec kernels under two launch tunings, side by side in one run (an A/B of a kernel
change that a tuning key can switch off), timed as ``coccl-bench codec`` times them.

    python3 bench/scripts/kernel_ab.py --compressor taco --counts 4M,16M,64M \\
        --tuning '{"hop_epl_from": 67108864}' --json ab.json

Each (count, dtype) is measured under the default tuning (arm ``default``) and under
``--tuning`` (arm ``tuned``), alternating ``--rounds`` times; rows carry ``copy_ms`` and
``size_fraction`` as the bench's. A script beside coccl-bench, not part of it.
"""

from __future__ import annotations

import argparse
import json
from contextlib import nullcontext
from dataclasses import asdict

from coccl.bench.cli import datatype, parse_size
from coccl.bench.codec import codec_specs, gpu_device, measure
from coccl.bench.table import provenance


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compressor", default="taco")
    ap.add_argument("--counts", default="4M,16M,64M")
    ap.add_argument("-d", "--dtypes", default="bfloat16,float32")
    ap.add_argument("--ops", default="encode,decode,hop")
    ap.add_argument("--tuning", required=True, help="JSON object of gpu_kernels.tuning keys")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("-n", "--iters", type=int, default=25)
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    device = gpu_device()
    copy = device.copy_gbps(10)["copy_GBps"]
    tuning = json.loads(args.tuning)
    ops = tuple(args.ops.split(","))
    rows = []
    for spec in codec_specs(args.compressor):
        for count in (parse_size(c) for c in args.counts.split(",")):
            for dtype in (datatype(d) for d in args.dtypes.split(",")):
                for r in range(args.rounds):
                    for arm in ("default", "tuned"):
                        tuned = device.tuning(tuning) if arm == "tuned" else nullcontext()
                        with tuned:
                            got = measure(device, spec, dtype, count, args.iters, 3, copy, ops)
                        for row in got:
                            rows.append({"arm": arm, "round": r, **asdict(row)})
                            print(
                                f"{arm:8s} {row.codec} {row.op:18s} {row.dtype:9s} {count:10d} "
                                f"{row.time_ms * 1e3:9.1f} us  of copy {row.size_fraction:.3f}  "
                                f"fraction {row.fraction:.3f}",
                                flush=True,
                            )
    record = {**provenance(__file__), "command": "python3 bench/scripts/kernel_ab.py " + " ".join(
        f"--{k.replace('_', '-')} {v!r}" for k, v in vars(args).items()), "tuning": tuning,
        "copy_GBps": copy, "rows": rows}  # fmt: skip
    with open(args.json, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
