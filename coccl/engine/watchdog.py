"""A watchdog for stream-ordered calls, whose host side returns before the device work ends.

A collective over NCCL (eager, replayed from a CUDA graph, or NCCL's own) only enqueues
work; if a peer never joins, the device waits forever and the host learns nothing until it
synchronizes, outside coccl. As torch's ProcessGroupNCCL does, a background thread watches
each call's completion event: a call still unfinished ``timeout_s`` after it was issued
(or an asynchronous NCCL error) fires ``on_expire`` once, which aborts the NCCL
communicator (the stuck kernels return) and marks the coccl communicator unusable, so the
next call raises instead of hanging.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from coccl.engine.graphs import ignore_other_threads_captures

log = logging.getLogger(__name__)

POLL_S = 0.05


class Watchdog:
    """Watches completion events of calls on one device.

    Args:
        device_id: the GPU the events live on (the thread makes it current).
        timeout_s: how long a call may take.
        on_expire: called once, from the watchdog thread, with a message naming the call.
        check: called every poll (e.g. NCCL's asynchronous error check); an exception
            from it fires ``on_expire`` with its message.
    """

    def __init__(
        self,
        device_id: int,
        timeout_s: float,
        on_expire: Callable[[str], None],
        check: Callable[[], None] | None = None,
    ) -> None:
        self._device_id = device_id
        self._timeout_s = timeout_s
        self._on_expire = on_expire
        self._check = check
        self._pending: deque[tuple[Any, float, str]] = deque()
        self._free: list[Any] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._polling = False
        self.fired = False

    def track(self, stream: Any, label: str) -> None:
        """Watch the work enqueued on ``stream`` so far (the call named ``label``)."""
        if self._timeout_s == float("inf"):
            return
        import cupy as cp  # noqa: PLC0415

        with self._lock:
            event = self._free.pop() if self._free else None
        if event is None:
            event = cp.cuda.Event(block=False, disable_timing=True)
        event.record(stream)
        with self._lock:
            self._pending.append((event, time.monotonic() + self._timeout_s, label))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="coccl-watchdog", daemon=True)
            self._thread.start()
            # stopped before the interpreter tears down CuPy, also if nobody closes it
            atexit.register(self.close)

    def _run(self) -> None:
        import cupy as cp  # noqa: PLC0415

        cp.cuda.Device(self._device_id).use()
        ignore_other_threads_captures()  # the caller may capture while events are queried
        while not self._stop.wait(POLL_S):
            try:
                message = self._poll()
            except Exception as exc:  # noqa: BLE001  (a failed query: no call can be watched)
                message = f"coccl's watchdog could not query a call's completion: {exc}"
            if message is not None:
                self.fired = True
                log.error("%s", message)
                self._on_expire(message)
                return

    def _poll(self) -> str | None:
        if self._check is not None:
            try:
                self._check()
            except Exception as exc:
                return str(exc)
        now = time.monotonic()
        with self._lock:
            pending, self._pending = self._pending, deque()
            self._polling = True  # ``pending`` is out of ``_pending`` until put back
        late = None
        keep: deque[tuple[Any, float, str]] = deque()
        done = []
        for event, deadline, label in pending:
            if event.done:
                done.append(event)
            else:
                keep.append((event, deadline, label))
                if now > deadline and late is None:
                    late = label
        with self._lock:
            keep.extend(self._pending)
            self._pending = keep
            self._free.extend(done)
            self._polling = False
        if late is not None:
            return (
                f"{late}: not finished after {self._timeout_s:g} s (COCCL_TIMEOUT_S); a peer "
                "did not join it (do all ranks make the same calls?): the NCCL communicator "
                "was aborted"
            )
        return None

    def drain(self) -> None:
        """Wait until every watched call has finished, or until the watchdog fires (the
        NCCL communicator is aborted then): what a communicator's close waits for before
        it destroys NCCL, which would wait for a stuck call forever."""
        while not self.fired and self._thread is not None and self._thread.is_alive():
            with self._lock:
                if not self._pending and not self._polling:
                    return
            time.sleep(POLL_S / 5)

    def close(self) -> None:
        """Stop watching (idempotent)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * POLL_S + 1)
            atexit.unregister(self.close)
