"""NCCL transport through ``cupy.cuda.nccl``: grouped point-to-point sends and receives on
a communication stream, and NCCL's own collectives as the ``native`` baseline.

One NCCL communicator per coccl Communicator; its unique id is broadcast over MPI.
Compressed payloads travel as ``ncclUint8`` byte counts. NCCL refuses two ranks on one
GPU (``ncclInvalidUsage``), so ``decide`` checks, before NCCL is even asked, that every
rank has a GPU of its own; ranks sharing a GPU use ``backend="mpi"``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from coccl.arrays import BFLOAT16, cupy_or_none, dtype_name
from coccl.errors import CocclError

# ncclDataType_t and ncclRedOp_t values (nccl.h); CuPy exposes most of them by name.
_NCCL_DTYPES = {
    np.dtype(np.int8): 0,
    np.dtype(np.uint8): 1,
    np.dtype(np.int32): 2,
    np.dtype(np.uint32): 3,
    np.dtype(np.int64): 4,
    np.dtype(np.uint64): 5,
    np.dtype(np.float16): 6,
    np.dtype(np.float32): 7,
    np.dtype(np.float64): 8,
    BFLOAT16: 9,
}
_NCCL_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
NCCL_UINT8 = 1


def nccl_dtype(dtype: Any) -> int:
    """NCCL's type for ``dtype``; TypeError where NCCL has none (int16, uint16)."""
    try:
        return _NCCL_DTYPES[np.dtype(dtype)]
    except KeyError:
        raise TypeError(
            f"NCCL has no {dtype_name(dtype)} type for its own collectives; "
            "use algorithm='ring' or 'two_shot'"
        ) from None


def wire_type(nbytes: int, wire_dtype: Any) -> tuple[int, int]:
    """``(count, ncclDataType)`` for a point-to-point message of ``nbytes`` bytes: the
    data's own NCCL type for uncompressed payloads where NCCL has one, else bytes."""
    if wire_dtype is not None:
        dtype = np.dtype(wire_dtype)
        code = _NCCL_DTYPES.get(dtype)
        if code is not None and nbytes % dtype.itemsize == 0:
            return nbytes // dtype.itemsize, code
    return int(nbytes), NCCL_UINT8


def _device_key(cp: Any, device_id: int) -> str:
    props = cp.cuda.runtime.getDeviceProperties(device_id)
    uuid = props.get("uuid")
    if uuid:
        return bytes(uuid).hex()
    return f"{props.get('pciDomainID', 0)}:{props.get('pciBusID', 0)}:{props.get('pciDeviceID', 0)}"


def decide(mpi_comm: Any, backend: str) -> tuple[str, int | None, str]:
    """Decide collectively which backend runs: ``(backend, device_id, why_not_nccl)``.

    NCCL runs when asked for (or for ``auto``) and every rank has CuPy with NCCL and a
    GPU that no other rank on its node uses. Every rank reaches the same decision.
    """
    if backend == "mpi":
        return "mpi", None, ""
    from mpi4py import MPI  # noqa: PLC0415

    reason, device_id, key = "", None, ""
    cp = cupy_or_none()
    if cp is None:
        reason = "CuPy is not installed"
    else:
        try:
            ndev = cp.cuda.runtime.getDeviceCount()
        except Exception as exc:  # no driver, no device
            ndev, reason = 0, f"no CUDA GPU is usable ({exc})"
        if ndev == 0 and not reason:
            reason = "no CUDA GPU is visible"
        if not reason:
            try:
                from cupy.cuda import nccl  # noqa: PLC0415

                if not getattr(nccl, "available", True):
                    reason = "CuPy was built without NCCL"
            except Exception as exc:
                reason = f"cupy.cuda.nccl is unavailable ({exc})"
        if not reason:
            local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
            device_id = local.Get_rank() % ndev
            key = _device_key(cp, device_id)
            keys = local.allgather(key)
            local.Free()
            if keys.count(key) > 1:
                sharing = [r for r, k in enumerate(keys) if k == key]
                reason = (
                    f"local ranks {sharing} would share GPU {device_id}: NCCL refuses two ranks "
                    "on one GPU (ncclInvalidUsage); use backend='mpi' for ranks that share a GPU"
                )
    reasons = mpi_comm.allgather(reason)
    bad = [(r, why) for r, why in enumerate(reasons) if why]
    if bad:
        rank, why = bad[0]
        return "mpi", None, f"rank {rank}: {why}"
    cp.cuda.Device(device_id).use()
    return "nccl", device_id, ""


class NcclTransport:
    """NCCL point-to-point and collectives for the ranks of ``mpi_comm``."""

    name = "nccl"

    def __init__(self, mpi_comm: Any, device_id: int) -> None:
        import cupy as cp  # noqa: PLC0415
        from cupy.cuda import nccl  # noqa: PLC0415

        self._nccl = nccl
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()
        self.device_id = device_id
        uid = nccl.get_unique_id() if self.rank == 0 else None
        uid = mpi_comm.bcast(uid, root=0)
        with cp.cuda.Device(device_id):
            self.comm = self._call(
                "ncclCommInitRank", nccl.NcclCommunicator, self.size, uid, self.rank
            )
        self._closed = False
        self.bytes_sent = 0  # payload bytes sent point to point (statistics)

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nccl.NcclError as exc:
            raise CocclError(f"NCCL {what} failed on rank {self.rank}: {exc}") from exc

    def check_async_error(self) -> None:
        """Raise CocclError if NCCL reported an asynchronous error (e.g. a dead peer)."""
        self._call("async error check", self.comm.check_async_error)

    def pools(self) -> list[Any]:
        return []

    def group_exchange(
        self,
        sends: list[tuple[int, Any]],
        recvs: list[tuple[int, Any]],
        stream: Any,
        wire_dtype: Any = None,
    ) -> None:
        """Post sends and receives of uint8 buffers as one NCCL group on ``stream``.

        Compressed payloads travel as ``ncclUint8`` byte counts; uncompressed ones
        (``wire_dtype`` given) in their own NCCL type where NCCL has one, bfloat16 too.
        """
        nccl = self._nccl
        self.bytes_sent += sum(int(buf.size) for _, buf in sends)
        self._call("groupStart", nccl.groupStart)
        try:
            for peer, buf in sends:
                count, nccl_type = wire_type(buf.size, wire_dtype)
                self.comm.send(buf.data.ptr, count, nccl_type, peer, stream.ptr)
            for peer, buf in recvs:
                count, nccl_type = wire_type(buf.size, wire_dtype)
                self.comm.recv(buf.data.ptr, count, nccl_type, peer, stream.ptr)
        except nccl.NcclError as exc:
            raise CocclError(f"NCCL send/recv failed on rank {self.rank}: {exc}") from exc
        finally:
            self._call("groupEnd", nccl.groupEnd)

    def finish(self) -> None:
        pass

    @staticmethod
    def has_native(collective: str, dtype: Any, op: str) -> bool:
        """Whether NCCL's own collective takes this dtype (AllGather moves bytes)."""
        return collective == "allgather" or np.dtype(dtype) in _NCCL_DTYPES

    # ------------------------------------------------------- native collectives
    def _stream(self) -> Any:
        import cupy as cp  # noqa: PLC0415

        return cp.cuda.get_current_stream().ptr

    def native_allreduce(self, x: Any, out: Any, op: str) -> None:
        """ncclAllReduce (ncclAvg for avg)."""
        self._call(
            "ncclAllReduce",
            self.comm.allReduce,
            x.data.ptr,
            out.data.ptr,
            x.size,
            nccl_dtype(x.dtype),
            _NCCL_OPS[op],
            self._stream(),
        )

    def native_reduce_scatter(self, x: Any, out: Any, op: str) -> None:
        """ncclReduceScatter."""
        self._call(
            "ncclReduceScatter",
            self.comm.reduceScatter,
            x.data.ptr,
            out.data.ptr,
            out.size,
            nccl_dtype(x.dtype),
            _NCCL_OPS[op],
            self._stream(),
        )

    def native_allgather(self, x: Any, out: Any) -> None:
        """ncclAllGather (moves bytes: any dtype)."""
        self._call(
            "ncclAllGather",
            self.comm.allGather,
            x.data.ptr,
            out.data.ptr,
            x.size * x.dtype.itemsize,
            NCCL_UINT8,
            self._stream(),
        )

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.comm.destroy()
