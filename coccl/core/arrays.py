"""Array adapters: numpy, CuPy, numba device arrays and PyTorch tensors in, the same kind out.

Inside coccl every buffer is a flat, C-contiguous numpy or CuPy array (``xp`` below) that
shares memory with the caller's object; bfloat16 is ``ml_dtypes.bfloat16`` on both. The
adapters here turn a caller's array into such a view and build results of the caller's
kind, without copies. ``signature`` reads the few attributes a call's plan is keyed by
(dtype, count, device) without building any view, and ``caller_stream`` finds the stream
a device call must order itself against: the current stream of the array's own framework.
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
    """Short name as used in tables and errors (``bfloat16``, ``float32``...); a
    non-native byte order is named as such (``>f4`` is 'float32 (big-endian)')."""
    dtype = np.dtype(dtype)
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and sys.byteorder == "big"):
        return f"{dtype.name} (big-endian)"
    return dtype.name


def accumulate_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype reductions run in: float64 for float64, float32 for other floats, the
    integer type itself for integers (wrapping on overflow, as MPI and NCCL do)."""
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        return dtype
    if dtype in FLOAT_DTYPES:
        return np.dtype(np.float32)
    return dtype


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


def check_dtype(dtype: Any, name: str) -> np.dtype:
    """``dtype`` as np.dtype if coccl moves it, else TypeError naming ``name``."""
    dtype = np.dtype(dtype)
    if dtype not in ALL_DTYPES or not dtype.isnative:
        supported = ", ".join(d.name for d in ALL_DTYPES)
        order = "" if dtype.isnative else " in the machine's own byte order"
        raise TypeError(f"{name} has dtype {dtype_name(dtype)}; coccl supports {supported}{order}")
    return dtype


def require_writeable(obj: Any, name: str) -> None:
    """ValueError if ``obj`` (a caller's array) cannot be written: checked before any byte
    moves, so a read-only output never fails halfway through a collective."""
    if isinstance(obj, np.ndarray):
        if not obj.flags.writeable:
            raise ValueError(f"{name} is read-only (numpy flags.writeable is False)")
        return
    if _module_of(obj) in ("cupy", "torch"):  # always writeable
        return
    interface = getattr(obj, "__cuda_array_interface__", None)
    if interface is not None and interface.get("data", (0, False))[1]:
        raise ValueError(f"{name} is a read-only CUDA array")


def _module_of(x: Any) -> str:
    return type(x).__module__.split(".")[0]


def array_kind(x: Any) -> str:
    """The framework of a caller's array: "numpy", "torch", "cupy", "numba" (any other
    ``__cuda_array_interface__``) or "other"."""
    if isinstance(x, np.ndarray):
        return "numpy"
    module = _module_of(x)
    if module in ("torch", "cupy"):
        return module
    if hasattr(x, "__cuda_array_interface__"):
        return "numba"
    return "other"


def _numpy_flat(x: np.ndarray, name: str) -> Flat:
    _require_contiguous(x.flags.c_contiguous, name)
    check_dtype(x.dtype, name)

    def new(shape: tuple[int, ...], dtype: Any = None) -> tuple[Any, Any]:
        arr = np.empty(shape, dtype=x.dtype if dtype is None else dtype)
        return arr.reshape(-1), arr

    return Flat(x.reshape(-1), x, "numpy", tuple(x.shape), new)


def _cupy_flat(x: Any, name: str, kind: str = "cupy", obj: Any = None) -> Flat:
    import cupy as cp  # noqa: PLC0415

    _require_contiguous(x.flags.c_contiguous, name)
    check_dtype(x.dtype, name)
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
        data = _cupy_view_of_cuda_tensor(raw.detach())
    else:
        raise TypeError(f"{name} is a torch tensor on {t.device}; coccl takes cpu or cuda tensors")
    if is_bf16:
        data = data.view(BFLOAT16)
    check_dtype(data.dtype, name)
    device = t.device

    def new(shape: tuple[int, ...], dtype: Any = None) -> tuple[Any, Any]:
        out = torch.empty(
            shape, dtype=t.dtype if dtype is None else torch_dtype(dtype), device=device
        )
        return _torch_flat(out, name).data, out

    return Flat(data.reshape(-1), t, "torch", tuple(t.shape), new)


def _cupy_view_of_cuda_tensor(t: Any) -> Any:
    """A flat CuPy view of a contiguous CUDA tensor, built from its pointer (cheaper than
    DLPack's capsule exchange; the tensor owns the memory and is kept alive by the view)."""
    import cupy as cp  # noqa: PLC0415

    nbytes = t.numel() * t.element_size()
    dtype = np.dtype(str(t.dtype).removeprefix("torch."))
    mem = cp.cuda.UnownedMemory(t.data_ptr(), nbytes, t, t.get_device())
    return cp.ndarray((t.numel(),), dtype, cp.cuda.MemoryPointer(mem, 0))


def as_flat(x: Any, name: str = "x") -> Flat:
    """View a caller's array as a flat internal array (no copy).

    Raises:
        TypeError: for an unknown array type or an unsupported dtype.
        ValueError: for a non-contiguous array.
    """
    if isinstance(x, np.ndarray):
        return _numpy_flat(x, name)
    module = _module_of(x)
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


# ------------------------------------------------------------------- per-call keys
_TORCH_DTYPES: dict[Any, np.dtype] = {}


def _torch_np_dtype(torch_dt: Any) -> Any:
    """numpy's dtype of a torch dtype, or the torch dtype itself where numpy has none (the
    call is then refused with a TypeError when its plan is built)."""
    dt = _TORCH_DTYPES.get(torch_dt)
    if dt is None:
        import torch  # noqa: PLC0415

        if torch_dt == torch.bfloat16:
            dt = BFLOAT16
        else:
            try:
                dt = np.dtype(str(torch_dt).removeprefix("torch."))
            except TypeError:
                return torch_dt
        _TORCH_DTYPES[torch_dt] = dt
    return dt


def signature(x: Any) -> tuple[str, Any, int, int | None]:
    """``(kind, dtype, count, device)`` of a caller's array, read without building views:
    what a call's plan is keyed by. ``device`` is the GPU ordinal, None for host data.
    Unknown objects give kind "other" (the plan's checks then refuse them)."""
    if isinstance(x, np.ndarray):
        return "numpy", x.dtype, x.size, None
    module = _module_of(x)
    if module == "torch":
        device = x.get_device()
        return "torch", _torch_np_dtype(x.dtype), x.numel(), None if device < 0 else device
    if module == "cupy":
        return "cupy", x.dtype, x.size, x.device.id
    if hasattr(x, "__cuda_array_interface__"):
        flat = as_flat(x)
        return "numba", flat.dtype, flat.size, flat.device_id
    return "other", None, 0, None


def caller_stream(x: Any) -> Any:
    """The stream a device call on ``x`` orders itself against: the current stream of
    ``x``'s own framework (torch's for a torch tensor, CuPy's for a CuPy array, the
    stream a numba array's ``__cuda_array_interface__`` names, else the legacy default
    stream, numba's default), as a CuPy stream object."""
    import cupy as cp  # noqa: PLC0415

    module = _module_of(x)
    if module == "torch":
        return external_stream(_torch_stream_ptr(x.get_device()))
    if module == "cupy":
        return cp.cuda.get_current_stream()
    ptr = getattr(x, "__cuda_array_interface__", {}).get("stream")
    if ptr in (None, 1):
        return cp.cuda.Stream.null
    if ptr == 2:
        return cp.cuda.Stream.ptds
    return external_stream(int(ptr))


def _torch_stream_ptr(device: int) -> int:
    import torch  # noqa: PLC0415

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return int(raw(device))
    return int(torch.cuda.current_stream(device).cuda_stream)


_EXTERNAL: dict[int, Any] = {}


class _ForeignStream:
    """A raw ``cudaStream_t`` seen through the CUDA stream protocol (``__cuda_stream__``)."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.ptr)


def external_stream(ptr: int) -> Any:
    """A CuPy object for a stream some other framework owns (one per pointer)."""
    stream = _EXTERNAL.get(ptr)
    if stream is None:
        import cupy as cp  # noqa: PLC0415

        from_external = getattr(cp.cuda.Stream, "from_external", None)  # CuPy >= 14
        if from_external is not None:
            stream = from_external(_ForeignStream(ptr))
        else:
            stream = cp.cuda.ExternalStream(ptr)
        _EXTERNAL[ptr] = stream
    return stream


def address(x: Any) -> int:
    """The address of a contiguous array's first element, on the host or a device
    (numpy, CuPy, torch, or any ``__cuda_array_interface__`` array)."""
    if isinstance(x, np.ndarray):
        return int(x.__array_interface__["data"][0])
    return data_ptr(x)


def overlap_offset(x: Any, x_nbytes: int, out: Any, out_nbytes: int) -> int | None:
    """Where the ``x_nbytes`` bytes at ``x`` start relative to the ``out_nbytes`` bytes at
    ``out`` (``address(x) - address(out)``) when the two ranges share memory; None when
    they do not (an empty range shares none). The one overlap test of the library."""
    if not x_nbytes or not out_nbytes:
        return None
    a, b = address(x), address(out)
    return a - b if a < b + out_nbytes and b < a + x_nbytes else None


def data_ptr(x: Any) -> int:
    """The device address of a contiguous CuPy array, torch CUDA tensor or other CUDA
    array (numba's: through ``__cuda_array_interface__``)."""
    module = _module_of(x)
    if module == "torch":
        return int(x.data_ptr())
    if module == "cupy":
        return int(x.data.ptr)
    return int(x.__cuda_array_interface__["data"][0])


def is_contiguous(x: Any) -> bool:
    """Whether a caller's array is C-contiguous (read from its attributes)."""
    if _module_of(x) == "torch":
        return bool(x.is_contiguous())
    flags = getattr(x, "flags", None)
    if isinstance(flags, dict):  # numba's device arrays
        return bool(flags["C_CONTIGUOUS"])
    return bool(flags.c_contiguous)


def new_like(x: Any, shape: tuple[int, ...]) -> Any:
    """An uninitialised array of ``x``'s kind, dtype and device, of ``shape``."""
    if isinstance(x, np.ndarray):
        return np.empty(shape, dtype=x.dtype)
    module = _module_of(x)
    if module == "torch":
        import torch  # noqa: PLC0415

        return torch.empty(shape, dtype=x.dtype, device=x.device)
    if module == "cupy":
        import cupy as cp  # noqa: PLC0415

        with x.device:
            return cp.empty(shape, dtype=x.dtype)
    return as_flat(x).new(shape)[1]
