"""The out-of-band exchanges a communicator needs besides its data transports: agreeing
on settings and on each new call's plan, broadcasting NCCL's unique id, finding which
ranks share a node. They carry a few hundred bytes, rarely (at init and when a call's
plan is first built), and every wait is bounded by a timeout, so a rank that never
arrives ends in a ``CocclError`` instead of a hang.

``MpiBootstrap`` runs them over a private duplicate of an MPI communicator; ``coccl.torch``
provides one over torch.distributed's store, for jobs launched without MPI.
"""

from __future__ import annotations

import pickle
import socket
import time
from typing import Any, Protocol

from coccl.errors import CocclError


class Bootstrap(Protocol):
    """Small collective exchanges of Python objects among the communicator's ranks."""

    rank: int
    size: int

    def allgather(self, obj: Any, timeout_s: float, what: str) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order. Raises CocclError naming
        ``what`` if some rank does not join within ``timeout_s``."""
        ...

    def close(self, abandoned: bool = False) -> None:
        """Free what the bootstrap holds (``abandoned``: after a failure, which may have
        left a message unmatched)."""
        ...


def node_ranks(boot: Bootstrap, timeout_s: float) -> tuple[int, int]:
    """``(local_rank, local_size)``: this rank's index among the ranks of its node, and
    their count (ranks are on one node when their host names match)."""
    hosts = boot.allgather(socket.gethostname(), timeout_s, "finding the ranks of each node")
    mine = hosts[boot.rank]
    local = [r for r, h in enumerate(hosts) if h == mine]
    return local.index(boot.rank), len(local)


# MPI duplicates closed with messages possibly unmatched, kept until MPI_Finalize.
_KEPT: list[Any] = []


def free_duplicate(comm: Any, abandoned: bool) -> None:
    """Free a private MPI duplicate, unless ``abandoned``: a failure or a message given up
    may have left messages on it unmatched, and MPI gives a freed communicator's context to
    the next one it creates, whose receives under the same tags would take them. Such a
    duplicate is kept (one of MPI's limited communicators) until MPI_Finalize."""
    from mpi4py import MPI  # noqa: PLC0415

    if comm == MPI.COMM_NULL or MPI.Is_finalized():
        return
    if abandoned:
        _KEPT.append(comm)
    else:
        comm.Free()


def wait_request(request: Any, deadline: float, describe: Any) -> None:
    """Poll an MPI request until it completes, or raise CocclError(``describe()``) past
    ``deadline``. Spin first (a small collective completes in microseconds, and yielding
    the core on every poll makes it many times slower) for 50 us, then yield the core
    now and then, then sleep: a peer still computing must not be starved of a shared core."""
    start = time.monotonic()
    spins = 0
    while not request.Test():
        spins += 1
        if spins % 64:
            continue
        now = time.monotonic()
        if now > deadline:
            raise CocclError(describe())
        waited = now - start
        if waited > 2e-3:
            time.sleep(50e-6)
        elif waited > 5e-5:
            time.sleep(0)


def _wait(request: Any, deadline: float, what: str, timeout_s: float) -> None:
    wait_request(
        request,
        deadline,
        lambda: (
            f"{what}: timed out after {timeout_s:g} s waiting for every rank "
            "(COCCL_TIMEOUT_S); do all ranks make the same calls in the same order?"
        ),
    )


# Bytes per rank in the first exchange: objects that pickle to less travel in one
# collective; larger ones take a second (every rank sees the sizes, so all agree on it).
SLOT_BYTES = 256


class MpiBootstrap:
    """Bootstrap exchanges over a private duplicate of an MPI communicator (nonblocking
    collectives polled against a deadline)."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm.Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self._timed_out = False  # an exchange left pending: its duplicate is kept

    def allgather(self, obj: Any, timeout_s: float, what: str) -> list[Any]:
        try:
            return self._allgather(obj, timeout_s, what)
        except CocclError:
            self._timed_out = True
            raise

    def _allgather(self, obj: Any, timeout_s: float, what: str) -> list[Any]:
        import numpy as np  # noqa: PLC0415
        from mpi4py import MPI  # noqa: PLC0415

        data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        deadline = time.monotonic() + timeout_s
        slot = np.zeros(SLOT_BYTES, dtype=np.uint8)
        slot[:8].view(np.int64)[0] = data.size
        if data.size <= SLOT_BYTES - 8:
            slot[8 : 8 + data.size] = data
        slots = np.empty((self.size, SLOT_BYTES), dtype=np.uint8)
        _wait(self.comm.Iallgather(slot, slots), deadline, what, timeout_s)
        sizes = slots[:, :8].copy().view(np.int64)[:, 0]
        if sizes.max(initial=0) <= SLOT_BYTES - 8:
            return [
                pickle.loads(row[8 : 8 + int(n)].tobytes())
                for row, n in zip(slots, sizes, strict=True)
            ]
        offsets = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        recv = np.empty(int(sizes.sum()), dtype=np.uint8)
        request = self.comm.Iallgatherv(
            [data, MPI.BYTE], [recv, (sizes.tolist(), offsets.tolist()), MPI.BYTE]
        )
        _wait(request, deadline, what, timeout_s)
        return [
            pickle.loads(recv[int(o) : int(o) + int(s)].tobytes())
            for o, s in zip(offsets, sizes, strict=True)
        ]

    def close(self, abandoned: bool = False) -> None:
        """Free the duplicate (kept if ``abandoned`` or after a timeout: see
        ``free_duplicate``)."""
        free_duplicate(self.comm, abandoned or self._timed_out)
