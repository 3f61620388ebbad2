"""The handle of a call in flight, as every nonblocking call returns it: the
Communicator's nonblocking collectives (``coccl.communicator.nonblocking``), its
point-to-point messages (``P2PHandle``), and what the torch backend's ``Work`` completes
from (``coccl.torch.work``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class CallHandle(Protocol):
    """A call in flight."""

    def wait(self) -> Any:
        """Block until the call is complete; its result (None for a call without one).
        Raises what the call raised."""
        ...

    def test(self) -> bool:
        """Whether the call is complete, without blocking."""
        ...


@runtime_checkable
class NotifyingHandle(CallHandle, Protocol):
    """A handle that says when it completes: ``fn()`` runs once the call has finished,
    on the thread that finished it (at once if it has)."""

    def add_done_callback(self, fn: Callable[[], None]) -> None: ...
