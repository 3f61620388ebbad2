"""NCCL transport through ``cupy.cuda.nccl``: grouped point-to-point sends and receives and
AllGathers of payload bytes on a communication stream, and NCCL's own collectives as the
``native`` baseline.

One NCCL communicator per coccl Communicator; its unique id travels over the bootstrap
(MPI or torch's store). Compressed payloads travel as ``ncclUint8`` byte counts. NCCL
refuses two ranks on one GPU (``ncclInvalidUsage``), so ``decide`` checks, before NCCL is
even asked, that every rank has a GPU of its own; ranks sharing a GPU use
``backend="mpi"``. ``detect_link`` says which class of link NCCL will use between the
ranks, for ``auto``'s table.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from coccl.config import LINK_CLASSES
from coccl.core.arrays import BFLOAT16, cupy_or_none, dtype_name
from coccl.errors import CocclError
from coccl.transports.bootstrap import Bootstrap

log = logging.getLogger(__name__)

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
NCCL_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
NCCL_UINT8 = 1
# Link classes, fastest first ("self": one rank); a communicator's link is the slowest
# between any two ranks.
DETECTED_LINKS = ("self", *LINK_CLASSES)


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


def _local_gpu(local_rank: int) -> tuple[str, int | None, str]:
    """Whether this process can run NCCL: ``(why_not, device_id, device_key)``."""
    cp = cupy_or_none()
    if cp is None:
        return "CuPy is not installed", None, ""
    try:
        ndev = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, no device
        return f"no CUDA GPU is usable ({exc})", None, ""
    if ndev == 0:
        return "no CUDA GPU is visible", None, ""
    try:
        from cupy.cuda import nccl  # noqa: PLC0415

        if not getattr(nccl, "available", True):
            return "CuPy was built without NCCL", None, ""
    except Exception as exc:
        return f"cupy.cuda.nccl is unavailable ({exc})", None, ""
    device_id = local_rank % ndev
    return "", device_id, _device_key(cp, device_id)


def decide(
    boot: Bootstrap, backend: str, local_rank: int, timeout_s: float
) -> tuple[str, int | None, str]:
    """Decide collectively which backend runs: ``(backend, device_id, why_not_nccl)``.

    NCCL runs when asked for (or for ``auto``) and every rank has CuPy with NCCL and a
    GPU that no other rank on its node uses. Every rank reaches the same decision.
    """
    if backend == "mpi":
        return "mpi", None, ""
    import socket  # noqa: PLC0415

    reason, device_id, key = _local_gpu(local_rank)
    facts = boot.allgather(
        (reason, socket.gethostname(), key), timeout_s, "choosing the device backend"
    )
    bad = [(r, why) for r, (why, _, _) in enumerate(facts) if why]
    if not bad:
        seen: dict[tuple[str, str], list[int]] = {}
        for r, (_, host, gpu) in enumerate(facts):
            seen.setdefault((host, gpu), []).append(r)
        shared = [ranks for ranks in seen.values() if len(ranks) > 1]
        if shared:
            bad = [
                (
                    shared[0][0],
                    f"ranks {shared[0]} would share one GPU: NCCL refuses two ranks on one "
                    "GPU (ncclInvalidUsage); use backend='mpi' for ranks that share a GPU",
                )
            ]
    if bad:
        rank, why = bad[0]
        return "mpi", None, f"rank {rank}: {why}"
    cp = cupy_or_none()
    assert cp is not None and device_id is not None  # no reason given: both exist
    cp.cuda.Device(device_id).use()
    return "nccl", device_id, ""


def detect_link(boot: Bootstrap, device_id: int, setting: str, timeout_s: float) -> str:
    """The class of link NCCL uses between this communicator's ranks (the slowest pair):
    ``COCCL_LINK`` if set, else from where the ranks run and what NCCL may use:

    * ranks on several nodes: ``net``;
    * ``NCCL_P2P_DISABLE=1``: ``socket`` with ``NCCL_SHM_DISABLE=1``, else ``shm`` (host
      shared memory, a PCIe-class path);
    * GPUs with peer access: ``nvlink`` where the pair supports native atomics (the NVLink
      case on every machine we know), else ``pcie``; no peer access: ``shm``.

    Every rank reaches the same answer."""
    import socket  # noqa: PLC0415

    if setting != "auto":
        return setting
    if boot.size == 1:
        return "self"
    facts = boot.allgather((socket.gethostname(), device_id), timeout_s, "detecting the link")
    host = facts[boot.rank][0]
    if any(h != host for h, _ in facts):
        link = "net"
    elif os.environ.get("NCCL_P2P_DISABLE", "0").strip() == "1":
        link = "socket" if os.environ.get("NCCL_SHM_DISABLE", "0").strip() == "1" else "shm"
    else:
        link = _peer_link(device_id, [d for h, d in facts if h == host and d != device_id])
    links = boot.allgather(link, timeout_s, "agreeing on the link")
    return max(links, key=DETECTED_LINKS.index)


def _peer_link(device_id: int, peers: list[int]) -> str:
    import cupy as cp  # noqa: PLC0415

    runtime = cp.cuda.runtime
    link = "nvlink"
    for peer in peers:
        if not runtime.deviceCanAccessPeer(device_id, peer):
            return "shm"
        try:
            atomics = runtime.deviceGetP2PAttribute(
                runtime.cudaDevP2PAttrNativeAtomicSupported, device_id, peer
            )
        except Exception:  # an older CuPy without the attribute query
            atomics = 1
        if not atomics:
            link = "pcie"
    return link


class NcclTransport:
    """NCCL point-to-point, AllGather and collectives for the ranks of a bootstrap."""

    name = "nccl"

    def __init__(self, boot: Bootstrap, device_id: int, timeout_s: float) -> None:
        import cupy as cp  # noqa: PLC0415
        from cupy.cuda import nccl  # noqa: PLC0415

        self._nccl = nccl
        self.rank = boot.rank
        self.size = boot.size
        self.device_id = device_id
        uid = nccl.get_unique_id() if self.rank == 0 else None
        uid = boot.allgather(uid, timeout_s, "sharing NCCL's unique id")[0]
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

    def allgather_bytes(self, send: Any, recv: Any, stream: Any) -> None:
        """ncclAllGather of the uint8 buffer ``send`` into ``recv`` (``size`` slots); in
        place when ``send`` is this rank's slot of ``recv``."""
        self.bytes_sent += int(send.size) * (self.size - 1)
        self._call(
            "ncclAllGather",
            self.comm.allGather,
            send.data.ptr,
            recv.data.ptr,
            int(send.size),
            NCCL_UINT8,
            stream.ptr,
        )

    @staticmethod
    def has_native(collective: str, dtype: Any, op: str) -> bool:
        """Whether NCCL's own collective takes this dtype (AllGather moves bytes)."""
        return collective == "allgather" or np.dtype(dtype) in _NCCL_DTYPES

    # ------------------------------------------------------- native collectives
    def native(self, collective: str, x: Any, out: Any, op: str, stream: Any) -> None:
        """NCCL's own collective of flat CuPy ``x`` into flat ``out`` on ``stream``."""
        self.native_ptrs(collective, x.data.ptr, out.data.ptr, int(x.size), x.dtype, op, stream.ptr)

    def native_ptrs(
        self, collective: str, src: int, dst: int, count: int, dtype: Any, op: str, stream: int
    ) -> None:
        """NCCL's own collective on device addresses (``count``: elements of the input),
        enqueued on the stream ``stream`` (a raw ``cudaStream_t``): the per-call path of
        ``native`` calls, which builds no array objects."""
        if collective == "allreduce":
            self._call(
                "ncclAllReduce",
                self.comm.allReduce,
                src, dst, count, nccl_dtype(dtype), NCCL_OPS[op], stream,
            )  # fmt: skip
        elif collective == "reduce_scatter":
            self._call(
                "ncclReduceScatter",
                self.comm.reduceScatter,
                src, dst, count // self.size, nccl_dtype(dtype), NCCL_OPS[op], stream,
            )  # fmt: skip
        else:
            nbytes = count * np.dtype(dtype).itemsize
            self._call("ncclAllGather", self.comm.allGather, src, dst, nbytes, NCCL_UINT8, stream)

    def abort(self) -> None:
        """Abort the NCCL communicator: kernels waiting on peers return (from any thread)."""
        if not self._closed:
            self._closed = True
            try:
                self.comm.abort()
            except Exception as exc:  # already broken: nothing more to do
                log.debug("ncclCommAbort on rank %d: %s", self.rank, exc)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.comm.destroy()
