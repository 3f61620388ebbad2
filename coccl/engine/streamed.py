"""The streamed engine: runs a schedule's rounds over a stream-ordered transport (NCCL),
enqueueing everything on three device streams, so the host never waits inside a call.

Per round: the compute stream waits for the round's dependencies and runs ``pre``; the
communication stream waits for that and runs the round's sends and receives as one NCCL
group (or its AllGather); the post stream waits for the exchange and runs ``post``. Three
streams let round i+1's ``pre`` run while round i is on the wire and round i-1's ``post``
decodes.

The window of ``depth`` rounds is kept on the device, not by the host: when a round
retires, its pool blocks go back to the pool at once (the next round the schedule yields
may take them), and the compute stream waits for the retired round's completion event
before anything that follows. Every later round starts on the compute stream or waits for
it, so no buffer is rewritten while an earlier round still uses it. Because nothing
waits on the host, the same code runs eagerly or under CUDA stream capture (coccl.engine.graphs),
where those waits become the graph's edges.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any, Protocol

from coccl.core.rounds import Round
from coccl.core.transport import StreamedTransport


class Streams(Protocol):
    """The device streams the engine runs on (coccl.engine.device's DeviceContext)."""

    compute: Any
    comm: Any
    post: Any

    def event(self, stream: Any) -> Any:
        """A new event recorded on ``stream``."""
        ...


def run_streamed(
    rounds: Iterable[Round], transport: StreamedTransport, ctx: Streams, *, depth: int
) -> None:
    """Enqueue every round of ``rounds`` on ``ctx``'s streams (see the module docstring).

    On return, the compute stream's next work follows every round's completion; the
    caller orders its own stream after the compute stream (``DeviceContext.leave``).
    """
    window: deque[Round] = deque()

    def retire(rnd: Round) -> None:
        ctx.compute.wait_event(rnd.done_event)
        rnd.release()

    for rnd in rounds:
        for dep in rnd.deps:
            ctx.compute.wait_event(dep.done_event)
        if rnd.pre is not None:
            with ctx.compute:
                rnd.pre()
        after_pre = ctx.event(ctx.compute)
        if rnd.exchanges:
            ctx.comm.wait_event(after_pre)
            if rnd.gather is not None:
                transport.allgather_bytes(rnd.gather[0], rnd.gather[1], ctx.comm)
            else:
                transport.group_exchange(rnd.sends, rnd.recvs, ctx.comm, rnd.wire_dtype)
            exchanged = ctx.event(ctx.comm)
        else:
            exchanged = after_pre
        if rnd.post is not None:
            ctx.post.wait_event(exchanged)
            with ctx.post:
                rnd.post()
            rnd.done_event = ctx.event(ctx.post)
        else:
            rnd.done_event = exchanged
        rnd.recvs_done = True
        window.append(rnd)
        # Retire before the schedule yields the next round: it allocates that round's
        # blocks as it yields it, so the window must have room first.
        if len(window) >= depth:
            retire(window.popleft())
    while window:
        retire(window.popleft())
