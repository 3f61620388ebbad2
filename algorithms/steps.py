"""Building blocks shared by the ring and two-shot schedules: the compute of one chunk
(encode own data, reduce received payloads, finish a reduced chunk) and the hand-over of
a payload from the round that produces it to the round that consumes it, and the order
in which chains of steps over chunks are issued (``waves``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from coccl.core.arrays import address
from coccl.core.pool import Block
from coccl.core.rounds import Round

from .schedule_args import ScheduleArgs, Span


@dataclass
class Pending:
    """A payload one round produces and a later round consumes.

    ``block`` is a reference taken for the consumer (None for a view of user memory);
    the consumer holds it, so the buffer lives until the consumer finishes.
    """

    round: Round | None
    data: Any
    block: Block | None
    salt: int = 0  # a stochastic codec's salt of the encode into ``data``, if any

    def hand_to(self, consumer: Round) -> Any:
        if self.round is not None:
            consumer.deps = [*consumer.deps, self.round]
        if self.block is not None:
            consumer.holds.append(self.block)
        return self.data


def new_round(plan: ScheduleArgs, label: str) -> Round:
    # identity payloads are the data itself: a transport may type them (NCCL does)
    wire = plan.dtype if plan.codec.lossless else None
    return Round(label=f"{plan.label} {label}", tag=plan.next_tag(), wire_dtype=wire)


def send_own(plan: ScheduleArgs, rnd: Round, src: Any, at: int | None = None) -> Any:
    """The payload of this rank's own data ``src``, sent by ``rnd``: a view of ``src`` for
    the identity codec, else a pooled buffer that ``rnd``'s pre encodes into. ``at``:
    ``src``'s offset in the call's input, where error feedback records its loss."""
    view = plan.zero_copy(src)
    if view is not None:
        return view
    block = plan.payload(src.size)
    rnd.holds.append(block)
    return _Encode(plan, src, block.data, at)


def encode_own(plan: ScheduleArgs, src: Any, payload: Any, salt: int, at: int | None) -> None:
    """``payload = encode(src)``, and with error feedback what it lost, at ``at``."""
    plan.encode(src, payload, salt)
    if at is not None:
        plan.feed_back(at, src, payload)


class _Encode:
    """A deferred encode of ``src`` into ``data`` (run as part of a round's pre)."""

    __slots__ = ("plan", "src", "data", "salt", "at")

    def __init__(self, plan: ScheduleArgs, src: Any, data: Any, at: int | None = None) -> None:
        self.plan, self.src, self.data, self.at = plan, src, data, at
        self.salt = plan.next_salt()  # drawn as the round is built

    def __call__(self) -> None:
        encode_own(self.plan, self.src, self.data, self.salt, self.at)


def payload_of(item: Any) -> Any:
    return item.data if isinstance(item, _Encode) else item


def encodes(items: list[Any]) -> list[_Encode]:
    return [item for item in items if isinstance(item, _Encode)]


def run_all(*fns: Any) -> Any:
    """One callable running ``fns`` in order (None when there is nothing to run)."""
    todo = [fn for fn in fns if fn is not None]
    if not todo:
        return None
    if len(todo) == 1:
        return todo[0]

    def run() -> None:
        for fn in todo:
            fn()

    return run


def result_payload(plan: ScheduleArgs, dst: Any, want: bool, rnd: Round) -> Pending | None:
    """Where a reduced chunk's payload goes when every rank must decode it (AllReduce):
    ``dst`` itself for identity, else a pooled buffer referenced for the consumer."""
    if not want:
        return None
    view = plan.zero_copy(dst)
    if view is not None:
        return Pending(rnd, view, None)
    block = plan.payload(dst.size)
    rnd.holds.append(block)
    return Pending(rnd, block.data, block.retain(), plan.next_salt())


def finish(
    plan: ScheduleArgs, acc: Any, dst: Any, result: Pending | None, at: int | None = None
) -> None:
    """``acc`` holds a fully reduced chunk: apply avg's division, then write ``dst``.

    For an AllReduce the chunk is encoded once and the owner decodes its own payload,
    so it holds bitwise what every other rank will decode; with error feedback the
    owner records what that encode lost at ``at`` (the chunk's offset in ``x``).
    """
    plan.finalize(acc)
    if result is None or result.block is None:  # no payload, or the payload is dst itself
        dst[...] = acc
        return
    plan.encode(acc, result.data, result.salt)
    plan.decode(result.data, dst)
    if at is not None:
        plan.feed_back_result(at, acc, dst)


def reduce_chunk(
    plan: ScheduleArgs,
    acc: Any,
    own: Any,
    payloads: list[Any],
    dst: Any,
    result: Pending | None,
    at: int | None = None,
) -> None:
    """``dst = own (op) decode(p) for p in payloads``, reduced in ``acc``, in order
    (``at``: the chunk's offset in ``x``, for error feedback; see ``finish``)."""
    plan.load(acc, own)
    for payload in payloads:
        plan.reduce(acc, payload)
    finish(plan, acc, dst, result, at)


StepBuilder = Callable[[int], "Round | None"]


def waves(nch: int, steps: list[StepBuilder], lag: int) -> Iterator[Round]:
    """Rounds of ``steps`` (each a chain over the chunks: step s of chunk c needs step
    s - 1 of chunk c) in skewed waves: wave w runs step s of chunk w - lag * s, the later
    step first. A step runs ``lag`` chunks behind the step before it, so with ``lag`` at
    least the pipeline depth the rounds in the window do not wait on each other; and a
    chunk's payload waits about ``lag`` waves for the step that consumes it, so staging
    memory is set by chunk size, lag and step count, not by the message size (in
    step-major order a whole step's payloads, a shard's worth, would wait)."""
    nsteps = len(steps)
    lag = max(1, min(lag, nch))  # a lag of nch or more is step-major order
    for wave in range(nch + lag * (nsteps - 1)):
        for s in range(nsteps - 1, -1, -1):
            c = wave - lag * s
            if 0 <= c < nch:
                rnd = steps[s](c)
                if rnd is not None:
                    yield rnd


def own_round(
    plan: ScheduleArgs,
    x: Any,
    out: Any,
    shards: list[Span],
    own: dict[int, Pending],
    keep: bool,
    c: int,
) -> Round:
    """The first round of an AllGather's chunk c: encode this rank's chunk of its shard
    and decode it into its own slot of ``out`` (so the owner holds bitwise what the others
    decode); ``own[c]`` keeps the payload for the sends when ``keep``."""
    base = shards[plan.rank][0]
    a, b = plan.chunk(shards[plan.rank], c)
    rnd = new_round(plan, f"encode own chunk {c + 1}")
    src, dst = x[a - base : b - base], out[a:b]
    item = send_own(plan, rnd, src)
    payload = payload_of(item)
    if encodes([item]):
        block = rnd.holds[-1]
        rnd.pre = run_all(item, partial(plan.decode, payload, dst))
        if keep:
            own[c] = Pending(rnd, payload, block.retain())
    else:  # identity: copy unless x already is out's own slot (in place)
        if address(src) != address(dst):
            rnd.pre = partial(_copy, dst, src)
        own[c] = Pending(None, payload, None)
    return rnd


def _copy(dst: Any, src: Any) -> None:
    dst[...] = src
