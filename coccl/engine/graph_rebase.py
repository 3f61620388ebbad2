"""Pointing an instantiated CUDA graph at the caller's buffers, without capturing again.

A plan's graph (coccl.engine.graphs) is captured on buffers of its own. Its codec kernels (and
any copy or memset) read the input and write the output at those buffers' addresses; its
NCCL operations, for a lossy codec, only ever see payload buffers the graph owns. So before
a replay whose input or output address differs from the last one, the nodes holding those
addresses get them moved by the difference (CUDA's executable-graph parameter updates,
which affect later launches only), and the call runs on the caller's buffers: no copy in,
no copy out. What the NCCL operations touch is checked while capturing (``WatchedTransport``):
a graph whose NCCL operations see the caller's buffers is not rebased.

A kernel's parameters are read with the driver's parameter layout (``cuFuncGetParamInfo``):
every 8-byte-aligned word of a parameter that lies inside a captured buffer is a pointer
into it (CuPy passes arrays as a pointer, or as a struct whose first word is the pointer;
sizes, strides and scalars are small numbers, never addresses of device memory). A kernel
whose parameters cannot be read is accepted only if it is NCCL's; any node of a kind not
handled here leaves the graph unrebased, and the call copies in and out instead.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

# CUgraphNodeType values (cuda.h)
_KERNEL, _MEMCPY, _MEMSET, _HOST, _EMPTY, _WAIT_EVENT, _EVENT_RECORD = 0, 1, 2, 3, 5, 6, 7
# node kinds that hold no buffer address
_INERT = {_HOST, _EMPTY, _WAIT_EVENT, _EVENT_RECORD}
_DEVICE_MEMORY = {2, 4}  # CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_UNIFIED
_INVALID_VALUE = 1  # CUDA_ERROR_INVALID_VALUE: past a kernel's last parameter
_MAX_PARAMS = 4096


class NotRebasable(Exception):
    """The graph holds a node whose buffer addresses cannot be read or moved."""


@dataclass(frozen=True)
class CapturedBuffer:
    """A captured buffer: its role's index (0 input, 1 output), address and size."""

    role: int
    base: int
    nbytes: int

    def holds(self, address: int) -> bool:
        return self.base <= address < self.base + self.nbytes


def role_of(address: int, spans: Sequence[CapturedBuffer]) -> int | None:
    """The role of the captured buffer holding ``address`` (None: none does)."""
    for span in spans:
        if span.holds(address):
            return span.role
    return None


def overlaps(address: int, nbytes: int, spans: Sequence[CapturedBuffer]) -> bool:
    """Whether ``nbytes`` from ``address`` share a byte with a captured buffer."""
    return any(address < s.base + s.nbytes and s.base < address + nbytes for s in spans)


def pointer_words(data: bytes) -> Iterator[tuple[int, int]]:
    """(offset, value) of each 8-byte-aligned little-endian word of a parameter."""
    for offset in range(0, len(data) - 7, 8):
        yield offset, int.from_bytes(data[offset : offset + 8], "little")


def pointer_sites(
    params: Sequence[bytes], spans: Sequence[CapturedBuffer]
) -> list[tuple[int, int, int, int]]:
    """(parameter, byte offset, role, value) of every word of ``params`` that points into
    a span."""
    sites = []
    for index, data in enumerate(params):
        for offset, value in pointer_words(data):
            role = role_of(value, spans)
            if role is not None:
                sites.append((index, offset, role, value))
    return sites


# ------------------------------------------------------------------ the driver API
class _KernelParams(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2
    _fields_ = [
        ("func", ctypes.c_void_p),
        ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("kernelParams", ctypes.c_void_p),
        ("extra", ctypes.c_void_p),
        ("kern", ctypes.c_void_p),
        ("ctx", ctypes.c_void_p),
    ]  # fmt: skip


def _memcpy_side(side: str) -> list[tuple[str, Any]]:
    return [
        (f"{side}XInBytes", ctypes.c_size_t), (f"{side}Y", ctypes.c_size_t),
        (f"{side}Z", ctypes.c_size_t), (f"{side}LOD", ctypes.c_size_t),
        (f"{side}MemoryType", ctypes.c_int), (f"{side}Host", ctypes.c_void_p),
        (f"{side}Device", ctypes.c_uint64), (f"{side}Array", ctypes.c_void_p),
        (f"reserved_{side}", ctypes.c_void_p),
        (f"{side}Pitch", ctypes.c_size_t), (f"{side}Height", ctypes.c_size_t),
    ]  # fmt: skip


class _Memcpy3D(ctypes.Structure):  # CUDA_MEMCPY3D
    _fields_ = [
        *_memcpy_side("src"),
        *_memcpy_side("dst"),
        ("WidthInBytes", ctypes.c_size_t), ("Height", ctypes.c_size_t),
        ("Depth", ctypes.c_size_t),
    ]  # fmt: skip


class _MemsetParams(ctypes.Structure):  # CUDA_MEMSET_NODE_PARAMS
    _fields_ = [
        ("dst", ctypes.c_uint64), ("pitch", ctypes.c_size_t), ("value", ctypes.c_uint),
        ("elementSize", ctypes.c_uint), ("width", ctypes.c_size_t), ("height", ctypes.c_size_t),
    ]  # fmt: skip


_driver: Any = None


def _cuda() -> Any:
    global _driver
    if _driver is None:
        try:
            _driver = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise NotRebasable(f"no CUDA driver library: {exc}") from exc
    return _driver


def _function(name: str) -> Any:
    try:
        return getattr(_cuda(), name)
    except AttributeError as exc:
        raise NotRebasable(f"this CUDA driver has no {name}") from exc


def _call(name: str, *args: Any) -> None:
    _check(name, _function(name)(*args))


def _check(name: str, rc: int) -> None:
    if rc != 0:
        text = ctypes.c_char_p()
        _cuda().cuGetErrorName(rc, ctypes.byref(text))
        raise NotRebasable(f"{name}: {(text.value or b'').decode() or rc}")


def _setter(name: str) -> Any:
    """A driver function that sets an executable graph node's parameters, typed once."""
    fn = _function(name)
    fn.argtypes = [ctypes.c_void_p] * (3 if "Kernel" in name else 4)
    fn.restype = ctypes.c_int
    return fn


def _function_name(params: _KernelParams) -> str:
    name = ctypes.c_char_p()
    try:
        if params.func:
            _call("cuFuncGetName", ctypes.byref(name), ctypes.c_void_p(params.func))
        elif params.kern:
            _call("cuKernelGetName", ctypes.byref(name), ctypes.c_void_p(params.kern))
    except NotRebasable:
        return ""
    return (name.value or b"").decode(errors="replace")


def _param_sizes(func: int) -> list[int] | None:
    """Sizes of a kernel's parameters in order, or None where the driver cannot say."""
    info = getattr(_cuda(), "cuFuncGetParamInfo", None)
    if info is None or not func:
        return None
    sizes = []
    offset, size = ctypes.c_size_t(), ctypes.c_size_t()
    for index in range(_MAX_PARAMS):
        rc = info(ctypes.c_void_p(func), ctypes.c_size_t(index), ctypes.byref(offset),
                  ctypes.byref(size))  # fmt: skip
        if rc == _INVALID_VALUE:
            return sizes
        if rc != 0:
            return None
        sizes.append(size.value)
    return None


class _KernelSite:
    """A kernel node holding captured addresses, with its parameters ready to rewrite."""

    SETTER = "cuGraphExecKernelNodeSetParams_v2"

    def __init__(self, node: int, params: _KernelParams, values: list[bytes], sites: list) -> None:
        self.node = node
        self.params = params
        self.buffers = [ctypes.create_string_buffer(v, len(v)) for v in values]
        pointers = (ctypes.c_void_p * max(1, len(values)))(
            *[ctypes.addressof(b) for b in self.buffers]
        )
        self._pointers = pointers
        params.kernelParams = ctypes.addressof(pointers)
        params.extra = None
        self.sites = sites  # (parameter, byte offset, role, captured value)
        self._set = _setter(self.SETTER)

    def apply(self, graph_exec: int, shifts: Sequence[int]) -> None:
        for index, offset, role, value in self.sites:
            struct.pack_into("<Q", self.buffers[index], offset, value + shifts[role])
        _check(self.SETTER, self._set(graph_exec, self.node, ctypes.addressof(self.params)))


class _CopySite:
    """A memcpy or memset node holding captured addresses."""

    def __init__(self, node: int, params: Any, fields: list[tuple[str, int, int]], setter: str):
        self.node, self.params, self.setter = node, params, setter
        self.fields = fields  # (field, role, captured value)
        context = ctypes.c_void_p()
        _call("cuCtxGetCurrent", ctypes.byref(context))
        self.context = context.value
        self._set = _setter(setter)

    def apply(self, graph_exec: int, shifts: Sequence[int]) -> None:
        for name, role, value in self.fields:
            setattr(self.params, name, value + shifts[role])
        rc = self._set(graph_exec, self.node, ctypes.addressof(self.params), self.context)
        _check(self.setter, rc)


def _kernel_site(node: int, spans: Sequence[CapturedBuffer]) -> _KernelSite | None:
    params = _KernelParams()
    _call("cuGraphKernelNodeGetParams_v2", ctypes.c_void_p(node), ctypes.byref(params))
    sizes = _param_sizes(params.func) if params.kernelParams else None
    if sizes is None:
        name = _function_name(params)
        if "nccl" in name.lower():  # NCCL's buffers were checked while capturing
            return None
        raise NotRebasable(f"the parameters of kernel {name or '(unnamed)'} cannot be read")
    arg_ptrs = (ctypes.c_void_p * max(1, len(sizes))).from_address(params.kernelParams)
    values = [ctypes.string_at(arg_ptrs[i], size) for i, size in enumerate(sizes)]
    sites = pointer_sites(values, spans)
    return _KernelSite(node, params, values, sites) if sites else None


def _memcpy_site(node: int, spans: Sequence[CapturedBuffer]) -> _CopySite | None:
    params = _Memcpy3D()
    _call("cuGraphMemcpyNodeGetParams", ctypes.c_void_p(node), ctypes.byref(params))
    fields = []
    for side in ("src", "dst"):
        if getattr(params, f"{side}MemoryType") not in _DEVICE_MEMORY:
            continue
        value = getattr(params, f"{side}Device")
        role = role_of(value + getattr(params, f"{side}XInBytes"), spans)
        if role is not None:
            fields.append((f"{side}Device", role, value))
    return _CopySite(node, params, fields, "cuGraphExecMemcpyNodeSetParams") if fields else None


def _memset_site(node: int, spans: Sequence[CapturedBuffer]) -> _CopySite | None:
    params = _MemsetParams()
    _call("cuGraphMemsetNodeGetParams", ctypes.c_void_p(node), ctypes.byref(params))
    role = role_of(params.dst, spans)
    if role is None:
        return None
    return _CopySite(node, params, [("dst", role, params.dst)], "cuGraphExecMemsetNodeSetParams")


class Rebase:
    """The nodes of one graph that hold the captured input and output addresses.

    Args:
        graph: the captured ``cudaGraph_t``; ``graph_exec``: its instantiation.
        spans: the captured input and output buffers (roles 0 and 1).

    Raises:
        NotRebasable: a node's addresses cannot be read or moved (the reason says which).
    """

    def __init__(self, graph: int, graph_exec: int, spans: Sequence[CapturedBuffer]) -> None:
        self.graph_exec = graph_exec
        self.captured = [s.base for s in sorted(spans, key=lambda s: s.role)]
        self.current = list(self.captured)
        self.sites: list[Any] = []
        count = ctypes.c_size_t()
        _call("cuGraphGetNodes", ctypes.c_void_p(graph), None, ctypes.byref(count))
        nodes = (ctypes.c_void_p * max(1, count.value))()
        _call("cuGraphGetNodes", ctypes.c_void_p(graph), nodes, ctypes.byref(count))
        kind = ctypes.c_int()
        for node in nodes[: count.value]:
            _call("cuGraphNodeGetType", ctypes.c_void_p(node), ctypes.byref(kind))
            if kind.value == _KERNEL:
                site: Any = _kernel_site(node, spans)
            elif kind.value == _MEMCPY:
                site = _memcpy_site(node, spans)
            elif kind.value == _MEMSET:
                site = _memset_site(node, spans)
            elif kind.value in _INERT:
                site = None
            else:
                raise NotRebasable(f"the graph holds a node of type {kind.value}")
            if site is not None:
                self.sites.append(site)

    def point_at(self, bases: Sequence[int]) -> None:
        """Make later launches use the buffers at ``bases`` (input, output)."""
        if list(bases) == self.current:
            return
        shifts = [new - old for new, old in zip(bases, self.captured, strict=True)]
        for site in self.sites:
            site.apply(self.graph_exec, shifts)
        self.current = list(bases)


class WatchedTransport:
    """A stream-ordered transport that records, while a schedule is captured, whether any
    operation it enqueues touches the captured buffers (``touched`` says which)."""

    def __init__(self, inner: Any, spans: Sequence[CapturedBuffer]) -> None:
        self.inner, self.spans = inner, spans
        self.touched = ""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _watch(self, what: str, arrays: Sequence[Any]) -> None:
        for a in arrays:
            if not self.touched and overlaps(a.data.ptr, a.nbytes, self.spans):
                self.touched = f"its {what} reads or writes the caller's buffers"

    def group_exchange(self, sends: list, recvs: list, stream: Any, wire_dtype: Any = None) -> None:
        self._watch("NCCL sends and receives", [a for _, a in sends] + [a for _, a in recvs])
        self.inner.group_exchange(sends, recvs, stream, wire_dtype)

    def allgather_bytes(self, send: Any, recv: Any, stream: Any) -> None:
        self._watch("NCCL AllGather", [send, recv])
        self.inner.allgather_bytes(send, recv, stream)
