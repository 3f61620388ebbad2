"""The nonblocking calls' queue on one rank (coccl/communicator/nonblocking.py): a
failure in a queued call reaches its wait() and breaks the communicator as a blocking
failure does, the calls queued behind it fail clearly; close() lets queued calls finish;
abort() refuses those not yet started; the handle protocol; buckets of torch tensors.
The multi-rank behaviour is in tests/mpi/test_nonblocking.py."""

import threading

import numpy as np
import pytest
from mpi4py import MPI

import coccl
from coccl import CallHandle, NotifyingHandle


@pytest.fixture
def comm():
    c = coccl.init(MPI.COMM_SELF, backend="mpi")
    yield c
    c.close()


def _hold_host_runs(comm, monkeypatch):
    """Make the host path wait for the returned event before it runs (the worker is
    then busy, deterministically, until the test sets it)."""
    release = threading.Event()
    runner = comm._runner
    real = runner._run_host

    def held(*args):
        assert release.wait(60), "the test never released the held call"
        real(*args)

    monkeypatch.setattr(runner, "_run_host", held)
    return release


def test_handles_follow_the_protocol(comm):
    h = comm.iallreduce(np.arange(3.0))
    assert isinstance(h, CallHandle) and isinstance(h, NotifyingHandle)
    np.testing.assert_array_equal(h.wait(), np.arange(3.0))
    p = comm.isend(np.ones(2), 0)
    assert isinstance(p, CallHandle)
    np.testing.assert_array_equal(comm.irecv(src=0, count=2, dtype=np.float64).wait(), 1.0)
    p.wait()


def test_pending_until_the_worker_runs_it(comm, monkeypatch):
    release = _hold_host_runs(comm, monkeypatch)
    h = comm.iallreduce(np.arange(4.0), algorithm="ring")
    done = threading.Event()
    h.add_done_callback(done.set)
    assert not h.test() and not done.is_set()
    release.set()
    np.testing.assert_array_equal(h.wait(), np.arange(4.0))
    assert h.test() and done.wait(10)


def test_failure_breaks_the_communicator_and_fails_the_queue(comm, monkeypatch):
    release = _hold_host_runs(comm, monkeypatch)

    def failing(*args):
        release.wait(60)
        raise coccl.CocclError("injected transport failure")

    monkeypatch.setattr(comm._runner, "_run_host", failing)
    first = comm.iallreduce(np.ones(8), algorithm="ring")
    behind = comm.iallgather(np.ones(8), algorithm="ring")
    release.set()
    with pytest.raises(coccl.CocclError, match="injected transport failure"):
        first.wait()
    with pytest.raises(coccl.CocclError, match="unusable after an earlier failure"):
        behind.wait()
    with pytest.raises(coccl.CocclError, match="unusable"):
        comm.allreduce(np.ones(8))
    with pytest.raises(coccl.CocclError, match="unusable"):
        comm.iallreduce(np.ones(8))


def test_close_finishes_the_queued_calls(comm, monkeypatch):
    release = _hold_host_runs(comm, monkeypatch)
    hs = [comm.iallreduce(np.full(5, float(i)), algorithm="ring") for i in range(3)]
    closer = threading.Thread(target=comm.close)
    closer.start()
    release.set()
    closer.join(60)
    assert not closer.is_alive()
    for i, h in enumerate(hs):
        np.testing.assert_array_equal(h.wait(), np.full(5, float(i)))
    with pytest.raises(coccl.CocclError, match="closed"):
        comm.iallreduce(np.ones(2))


def test_abort_refuses_the_calls_not_yet_started(comm, monkeypatch):
    release = _hold_host_runs(comm, monkeypatch)
    running = comm.iallreduce(np.ones(3), algorithm="ring")
    queued = [comm.iallreduce(np.ones(3), algorithm="ring") for _ in range(2)]
    aborter = threading.Thread(target=comm.abort)
    aborter.start()
    queue = comm._call_queue
    while queue._refusal is None:  # abort has marked the queue (then it waits)
        aborter.join(0.001)
    release.set()
    aborter.join(60)
    np.testing.assert_array_equal(running.wait(), np.ones(3))
    for h in queued:
        with pytest.raises(coccl.CocclError, match="aborted before the call ran"):
            h.wait()


def test_blocking_call_waits_for_the_queue(comm, monkeypatch):
    """The blocking call starts only after the queued one has run."""
    release = _hold_host_runs(comm, monkeypatch)
    order = []
    h = comm.iallreduce(np.ones(2), algorithm="ring")
    h.add_done_callback(lambda: order.append("queued"))
    t = threading.Thread(target=lambda: (comm.allreduce(np.ones(2)), order.append("blocking")))
    t.start()
    t.join(0.05)
    assert order == []  # the blocking call is waiting for its turn
    release.set()
    t.join(60)
    assert order == ["queued", "blocking"]


def test_torch_bucket_keeps_types_and_shapes(comm):
    torch = pytest.importorskip("torch")
    xs = [torch.ones(2, 3), torch.arange(4, dtype=torch.float64), torch.zeros(0)]
    ys = comm.iallreduce(xs).wait()
    assert [type(y) for y in ys] == [torch.Tensor] * 3
    assert [y.shape for y in ys] == [x.shape for x in xs]
    assert all(torch.equal(x, y) for x, y in zip(xs, ys, strict=True))


def test_calls_from_a_completion_callback_run_at_once(comm, monkeypatch):
    """A callback on the worker that issues a call gets it run at once (no deadlock with a
    blocking call holding the queue's lock); one that waits for a call queued behind it,
    or closes the communicator, is refused instead of waiting for itself forever."""
    release = _hold_host_runs(comm, monkeypatch)
    first = comm.iallreduce(np.ones(2), algorithm="ring")
    behind = comm.iallreduce(np.ones(2), algorithm="ring")
    seen = []

    def callback():
        seen.append(comm.iallreduce(np.full(2, 3.0)))
        for refused in (behind.wait, comm.close):
            try:
                refused()
            except coccl.CocclError as exc:
                seen.append(str(exc))

    first.add_done_callback(callback)
    release.set()
    np.testing.assert_array_equal(comm.allreduce(np.ones(2)), np.ones(2))  # waits its turn
    nested, waiting, closing = seen
    assert nested.test()
    np.testing.assert_array_equal(nested.wait(), np.full(2, 3.0))
    assert "would wait forever" in waiting and "close() from a completion callback" in closing
    np.testing.assert_array_equal(behind.wait(), np.ones(2))
