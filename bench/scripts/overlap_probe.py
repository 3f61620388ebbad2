"""A/B probe of the staged-GPU pipeline's overlap: run under ``mpiexec -n N``.

For each (dtype, size, chunk size, algorithm, compressor, pipeline depth, forward) it
measures ``Communicator.overlap_profile`` and the peak staging memory of the pipelined
run; rank 0 prints one line per point and writes them as JSON. Each (depth, forward)
setting gets a communicator of its own, built with the setting in the environment
(``COCCL_PIPELINE_DEPTH``, ``COCCL_FORWARD_FROM_PINNED``), as a user would set it; each
holds its own staging pools.
Depths above the staging limit's are lowered by the Communicator, as in any call.

    mpiexec -n 4 python3 bench/scripts/overlap_probe.py --out probe.json \\
        --depths 2,4 --chunks 4M,16M --sizes 64M,256M

``--compressors taco-nohop,int8-nohop`` are the codecs without their fused ring-hop
kernel (the ring then decodes, adds and encodes in three steps); ``--forward host,device``
is the A/B of ring AllGather forwards sent from the pinned copy they arrived in (host,
``COCCL_FORWARD_FROM_PINNED=1``) or copied back from the device (``=0``).

A script beside coccl-bench, not part of it: it uses coccl's public API only.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from typing import Any

import numpy as np
from mpi4py import MPI

import coccl
from coccl.bench.cli import datatype, parse_size
from coccl.compressors import Compressor, Int8Compressor, TacoCompressor


class _NoHop:
    """A codec without its fused ring-hop kernel (``reduce_encode_kernel`` returns None:
    the contract's way of saying there is none)."""

    def reduce_encode_kernel(self, like: object, dtype: object) -> None:
        return None


@coccl.register_compressor
class TacoNoHop(_NoHop, TacoCompressor):
    codec_id = "taco-nohop"  # its own config, so no cache mistakes it for taco


@coccl.register_compressor
class Int8NoHop(_NoHop, Int8Compressor):
    codec_id = "int8-nohop"


FORWARD_SETTING = {"host": "1", "device": "0"}  # --forward -> COCCL_FORWARD_FROM_PINNED


def communicator(world: MPI.Comm, depth: int, forward: str) -> Any:
    """A communicator built with this pipeline depth and forward source in effect."""
    os.environ["COCCL_PIPELINE_DEPTH"] = str(depth)
    os.environ["COCCL_FORWARD_FROM_PINNED"] = FORWARD_SETTING[forward]
    return coccl.init(world, backend="mpi")


def _line(row: dict, seconds: float) -> str:
    return (
        f"{row['forward']:6s} {row['dtype']:8s} {row['size'] >> 20:5d}M "
        f"chunk {row['chunk_bytes'] >> 20:3d}M d{row['depth']:<2d} {row['algorithm']:8s} "
        f"{row['compressor']:10s} algbw {row['algbw_GBps']:5.2f} "
        f"ov {row['overlap_efficiency']:.2f} pipe {row['pipelined_ms']:7.1f} "
        f"codec {row['codec_only_ms']:6.1f} wire {row['transport_only_ms']:7.1f} "
        f"peak {row['peak_staging_MiB']:5.0f} MiB ({seconds:.1f}s)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file for the points")
    ap.add_argument("--chunks", default="4M", help="chunk sizes (bytes)")
    ap.add_argument("--sizes", default="64M,256M", help="message sizes (bytes)")
    ap.add_argument("--algorithms", default="ring,two_shot")
    ap.add_argument("--compressors", default="taco,int8", help="also taco-nohop, int8-nohop")
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--iters", type=int, default=5, help="timed runs of each profile")
    ap.add_argument("--depths", default="4", help="COCCL_PIPELINE_DEPTH values")
    ap.add_argument("--forward", default="host", help="host,device: see the docstring")
    args = ap.parse_args()

    import cupy as cp

    world = MPI.COMM_WORLD
    cp.cuda.Device(0).use()
    codecs: dict[str, Compressor] = {
        name: coccl.get_compressor(name) for name in args.compressors.split(",")
    }
    # One communicator per (depth, forward) setting, all built first, so that the two runs
    # of an A/B stay neighbours in time (the setting varies innermost).
    settings = list(itertools.product(map(int, args.depths.split(",")), args.forward.split(",")))
    comms = {setting: communicator(world, *setting) for setting in settings}
    rows = []
    for dtype, size in itertools.product(
        args.dtypes.split(","), map(parse_size, args.sizes.split(","))
    ):
        np_dtype = datatype(dtype)
        rng = np.random.default_rng(world.rank)
        x = cp.asarray(
            rng.standard_normal(size // np_dtype.itemsize, dtype=np.float32).astype(np_dtype)
        )
        for chunk, algorithm, name, (depth, forward) in itertools.product(
            map(parse_size, args.chunks.split(",")),
            args.algorithms.split(","),
            codecs,
            settings,
        ):
            comm = comms[depth, forward]
            comm.reset_stats()
            t0 = time.perf_counter()
            prof = comm.overlap_profile(
                "allreduce",
                x,
                algorithm=algorithm,
                compressor=codecs[name],
                chunk_bytes=chunk,
                iters=args.iters,
            )
            st = comm.stats()
            peak = world.allreduce(st["peak_pinned_bytes"] + st["peak_device_bytes"], op=MPI.MAX)
            row = {
                "forward": forward,
                "dtype": dtype,
                "size": size,
                "chunk_bytes": chunk,
                "depth": depth,
                "algorithm": algorithm,
                "compressor": name,
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
    for comm in comms.values():
        comm.close()
    if world.rank == 0:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
