"""Host cost of each operation a staged-GPU pipeline round performs (one process, one GPU).

Each operation is called ``--calls`` times back to back without synchronizing (the GPU
queues the work); the host time per call is what the pipeline's polling thread pays for
it: the codecs' kernel launches (encode, decode, decode-accumulate, the fused ring hop),
the copies between device and pinned host memory, events and stream switches.

    python3 bench/scripts/host_costs.py --count 1M

A script beside coccl-bench, not part of it: it uses coccl's public API (the codec
contract of ``coccl.compressors``) and CuPy's.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import ml_dtypes
import numpy as np

import coccl
from coccl.bench.cli import parse_size
from coccl.bench.codec import codec_specs


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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", default="1M", help="elements per chunk")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument(
        "--compressors",
        default="",
        help="more codecs ('name:key=value', as coccl-bench): encode and decode each, bfloat16",
    )
    ap.add_argument("--profile", action="store_true", help="cProfile each added codec's calls")
    args = ap.parse_args()

    import cupy as cp

    n = parse_size(args.count)
    f32 = np.dtype(np.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    taco = coccl.get_compressor("taco")
    int8 = coccl.get_compressor("int8")
    with stream:
        x = cp.asarray(np.random.default_rng(0).standard_normal(n, dtype=np.float32))
        xb = cp.zeros(n, dtype=np.uint16).view(ml_dtypes.bfloat16)
        acc = cp.empty_like(x)
        tp = cp.empty(taco.encoded_nbytes(n, f32), dtype=np.uint8)
        ip = cp.empty(int8.encoded_nbytes(n, f32), dtype=np.uint8)
        taco.encode_into(x, tp, f32)
        int8.encode_into(x, ip, f32)
        tp2 = cp.empty_like(tp)
        hop = taco.reduce_encode_kernel(x, f32)
        pinned = cp.cuda.alloc_pinned_memory(tp.nbytes)
        host = np.frombuffer(pinned, dtype=np.uint8, count=tp.nbytes)

        def event() -> None:
            e = cp.cuda.Event(block=False, disable_timing=True)
            e.record(stream)

        def with_stream() -> None:
            with stream:
                pass

        ops: dict[str, Callable[[], object]] = {
            "taco encode_into": lambda: taco.encode_into(x, tp, f32),
            "taco decode_into (accumulate)": lambda: taco.decode_into(tp, acc, f32, True),
            "taco decode_into": lambda: taco.decode_into(tp, acc, f32, False),
            "int8 encode_into": lambda: int8.encode_into(x, ip, f32),
            "int8 decode_into (accumulate)": lambda: int8.decode_into(ip, acc, f32, True),
            "acc[...] = x (float32)": lambda: acc.__setitem__(Ellipsis, x),
            "acc[...] = x (bfloat16)": lambda: acc.__setitem__(Ellipsis, xb),
            "cupy.copyto(acc, x)": lambda: cp.copyto(acc, x),
            "acc.data.copy_from_device_async": lambda: acc.data.copy_from_device_async(
                x.data, x.nbytes, stream
            ),
            "Event() + record": event,
            "with stream": with_stream,
            "D2H payload.get(out=pinned)": lambda: tp.get(out=host, blocking=False),
            "H2D payload.set(pinned)": lambda: tp.set(host, stream=stream),
        }
        if hop is not None:
            ops["taco fused hop (reduce_encode)"] = lambda: hop(x, tp, tp2)
        added: dict[str, Callable[[], object]] = {}
        for spec in codec_specs(args.compressors) if args.compressors else ():
            added.update(codec_ops(spec.label, spec.codec, n))
        for name, fn in {**ops, **added}.items():
            print(f"{name:34s} {per_call_us(fn, args.calls):8.1f} us/call", flush=True)
            if args.profile and name in added:
                profile(fn, args.calls)


def codec_ops(label: str, codec: object, n: int) -> dict[str, Callable[[], object]]:
    """Encode and decode of ``n`` bfloat16 elements by ``codec`` (the current stream): the
    public ``encode`` and the ``encode_into`` / ``decode_into`` a pipeline's chunk calls."""
    import cupy as cp

    bf16 = np.dtype(ml_dtypes.bfloat16)
    host = np.random.default_rng(0).standard_normal(n, dtype=np.float32).astype(bf16)
    x = cp.asarray(host.view(np.uint16)).view(bf16)
    out = cp.empty_like(x)
    payload = codec.encode(x)
    return {
        f"{label} encode (bfloat16)": lambda: codec.encode(x, out=payload),
        f"{label} encode_into": lambda: codec.encode_into(x, payload, bf16),
        f"{label} decode_into": lambda: codec.decode_into(payload, out, bf16, False),
    }


def profile(fn: Callable[[], object], calls: int) -> None:
    """The functions with the most own time over ``calls`` calls of ``fn``."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
    print(text.getvalue(), flush=True)


if __name__ == "__main__":
    main()
