"""The polling engine: runs a schedule's rounds over a transport whose messages complete
asynchronously (MPI), with compute on an executor, so that compute and transfers overlap.

The host thread polls: it posts receives as rounds are admitted, submits compute as
dependencies land, posts sends as compute completes, and tests messages (which is what
makes MPI progress). Executors are FIFO: a ``pre`` submitted after a dependency's
``post`` runs after it. On the CPU the executor is one worker thread running numba
kernels that release the GIL, while the main thread keeps MPI progressing; on the GPU it
is a compute stream (kernels are enqueued, completion is an event).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from coccl.core.rounds import Round
from coccl.core.transport import PollingTransport
from coccl.errors import CocclError


class _Done:
    """A handle that is already complete."""

    @staticmethod
    def done() -> bool:
        return True

    @staticmethod
    def result() -> None:
        return None


DONE = _Done()


def _noop() -> None:
    pass


def _backoff(spins: int) -> None:
    """Wait a little after ``spins`` polls that made no progress: spin first (a message
    on shared memory lands in microseconds), then yield the GIL to the worker thread,
    then sleep, so ranks that share cores still progress. Shared-memory MPI only moves
    data while some rank calls into it, so the wait stays short."""
    if spins < 64:
        return
    time.sleep(0 if spins < 256 else 50e-6)


def _yield(spins: int) -> None:
    """The GPU executor's wait: yield the core now and then, never sleep. A GPU rank has a
    host core of its own, and over staged MPI its polling is what moves the bytes: a
    50 us sleep while a ring step waits for its neighbour is latency on the step's chain
    (bench/NOTES.md)."""
    if spins >= 64:
        time.sleep(0)


def limit_numba_threads(threads: int | None) -> None:
    """Give the calling thread's numba kernels ``threads`` threads (None: leave numba's
    default). numba's count is per calling thread: a thread that runs codec kernels sets
    it on itself."""
    if threads is not None:
        import numba  # noqa: PLC0415

        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))


class CpuExecutor:
    """One worker thread: numba codec kernels run there without the GIL."""

    def __init__(self, threads: int | None = None) -> None:
        self._threads = threads
        self._pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="coccl-codec", initializer=self._init_thread
        )

    def _init_thread(self) -> None:
        limit_numba_threads(self._threads)

    def submit(self, fn: Callable[[], None] | None) -> Any:
        return DONE if fn is None else self._pool.submit(fn)

    idle = staticmethod(_backoff)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class InlineExecutor:
    """Runs compute on the calling thread at once: for small chunks, where handing work
    to a worker thread costs more (a wake-up, on a busy machine a scheduler slice) than
    the work itself. FIFO by construction."""

    @staticmethod
    def submit(fn: Callable[[], None] | None) -> Any:
        if fn is not None:
            fn()
        return DONE

    idle = staticmethod(_backoff)


class EventHandle:
    """A GPU executor's handle: the event recorded after the submitted kernels."""

    __slots__ = ("event",)

    def __init__(self, event: Any) -> None:
        self.event = event

    def done(self) -> bool:
        return self.event.done

    def result(self) -> None:
        return None


class GpuExecutor:
    """A compute stream: ``submit`` enqueues the work and returns its completion event."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def submit(self, fn: Callable[[], None] | None) -> Any:
        if fn is None:
            return DONE
        import cupy as cp  # noqa: PLC0415

        if cp.cuda.get_current_stream() is self.stream:  # as in a collective: saves a switch
            fn()
        else:
            with self.stream:
                fn()
        event = cp.cuda.Event(block=False, disable_timing=True)
        event.record(self.stream)
        return EventHandle(event)

    idle = staticmethod(_yield)

    def close(self) -> None:
        pass


def _pending_peers(handles: Iterable[Any]) -> str:
    """The peers of the unfinished messages among ``handles`` ("" if none)."""
    return ", ".join(str(h.peer) for h in handles if not h.test())


def _describe_wait(label: str, active: Iterable[Round], timeout_s: float) -> str:
    for rnd in active:
        peers = _pending_peers(rnd.recv_handles)
        if peers:
            return (
                f"{rnd.label}: timed out after {timeout_s:g} s waiting to receive "
                f"from rank {peers} (COCCL_TIMEOUT_S); do all ranks call the same "
                "collective with the same count, dtype and options?"
            )
        peers = _pending_peers(rnd.send_handles or [])
        if peers:
            return (
                f"{rnd.label}: timed out after {timeout_s:g} s waiting for "
                f"rank {peers} to take a message (COCCL_TIMEOUT_S)"
            )
    return f"{label}: timed out after {timeout_s:g} s waiting for local compute (COCCL_TIMEOUT_S)"


def may_send(rnd: Round, transport: PollingTransport) -> bool:
    """Whether a round's sends may start: once its ``pre`` has run; or, over a transport
    whose sends are copied out on the compute stream (staged MPI), as soon as ``pre``'s
    kernels are enqueued (a GPU executor's handle: ``submit`` enqueued them): the copy
    then runs right after them, with no host round trip between."""
    handle = rnd.pre_handle
    if isinstance(handle, EventHandle) and transport.sends_follow_stream:
        return True
    return handle.done()


def landed_buffers(rnd: Round) -> list[Any]:
    """Buffers whose bytes are those of a completed receive: a round with no compute of
    its own that sends what its dependencies received (a ring AllGather forward). A
    staged transport may send them from the host copy they arrived in."""
    if rnd.pre is not None:
        return []
    return [buf for dep in rnd.deps if dep.forwards for _, buf in dep.recvs]


def advance(rnd: Round, transport: PollingTransport, executor: Any) -> bool:
    """Move one unfinished round as far as it can go without blocking; True if any of its
    steps completed (a finished round never counts: it must not look like progress while
    an earlier round is stuck)."""
    changed = False
    if rnd.pre_handle is None and all(dep.ready for dep in rnd.deps):
        # With dependencies, even an empty pre goes through the FIFO executor: the sends
        # must wait for the dependencies' posts, which may still be queued there.
        rnd.pre_handle = executor.submit(rnd.pre if rnd.pre or not rnd.deps else _noop)
        changed = True
    if rnd.send_handles is None and rnd.pre_handle is not None and may_send(rnd, transport):
        rnd.pre_handle.result()  # re-raise a failure of the compute
        landed = landed_buffers(rnd)
        rnd.send_handles = [
            transport.isend(buf, peer, rnd.tag, landed=any(buf is b for b in landed))
            for peer, buf in rnd.sends
        ]
        changed = True
    if not rnd.recvs_done:
        # test every handle (no short-circuit): testing is what drives MPI progress
        if all([h.test() for h in rnd.recv_handles]):
            rnd.recvs_done = True
            changed = True
    if rnd.recvs_done and rnd.pre_handle is not None and rnd.post_handle is None:
        rnd.post_handle = executor.submit(rnd.post)
        changed = True
    if rnd.send_handles is not None and not rnd.sends_done:
        if all([h.test() for h in rnd.send_handles]):
            rnd.sends_done = True
            changed = True
    if rnd.sends_done and rnd.post_handle is not None and rnd.post_handle.done():
        rnd.post_handle.result()
        rnd.finished = True
        changed = True
    return changed


def run_polling(
    rounds: Iterable[Round],
    transport: PollingTransport,
    executor: Any,
    *,
    depth: int,
    timeout_s: float,
    label: str,
) -> None:
    """Run rounds over a transport whose messages complete asynchronously (MPI).

    Admits up to ``depth`` rounds (posting their receives), advances every unfinished one
    on each poll, retires finished rounds in order. A wait that makes no progress for
    ``timeout_s`` raises ``CocclError`` naming the step and the peer. On any failure
    (timeout, an error, KeyboardInterrupt) the unfinished messages are given up
    (``transport.cancel``) before the exception propagates.
    """
    source = iter(rounds)
    active: deque[Round] = deque()
    exhausted = False
    last_progress = time.monotonic()
    spins = 0
    try:
        while True:
            while not exhausted and len(active) < depth:
                rnd = next(source, None)
                if rnd is None:
                    exhausted = True
                    break
                rnd.recv_handles = [
                    transport.irecv(buf, peer, rnd.tag, forward=rnd.forwards)
                    for peer, buf in rnd.recvs
                ]
                active.append(rnd)
            if not active:
                return
            progressed = False
            for rnd in active:
                if not rnd.finished:
                    progressed |= advance(rnd, transport, executor)
            while active and active[0].finished:
                active.popleft().release()
            if progressed:
                spins = 0
                last_progress = time.monotonic()
                continue
            spins += 1
            if spins % 64 == 0 and time.monotonic() - last_progress > timeout_s:
                raise CocclError(_describe_wait(label, active, timeout_s))
            executor.idle(spins)
    except BaseException:
        transport.cancel([h for rnd in active for h in rnd.recv_handles])
        raise
    finally:
        transport.finish()
