"""The chunk pipeline: runs a schedule's rounds so that compute and transfers overlap.

An algorithm describes a collective as an ordered stream of ``Round``s, one per chunk
and step. A round

1. waits for its ``deps`` (earlier rounds whose received payloads or results it reads),
2. runs ``pre`` on the compute executor (encode, decode-accumulate + re-encode...),
   which fills its send buffers,
3. exchanges: its receives were posted when it was admitted; its sends are posted once
   ``pre`` has completed,
4. runs ``post`` once its receives have landed (decode into the output, final reduce),
5. finishes when its sends and ``post`` are complete, and releases the pool blocks it
   holds.

At most ``depth`` rounds are admitted at once, which bounds the staging memory by the
chunk size and depth, never by the message size. While round i's payload is on the wire,
round i+1's ``pre`` runs and round i-1's ``post``: that is the overlap.

Executors are FIFO: a ``pre`` submitted after a dependency's ``post`` runs after it. On
the CPU the executor is one worker thread running numba kernels that release the GIL,
while the main thread keeps MPI progressing; on the GPU it is a compute stream (kernels
are enqueued, completion is an event).

Every rank generates the same rounds in the same order; a round's tag is its position in
that order, so out-of-order completion can never pair the wrong messages.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from coccl.errors import CocclError
from coccl.pool import Block

TAG_MODULUS = 32768  # MPI guarantees tags up to 32767


@dataclass(eq=False)
class Round:
    """One chunk-step of a schedule (see the module docstring)."""

    label: str
    tag: int
    sends: list[tuple[int, Any]] = field(default_factory=list)
    recvs: list[tuple[int, Any]] = field(default_factory=list)
    pre: Callable[[], None] | None = None
    post: Callable[[], None] | None = None
    deps: Sequence[Round] = ()
    holds: list[Block] = field(default_factory=list)
    wire_dtype: Any = None  # the element type of uncompressed payloads (None: bytes)
    forwards: bool = False  # later rounds send its received payloads on unchanged

    # engine state
    pre_handle: Any = None
    post_handle: Any = None
    send_handles: list[Any] | None = None
    recv_handles: list[Any] = field(default_factory=list)
    recvs_done: bool = False
    sends_done: bool = False
    finished: bool = False
    # streamed (NCCL) engine: events marking completion on the device timelines
    exchange_event: Any = None
    done_event: Any = None

    @property
    def ready(self) -> bool:
        """Dependents may run: received data landed and ``post`` was submitted."""
        return self.recvs_done and (self.post is None or self.post_handle is not None)

    def release(self) -> None:
        for block in self.holds:
            block.release()
        self.holds.clear()


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


class CpuExecutor:
    """One worker thread: numba codec kernels run there without the GIL."""

    def __init__(self, threads: int | None = None) -> None:
        self._threads = threads
        self._pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="coccl-codec", initializer=self._init_thread
        )

    def _init_thread(self) -> None:
        if self._threads is not None:
            import numba  # noqa: PLC0415

            # numba's thread count is per calling thread: set it on the worker itself.
            numba.set_num_threads(min(self._threads, numba.config.NUMBA_NUM_THREADS))

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


class _EventHandle:
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
        return _EventHandle(event)

    idle = staticmethod(_yield)

    def close(self) -> None:
        pass


def _describe_wait(what: str, active: Iterable[Round], timeout_s: float) -> str:
    for rnd in active:
        pending = [h for h in rnd.recv_handles if not h.test()]
        if pending:
            peers = ", ".join(str(h.peer) for h in pending)
            return (
                f"{rnd.label}: timed out after {timeout_s:g} s waiting to receive "
                f"from rank {peers} (COCCL_TIMEOUT_S); do all ranks call the same "
                "collective with the same count, dtype and options?"
            )
        if rnd.send_handles is not None:
            pending = [h for h in rnd.send_handles if not h.test()]
            if pending:
                peers = ", ".join(str(h.peer) for h in pending)
                return (
                    f"{rnd.label}: timed out after {timeout_s:g} s waiting for "
                    f"rank {peers} to take a message (COCCL_TIMEOUT_S)"
                )
    return f"{what}: timed out after {timeout_s:g} s waiting for local compute (COCCL_TIMEOUT_S)"


def _may_send(rnd: Round, transport: Any) -> bool:
    """A round's sends may start once its ``pre`` has run; or, over a transport whose
    sends are copied out on the compute stream (staged MPI), as soon as ``pre``'s kernels
    are enqueued (a GPU executor's handle: ``submit`` enqueued them): the copy then runs
    right after them, with no host round trip between."""
    handle = rnd.pre_handle
    if isinstance(handle, _EventHandle) and getattr(transport, "sends_follow_stream", False):
        return True
    return handle.done()


def _landed(rnd: Round) -> list[Any]:
    """Buffers whose bytes are those of a completed receive: a round with no compute of
    its own that sends what its dependencies received (a ring AllGather forward). A
    staged transport may send them from the host copy they arrived in."""
    if rnd.pre is not None:
        return []
    return [buf for dep in rnd.deps if dep.forwards for _, buf in dep.recvs]


def _advance(rnd: Round, transport: Any, executor: Any) -> bool:
    """Move one round as far as it can go without blocking; True if anything changed."""
    changed = False
    if rnd.pre_handle is None and all(dep.ready for dep in rnd.deps):
        # With dependencies, even an empty pre goes through the FIFO executor: the sends
        # must wait for the dependencies' posts, which may still be queued there.
        rnd.pre_handle = executor.submit(rnd.pre if rnd.pre or not rnd.deps else _noop)
        changed = True
    if rnd.send_handles is None and rnd.pre_handle is not None and _may_send(rnd, transport):
        rnd.pre_handle.result()  # re-raise a failure of the compute
        landed = _landed(rnd)
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
    transport: Any,
    executor: Any,
    *,
    depth: int,
    timeout_s: float | None,
    what: str,
) -> None:
    """Run rounds over a transport whose messages complete asynchronously (MPI).

    The host thread polls: it posts receives as rounds are admitted, submits compute as
    dependencies land, posts sends as compute completes, and tests messages (which is
    what makes MPI progress). With ``timeout_s``, a wait that makes no progress for that
    long raises ``CocclError`` naming the step and the peer.
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
                progressed |= _advance(rnd, transport, executor)
            while active and active[0].finished:
                active.popleft().release()
            if progressed:
                spins = 0
                last_progress = time.monotonic()
                continue
            spins += 1
            if timeout_s is not None and spins % 64 == 0:
                if time.monotonic() - last_progress > timeout_s:
                    raise CocclError(_describe_wait(what, active, timeout_s))
            executor.idle(spins)
    finally:
        transport.finish()


def _wait_event(event: Any, transport: Any, deadline: float | None, describe: Any) -> None:
    while not event.done:
        transport.check_async_error()
        if deadline is not None and time.monotonic() > deadline:
            raise CocclError(describe())
        time.sleep(20e-6)


def run_streamed(
    rounds: Iterable[Round],
    transport: Any,
    ctx: Any,
    *,
    depth: int,
    timeout_s: float | None,
    what: str,
) -> None:
    """Run rounds over a stream-ordered transport (NCCL): nothing blocks the host but the
    window. Per round: the compute stream waits for the round's dependencies, runs
    ``pre``; the communication stream waits for that, runs the round's sends and receives
    as one NCCL group; the post stream waits for the exchange and runs ``post``. Using
    three streams lets round i+1's ``pre`` run while round i is on the wire and round
    i-1's ``post`` decodes. When ``depth`` rounds are in flight the host waits for the
    oldest (then its buffers can be reused) — with ``timeout_s``, not forever.
    """
    inflight: deque[Round] = deque()

    def retire(rnd: Round) -> None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        peers = sorted({p for p, _ in rnd.sends} | {p for p, _ in rnd.recvs})
        _wait_event(
            rnd.done_event,
            transport,
            deadline,
            lambda: (
                f"{rnd.label}: timed out after {timeout_s:g} s exchanging with "
                f"rank {', '.join(map(str, peers))} (COCCL_TIMEOUT_S)"
            ),
        )
        rnd.release()

    source = iter(rounds)
    while True:
        # Retire before taking the next round: the schedule allocates a round's blocks
        # as it yields it, so the window must have room first (depth rounds, not depth + 1).
        if len(inflight) >= depth:
            retire(inflight.popleft())
        rnd = next(source, None)
        if rnd is None:
            break
        for dep in rnd.deps:
            ctx.compute.wait_event(dep.done_event)
        if rnd.pre is not None:
            with ctx.compute:
                rnd.pre()
        ctx.comm.wait_event(ctx.event(ctx.compute))
        if rnd.sends or rnd.recvs:
            transport.group_exchange(rnd.sends, rnd.recvs, ctx.comm, rnd.wire_dtype)
        rnd.exchange_event = ctx.event(ctx.comm)
        if rnd.post is not None:
            ctx.post.wait_event(rnd.exchange_event)
            with ctx.post:
                rnd.post()
            rnd.done_event = ctx.event(ctx.post)
        else:
            rnd.done_event = rnd.exchange_event
        # a later round's pre reads this round's results: it waits on done_event
        rnd.recvs_done = True
        inflight.append(rnd)
    while inflight:
        retire(inflight.popleft())
