"""The watchdog of stream-ordered calls (``coccl.engine.watchdog``) on the host, with
stand-ins for CuPy's events: a close drains the watched calls first (NCCL's destroy would
wait for a stuck one forever), a stuck call or a failed event query fires the watchdog
with a message, and its thread leaves other threads' captures alone."""

from __future__ import annotations

import sys
import threading
from types import SimpleNamespace

import pytest

from coccl.engine import watchdog as wd

BOUND_S = 30  # a drain that has not returned by then hangs (a failure, never a timing)


class _Event:
    def __init__(self, fail: bool = False):
        self.finished = False
        self.fail = fail

    def record(self, stream) -> None:
        pass

    @property
    def done(self) -> bool:
        if self.fail:
            raise RuntimeError("cudaErrorIllegalAddress")
        return self.finished


@pytest.fixture
def threads(monkeypatch):
    """The names of the threads that left other threads' captures alone."""
    cuda = SimpleNamespace(Device=lambda i: SimpleNamespace(use=lambda: None))
    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(cuda=cuda))
    names: list[str] = []
    monkeypatch.setattr(
        wd, "ignore_other_threads_captures", lambda: names.append(threading.current_thread().name)
    )
    return names


def _watch(event: _Event, timeout_s: float) -> tuple[wd.Watchdog, list[str]]:
    messages: list[str] = []
    watchdog = wd.Watchdog(0, timeout_s, messages.append)
    watchdog._free.append(event)  # track() records this one
    watchdog.track(None, "allreduce (ring, taco)")
    return watchdog, messages


def _drain(watchdog: wd.Watchdog) -> None:
    drainer = threading.Thread(target=watchdog.drain, daemon=True)
    drainer.start()
    drainer.join(BOUND_S)
    assert not drainer.is_alive(), "drain() did not return"


def test_drain_waits_for_the_watched_call(threads):
    event = _Event()
    watchdog, messages = _watch(event, 600)
    finish = threading.Timer(3 * wd.POLL_S, lambda: setattr(event, "finished", True))
    finish.start()
    _drain(watchdog)
    assert event.finished and not watchdog.fired and messages == []
    watchdog.close()
    assert threads == ["coccl-watchdog"]


def test_drain_ends_when_a_stuck_call_times_out(threads):
    watchdog, messages = _watch(_Event(), 2 * wd.POLL_S)
    _drain(watchdog)
    assert watchdog.fired
    assert len(messages) == 1 and "allreduce (ring, taco): not finished" in messages[0]
    watchdog.close()


def test_a_failed_query_fires_the_watchdog(threads):
    watchdog, messages = _watch(_Event(fail=True), 600)
    _drain(watchdog)
    assert watchdog.fired
    assert len(messages) == 1 and "could not query" in messages[0]
    assert "cudaErrorIllegalAddress" in messages[0]
    watchdog.close()


def test_drain_without_calls_returns(threads):
    wd.Watchdog(0, 600, print).drain()  # no thread: nothing to wait for
