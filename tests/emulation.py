"""Builds the CUDA host emulation (tests/cuda_emulation/) of kernel sources: one shared
library per variant's defines, compiled with g++ and cached for a module's tests. A test
module skips where there is no g++ able to build C++20 threads and barriers (``CXX`` is
None); where there is one, a variant that does not build fails its test (a kernel that
no longer compiles is a fault, not a reason to skip)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest


def _cxx20() -> str | None:
    """g++, if it builds a C++20 program with std::barrier and std::atomic_ref (emu.h's)."""
    cxx = shutil.which("g++")
    if cxx is None:
        return None
    probe = "#include <atomic>\n#include <barrier>\nint main() { std::barrier<> b(1); int i = 0;"
    probe += " std::atomic_ref<int>(i).fetch_add(1); b.arrive_and_wait(); return 0; }\n"
    done = subprocess.run(
        [cxx, "-std=c++20", "-fsyntax-only", "-x", "c++", "-"], input=probe.encode(),
        capture_output=True,
    )  # fmt: skip
    return cxx if done.returncode == 0 else None


CXX = _cxx20()
EMULATION = Path(__file__).parent / "cuda_emulation"
KERNELS = Path(__file__).parent.parent / "compressors"
FLAGS = ["-std=c++20", "-O1", "-ffp-contract=off", "-fPIC", "-shared"]


def builder(
    workdir: Path, sources: Sequence[Path], argtypes: dict[str, list], base: dict | None = None
) -> Callable[[dict], ctypes.CDLL]:
    """A function from a variant's defines (over ``base``) to its compiled emulation: the
    texts of ``sources`` in order, built in ``workdir``, with ``argtypes`` set on the
    library's functions of those names."""
    source = workdir / "all.cpp"
    source.write_text("\n".join(p.read_text() for p in sources))
    libs: dict[tuple, ctypes.CDLL] = {}

    def get(defines: dict) -> ctypes.CDLL:
        key = tuple(sorted({**(base or {}), **defines}.items()))
        if key not in libs:
            so = workdir / ("v" + "".join(f"_{k}{v}" for k, v in key) + ".so")
            flags = [f"-D{k}={v}" for k, v in key]
            done = subprocess.run(
                [CXX, *FLAGS, *flags, "-o", str(so), str(source)], capture_output=True
            )
            if done.returncode != 0:
                pytest.fail(f"the emulation of {key} does not build: {done.stderr[-800:]!r}")
            lib = ctypes.CDLL(str(so))
            for name, types in argtypes.items():
                getattr(lib, name).argtypes = types
            libs[key] = lib
        return libs[key]

    return get
