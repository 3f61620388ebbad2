"""Host cost of each operation a staged-GPU pipeline round performs (one process).

Each operation is called ``--calls`` times back to back without synchronizing (the GPU
queues the work); the host time per call is what the polling thread pays for it.

    python3 bench/host_costs.py --count 1M
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

import coccl
from coccl.bench.cli import parse_size


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    import cupy as cp

    fn()
    cp.cuda.get_current_stream().synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    cp.cuda.get_current_stream().synchronize()
    return 1e6 * elapsed / calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", default="1M", help="elements per chunk")
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args()

    import cupy as cp

    from coccl.pipeline import Round
    from coccl.pool import device_pool, pinned_pool

    n = parse_size(args.count)
    stream = cp.cuda.Stream(non_blocking=True)
    taco = coccl.get_compressor("taco")
    int8 = coccl.get_compressor("int8")
    with stream:
        x = cp.asarray(np.random.default_rng(0).standard_normal(n, dtype=np.float32))
        acc = cp.empty_like(x)
        try:
            xb = cp.zeros(n, dtype=np.uint16).view(coccl.arrays.BFLOAT16)
        except Exception:  # a CuPy without ml_dtypes' bfloat16
            xb = None
        tp = cp.empty(taco.encoded_nbytes(n, np.float32), dtype=np.uint8)
        ip = cp.empty(int8.encoded_nbytes(n, np.float32), dtype=np.uint8)
        taco.encode_into(x, tp, np.dtype(np.float32))
        int8.encode_into(x, ip, np.dtype(np.float32))
        tp2 = cp.empty_like(tp)
        hop = taco.reduce_encode_kernel(x, np.dtype(np.float32))
        dpool, ppool = device_pool(cp.cuda.Device()), pinned_pool()
        host = ppool.get(tp.size)

        def event() -> None:
            e = cp.cuda.Event(block=False, disable_timing=True)
            e.record(stream)

        def with_stream() -> None:
            with stream:
                pass

        def pool_cycle() -> None:
            dpool.get(tp.size).release()

        ops: dict[str, Callable[[], object]] = {
            "taco encode_into": lambda: taco.encode_into(x, tp, np.dtype(np.float32)),
            "taco decode_into (accumulate)": lambda: taco.decode_into(
                tp, acc, np.dtype(np.float32), True
            ),
            "taco decode_into": lambda: taco.decode_into(tp, acc, np.dtype(np.float32), False),
            "taco fused hop (reduce_encode)": lambda: hop(x, tp, tp2),
            "int8 encode_into": lambda: int8.encode_into(x, ip, np.dtype(np.float32)),
            "int8 decode_into (accumulate)": lambda: int8.decode_into(
                ip, acc, np.dtype(np.float32), True
            ),
            "acc[...] = x (float32)": lambda: acc.__setitem__(Ellipsis, x),
            "cupy.copyto(acc, x)": lambda: cp.copyto(acc, x),
            "acc.data.copy_from_device_async": lambda: acc.data.copy_from_device_async(
                x.data, x.nbytes, stream
            ),
            "Event() + record": event,
            "with stream": with_stream,
            "device pool get+release": pool_cycle,
            "D2H payload.get(out=pinned)": lambda: tp.get(out=host.data, blocking=False),
            "H2D payload.set(pinned)": lambda: tp.set(host.data, stream=stream),
            "Round()": lambda: Round(label="x", tag=1),
        }
        if xb is not None:
            ops["acc[...] = x (bfloat16)"] = lambda: acc.__setitem__(Ellipsis, xb)
        for name, fn in ops.items():
            print(f"{name:34s} {per_call_us(fn, args.calls):8.1f} us/call", flush=True)


if __name__ == "__main__":
    main()
