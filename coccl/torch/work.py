"""The ``Work`` a coccl process group returns, and the handles it completes from.

A coccl call on CPU tensors is queued on its Communicator's worker (``comm.iallreduce``
and the other nonblocking forms) and returns at once, so DDP overlaps its gradient
reduce with the backward pass as it does over Gloo: the Work's ``wait()``,
``is_completed()`` and ``get_future()`` follow the call's real completion, and an
exception in the call is raised by ``wait()`` and set on the future. A call on CUDA
tensors is enqueued on the caller's stream when the group returns (``handle=None``):
``wait()`` makes the current stream wait for the event recorded after it.

``CocclWork(outputs, handle=h)`` takes any handle with ``wait()``/``test()``
(``coccl.CallHandle``: a Communicator's nonblocking call, a point-to-point message).
One that also says when it completes (``coccl.NotifyingHandle``: the queued calls)
completes the future on its own; any other completes it when the Work is waited for or
found completed. ``Steps`` is such a handle made of several, with a last step that runs
once they are complete (a copy back into a strided output, a PREMUL_SUM factor).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from coccl import CallHandle, NotifyingHandle


class Steps:
    """Several handles as one, then ``finish()`` once they are all complete: ``wait()``
    waits for each (raising the first error) and returns None; ``test()`` is True once
    every one is complete. It notifies (``add_done_callback``) when all of its handles do.
    """

    def __init__(self, handles: Sequence[CallHandle], finish: Callable[[], None] | None) -> None:
        self._handles = list(handles)
        self._finish = finish
        self._lock = threading.Lock()
        self._finished = False

    def wait(self) -> None:
        for h in self._handles:
            h.wait()
        with self._lock:  # the done callback may be finishing on the worker right now
            if not self._finished:
                if self._finish is not None:
                    self._finish()
                self._finished = True

    def test(self) -> bool:
        return all(h.test() for h in self._handles)

    @property
    def notifies(self) -> bool:
        """Whether every handle says when it completes (then so does this one)."""
        return all(
            h.notifies if isinstance(h, Steps) else isinstance(h, NotifyingHandle)
            for h in self._handles
        )

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """``fn()`` once every handle is complete (only if all of them notify)."""
        if not self.notifies:
            raise TypeError("Steps notifies only when every one of its handles does")
        left = [len(self._handles)]
        count = threading.Lock()

        def one_done() -> None:
            with count:
                left[0] -= 1
                last = left[0] == 0
            if last:
                fn()

        if not self._handles:
            fn()
        for h in self._handles:
            h.add_done_callback(one_done)  # type: ignore[attr-defined]


class CocclWork(dist._Work):
    """A coccl collective's ``Work`` (see the module docstring).

    Args:
        outputs: the tensors the call writes (the future's value).
        handle: the call in flight (``wait()``/``test()``), or None for a call that has
            completed, or is enqueued on the current CUDA stream, when the Work is made.
    """

    def __init__(self, outputs: list[torch.Tensor], handle: CallHandle | None = None) -> None:
        super().__init__()
        self._outputs = outputs
        self._handle = handle
        device = outputs[0].device if outputs else torch.device("cpu")
        self._device = device
        self._event: Any = None
        self._error: BaseException | None = None
        self._settled = False
        self._lock = threading.Lock()
        self._future_set = threading.Event()  # the future is complete (after _settled)
        self._settler: int | None = None  # the thread completing it
        if device.type == "cuda":
            # a future over CUDA tensors orders its consumers' streams after this one
            self._future: torch.futures.Future = torch.futures.Future(devices=[device])
        else:
            self._future = torch.futures.Future()
        if handle is None:
            if device.type == "cuda":
                self._event = torch.cuda.Event()
                self._event.record(torch.cuda.current_stream(device))
            self._settle(None)
        self._notifies = isinstance(handle, NotifyingHandle) and not (
            isinstance(handle, Steps) and not handle.notifies
        )
        if handle is not None and self._notifies:
            handle.add_done_callback(self._completed)

    def _completed(self) -> None:
        """The handle has completed (on the thread that completed it): settle."""
        try:
            self._handle.wait()  # type: ignore[union-attr]  # returns at once: done
        except BaseException as exc:
            self._settle(exc)
        else:
            self._settle(None)

    def _settle(self, error: BaseException | None) -> None:
        """Complete the future once, with the outputs or the error; return once it is
        complete (another thread may be completing it), so that ``wait()`` and
        ``is_completed()`` never run ahead of the future."""
        with self._lock:
            settling = not self._settled
            if settling:
                self._settled, self._error = True, error
                self._settler = threading.get_ident()
        if not settling:
            if self._settler != threading.get_ident():  # not from its own callbacks
                self._future_set.wait()
            return
        try:
            if error is None:
                self._future.set_result(self._outputs)
            else:
                self._future.set_exception(error)
        finally:
            self._future_set.set()

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until the call is complete (each call is bounded by the group's timeout
        already), or raise RuntimeError once ``timeout`` (if given and not zero, torch's
        "no timeout") has passed, as Gloo's; raises the call's exception. For CUDA, the
        current stream waits."""
        if self._handle is not None:
            try:
                in_time = _test_until(self._handle, timeout)
                if in_time:
                    self._handle.wait()
            except BaseException as exc:
                self._settle(exc)
                raise
            if not in_time:  # the call goes on, bounded by the group's timeout
                raise RuntimeError(
                    f"the coccl call did not complete within Work.wait's timeout ({timeout})"
                )
            self._settle(None)
        if self._event is not None:
            torch.cuda.current_stream(self._device).wait_event(self._event)
        if self._error is not None:
            raise self._error
        return True

    def synchronize(self) -> None:
        self.wait()

    def is_completed(self) -> bool:
        """Whether the call has ended, successfully or not (as Gloo's: a failed call is
        completed, ``is_success()`` False, ``wait()`` raises its error)."""
        if self._handle is not None:
            try:
                if not self._handle.test():
                    return False
            except BaseException as exc:
                self._settle(exc)
                return True
            self._completed()  # a handle that does not notify settles here
            return True
        return self._event is None or self._event.query()

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> Any:
        return self._error

    def result(self) -> list[torch.Tensor]:
        return self._outputs

    def get_future(self) -> torch.futures.Future:
        """The outputs' future. A handle that does not notify (a point-to-point message)
        is waited for first, so the future is never left pending with no one to settle it."""
        if self._handle is not None and not self._settled and not self._notifies:
            try:
                self.wait()
            except BaseException:  # noqa: S110  (the future holds the exception)
                pass
        return self._future


def _test_until(handle: CallHandle, timeout: timedelta | None) -> bool:
    """Poll ``handle`` until it is complete (True), or until ``timeout`` has passed
    (False); True at once without a timeout (None or zero: torch's "no timeout")."""
    if timeout is None or timeout.total_seconds() <= 0:
        return True
    deadline = time.monotonic() + timeout.total_seconds()
    pause = 1e-5
    while not handle.test():
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)
    return True
