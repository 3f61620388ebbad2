"""The taco ring hop's kernels, timed on one GPU: the 32-elements-per-lane hop with
per-lane and with staged (shared-memory, coalesced) accesses and the EPL hop (kernel 7's
layout), with and without their decoded output (DEC), against the encode and decode
kernels and a device copy of the same bytes, for one shard of a 2-rank AllReduce, under
each grid cap of ``--grids`` (the ``blocks_per_sm`` tuning: a kernel's grid is at most
that many blocks per SM). Each operation is captured ``--calls`` times into a CUDA
graph, so the times are the GPU's (no host launch cost between calls); ``--repeats``
replays, median.

    python3 bench/scripts/hop_probe.py --out hop.json --sizes 16M,64M --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from typing import Any

import cupy as cp
import ml_dtypes
import numpy as np

from coccl.bench.cli import parse_size
from coccl.bench.table import provenance
from coccl.compressors import get_compressor
from coccl.compressors import gpu_kernels as gk  # its tuning hooks only

TACO = dict(group_size=128, fp8_format="e4m3", ash=True, dual_scale=True)
# the hop kernels compared, as the tuning that selects each
KERNELS: dict[str, dict[str, Any]] = {
    "32 per lane, per-lane accesses": {"hop_epl": 0, "stage": {"hop": 0}},
    "32 per lane, staged": {"hop_epl": 0, "stage": {"hop": 1}},
    "EPL 32": {"hop_epl": 32, "hop_epl_from": 0},
    "EPL 64": {"hop_epl": 64, "hop_epl_from": 0},
}


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--out", default="hop.json", help="JSON file written")
    p.add_argument("--sizes", default="16M,64M", help="elements per shard")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--calls", type=int, default=20, help="calls per graph")
    p.add_argument("--repeats", type=int, default=7, help="graph replays timed")
    p.add_argument("--grids", default="16", help="blocks_per_sm values, comma-separated")
    return p.parse_args()


def timed_us(fn: Callable[[], None], calls: int, repeats: int) -> float:
    """Median GPU time of one call of ``fn``: ``calls`` of them captured in one graph."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        fn()  # compile and warm up outside the capture
    stream.synchronize()
    stream.begin_capture()
    try:
        with stream:
            for _ in range(calls):
                fn()
    finally:
        graph = stream.end_capture()
    graph.upload(stream)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    samples = []
    for _ in range(repeats):
        start.record(stream)
        graph.launch(stream)
        end.record(stream)
        end.synchronize()
        samples.append(cp.cuda.get_elapsed_time(start, end) * 1e3 / calls)
    return statistics.median(samples)


def operations(n: int, dtype: np.dtype) -> tuple[dict[str, Callable[[], None]], dict[str, int]]:
    """The timed operations on a shard of ``n`` elements, and the bytes each moves."""
    rng = np.random.default_rng(0)
    host = rng.standard_normal(n, dtype=np.float32).astype(dtype)
    own = cp.asarray(host.view(np.uint16 if dtype.itemsize == 2 else np.float32)).view(dtype)
    dec = cp.empty_like(own)
    taco = get_compressor({"id": "taco", **TACO})
    nb = taco.encoded_nbytes(n, dtype)
    received, out = cp.empty(nb, cp.uint8), cp.empty(nb, cp.uint8)
    taco.encode_into(own, received, dtype)
    hop_kernel = taco.reduce_encode_kernel(own, dtype)
    x = own.nbytes

    def hop(kernel: str, decoded: bool) -> Callable[[], None]:
        def run() -> None:
            with gk.tuning(**KERNELS[kernel]):
                hop_kernel(own, received, out, dec if decoded else None)

        return run

    def hop_then_decode() -> None:
        with gk.tuning(**KERNELS["32 per lane, staged"]):
            hop_kernel(own, received, out)
        taco.decode_into(out, dec, dtype, False)

    def copy() -> None:
        cp.cuda.runtime.memcpyAsync(
            dec.data.ptr, own.data.ptr, x, cp.cuda.runtime.memcpyDeviceToDevice,
            cp.cuda.get_current_stream().ptr,
        )  # fmt: skip

    ops = {
        "device copy of the shard": copy,
        "encode": lambda: taco.encode_into(own, out, dtype),
        "decode": lambda: taco.decode_into(received, dec, dtype, False),
        "hop then decode (two kernels)": hop_then_decode,
    }
    moved = {
        "device copy of the shard": 2 * x,
        "encode": x + nb,
        "decode": nb + x,
        "hop then decode (two kernels)": 2 * x + 3 * nb,
    }
    for kernel in KERNELS:
        ops[f"hop, {kernel}"] = hop(kernel, False)
        ops[f"hop + decoded, {kernel}"] = hop(kernel, True)
        moved[f"hop, {kernel}"] = x + 2 * nb
        moved[f"hop + decoded, {kernel}"] = 2 * x + 2 * nb
    return ops, moved


def main() -> None:
    args = parse()
    dtype = np.dtype(ml_dtypes.bfloat16) if args.dtype == "bfloat16" else np.dtype(args.dtype)
    rows: list[dict[str, Any]] = []
    for n in (parse_size(s) for s in args.sizes.split(",")):
        ops, moved = operations(n, dtype)
        for grid in (int(g) for g in args.grids.split(",")):
            for name, fn in ops.items():
                with gk.tuning(blocks_per_sm=grid):
                    us = timed_us(fn, args.calls, args.repeats)
                gbps = moved[name] / us / 1e3
                rows.append({"elements": n, "dtype": args.dtype, "blocks_per_sm": grid,
                             "operation": name, "us": us, "bytes_moved": moved[name],
                             "gb_per_s": gbps})  # fmt: skip
                print(f"{n:>11} {grid:>2} {name:<48} {us:8.1f} us {gbps:6.0f} GB/s", flush=True)
    flags = " ".join(f"--{k} {v}" for k, v in vars(args).items())
    record = {
        "command": f"python3 bench/scripts/hop_probe.py {flags}",
        **provenance(__file__),
        "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "codec": TACO,
        "rows": rows,
    }
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
