"""Point-to-point of device data over NCCL: a group of messages launched as one stream of
NCCL groups, and its ordering against the callers' streams.

The progress engine (``coccl.communicator.p2p_engine``) collects the streamed messages
posted since its last launch and hands them here together. Their schedules
(``coccl.algorithms.p2p``: one round per chunk, each chunk one payload) are merged round
by round: round c of the group carries the c-th chunk of every (peer, direction), as one
NCCL group (``ncclGroupStart``/``ncclGroupEnd``), so the sends and receives of an
exchange in both directions, or around a ring, progress together and cannot wait on each
other. Several messages to one peer in one direction are chained, the second's chunks
after the first's: NCCL pairs a peer's sends and receives in the order they are
enqueued, and so each end enqueues them in posting order however the messages were
grouped. The
streamed engine (``coccl.engine.streamed``) runs the merged rounds on coccl's three
streams: the encode of chunk c+1 (compute stream) runs while chunk c is on the wire
(communication stream), and the decode of chunk c (post stream) while chunk c+1 arrives.

Streams: each message records an event on its caller's stream when it is posted (the
current stream of the array's framework, ``coccl.core.arrays.caller_stream``); every
coccl stream waits for the group's events before its first round, so a send reads ``x``
after the work the caller enqueued before ``isend``. Once the group is enqueued, its
completion is one event; when a message finishes, the stream that was current at its
post waits for that event, so the received array (or the reuse of a sent one) is ordered
after the transfer on that stream, without the host waiting for the device.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain, zip_longest
from typing import Any

from coccl.core.rounds import Round
from coccl.engine.streamed import run_streamed


@dataclass(eq=False)
class DeviceMessage:
    """The stream state of one streamed message.

    Attributes:
        caller: the caller's stream at the post (it waits for ``done_event``).
        ready: an event on ``caller`` recorded at the post (the input is ready after it).
        done_event: the completion of the message's group, once launched.
    """

    caller: Any
    ready: Any
    done_event: Any = None

    def order_caller(self) -> None:
        """Make the caller's stream wait for the message's group (once it is launched)."""
        if self.done_event is not None:
            self.caller.wait_event(self.done_event)


def merged_rounds(sources: list[tuple[Any, Iterator[Round]]], label: str) -> Iterator[Round]:
    """The rounds of ``(channel, rounds)`` sources as one stream: the sources of one
    channel chained in order, then round c of every channel merged into one round (its
    sends, receives and pool blocks together, its ``pre`` and ``post`` running each
    part's in order). Point-to-point rounds depend on no other round, so merging keeps
    every round's own ordering."""
    channels: dict[Any, list[Iterator[Round]]] = {}
    for channel, rounds in sources:
        channels.setdefault(channel, []).append(rounds)
    chains = [chain(*parts) for parts in channels.values()]
    for c, parts in enumerate(zip_longest(*chains)):
        present = [rnd for rnd in parts if rnd is not None]
        merged = Round(f"{label} chunk {c + 1}", 0)
        for rnd in present:
            merged.sends.extend(rnd.sends)
            merged.recvs.extend(rnd.recvs)
            merged.holds.extend(rnd.holds)
        merged.pre = _in_order([rnd.pre for rnd in present])
        merged.post = _in_order([rnd.post for rnd in present])
        yield merged  # wire_dtype None: payloads travel as bytes (messages' types differ)


def _in_order(fns: list[Any]) -> Any:
    todo = [fn for fn in fns if fn is not None]
    if not todo:
        return None

    def run() -> None:
        for fn in todo:
            fn()

    return run


def launch_group(
    postings: list[Any], nccl: Any, ctx: Any, depth: int, watchdog: Any, label: str
) -> None:
    """Enqueue the chunks of ``postings`` (streamed ``p2p_engine.Posting``s) over
    ``nccl`` on ``ctx``'s streams (see the module docstring); sets each message's
    ``done_event`` and has the watchdog watch the group."""
    with ctx.device:
        for p in postings:
            for stream in (ctx.compute, ctx.comm, ctx.post):
                stream.wait_event(p.device.ready)
        rounds = merged_rounds([((p.peer, p.kind), p.rounds()) for p in postings], label)
        run_streamed(rounds, nccl, ctx, depth=depth)
        for stream in (ctx.comm, ctx.post):
            ctx.compute.wait_event(ctx.event(stream))
        done = ctx.event(ctx.compute)
    for p in postings:
        p.device.done_event = done
    if watchdog is not None:
        watchdog.track(ctx.compute, label)


__all__ = ["DeviceMessage", "launch_group", "merged_rounds"]
