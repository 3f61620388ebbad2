"""Nonblocking forms of the Communicator's collectives, and the order every call runs in.

Calls pair across ranks by issue order, as MPI's nonblocking collectives do: every rank
must issue the same collectives, blocking or not, in the same order. Each communicator
keeps one FIFO of calls (``CallQueue``), run by one worker thread that is started by the
first nonblocking call:

* a nonblocking call of host data (numpy, CPU torch tensors; ``ibarrier``) is checked
  for its argument names at once (a misspelt keyword raises ``TypeError`` on the spot,
  not on the worker while the peers wait), queued, and run on the worker by the blocking
  call itself, so every check, agreement and failure is the blocking call's: a refusal
  raises on every rank alike, a failure after bytes moved breaks the communicator. Its
  handle (``QueuedCall``) returns the result from ``wait()`` or raises what the call
  raised; ``test()`` says whether it has finished, without blocking; the worker makes
  progress whether or not anyone waits.
* a blocking call waits for the calls queued before it (its own turn), then runs on the
  caller's thread: blocking and nonblocking calls keep their issue order.
* a call of device data also waits for its turn and then runs on the caller's thread,
  where the caller's current stream is: over NCCL it returns once its work is enqueued on
  that stream (NCCL's own collectives, a CUDA graph's replay and the streamed engine only
  enqueue), over MPI once the staged transfer is done. Its handle (``StreamHandle``) holds
  an event recorded on the caller's stream after the call: ``test()`` queries it,
  ``wait()`` makes the current stream of the result's framework wait for it (as torch's
  ``Work.wait()`` does) and returns the result.

A completion callback (``add_done_callback``, a torch future's ``then``) runs on the worker
when it is registered before the call completes: a call it makes runs at once there,
ahead of the calls queued behind (waiting for its turn would wait for the worker itself);
waiting there for a queued handle, or closing the communicator, raises ``CocclError``.
Point-to-point calls are not in this order (their messages pair per peer, on a transport
of their own) and may progress while a queued collective runs. ``close()`` lets the
queued calls run to their end (each bounded by COCCL_TIMEOUT_S, as a blocking call is);
``abort()`` refuses the ones not yet started (their handles raise ``CocclError``) and
waits only for the one running. The caller must not change an input, nor read an output,
until its handle is complete.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any

from coccl.communicator import buckets
from coccl.core.arrays import caller_stream, signature
from coccl.core.handles import CallHandle
from coccl.errors import CocclError

# The collectives that keep the issue order (a blocking one waits for its turn), and
# those of them that take a list of arrays as one bucket (``coccl.communicator.buckets``).
ORDERED_CALLS = (
    "allreduce", "reduce_scatter", "allgather", "alltoall", "broadcast", "reduce",
    "gather", "scatter", "barrier", "split", "overlap_profile",
)  # fmt: skip
BUCKET_CALLS = buckets.COLLECTIVES


class QueuedCall:
    """The handle of a call queued on a communicator's worker (see the module docstring)."""

    def __init__(self, future: Future, label: str, queue: CallQueue) -> None:
        self._future = future
        self.label = label
        self._queue = queue

    def wait(self) -> Any:
        """Block until the call has run; its result, or the exception it raised."""
        if not self._future.done() and self._queue.on_worker():
            raise CocclError(
                f"a completion callback waits for the queued {self.label}, which runs only "
                "after the callback has returned: it would wait forever"
            )
        return self._future.result()

    def test(self) -> bool:
        """Whether the call has run (successfully or not)."""
        return self._future.done()

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        self._future.add_done_callback(lambda _: fn())

    def __repr__(self) -> str:
        return f"QueuedCall({self.label}, {'done' if self.test() else 'pending'})"


class StreamHandle:
    """The handle of a device call already ordered on the caller's stream: an event
    recorded on that stream after the call's work."""

    def __init__(self, result: Any, array: Any, label: str) -> None:
        import cupy  # noqa: PLC0415

        self._result, self._array, self.label = result, array, label
        with cupy.cuda.Device(signature(array)[3]):
            self._event = cupy.cuda.Event(disable_timing=True)
            self._event.record(caller_stream(array))

    def wait(self) -> Any:
        """Make the current stream (of the array's framework) wait for the call; the
        result."""
        caller_stream(self._array).wait_event(self._event)
        return self._result

    def test(self) -> bool:
        """Whether the call's work on the device has finished."""
        return bool(self._event.done)


_WORKER = threading.local()  # .token: the CallQueue token of the worker running here


def _mark_worker(token: object) -> None:
    _WORKER.token = token


class CallQueue:
    """One communicator's FIFO of calls and the worker thread that runs them.

    The worker holds a token, not the queue, so an unclosed communicator can still be
    collected (its executor then lets the thread end)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # held while a call is issued or run on the caller
        self._token = object()
        self._pool: ThreadPoolExecutor | None = None
        self._last: Future | None = None
        self._refusal: str | None = None
        self._stopped = False

    def on_worker(self) -> bool:
        """Whether the calling thread is this queue's worker."""
        return getattr(_WORKER, "token", None) is self._token

    def submit(self, fn: Callable[[], Any]) -> Future:
        """Queue ``fn`` behind every call queued before (hold ``lock``); the future of
        its result."""
        if self._stopped:
            raise CocclError("this communicator is closed")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                1, "coccl-calls", initializer=_mark_worker, initargs=(self._token,)
            )
        result: Future = Future()
        self._last = self._pool.submit(self._run, fn, result)
        return result

    def _run(self, fn: Callable[[], Any], result: Future) -> None:
        # The result's callbacks run here, inside the call's turn: the queue's own future
        # (``_last``) ends after them, so no blocking call starts beside a call that a
        # callback makes (a future wakes its waiters before it runs its callbacks).
        try:
            if self._refusal is not None:
                raise CocclError(self._refusal)
            value = fn()
        except BaseException as exc:  # noqa: BLE001  (the handle raises it)
            result.set_exception(exc)
        else:
            result.set_result(value)

    def drain(self) -> None:
        """Wait until every queued call has run (FIFO: the last one's end is theirs)."""
        last = self._last
        if last is not None and not last.done():
            wait_futures([last])

    def stop(self, refusal: str | None) -> None:
        """Let the queued calls run (``refusal`` None) or refuse those not yet started,
        then end the worker."""
        with self.lock:
            if refusal is not None:
                self._refusal = refusal
            self.drain()
            self._stopped = True
            if self._pool is not None:
                self._pool.shutdown(wait=True)


class NonblockingCalls:
    """The Communicator's nonblocking collectives (a mixin; see the module docstring).
    Each takes its blocking form's arguments, keywords passed through unchanged, and
    returns a handle (``wait()`` returns the blocking form's result; ``test()``)."""

    def iallreduce(self, x: Any, out: Any = None, **kwargs: Any) -> CallHandle:
        """``allreduce`` without waiting (``x`` may be a list: one bucket)."""
        return self._issue(self.allreduce, x, out, **kwargs)  # type: ignore[attr-defined]

    def ireduce_scatter(self, x: Any, out: Any = None, **kwargs: Any) -> CallHandle:
        """``reduce_scatter`` without waiting (``x`` may be a list: one bucket)."""
        return self._issue(self.reduce_scatter, x, out, **kwargs)  # type: ignore[attr-defined]

    def iallgather(self, x: Any, out: Any = None, **kwargs: Any) -> CallHandle:
        """``allgather`` without waiting (``x`` may be a list: one bucket)."""
        return self._issue(self.allgather, x, out, **kwargs)  # type: ignore[attr-defined]

    def ialltoall(self, x: Any, out: Any = None, **kwargs: Any) -> CallHandle:
        """``alltoall`` without waiting."""
        return self._issue(self.alltoall, x, out, **kwargs)  # type: ignore[attr-defined]

    def ibroadcast(self, x: Any, **kwargs: Any) -> CallHandle:
        """``broadcast`` without waiting; ``wait()`` returns ``x``."""
        return self._issue(self.broadcast, x, **kwargs)  # type: ignore[attr-defined]

    def ireduce(self, x: Any, out: Any = None, **kwargs: Any) -> CallHandle:
        """``reduce`` without waiting; ``wait()`` returns None off the root."""
        return self._issue(self.reduce, x, out, **kwargs)  # type: ignore[attr-defined]

    def igather(self, x: Any, out: Any = None, **kwargs: Any) -> CallHandle:
        """``gather`` without waiting; ``wait()`` returns None off the root."""
        return self._issue(self.gather, x, out, **kwargs)  # type: ignore[attr-defined]

    def iscatter(self, x: Any, out: Any = None, **kwargs: Any) -> CallHandle:
        """``scatter`` without waiting."""
        return self._issue(self.scatter, x, out, **kwargs)  # type: ignore[attr-defined]

    def ibarrier(self) -> CallHandle:
        """``barrier`` without waiting: ``test()`` is True once every rank has called it."""
        return self._issue(self.barrier)  # type: ignore[attr-defined]

    # ------------------------------------------------------------- plumbing
    @property
    def _calls(self) -> CallQueue:
        queue = self.__dict__.get("_call_queue")
        if queue is None:
            queue = self.__dict__.setdefault("_call_queue", CallQueue())
        return queue

    def _issue(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> CallHandle:
        """Queue ``method(*args, **kwargs)`` (host data), or run it now on the caller's
        stream (device data), after the calls issued before it."""
        _signature_of(method.__func__).bind(self, *args, **kwargs)  # type: ignore[attr-defined]
        self._check_usable()  # type: ignore[attr-defined]
        label = method.__name__
        queue = self._calls
        device = _device_array(args, kwargs)
        if queue.on_worker():  # from a completion callback: at once (the lock may be held)
            return _ran_now(functools.partial(method, *args, **kwargs), label, queue, device)
        with queue.lock:
            if device is None:
                future = queue.submit(functools.partial(method, *args, **kwargs))
                return QueuedCall(future, label, queue)
            queue.drain()
            return StreamHandle(method(*args, **kwargs), device, label)


def _ran_now(call: Callable[[], Any], label: str, queue: CallQueue, device: Any) -> CallHandle:
    """A call made on the worker (by a callback of the call that just completed): run at
    once, as the blocking calls made there are (waiting for its turn would wait for the
    worker itself); its handle is complete (or raises what it raised)."""
    if device is not None:
        return StreamHandle(call(), device, label)
    future: Future = Future()
    try:
        future.set_result(call())
    except Exception as exc:
        future.set_exception(exc)
    return QueuedCall(future, label, queue)


@functools.lru_cache(maxsize=64)
def _signature_of(fn: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(fn)


def _device_array(args: tuple, kwargs: dict[str, Any]) -> Any:
    """The call's first array (``x``, else ``out``; a bucket's first element) if it is
    device data, else None."""
    for a in (*args[:2], kwargs.get("x"), kwargs.get("out")):
        if isinstance(a, (list, tuple)):
            a = a[0] if a else None
        if a is not None:
            return a if signature(a)[3] is not None else None
    return None


def in_issue_order(cls: type) -> type:
    """Class decorator of the Communicator: its collectives (``ORDERED_CALLS``) keep the
    issue order with the queued calls, those in ``BUCKET_CALLS`` take a list of arrays
    as one bucket, and ``close``/``abort`` end the queue first (see the module docstring)."""
    for name in ORDERED_CALLS:
        setattr(cls, name, _ordered(getattr(cls, name), name in BUCKET_CALLS))
    cls.close = _ending(cls.close, None)  # type: ignore[attr-defined]
    cls.abort = _ending(cls.abort, "this communicator was aborted before the call ran")  # type: ignore[attr-defined]
    return cls


def _ordered(method: Callable[..., Any], bucketed: bool) -> Callable[..., Any]:
    """``method`` run in its turn: on the worker at once, elsewhere after the calls
    queued before it; with a list of arrays as ``x``, as one bucket."""

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if bucketed and isinstance(args[0] if args else kwargs.get("x"), (list, tuple)):
            xs = args[0] if args else kwargs.pop("x")
            out = args[1] if len(args) > 1 else kwargs.pop("out", None)
            if len(args) > 2:  # keyword-only in the blocking form: let it say so
                return method(self, *args, **kwargs)
            one = functools.partial(method, self)
            agree = self._agreement.agree_once
            return buckets.run(one, method.__name__, self.rank, self.size, xs, out, kwargs, agree)
        return method(self, *args, **kwargs)

    @functools.wraps(method)
    def in_turn(self: Any, *args: Any, **kwargs: Any) -> Any:
        queue = self._calls
        if queue.on_worker():
            return run(self, *args, **kwargs)
        with queue.lock:
            queue.drain()
            return run(self, *args, **kwargs)

    return in_turn


def _ending(method: Callable[[Any], None], refusal: str | None) -> Callable[[Any], None]:
    """``close``/``abort`` after the queue has ended (its calls run, or are refused)."""

    @functools.wraps(method)
    def end(self: Any) -> None:
        queue = self.__dict__.get("_call_queue")
        if queue is not None:
            if queue.on_worker():
                raise CocclError(
                    f"{method.__name__}() from a completion callback would wait for the "
                    "worker that runs it; call it after the callback"
                )
            queue.stop(refusal)
        method(self)

    return end
