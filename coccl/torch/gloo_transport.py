"""Host data and bootstrap exchanges over torch.distributed, so that a Communicator runs
inside a torch.distributed job (torchrun, or mpiexec with ``coccl.torch``) without MPI.

* ``StoreBootstrap`` does coccl's rare out-of-band exchanges (settings, plan agreement,
  NCCL's unique id) through torch's key-value store, every wait bounded by a timeout.
* ``GlooTransport`` is a ``PollingTransport`` (coccl.core.transport) over a Gloo process
  group: nonblocking sends and receives of the pipeline's uint8 host buffers, and Gloo's
  own collectives as the ``native`` baseline.

Gloo marks a point-to-point ``Work`` (and some collectives') complete only inside
``Work.wait()`` (``is_completed`` stays False until someone waits), and a ``wait`` with a
short timeout closes the connection. So each message is waited for by a thread of a small
pool, which blocks in ``wait`` with the GIL released, and a handle's ``test()`` reads that
thread's outcome: one thread per message in flight, at most ``2 (size - 1) * depth``.

Host data only: device data travels over coccl's NCCL transport (every rank has a GPU of
its own) or not at all (``coccl.torch`` refuses CUDA tensors then).
"""

from __future__ import annotations

import pickle
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from coccl.core.arrays import BFLOAT16, is_device_array
from coccl.core.reduction import finalize
from coccl.errors import CocclError

# The longest wait torch's store takes (a timedelta cannot be infinite).
_FOREVER_S = 10.0**7
_REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.SUM,  # Gloo has no AVG: sum, then coccl's one division
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "prod": dist.ReduceOp.PRODUCT,
}
# dtypes Gloo reduces (16-bit floats are reduced in float32, as coccl's own schedules do).
_GLOO_REDUCIBLE = tuple(
    np.dtype(t)
    for t in (np.float32, np.float64, np.float16, BFLOAT16, np.int8, np.uint8, np.int32, np.int64)
)


def as_timedelta(seconds: float) -> timedelta:
    """``seconds`` (may be inf) as the timedelta torch's waits take."""
    return timedelta(seconds=min(float(seconds), _FOREVER_S))


class StoreBootstrap:
    """coccl's bootstrap exchanges (``coccl.transports.bootstrap.Bootstrap``) through a torch
    ``Store``: each ``allgather`` is a numbered round of keys, one per rank.

    Args:
        store: a store private to this communicator (e.g. a ``PrefixStore``).
        rank: this process's rank in the group.
        size: the group's rank count.
    """

    def __init__(self, store: dist.Store, rank: int, size: int) -> None:
        self._store = store
        self.rank = rank
        self.size = size
        self._round = 0

    def allgather(self, obj: Any, timeout_s: float, what: str) -> list[Any]:
        """Every rank's ``obj`` in rank order; CocclError naming ``what`` if a rank does
        not join within ``timeout_s``."""
        n = self._round
        self._round += 1
        self._store.set(f"{n}/{self.rank}", pickle.dumps(obj))
        keys = [f"{n}/{r}" for r in range(self.size)]
        try:
            self._store.wait(keys, as_timedelta(timeout_s))
            values = [pickle.loads(self._store.get(key)) for key in keys]
        except RuntimeError as exc:  # torch's DistStoreError (a timeout) and store failures
            raise CocclError(
                f"{what}: no answer from every rank within {timeout_s:g} s through torch's "
                f"store ({exc}); do all ranks make the same calls in the same order?"
            ) from exc
        # Every rank has read round n - 2: each set its key of round n - 1 after that.
        if n >= 2:
            self._store.delete_key(f"{n - 2}/{self.rank}")
        return values

    def close(self, abandoned: bool = False) -> None:
        """Nothing to free: the store belongs to torch.distributed."""


class _Message:
    """One point-to-point message; its ``Work`` is waited for by a pool thread."""

    __slots__ = ("peer", "kind", "_tensor", "_waited")

    def __init__(
        self, peer: int, kind: str, work: Any, tensor: torch.Tensor, waiters: ThreadPoolExecutor
    ) -> None:
        self.peer = peer
        self.kind = kind
        self._tensor = tensor  # Gloo reads or writes this memory until the message completes
        self._waited: Future = waiters.submit(work.wait)

    def test(self) -> bool:
        if not self._waited.done():
            return False
        exc = self._waited.exception()
        if exc is not None:
            raise CocclError(
                f"Gloo {self.kind} with rank {self.peer} failed: {exc}; do all ranks make the "
                "same calls (the same collectives; each send matched by a recv) with the same "
                "count, dtype and options?"
            ) from exc
        return True


class GlooTransport:
    """Point-to-point host bytes over a Gloo process group private to one Communicator.

    Args:
        group: a ``ProcessGroupGloo`` that nothing else uses (its messages must not meet
            the application's own sends and receives), created with the communicator's
            timeout: Gloo's own timeout then bounds every wait (the pipeline's own
            deadline, COCCL_TIMEOUT_S, also bounds point-to-point rounds).
        timeout_s: that timeout, for messages.
        depth: the pipeline depth (rounds in flight), which bounds the messages in flight.
        waiters: at most this many messages waited for at once (default: a round's
            ``2 (size - 1) depth``); point-to-point, whose messages in flight the caller
            decides, takes more. A message beyond it is waited for once one ends.
    """

    name = "gloo"
    cuda_aware = False
    sends_follow_stream = False
    thread_safe = True  # its messages wait on threads of their own already

    def __init__(
        self, group: Any, timeout_s: float, depth: int, waiters: int | None = None
    ) -> None:
        self.group = group
        self.rank: int = group.rank()
        self.size: int = group.size()
        self.timeout_s = timeout_s
        self.bytes_sent = 0
        # A message in flight holds one thread; a round has at most size - 1 sends and
        # size - 1 receives. Threads start only as messages need them.
        if waiters is None:
            waiters = 2 * (self.size - 1) * depth
        self._waiters = ThreadPoolExecutor(
            max_workers=max(1, waiters), thread_name_prefix="coccl-gloo"
        )

    # ----------------------------------------------------------- point to point
    def isend(self, buf: Any, peer: int, tag: int, landed: bool = False) -> _Message:
        """Start sending the uint8 host array ``buf`` to ``peer``."""
        tensor = _host_tensor(buf)
        self.bytes_sent += int(buf.size)
        return _Message(peer, "send", self.group.send([tensor], peer, tag), tensor, self._waiters)

    def irecv(self, buf: Any, peer: int, tag: int, forward: bool = False) -> _Message:
        """Start receiving into the uint8 host array ``buf`` from ``peer``."""
        tensor = _host_tensor(buf)
        return _Message(peer, "recv", self.group.recv([tensor], peer, tag), tensor, self._waiters)

    def finish(self) -> None:
        """Nothing is kept between collectives."""

    def cancel(self, handles: list[Any]) -> None:
        """After a failure: abort the Gloo group (Gloo cannot cancel one receive), which
        ends the waits of every unfinished message. The Communicator is unusable from then
        on anyway."""
        if self.group is not None and any(not h._waited.done() for h in handles):
            self.group.abort()

    def pools(self) -> list[Any]:
        return []

    def close(self, abandoned: bool = False) -> None:
        """Stop the waiters and let go of the Gloo group (a group of its own: no later
        group receives what it left unmatched, ``abandoned`` or not): it is destroyed now,
        its worker threads joined while the interpreter is alive. (A Gloo worker that
        dropped the last reference of a message's tensor, which wraps numpy memory, takes
        the GIL to free it; at interpreter exit that aborts the process.)"""
        self._waiters.shutdown(wait=False, cancel_futures=True)
        self.group = None

    # ------------------------------------------------------- native collectives
    def has_native(self, collective: str, dtype: Any, op: str) -> bool:
        """Gloo gathers any dtype; it reduces the common float and integer types."""
        return collective == "allgather" or np.dtype(dtype) in _GLOO_REDUCIBLE

    def native(self, collective: str, x: Any, out: Any, op: str, stream: Any = None) -> None:
        """Gloo's own collective of flat host ``x`` into flat host ``out`` (16-bit floats
        reduced in float32)."""
        if collective == "allgather":
            recv = torch.from_numpy(out.view(np.uint8))
            work = self.group._allgather_base(recv, _host_tensor(x.view(np.uint8)))
            self._complete(work, "Gloo allgather")
            return
        widen = x.dtype in (np.dtype(np.float16), BFLOAT16)
        if collective == "allreduce":
            # Gloo reduces in place: in ``out`` itself (a copy of ``x`` unless the call is
            # in place), or in a float32 copy of 16-bit floats
            acc = x.astype(np.float32) if widen else out
            if acc is not x and not widen:
                np.copyto(acc, x)
            work = self.group.allreduce([torch.from_numpy(acc)], _allreduce_options(op))
        else:
            send = x.astype(np.float32) if widen else x
            acc = np.empty(send.size // self.size, dtype=send.dtype) if widen else out
            opts = dist.ReduceScatterOptions()
            opts.reduceOp = _REDUCE_OPS[op]
            work = self.group._reduce_scatter_base(
                torch.from_numpy(acc), torch.from_numpy(send), opts
            )
        self._complete(work, f"Gloo {collective}")
        finalize(acc, op, self.size)
        if acc is not out:
            out[...] = acc.astype(out.dtype)

    def _complete(self, work: Any, what: str) -> None:
        """Wait for a Gloo collective; the group's timeout bounds the wait, and its failure
        or the timeout raises CocclError."""
        try:
            work.wait()
        except RuntimeError as exc:
            raise CocclError(
                f"{what} failed or timed out after {self.timeout_s:g} s (the group's timeout, "
                f"at most COCCL_TIMEOUT_S): {exc}; do all ranks call the same collective?"
            ) from exc


def _allreduce_options(op: str) -> Any:
    opts = dist.AllreduceOptions()
    opts.reduceOp = _REDUCE_OPS[op]
    return opts


def _host_tensor(buf: Any) -> torch.Tensor:
    """A torch view of a flat host array (bfloat16 and other ml_dtypes as raw bytes)."""
    if is_device_array(buf):
        raise CocclError(
            "the Gloo transport moves host data only; device data needs coccl's NCCL "
            "transport (a GPU of its own on every rank, and CuPy)"
        )
    if buf.dtype.kind not in "biuf" or buf.dtype == BFLOAT16:
        buf = buf.view(np.uint8)
    return torch.from_numpy(buf)
