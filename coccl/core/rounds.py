"""The chunk pipeline's unit of work: a ``Round``, one chunk-step of a schedule.

An algorithm describes a collective as an ordered stream of rounds, one per chunk and
step. A round

1. waits for its ``deps`` (earlier rounds whose received payloads or results it reads),
2. runs ``pre`` (encode, decode-accumulate + re-encode...), which fills its send buffers,
3. exchanges: its sends and receives (or its AllGather),
4. runs ``post`` once its receives have landed (decode into the output, final reduce),
5. finishes, and releases the pool blocks it holds.

At most ``depth`` rounds are in flight at once, which bounds the staging memory by the
chunk size and depth, never by the message size. While round i's payload is on the wire,
round i+1's ``pre`` runs and round i-1's ``post``: that is the overlap.

Two engines run rounds: ``coccl.engine.polling.run_polling`` over a transport whose messages
complete asynchronously (MPI: the host polls), and ``coccl.engine.streamed.run_streamed`` over a
stream-ordered one (NCCL: everything is enqueued on device streams, and can be captured
as a CUDA graph). Every rank generates the same rounds in the same order; a round's tag is
its position in that order, so out-of-order completion can never pair the wrong messages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from coccl.core.pool import Block

TAG_MODULUS = 32768  # MPI guarantees tags up to 32767


@dataclass(eq=False)
class Round:
    """One chunk-step of a schedule (see the module docstring).

    ``gather``: instead of ``sends``/``recvs``, a round may exchange through the
    transport's AllGather: ``(send, recv)``, ``recv`` holding ``size`` slots of
    ``send.size`` bytes (streamed transports only).
    """

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
    gather: tuple[Any, Any] | None = None

    # polling engine state
    pre_handle: Any = None
    post_handle: Any = None
    send_handles: list[Any] | None = None
    recv_handles: list[Any] = field(default_factory=list)
    recvs_done: bool = False
    sends_done: bool = False
    finished: bool = False
    # streamed engine: the event marking the round's completion on the device timelines
    done_event: Any = None

    @property
    def ready(self) -> bool:
        """Dependents may run: received data landed and ``post`` was submitted."""
        return self.recvs_done and (self.post is None or self.post_handle is not None)

    @property
    def exchanges(self) -> bool:
        """Whether the round moves any bytes."""
        return bool(self.sends or self.recvs or self.gather)

    def release(self) -> None:
        """The round is done: its pool blocks go back, and it lets go of its steps and
        dependencies. A step's payload (``Pending``) points back at the round that made
        it, so a round holding its steps is a reference cycle through the caller's
        buffers; only the garbage collector would free those, at a time of its choosing,
        and torch's cudagraph trees snapshot their pool when a recording ends, counting
        a buffer still held then as allocated for good."""
        for block in self.holds:
            block.release()
        self.holds.clear()
        self.pre = self.post = None  # done_event and recvs_done stay: dependents read them
        self.deps = ()
