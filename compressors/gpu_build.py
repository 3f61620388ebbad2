"""What every codec's CUDA kernels share: CuPy loaded once, NVRTC compilation of a CUDA
source with ``-D`` defines (cached per device and variant), the device's multiprocessor
count, and the checks of the arrays a kernel is handed.

A codec's launcher module (``gpu_kernels`` for taco and int8, and one module per other
codec) keeps its own defines, grid and tuning; it compiles through :func:`compile_function`
and checks its arguments with the functions here, so every codec states the same errors
in the same words. Importing this module touches neither CuPy nor the GPU.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
# The element types the kernels read and write, and the XT define that names each.
ELEMENT_TYPES: dict[np.dtype, int] = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, BF16: 2}
KERNEL_DTYPES = frozenset(ELEMENT_TYPES)

_lock = threading.Lock()
_functions: dict[tuple, Any] = {}
_sources: dict[Path, str] = {}
_sm_counts: dict[int, int] = {}
_cupy_module: list[Any] = []
_last_kernel: list[Any] = [None]  # the kernel this process launched last (any codec)


def cupy_module() -> Any:
    """CuPy, imported on first use (RuntimeError if it cannot be)."""
    if _cupy_module:  # every launch asks: skip the import machinery after the first
        return _cupy_module[0]
    try:
        import cupy  # noqa: PLC0415
    except Exception as exc:  # ImportError, or a broken CUDA install
        raise RuntimeError("the GPU codec kernels need CuPy") from exc
    _cupy_module.append(cupy)
    return cupy


def read_source(path: Path) -> str:
    """The text of a CUDA source file, read once per process."""
    text = _sources.get(path)
    if text is None:
        text = _sources[path] = path.read_text()
    return text


def compile_function(
    path: Path | tuple[Path, ...], defines: dict[str, Any], name: str = "coccl_codec"
) -> Any:
    """The kernel ``name`` of CUDA source ``path`` compiled with ``-D`` ``defines`` for the
    current device, compiled once per (device, source, defines) in this process (CuPy also
    caches the binary on disk, keyed by the whole text). A tuple of paths is one source,
    their texts in that order (a codec's kernels after the helpers of another file).

    CuPy adds ``-arch`` for the current device and ``-ftz=true``; the codec kernels do
    their float arithmetic in inline PTX without ``.ftz``, so the flag cannot flush
    subnormals, and ``--fmad=false`` keeps anything else from being contracted."""
    cp = cupy_module()
    key = (cp.cuda.Device().id, path, name, tuple(sorted(defines.items())))
    fn = _functions.get(key)
    if fn is None:
        with _lock:
            fn = _functions.get(key)
            if fn is None:
                options = ("-std=c++17", "--fmad=false") + tuple(
                    f"-D{k}={v}" for k, v in sorted(defines.items())
                )
                paths = path if isinstance(path, tuple) else (path,)
                code = "\n".join(read_source(p) for p in paths)
                module = cp.RawModule(code=code, options=options)
                fn = _functions[key] = module.get_function(name)
    return fn


def note_launch(kern: Any) -> None:
    """Record ``kern`` as the kernel launched last (what :func:`last_kernel_attributes`
    reports); every codec's launcher calls it after a launch."""
    _last_kernel[0] = kern


def last_kernel_attributes() -> dict[str, Any]:
    """Registers, local (spill) memory, shared memory and the like of the codec kernel this
    process launched last (CuPy's ``Function.attributes``); empty before the first."""
    kern = _last_kernel[0]
    return {} if kern is None else dict(kern.attributes)


def sm_count(cp: Any) -> int:
    """The current device's multiprocessor count (cached per device)."""
    dev = cp.cuda.Device()
    n = _sm_counts.get(dev.id)
    if n is None:
        n = _sm_counts[dev.id] = int(dev.attributes["MultiProcessorCount"])
    return n


# ------------------------------------------------------------------ argument checks
def as_int(v: Any, name: str) -> int:
    """``v`` as an int (ValueError for a bool or a non-integer)."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {v!r}")
    return int(v)


def element_type(cp: Any, a: Any, name: str) -> int:
    """The XT define of a kernel's element array ``a`` (a C-contiguous CuPy array of
    float32, float16 or bfloat16; TypeError or ValueError otherwise)."""
    if not isinstance(a, cp.ndarray):
        raise TypeError(f"{name} must be a cupy.ndarray, got {type(a).__name__}")
    xt = ELEMENT_TYPES.get(a.dtype)
    if xt is None:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {a.dtype.name}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    return xt


def check_accumulate(out: Any, accumulate: bool) -> None:
    """A decode that accumulates adds into float32 only."""
    if accumulate and np.dtype(out.dtype) != np.float32:
        raise TypeError(f"accumulate=True needs a float32 out, got {np.dtype(out.dtype).name}")


def check_payload(cp: Any, payload: Any, nbytes: int, like: Any) -> None:
    """``payload`` is a C-contiguous uint8 CuPy array of ``nbytes`` on ``like``'s device."""
    if not isinstance(payload, cp.ndarray):
        raise TypeError(f"payload must be a cupy.ndarray, got {type(payload).__name__}")
    if payload.dtype != np.uint8:
        raise TypeError(f"payload must be uint8, got {payload.dtype.name}")
    if not payload.flags.c_contiguous:
        raise ValueError("payload must be C-contiguous")
    if int(payload.size) != nbytes:
        raise ValueError(f"payload holds {payload.size} bytes; the payload is {nbytes} bytes")
    if payload.data.device_id != like.data.device_id:
        raise ValueError("payload and data must be on the same device")


def check_disjoint(payload: Any, out: Any) -> None:
    """A kernel that reads ``payload`` while it writes ``out`` needs them apart."""
    if overlap(payload, out):
        raise ValueError("payload and out must not overlap")


def overlap(a: Any, b: Any) -> bool:
    """Whether two contiguous device arrays share a byte."""
    a0, b0 = a.data.ptr, b.data.ptr
    return bool(a.nbytes and b.nbytes and a0 < b0 + b.nbytes and b0 < a0 + a.nbytes)
