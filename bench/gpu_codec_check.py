"""One-call GPU check of the taco/int8 CUDA kernels (compressors/gpu_kernels.py).

Run from the repository root, no install needed:

    python bench/gpu_codec_check.py --out DIR

It (a) measures the device-to-device copy bandwidth, (b) checks the GPU kernels against
the CPU kernels bit for bit (and the hardware FP8 conversion against the software one over
every finite float32), (c) times encode / decode / decode-accumulate of both codecs,
(d) tries a few launch configurations of the two kernels with performance targets, and
(e) prints register/spill usage, and with --tests (f) runs tests/test_codec_gpu.py in the
same process (--only-tests: just that). Results go to DIR/codec.json (rewritten after each
part, so a partial run still leaves its numbers). One failing variant is reported and
skipped; it does not stop the others.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------- imports
def _package_dirs() -> dict[str, Path]:
    """pyproject's [tool.setuptools] package-dir (coccl.compressors -> compressors/...)."""
    dirs = {
        "coccl.compressors": "compressors",
        "coccl.algorithms": "algorithms",
        "coccl.bench": "bench",
    }
    try:
        import tomllib  # noqa: PLC0415

        with open(ROOT / "pyproject.toml", "rb") as f:
            dirs.update(tomllib.load(f)["tool"]["setuptools"]["package-dir"])
    except Exception:
        pass
    return {k: ROOT / v for k, v in dirs.items() if k != "coccl"}


class _PackageDirFinder(importlib.abc.MetaPathFinder):
    """Finds coccl's subpackages in the folders pyproject maps them to, so that the repo
    runs without `pip install -e .`; submodules are then found through __path__."""

    def __init__(self, dirs: dict[str, Path]) -> None:
        self.dirs = dirs

    def find_spec(self, fullname, path=None, target=None):  # noqa: ARG002
        folder = self.dirs.get(fullname)
        if folder is None or not (folder / "__init__.py").exists():
            return None
        return importlib.util.spec_from_file_location(
            fullname, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )


def _setup_imports() -> None:
    sys.path.insert(0, str(ROOT))
    sys.meta_path.insert(0, _PackageDirFinder(_package_dirs()))


def _load_gpu_kernels():
    try:
        from coccl.compressors import gpu_kernels  # noqa: PLC0415

        return gpu_kernels
    except Exception:
        print("! importing coccl.compressors failed; loading gpu_kernels.py by path:")
        traceback.print_exc()
        spec = importlib.util.spec_from_file_location(
            "coccl_gpu_kernels", ROOT / "compressors" / "gpu_kernels.py"
        )
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod


def _load_cpu_kernels():
    try:
        from coccl.compressors import cpu_kernels  # noqa: PLC0415

        return cpu_kernels
    except Exception:
        print("! the CPU kernels could not be imported; bitwise checks are skipped:")
        traceback.print_exc()
        return None


# ---------------------------------------------------------------------- helpers
M = 1 << 20
GIB = 1 << 30


def log(*a: Any) -> None:
    print(*a, flush=True)


class Report:
    def __init__(self, out: Path) -> None:
        self.path = out / "codec.json"
        self.data: dict[str, Any] = {
            "rows": [],
            "checks": [],
            "tuning": [],
            "launch_cost": [],
            "errors": [],
        }

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)

    def error(self, what: str, exc: BaseException) -> None:
        msg = f"{what}: {type(exc).__name__}: {exc}"
        log("  ERROR", msg)
        traceback.print_exc()
        self.data["errors"].append(msg)
        self.save()


_SPIN_SOURCE = r"""
extern "C" __global__ void coccl_spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}
"""
_spin: list[Any] = []


def gpu_spin(cp, cycles: int = 2_000_000) -> None:
    """Keep the GPU busy for ``cycles`` SM clocks (about 1 ms at 1.98 GHz) on the current
    stream, so that the host can queue what follows before the GPU reaches it."""
    if not _spin:
        _spin.append(cp.RawKernel(_SPIN_SOURCE, "coccl_spin"))
    _spin[0]((1,), (1,), (cp.int64(cycles),))


def timed_ms(cp, fns, reps: int, warmup: int = 3, hide_launch: bool = True) -> float:
    """Median over reps of the device time of one call (CUDA events), rotating over fns.

    With ``hide_launch`` (the default) each timed call is queued behind a spin kernel, so
    the events bracket the call's GPU work only, as in a pipeline where launches run ahead
    of the GPU. Without it the GPU is idle when the start event is recorded, and the time
    also holds the host's cost of launching the call (CuPy's argument handling, ~20 us);
    bench/NOTES.md compares the two."""
    for i in range(max(warmup, len(fns))):
        fns[i % len(fns)]()
    cp.cuda.get_current_stream().synchronize()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for i in range(reps):
        f = fns[i % len(fns)]
        if hide_launch:
            gpu_spin(cp)
        start.record()
        f()
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end))
    times.sort()
    return times[len(times) // 2]


def random_dev(cp, n: int, dtype, seed: int):
    """n random normal values of dtype on the GPU (never zeros)."""
    import numpy as np  # noqa: PLC0415

    rs = cp.random.RandomState(seed)
    x = rs.standard_normal(n, dtype=cp.float32)
    x *= 3.0
    dt = np.dtype(dtype)
    if dt == np.float32:
        return x
    if dt == np.float16:
        return x.astype(cp.float16)
    bits = x.view(cp.uint32)  # bfloat16: round to nearest even through the bits
    b16 = ((bits + cp.uint32(0x7FFF) + ((bits >> 16) & cp.uint32(1))) >> 16).astype(cp.uint16)
    del x, bits
    return b16.view(dt)


# ------------------------------------------------------------- (a) copy bandwidth
def measure_copy(cp, rep: Report, reps: int) -> float:
    n = GIB
    src = cp.empty(n, cp.uint8)
    src[...] = 7
    dst = cp.empty(n, cp.uint8)
    stream = cp.cuda.get_current_stream()
    ms = timed_ms(cp, [lambda: dst.data.copy_from_device_async(src.data, n, stream)], reps)
    gbps = 2 * n / ms / 1e6
    ms_k = timed_ms(cp, [lambda: cp.copyto(dst.view(cp.float32), src.view(cp.float32))], reps)
    gbps_k = 2 * n / ms_k / 1e6
    log(
        f"(a) device copy of 1 GiB: memcpy {gbps:.0f} GB/s, copy kernel {gbps_k:.0f} GB/s "
        "(bytes read + written)"
    )
    rep.data["copy_GBps"] = gbps
    rep.data["copy_kernel_GBps"] = gbps_k
    rep.save()
    return gbps


# ---------------------------------------------------------------- (b) bit checks
def _mismatch_values(a, b) -> int:
    import numpy as np  # noqa: PLC0415

    af, bf = a.astype(np.float32), b.astype(np.float32)
    an, bn = np.isnan(af), np.isnan(bf)
    u = {2: np.uint16, 4: np.uint32}[a.dtype.itemsize]
    return int(((an != bn) | (~an & (a.view(u) != b.view(u)))).sum())


def _test_data(n: int, dtype, G: int, rng):
    import ml_dtypes  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    dt = np.dtype(dtype)
    K = max(1, -(-n // G))
    x = rng.standard_normal(n)
    lo, hi = (-6, 3) if dt == np.float16 else (-30, 30)
    x *= np.repeat(10.0 ** rng.uniform(lo, hi, K), G)[:n]
    tiny = 3e-6 if dt == np.float16 else (3e-39 if dt == np.dtype(ml_dtypes.bfloat16) else 3e-40)
    for i, g in enumerate(range(1, K, 5)):
        sl = slice(g * G, min(n, (g + 1) * G))
        kind = i % 5
        if kind == 0:
            x[sl] = 0.0
        elif kind == 1:
            x[sl] = rng.standard_normal(sl.stop - sl.start) * tiny
        elif kind == 2:
            x[sl.start] = np.nan
        elif kind == 3:
            x[sl.stop - 1] = -np.inf
        else:
            x[sl.start] = 1e4
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(dt)


def _to_dev(cp, a):
    import ml_dtypes  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    if a.dtype == np.dtype(ml_dtypes.bfloat16):
        return cp.asarray(a.view(np.uint16)).view(a.dtype)
    return cp.asarray(a)


def _to_host(cp, d):
    import ml_dtypes  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    if np.dtype(d.dtype) == np.dtype(ml_dtypes.bfloat16):
        return cp.asnumpy(d.view(cp.uint16)).view(d.dtype)
    return cp.asnumpy(d)


def bit_checks(cp, gk, ck, rep: Report, sizes: list[int]) -> None:
    import ml_dtypes  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    bf16 = np.dtype(ml_dtypes.bfloat16)
    log("(b) GPU vs CPU kernels, bit for bit (payload bytes; decoded values, NaN as NaN)")
    rng = np.random.default_rng(0)
    cases = []
    for G in (32, 128, 512):
        for fmt in ("e4m3", "e5m2"):
            for ash, dual in ((True, True), (False, False), (True, False), (False, True)):
                cases.append(("taco", G, fmt, ash, dual, bf16))
    for dt in (np.float32, np.float16):
        cases.append(("taco", 128, "e4m3", True, True, np.dtype(dt)))
        cases.append(("taco", 64, "e5m2", True, True, np.dtype(dt)))
    for G in (128, 32, 1024, 100):
        for dt in (np.float32, np.float16, bf16):
            cases.append(("int8", G, None, None, None, np.dtype(dt)))
    total_bad = 0
    for codec, G, fmt, ash, dual, dt in cases:
        name = f"{codec} G={G} {fmt or ''} ash={ash} ds={dual} {dt.name}"
        try:
            bad = {"payload": 0, "decode": 0, "accumulate": 0}
            for n in sizes:
                x = _test_data(n, dt, G, rng)
                K = -(-n // G)
                if codec == "taco":
                    kw = dict(group_size=G, fp8_format=fmt, ash=ash, dual_scale=dual)
                    nb = K * G + 4 * K * (int(ash) + int(dual))
                    enc, dec = ck.taco_encode, ck.taco_decode
                    genc, gdec = gk.taco_encode, gk.taco_decode
                else:
                    kw = dict(group_size=G)
                    nb = n + 4 * K
                    enc, dec = ck.int8_encode, ck.int8_decode
                    genc, gdec = gk.int8_encode, gk.int8_decode
                want = np.empty(nb, np.uint8)
                enc(x, want, **kw)
                pd = cp.full(nb, 0xA5, cp.uint8)
                genc(_to_dev(cp, x), pd, **kw)
                bad["payload"] += int((cp.asnumpy(pd) != want).sum())
                want_d = np.empty(n, dt)
                dec(want, want_d, accumulate=False, **kw)
                od = cp.full(n * dt.itemsize, 0xFF, cp.uint8).view(
                    cp.uint16 if dt.itemsize == 2 else cp.float32
                )
                od = od.view(dt) if dt != bf16 else od.view(bf16)
                gdec(cp.asarray(want), od, accumulate=False, **kw)
                bad["decode"] += _mismatch_values(_to_host(cp, od), want_d)
                acc = rng.standard_normal(n).astype(np.float32)
                want_a = acc.copy()
                dec(want, want_a, accumulate=True, **kw)
                ad = cp.asarray(acc)
                gdec(cp.asarray(want), ad, accumulate=True, **kw)
                bad["accumulate"] += _mismatch_values(cp.asnumpy(ad), want_a)
            ok = not any(bad.values())
            total_bad += not ok
            rep.data["checks"].append({"case": name, "sizes": sizes, "mismatches": bad, "ok": ok})
            log(f"  {'ok  ' if ok else 'FAIL'} {name} {'' if ok else bad}")
        except Exception as exc:  # noqa: BLE001
            total_bad += 1
            rep.error(f"check {name}", exc)
    rep.save()
    log(f"  {len(cases) - total_bad}/{len(cases)} cases bitwise identical")


def fp8_exhaustive(cp, gk, ck, rep: Report, nchunks: int, chunk: int = 1 << 28) -> None:
    """Hardware FP8 conversion (cvt.rn.satfinite) vs the software one in the same kernel,
    over every float32 bit pattern (groups holding Inf/NaN patterns are all-NaN codes on
    both), and vs the CPU kernels on a sample."""
    import numpy as np  # noqa: PLC0415

    log("(b2) FP8 conversion: hardware vs software over all 2^32 float32 patterns")
    for fmt in ("e4m3", "e5m2"):
        try:
            kw = dict(group_size=32, fp8_format=fmt, ash=False, dual_scale=False)
            mism = 0
            t0 = time.time()
            hw = cp.empty(chunk, cp.uint8)
            sw = cp.empty(chunk, cp.uint8)
            for c in range(nchunks):
                bits = cp.arange(c * chunk, (c + 1) * chunk, dtype=cp.uint64).astype(cp.uint32)
                x = bits.view(cp.float32)
                gk.taco_encode(x, hw, **kw)
                old = gk._set_tuning(sw_cvt=1)
                try:
                    gk.taco_encode(x, sw, **kw)
                finally:
                    gk._set_tuning(**old)
                mism += int((hw != sw).sum())
                del bits, x
            sample_bad, nsample = -1, 0
            if ck is not None:
                rng = np.random.default_rng(1)
                nsample = min(1 << 22, nchunks * chunk)
                xs = rng.integers(0, 1 << 32, nsample, dtype=np.uint64).astype(np.uint32)
                xs = xs.view(np.float32)
                want = np.empty(xs.size, np.uint8)
                ck.taco_encode(xs, want, **kw)
                got = cp.empty(xs.size, cp.uint8)
                gk.taco_encode(cp.asarray(xs), got, **kw)
                sample_bad = int((cp.asnumpy(got) != want).sum())
            ok = mism == 0 and sample_bad <= 0
            rep.data["checks"].append(
                {
                    "case": f"fp8 {fmt} hw vs sw, {nchunks * chunk} patterns",
                    "mismatches": mism,
                    "cpu_sample_mismatches": sample_bad,
                    "ok": ok,
                }
            )
            log(
                f"  {'ok  ' if ok else 'FAIL'} {fmt}: {mism} hw/sw mismatches over "
                f"{nchunks * chunk} patterns, {sample_bad} vs CPU on {nsample} random patterns "
                f"({time.time() - t0:.1f} s)"
            )
            del hw, sw
        except Exception as exc:  # noqa: BLE001
            rep.error(f"fp8 exhaustive {fmt}", exc)
    rep.save()


# ----------------------------------------------------------------- (c) timings
def _attrs(gk) -> dict[str, Any]:
    try:
        a = gk._last_kernel_attributes()
        return {
            "regs": a.get("num_regs"),
            "local_bytes": a.get("local_size_bytes"),
            "smem_bytes": a.get("shared_size_bytes"),
        }
    except Exception:  # noqa: BLE001
        return {}


def _bind(fn, *args, **kwargs):
    return lambda: fn(*args, **kwargs)


class Bench:
    def __init__(self, cp, gk, rep: Report, copy_gbps: float, reps: int) -> None:
        self.cp, self.gk, self.rep, self.copy, self.reps = cp, gk, rep, copy_gbps, reps
        self.hide_launch = True  # see timed_ms

    def row(self, codec, op, dtype, count, ms, nbytes, G, extra=None) -> dict[str, Any]:
        gbps = nbytes / ms / 1e6
        r = {
            "codec": codec,
            "op": op,
            "dtype": dtype,
            "count": count,
            "group_size": G,
            "GBps": round(gbps, 1),
            "fraction": round(gbps / self.copy, 4),
            "ms": round(ms, 4),
            **_attrs(self.gk),
            **(extra or {}),
        }
        return r

    def emit(self, r: dict[str, Any], table: str = "rows") -> None:
        self.rep.data[table].append(r)
        self.rep.save()
        cfg = r.get("config", "")
        log(
            f"  {r['codec']:<5} {r['op']:<17} {r['dtype']:<9} {r['count'] // M:>4}M "
            f"G={r['group_size']:<4} {r['GBps']:>8.1f} GB/s  {r['fraction']:>6.3f}  "
            f"{r['ms']:.3f} ms  regs={r.get('regs')} lmem={r.get('local_bytes')} {cfg}"
        )

    def run_codec(self, codec: str, dtype, count: int, groups, ops, table="rows", config=None):
        import numpy as np  # noqa: PLC0415

        cp, gk = self.cp, self.gk
        dt = np.dtype(dtype)
        xs = [random_dev(cp, count, dt, seed) for seed in (1, 2)]
        out_rows = []
        for G in groups:
            try:
                if codec == "taco":
                    kw = dict(group_size=G, fp8_format="e4m3", ash=True, dual_scale=True)
                    K = -(-count // G)
                    nb = K * G + 8 * K
                    enc, dec = gk.taco_encode, gk.taco_decode
                else:
                    kw = dict(group_size=G)
                    K = -(-count // G)
                    nb = count + 4 * K
                    enc, dec = gk.int8_encode, gk.int8_decode
                ps = [cp.empty(nb, cp.uint8) for _ in xs]

                def time_calls(calls):
                    return timed_ms(cp, calls, self.reps, hide_launch=self.hide_launch)

                if "encode" in ops:
                    calls = [_bind(enc, x, p, **kw) for x, p in zip(xs, ps, strict=True)]
                    ms = time_calls(calls)
                    nbytes = count * dt.itemsize + nb
                    r = self.row(codec, "encode", dt.name, count, ms, nbytes, G, config)
                    self.emit(r, table)
                    out_rows.append(r)
                else:
                    for x, p in zip(xs, ps, strict=True):
                        enc(x, p, **kw)
                if "decode" in ops:
                    outs = [cp.empty(count, dt) for _ in ps]
                    calls = [
                        _bind(dec, p, o, accumulate=False, **kw)
                        for p, o in zip(ps, outs, strict=True)
                    ]
                    ms = time_calls(calls)
                    nbytes = nb + count * dt.itemsize
                    r = self.row(codec, "decode", dt.name, count, ms, nbytes, G, config)
                    self.emit(r, table)
                    out_rows.append(r)
                    del outs, calls
                if "decode_accumulate" in ops:
                    accs = [random_dev(cp, count, np.float32, 10 + i) for i in range(len(ps))]
                    calls = [
                        _bind(dec, p, a, accumulate=True, **kw)
                        for p, a in zip(ps, accs, strict=True)
                    ]
                    ms = time_calls(calls)
                    nbytes = nb + 8 * count
                    r = self.row(
                        codec, "decode_accumulate", "float32", count, ms, nbytes, G, config
                    )
                    self.emit(r, table)
                    out_rows.append(r)
                    del accs, calls
                del ps
            except Exception as exc:  # noqa: BLE001
                self.rep.error(f"time {codec} {dt.name} {count} G={G} {ops}", exc)
        del xs
        cp.get_default_memory_pool().free_all_blocks()
        return out_rows


def timings(bench: Bench, sizes, quick: bool) -> None:
    import ml_dtypes  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    bf16 = np.dtype(ml_dtypes.bfloat16)
    log(
        "(c) throughput: codec op dtype count G  GB/s  fraction_of_copy  (bytes read + "
        "written: encode x + payload; decode payload + out; accumulate payload + 2 x f32)"
    )
    for count in sizes:
        for codec in ("taco", "int8"):
            for dt in (bf16, np.dtype(np.float16), np.dtype(np.float32)):
                ops = ["encode", "decode"]
                if dt == bf16:
                    ops.append("decode_accumulate")
                groups = [128]
                bench.run_codec(codec, dt, count, groups, ops)
                if codec == "taco" and dt == bf16 and not quick:
                    bench.run_codec(codec, dt, count, [32, 512], ["encode"])


def launch_cost(bench: Bench, sizes) -> None:
    """The default kernels timed the old way too (the GPU idle at the start event, so the
    host's launch cost is inside the time), to show what that cost does to the figures."""
    import ml_dtypes  # noqa: PLC0415

    bf16 = ml_dtypes.bfloat16
    log("(c2) the same, timed with the launch cost inside (GPU idle at the start event)")
    bench.hide_launch = False
    try:
        for count in sizes:
            for ops in (["encode"], ["decode_accumulate"]):
                cfg = {"config": "default, launch cost timed"}
                bench.run_codec("taco", bf16, count, [128], ops, "launch_cost", cfg)
    finally:
        bench.hide_launch = True


def tuning(bench: Bench, count: int) -> None:
    import ml_dtypes  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    bf16 = np.dtype(ml_dtypes.bfloat16)
    gk = bench.gk
    log(f"(d) encode launch configurations at {count // M}M elements, G=128")
    # Each row: the _TUNING changes for the encode kernels. epl: elements per lane (0: the
    # 32-per-lane kernel, with its stage/prefetch/threads/resident); bps: blocks per SM in
    # the grid (16: several waves of blocks; the occupancy limit: one persistent wave);
    # raw: check every group for NaN/Inf (before the energy test).
    configs = [
        dict(encode_epl=0, threads=256, resident={"encode": 768}, blocks_per_sm=16),
        dict(encode_epl=128, epl_threads=64, epl_resident=384, blocks_per_sm=16),
        dict(encode_epl=128, epl_threads=64, epl_resident=384, blocks_per_sm=6),
        dict(encode_epl=128, epl_threads=64, epl_resident=320, blocks_per_sm=16),
        dict(encode_epl=64, epl_threads=128, epl_resident=512, blocks_per_sm=16),
        dict(encode_epl=64, epl_threads=128, epl_resident=640, blocks_per_sm=16),
        dict(encode_epl=64, epl_threads=64, epl_resident=512, blocks_per_sm=16),
        dict(encode_epl=64, epl_threads=128, epl_resident=512, blocks_per_sm=4),
    ]
    keys = {k for c in configs for k in c}
    saved = {k: gk._TUNING[k] for k in keys}
    for c in configs:
        name = " ".join(f"{k}={v}" for k, v in c.items())
        try:
            changes = dict(c)
            if "resident" in changes:
                changes["resident"] = {**gk._TUNING["resident"], **changes["resident"]}
            gk._set_tuning(**changes)
            for count_ in (count, count // 4):
                bench.run_codec("taco", bf16, count_, [128], ["encode"], "tuning", {"config": name})
        except Exception as exc:  # noqa: BLE001
            bench.rep.error(f"tuning {name}", exc)
        finally:
            gk._set_tuning(**saved)


def probe(gk, cp, what: str, count: int, launches: int = 6) -> None:
    """A few launches of one default kernel and nothing else, for a profiler (ncu)."""
    import ml_dtypes  # noqa: PLC0415

    x = random_dev(cp, count, ml_dtypes.bfloat16, 1)
    kw = dict(group_size=128, fp8_format="e4m3", ash=True, dual_scale=True)
    K = -(-count // 128)
    p = cp.empty(K * 128 + 8 * K, cp.uint8)
    gk.taco_encode(x, p, **kw)
    acc = random_dev(cp, count, "float32", 2)
    for _ in range(launches):
        if what == "encode":
            gk.taco_encode(x, p, **kw)
        else:
            gk.taco_decode(p, acc, accumulate=True, **kw)
    cp.cuda.runtime.deviceSynchronize()
    log(f"probe: {launches} x {what} of {count} elements done")


# ------------------------------------------------------------------- (e) ptxas
def ptxas_report(rep: Report, cc: str) -> None:
    nvcc = shutil.which("nvcc")
    log(f"(e) ptxas resource usage (nvcc: {nvcc or 'not on PATH'})")
    if not nvcc:
        return
    src = ROOT / "compressors" / "codec_kernels.cu"
    variants = {
        "taco encode bf16 G128": "-DOP=1 -DXT=2 -DGS=128 -DMIN_BLOCKS=4",
        "taco encode f32 G128": "-DOP=1 -DXT=0 -DGS=128 -DMIN_BLOCKS=4",
        "taco encode bf16 G512": "-DOP=1 -DXT=2 -DGS=512 -DMIN_BLOCKS=4",
        "taco decode bf16 G128": "-DOP=2 -DXT=2 -DGS=128 -DMIN_BLOCKS=4",
        "taco decode acc G128": "-DOP=2 -DXT=0 -DACC=1 -DGS=128 -DMIN_BLOCKS=2",
        "int8 encode bf16 G128": "-DOP=3 -DXT=2 -DGS=128 -DMIN_BLOCKS=4",
        "int8 decode acc G128": "-DOP=4 -DXT=0 -DACC=1 -DGS=128 -DMIN_BLOCKS=2",
    }
    lines = {}
    for name, d in variants.items():
        cmd = [
            nvcc,
            "-std=c++17",
            "--fmad=false",
            f"-arch=sm_{cc}",
            "-cubin",
            "-Xptxas",
            "-v",
            "-o",
            os.devnull,
            *d.split(),
            str(src),
        ]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            info = " ".join(
                ln.split(":", 1)[-1].strip()
                for ln in r.stderr.splitlines()
                if "registers" in ln or "spill" in ln or "error" in ln
            )
        except Exception as exc:  # noqa: BLE001
            info = f"failed: {exc}"
        lines[name] = info
        log(f"  {name:<24} {info}")
    rep.data["ptxas"] = lines
    rep.save()


# ------------------------------------------------------------------- (f) tests
def run_tests(rep: Report, out: Path) -> None:
    """pytest on tests/test_codec_gpu.py here, where the package map is in place."""
    log("(f) pytest tests/test_codec_gpu.py")
    try:
        import pytest  # noqa: PLC0415

        junit = out / "test_codec_gpu.xml"
        code = pytest.main(
            [str(ROOT / "tests" / "test_codec_gpu.py"), "-q", "-rfEs", f"--junitxml={junit}"]
        )
        rep.data["pytest_exit_code"] = int(code)
        log(f"  pytest exit code {int(code)} (0 = all passed); junit xml in {junit}")
    except Exception as exc:  # noqa: BLE001
        rep.error("pytest", exc)
    rep.save()


# ------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for codec.json")
    ap.add_argument("--sizes", default="64,256", help="element counts in Mi, comma-separated")
    ap.add_argument("--reps", type=int, default=25, help="timed repetitions (median)")
    ap.add_argument("--quick", action="store_true", help="fewer checks and sizes")
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--skip-tuning", action="store_true")
    ap.add_argument(
        "--tests",
        action="store_true",
        help="also run tests/test_codec_gpu.py in this process (no install needed)",
    )
    ap.add_argument("--only-tests", action="store_true", help="run only the pytest part")
    ap.add_argument(
        "--probe",
        choices=("encode", "decode_accumulate"),
        help="only launch this default taco bf16 kernel a few times (for ncu)",
    )
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rep = Report(args.out)

    _setup_imports()
    if args.only_tests:
        run_tests(rep, args.out)
        return 0 if rep.data.get("pytest_exit_code") == 0 else 1
    import cupy as cp  # noqa: PLC0415

    gk = _load_gpu_kernels()
    if args.probe:
        probe(gk, cp, args.probe, int(float(args.sizes.split(",")[0]) * M))
        return 0
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    cc = f"{props['major']}{props['minor']}"
    rep.data.update(
        {
            "gpu": name,
            "compute_capability": cc,
            "sm_count": props["multiProcessorCount"],
            "l2_bytes": props.get("l2CacheSize"),
            "cupy": cp.__version__,
            "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
            "driver": cp.cuda.runtime.driverGetVersion(),
            "python": platform.python_version(),
            "tuning_default": {k: v for k, v in gk._TUNING.items()},
        }
    )
    log(
        f"GPU {name} (sm_{cc}, {props['multiProcessorCount']} SMs), CuPy {cp.__version__}, "
        f"runtime {rep.data['cuda_runtime']}, driver {rep.data['driver']}"
    )
    rep.save()

    copy_gbps = 1.0
    try:
        copy_gbps = measure_copy(cp, rep, args.reps)
    except Exception as exc:  # noqa: BLE001
        rep.error("copy bandwidth", exc)
    if not args.skip_checks:
        ck = _load_cpu_kernels()
        if ck is not None:
            sizes = [1, 1000, 100003] + ([] if args.quick else [M + 7])
            bit_checks(cp, gk, ck, rep, sizes)
        fp8_exhaustive(cp, gk, ck, rep, nchunks=2 if args.quick else 16)
    bench = Bench(cp, gk, rep, copy_gbps, args.reps)
    sizes = [int(float(s) * M) for s in args.sizes.split(",") if s.strip()]
    if args.quick:
        sizes = sizes[:1]
    timings(bench, sizes, args.quick)
    launch_cost(bench, sizes)
    if not args.skip_tuning:
        tuning(bench, max(sizes))
    ptxas_report(rep, cc)
    if args.tests:
        run_tests(rep, args.out)

    log("\nsummary (codec op dtype count GB/s fraction_of_copy):")
    for r in rep.data["rows"]:
        log(
            f"  {r['codec']} {r['op']} {r['dtype']} {r['count']} G={r['group_size']} "
            f"{r['GBps']:.0f} {r['fraction']:.3f}"
        )
    targets = [("taco", "encode", "bfloat16", 0.85), ("taco", "decode_accumulate", "float32", 0.90)]
    for codec, op, dt, goal in targets:
        got = [
            r["fraction"]
            for r in rep.data["rows"]
            if r["codec"] == codec and r["op"] == op and r["dtype"] == dt and r["group_size"] == 128
        ]
        if got:
            log(f"  target {codec} {op} {dt} >= {goal}: got {min(got):.3f}..{max(got):.3f}")
    log(f"errors: {len(rep.data['errors'])}; results in {rep.path}")
    return 0 if not rep.data["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
