"""A/B probe of the staged-GPU pipeline's overlap: run under ``mpiexec -n N``.

For each (variant, chunk size, algorithm, compressor, size) it measures
``Communicator.overlap_profile`` and the peak staging memory of the pipelined run, and
rank 0 prints one line per point and writes them as JSON. Depths above the staging
limit's are lowered by the Communicator, as in any call.

    mpiexec -n 4 python3 bench/overlap_probe.py --out probe.json \\
        --depths 2,4 --chunks 4M,16M --sizes 64M,256M

``--compressors taco-nohop,int8-nohop`` are the codecs without their fused ring-hop
kernels; ``--forward host,device`` is the A/B of ring AllGather forwards sent from the
pinned copy they arrived in (host) or copied back from the device.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import time

import numpy as np
from mpi4py import MPI

import coccl
from coccl.bench.cli import datatype, parse_size
from coccl.compressors import Int8Compressor, TacoCompressor


def _line(row: dict, seconds: float) -> str:
    return (
        f"{row['forward']:6s} {row['dtype']:8s} {row['size'] >> 20:5d}M "
        f"chunk {row['chunk_bytes'] >> 20:3d}M d{row['depth']:<2d} {row['algorithm']:8s} "
        f"{row['compressor']:10s} algbw {row['algbw_GBps']:5.2f} "
        f"ov {row['overlap_efficiency']:.2f} pipe {row['pipelined_ms']:7.1f} "
        f"codec {row['codec_only_ms']:6.1f} wire {row['transport_only_ms']:7.1f} "
        f"peak {row['peak_staging_MiB']:5.0f} MiB ({seconds:.1f}s)"
    )


class _NoHop:
    """A codec without its fused ring-hop kernel: the ring loads, decode-accumulates and
    encodes in three steps (the A/B of the hop)."""

    def reduce_encode_kernel(self, like: object, dtype: object) -> None:
        return None


class _TacoNoHop(_NoHop, TacoCompressor):
    pass


class _Int8NoHop(_NoHop, Int8Compressor):
    pass


def _codec(name: str) -> object:
    """A compressor name, or ``taco-nohop`` / ``int8-nohop``."""
    return {"taco-nohop": _TacoNoHop, "int8-nohop": _Int8NoHop}.get(name, lambda: name)()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--chunks", default="4M")
    ap.add_argument("--sizes", default="64M,256M")
    ap.add_argument("--algorithms", default="ring,two_shot")
    ap.add_argument("--compressors", default="taco,int8")
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--depths", default="4", help="COCCL_PIPELINE_DEPTH values")
    ap.add_argument("--forward", default="host", help="host,device: see the docstring")
    args = ap.parse_args()

    import cupy as cp

    world = MPI.COMM_WORLD
    cp.cuda.Device(0).use()
    comm = coccl.init(world, backend="mpi")
    base_settings = comm._settings
    rows = []
    for dtype in args.dtypes.split(","):
        for size in map(parse_size, args.sizes.split(",")):
            np_dtype = datatype(dtype)
            count = size // np_dtype.itemsize
            rng = np.random.default_rng(world.rank)
            x = cp.asarray(rng.standard_normal(count, dtype=np.float32).astype(np_dtype))
            for depth, chunk, algorithm, compressor, forward in itertools.product(
                map(int, args.depths.split(",")),
                map(parse_size, args.chunks.split(",")),
                args.algorithms.split(","),
                args.compressors.split(","),
                args.forward.split(","),  # innermost: an A/B's two runs are neighbours
            ):
                comm._settings = dataclasses.replace(base_settings, pipeline_depth=depth)
                comm._mpi.forward_from_host = forward == "host"
                comm.reset_stats()
                t0 = time.perf_counter()
                prof = comm.overlap_profile(
                    "allreduce",
                    x,
                    algorithm=algorithm,
                    compressor=_codec(compressor),
                    chunk_bytes=chunk,
                    iters=args.iters,
                )
                st = comm.stats()
                peak = world.allreduce(
                    st["peak_pinned_bytes"] + st["peak_device_bytes"], op=MPI.MAX
                )
                row = {
                    "forward": forward,
                    "dtype": dtype,
                    "size": size,
                    "chunk_bytes": chunk,
                    "depth": depth,
                    "algorithm": algorithm,
                    "compressor": compressor,
                    "algbw_GBps": size / prof["pipelined_s"] / 1e9,
                    "overlap_efficiency": prof["overlap_efficiency"],
                    "pipelined_ms": prof["pipelined_s"] * 1e3,
                    "codec_only_ms": prof["codec_only_s"] * 1e3,
                    "transport_only_ms": prof["transport_only_s"] * 1e3,
                    "peak_staging_MiB": peak / 2**20,
                }
                rows.append(row)
                if world.rank == 0:
                    print(_line(row, time.perf_counter() - t0), flush=True)
            del x
    if world.rank == 0:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    comm.close()


if __name__ == "__main__":
    main()
