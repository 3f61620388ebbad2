"""Compile every numba codec kernel into numba's on-disk cache, once, before the suite
launches ranks (tests/conftest.py runs this when the session holds ``launch`` tests).

In a fresh clone the cache is empty, and each rank of the first multi-rank tests would
compile the same kernels at the same time (minutes of CPU on a small machine, four
times over under four ranks); compiled here first, every later process loads them.

Usage: ``python tests/numba_warmup.py CLAIMDIR``. Several such processes share the work:
each compiles the jobs whose claim file (in CLAIMDIR) it creates first.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

# Every codec with its defaults, plus the options that reach a kernel the defaults do not
# (mx's two-level scale); the slowest to compile first, so that the workers end together.
EXTRA = [("mx", {"scale": "e4m3", "block": 16})]
FIRST = ["taco", "int", "taco_fp", "tah", "mx"]


def jobs() -> list[tuple[str, dict]]:
    """The codecs (name, options) to compile, the slowest first; then the references."""
    import coccl  # noqa: PLC0415

    names = sorted(coccl.available_compressors(), key=lambda n: (n not in FIRST, n))
    return [(name, {}) for name in names] + EXTRA + [("references", {})]


def compile_job(name: str, options: dict) -> None:
    """Encode, decode and decode-accumulate float32 through one codec (or the reference
    fp8/minifloat encoders): every numba kernel it uses is compiled and cached."""
    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    if name == "references":
        from coccl.compressors import fp8, minifloat  # noqa: PLC0415

        fp8.encode(x)
        minifloat.encode(x, "e2m1")
        return
    import coccl  # noqa: PLC0415

    c = coccl.get_compressor(name, **options)
    payload = c.encode(x)
    out = c.decode(payload, count=x.size, dtype=np.float32)
    c.decode(payload, out, count=x.size, dtype=np.float32, accumulate=True)


def main(claims: Path) -> None:
    for i, (name, options) in enumerate(jobs()):
        try:
            os.close(os.open(claims / f"{i}", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue  # another worker has it
        compile_job(name, options)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
