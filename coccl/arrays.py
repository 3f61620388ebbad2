"""Array adapters: numpy, CuPy, numba device arrays and PyTorch tensors in, the same kind out.

Inside coccl every buffer is a flat, C-contiguous numpy or CuPy array (``xp`` below) that
shares memory with the caller's object; bfloat16 is ``ml_dtypes.bfloat16`` on both. The
adapters here turn a caller's array into such a view and build results of the caller's
kind, without copies.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import ml_dtypes
import numpy as np

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT_DTYPES: tuple[np.dtype, ...] = (
    np.dtype(np.float32),
    np.dtype(np.float16),
    BFLOAT16,
    np.dtype(np.float64),
)
INT_DTYPES: tuple[np.dtype, ...] = tuple(
    np.dtype(t)
    for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64)
)
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES


def dtype_name(dtype: np.dtype) -> str:
    """Short name as used in tables and errors (``bfloat16``, ``float32``...)."""
    return np.dtype(dtype).name


def accumulate_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype reductions run in: float64 for float64, float32 for other floats, the
    integer type itself for integers (wrapping on overflow, as MPI and NCCL do)."""
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        return dtype
    if dtype in FLOAT_DTYPES:
        return np.dtype(np.float32)
    return dtype


def is_float(dtype: np.dtype) -> bool:
    return np.dtype(dtype) in FLOAT_DTYPES


def cupy_or_none() -> ModuleType | None:
    """CuPy if it is already imported or importable, else None (never raises)."""
    mod = sys.modules.get("cupy")
    if mod is not None:
        return mod
    try:
        import cupy  # noqa: PLC0415
    except Exception:  # ImportError, or a broken CUDA install
        return None
    return cupy


def array_module(a: Any) -> ModuleType:
    """numpy for host arrays, cupy for device arrays (flat internal arrays only)."""
    if isinstance(a, np.ndarray):
        return np
    cp = sys.modules.get("cupy")
    if cp is not None and isinstance(a, cp.ndarray):
        return cp
    raise TypeError(f"expected a numpy or cupy array, got {type(a).__name__}")


def is_device_array(a: Any) -> bool:
    return array_module(a) is not np


@dataclass
class Flat:
    """A caller's array seen as a flat internal array.

    Attributes:
        data: 1-D contiguous numpy or cupy array sharing memory with ``obj``.
        obj: the caller's object.
        kind: "numpy", "cupy", "numba" or "torch".
        shape: the caller's shape.
        new: ``new(shape, dtype=None)`` allocates an uninitialised array of the same
            kind and device (and dtype unless given); returns ``(flat_view, caller_object)``.
    """

    data: Any
    obj: Any
    kind: str
    shape: tuple[int, ...]
    new: Callable[..., tuple[Any, Any]]

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.data.dtype)

    @property
    def size(self) -> int:
        return int(self.data.size)

    @property
    def xp(self) -> ModuleType:
        return array_module(self.data)

    @property
    def device_id(self) -> int | None:
        if self.xp is np:
            return None
        return int(self.data.device.id)


def _require_contiguous(ok: bool, name: str) -> None:
    if not ok:
        raise ValueError(
            f"{name} must be C-contiguous (coccl moves flat buffers); "
            "pass a contiguous copy, e.g. np.ascontiguousarray(x) or x.contiguous()"
        )


def _check_dtype(dtype: Any, name: str) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in ALL_DTYPES:
        supported = ", ".join(dtype_name(d) for d in ALL_DTYPES)
        raise TypeError(f"{name} has dtype {dtype_name(dtype)}; coccl supports {supported}")
    return dtype


def _numpy_flat(x: np.ndarray, name: str) -> Flat:
    _require_contiguous(x.flags.c_contiguous, name)
    _check_dtype(x.dtype, name)

    def new(shape: tuple[int, ...], dtype: Any = None) -> tuple[Any, Any]:
        arr = np.empty(shape, dtype=x.dtype if dtype is None else dtype)
        return arr.reshape(-1), arr

    return Flat(x.reshape(-1), x, "numpy", tuple(x.shape), new)


def _cupy_flat(x: Any, name: str, kind: str = "cupy", obj: Any = None) -> Flat:
    import cupy as cp  # noqa: PLC0415

    _require_contiguous(x.flags.c_contiguous, name)
    _check_dtype(x.dtype, name)
    device = x.device

    def new(shape: tuple[int, ...], dtype: Any = None) -> tuple[Any, Any]:
        with device:
            arr = cp.empty(shape, dtype=x.dtype if dtype is None else dtype)
        if kind == "numba":
            from numba import cuda  # noqa: PLC0415

            return arr.reshape(-1), cuda.as_cuda_array(arr)
        return arr.reshape(-1), arr

    return Flat(x.reshape(-1), x if obj is None else obj, kind, tuple(x.shape), new)


def _torch_flat(t: Any, name: str) -> Flat:
    import torch  # noqa: PLC0415

    _require_contiguous(t.is_contiguous(), name)
    is_bf16 = t.dtype == torch.bfloat16
    # DLPack and .numpy() know no bfloat16: move it as int16 bits, view it back.
    raw = t.view(torch.int16) if is_bf16 else t
    if t.device.type == "cpu":
        data = raw.detach().numpy()
    elif t.device.type == "cuda":
        import cupy as cp  # noqa: PLC0415

        data = cp.from_dlpack(raw.detach())
    else:
        raise TypeError(f"{name} is a torch tensor on {t.device}; coccl takes cpu or cuda tensors")
    if is_bf16:
        data = data.view(BFLOAT16)
    _check_dtype(data.dtype, name)
    device = t.device

    def new(shape: tuple[int, ...], dtype: Any = None) -> tuple[Any, Any]:
        out = torch.empty(
            shape, dtype=t.dtype if dtype is None else torch_dtype(dtype), device=device
        )
        return _torch_flat(out, name).data, out

    return Flat(data.reshape(-1), t, "torch", tuple(t.shape), new)


def as_flat(x: Any, name: str = "x") -> Flat:
    """View a caller's array as a flat internal array (no copy).

    Raises:
        TypeError: for an unknown array type or an unsupported dtype.
        ValueError: for a non-contiguous array.
    """
    if isinstance(x, np.ndarray):
        return _numpy_flat(x, name)
    module = type(x).__module__.split(".")[0]
    if module == "cupy":
        return _cupy_flat(x, name)
    if module == "torch":
        return _torch_flat(x, name)
    if hasattr(x, "__cuda_array_interface__"):
        cp = cupy_or_none()
        if cp is None:
            raise TypeError(f"{name} is a CUDA array; coccl needs CuPy installed to use it")
        return _cupy_flat(cp.asarray(x), name, kind="numba", obj=x)
    raise TypeError(
        f"{name} is a {type(x).__module__}.{type(x).__name__}; coccl takes numpy, cupy, "
        "numba device arrays or torch tensors"
    )


def torch_dtype(dtype: Any) -> Any:
    """The torch dtype of a numpy/ml_dtypes dtype."""
    import torch  # noqa: PLC0415

    dtype = np.dtype(dtype)
    if dtype == BFLOAT16:
        return torch.bfloat16
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype
