"""The MPI transport's staging blocks (coccl/transports/mpi.py), in one process without a
GPU: a staged receive's pinned block outlives its host-to-device copy and is released
once that copy has ended, at the next post of a receive as at the next send. A rank
that only receives (point to point) then holds the pipeline's window of blocks, not
the whole message's (the pool's promise: bounded by the window, not by the message)."""

import numpy as np
from mpi4py import MPI

from coccl.core.pool import host_pool
from coccl.transports.mpi import MpiTransport


class Copy:
    """A stand-in for a host-to-device copy's CUDA event."""

    def __init__(self, done: bool) -> None:
        self.done = done

    def synchronize(self) -> None:
        self.done = True


def test_a_receive_releases_the_staging_of_copies_that_ended():
    transport = MpiTransport(MPI.COMM_SELF)
    pool = host_pool()
    ended, running = pool.get(1024), pool.get(1024)
    transport._deferred += [(Copy(True), ended), (Copy(False), running)]
    assert pool.in_use_bytes == 2048
    buf = np.empty(16, np.uint8)
    recv = transport.irecv(buf, 0, 3)
    assert pool.in_use_bytes == 1024  # the ended copy's block is back in the pool
    assert transport._deferred == [(transport._deferred[0][0], running)]
    send = transport.isend(np.arange(16, dtype=np.uint8), 0, 3)
    while not (recv.test() and send.test()):
        pass
    np.testing.assert_array_equal(buf, np.arange(16, dtype=np.uint8))
    transport.finish()  # the end of a call waits for every copy
    assert pool.in_use_bytes == 0 and transport._deferred == []
    transport.close()
