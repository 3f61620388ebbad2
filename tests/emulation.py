"""Builds the CUDA host emulation (tests/cuda_emulation/) of kernel sources: one shared
library per variant's defines, compiled with g++ and cached for a module's tests. A test
module skips where there is no g++ (``CXX`` is None) or a variant does not build."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

CXX = shutil.which("g++")
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
                pytest.skip(f"the emulation does not build here: {done.stderr[-500:]!r}")
            lib = ctypes.CDLL(str(so))
            for name, types in argtypes.items():
                getattr(lib, name).argtypes = types
            libs[key] = lib
        return libs[key]

    return get
