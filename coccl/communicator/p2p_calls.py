"""Point-to-point calls of the Communicator: ``send``, ``recv``, their nonblocking forms
``isend``/``irecv``, and ``batch_p2p`` (torch's ``batch_isend_irecv``).

Messages between two ranks pair in the order they are posted, on both sides; the tag is
checked, not used for matching (``coccl.communicator.p2p_agreement``). Every argument is
checked before any byte moves; then the message is handed to the communicator's
progress engine (``coccl.communicator.p2p_engine``), which exchanges the two ends'
signatures over a transport of its own (an MPI duplicate), so its messages never meet
the collectives'. Host data travels over that transport. Device data on a communicator
with NCCL travels over NCCL, in groups (``coccl.communicator.p2p_nccl``); on one without,
over MPI as the collectives' staged device data does: the codec's kernels run on the
device, on coccl's compute stream, and only each chunk's payload is copied through pinned
host memory, on that stream (``coccl.transports.mpi``), so the host never waits for the
device inside a message but where MPI needs a payload's bytes. The compute stream waits
for the caller's stream at the post; the caller's stream waits for the compute stream
when the message finishes.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from coccl import algorithms
from coccl.algorithms import p2p
from coccl.algorithms.schedule_args import chunk_elems
from coccl.communicator import p2p_agreement as agreement
from coccl.communicator.p2p_engine import Message, P2PEngine, Posting
from coccl.communicator.p2p_nccl import DeviceMessage, launch_group
from coccl.communicator.runner import refuse_p2p_capture
from coccl.communicator.sizing import p2p_chunk_bytes
from coccl.compressors import Compressor
from coccl.core.arrays import (
    Flat,
    as_flat,
    caller_stream,
    check_dtype,
    dtype_name,
    require_writeable,
)
from coccl.core.options import check_chunk_bytes
from coccl.core.transport import PollingTransport
from coccl.engine.polling import GpuExecutor, InlineExecutor
from coccl.errors import CocclError


class P2POp(NamedTuple):
    """One operation of ``batch_p2p``: ``("send", x, peer)`` or ``("recv", out, peer)``."""

    op: str
    array: Any
    peer: int


class P2PHandle:
    """A posted point-to-point message: ``wait()`` blocks until it is complete and returns
    the received array (None for a send); ``test()`` says whether it is, without blocking.
    Either drives every message of the communicator in flight; on a communicator that
    was closed or broke since, either raises CocclError.

    Over NCCL, ``wait()`` returns once both ends matched and the message's group is
    enqueued: the received array is ready in the order of the stream that was current at
    the post (as a collective's result over NCCL), and the host does not wait for the
    device; ``test()`` is True once the device work has ended too. Device data over MPI:
    ``wait()`` returns once the transfers are done, the received array ready in the order
    of the stream that was current at the post."""

    def __init__(self, engine: P2PEngine, message: Message, check: Callable[[], None]) -> None:
        self._engine = engine
        self._message = message
        self._check = check

    def wait(self) -> Any:
        """Block until the message is complete; the received array (None for a send)."""
        if not self._message.finished:
            self._check()
        return self._engine.wait(self._message)

    def test(self) -> bool:
        """Whether the message is complete (polls every message in flight once)."""
        if not self._message.finished:
            self._check()
        return self._engine.test(self._message)


class PointToPointCalls:
    """The point-to-point methods of ``Communicator`` (a mixin; see the module docstring)."""

    rank: int
    size: int
    _p2p: P2PEngine | None

    def _init_point_to_point(self, transport: PollingTransport | None) -> None:
        """Start the progress engine on ``transport`` (None: p2p calls raise)."""
        self._p2p = None
        if transport is None:
            return
        self._p2p = self._resources.p2p = P2PEngine(  # type: ignore[attr-defined]
            self.rank,
            transport,
            # MPI says how large its tags may be; other transports give MPI's guarantee
            getattr(transport, "tag_ub", agreement.GUARANTEED_TAG_UB),
            self._settings.timeout_s,  # type: ignore[attr-defined]
            self._settings.pipeline_depth,  # type: ignore[attr-defined]
            # weakly: the engine lives in the resources a finalizer holds, so a bound
            # method would keep an unclosed communicator alive forever
            partial(_break_weakly, weakref.ref(self)),
            None if self._nccl is None else partial(_launch_weakly, weakref.ref(self)),  # type: ignore[attr-defined]
            self._runner.cpu_threads,  # type: ignore[attr-defined]
        )

    # ------------------------------------------------------------ public calls
    def send(
        self,
        x: Any,
        dst: int,
        *,
        compressor: str | dict | Compressor = "identity",
        tag: int = 0,
        chunk_bytes: int | None = None,
    ) -> None:
        """Send ``x`` to rank ``dst``, which must post the matching ``recv`` (same count,
        dtype, compressor and tag; messages between two ranks pair in posting order).

        Args:
            x: contiguous numpy/CuPy/numba-device array or torch tensor.
            dst: the receiving rank (not this rank: use ``isend``/``irecv`` for that).
            compressor: a codec name or label, config dict or Compressor; lossy codecs decode
                within their bound, chunk by chunk, pipelined.
            tag: an integer both ends must give alike (checked, not matched on).
            chunk_bytes: pipeline chunk size (default: ``sizing.p2p_chunk_bytes``); both ends alike.

        Raises:
            TypeError, ValueError: bad arguments, before any byte moves.
            CocclError: the ends disagree, or no matching recv within COCCL_TIMEOUT_S.
        """
        self._refuse_self(dst, "send")
        self.isend(x, dst, compressor=compressor, tag=tag, chunk_bytes=chunk_bytes).wait()

    def recv(
        self,
        out: Any = None,
        src: int | None = None,
        *,
        compressor: str | dict | Compressor = "identity",
        tag: int = 0,
        count: int | None = None,
        dtype: Any = None,
        shape: Sequence[int] | None = None,
        chunk_bytes: int | None = None,
    ) -> Any:
        """Receive a message from rank ``src`` into ``out``, or into a new numpy array on
        the host of ``count`` elements of ``dtype`` (shaped ``shape``), and return it.
        The other arguments as ``send``'s; to receive into device memory, pass ``out``."""
        self._refuse_self(src, "recv")
        handle = self.irecv(
            out, src, compressor=compressor, tag=tag, count=count, dtype=dtype,
            shape=shape, chunk_bytes=chunk_bytes,
        )  # fmt: skip
        return handle.wait()

    def isend(
        self,
        x: Any,
        dst: int,
        *,
        compressor: str | dict | Compressor = "identity",
        tag: int = 0,
        chunk_bytes: int | None = None,
    ) -> P2PHandle:
        """``send`` without waiting: returns a handle (``wait()``, ``test()``). ``x`` must
        not change until the handle is complete."""
        engine = self._engine()
        posting = self._sending(x, dst, compressor, tag, chunk_bytes)
        return self._handles(engine, [posting])[0]

    def irecv(
        self,
        out: Any = None,
        src: int | None = None,
        *,
        compressor: str | dict | Compressor = "identity",
        tag: int = 0,
        count: int | None = None,
        dtype: Any = None,
        shape: Sequence[int] | None = None,
        chunk_bytes: int | None = None,
    ) -> P2PHandle:
        """``recv`` without waiting: returns a handle whose ``wait()`` returns the array."""
        engine = self._engine()
        out = _output(out, count, dtype, shape)
        posting = self._receiving(out, src, compressor, tag, chunk_bytes)
        return self._handles(engine, [posting])[0]

    def batch_p2p(
        self,
        ops: Sequence[tuple[str, Any, int] | P2POp],
        *,
        compressor: str | dict | Compressor = "identity",
        tag: int = 0,
        chunk_bytes: int | None = None,
    ) -> list[P2PHandle]:
        """Post several sends and receives at once (torch's ``batch_isend_irecv``):
        ``("send", x, peer)`` and ``("recv", out, peer)``, every one checked before any
        is posted; all progress together, so rings of exchanges in both directions
        cannot deadlock. Several messages to one peer pair in the order given. Over
        NCCL the batch is one group of its own, launched at once (after the messages
        posted before it).

        Returns:
            one handle per op, in order (``wait()`` returns ``out`` for receives).
        """
        engine = self._engine()
        if not isinstance(ops, (list, tuple)):
            raise ValueError(f"ops must be a list of (kind, array, peer), got {ops!r}")
        postings = []
        for i, op in enumerate(ops):
            if not isinstance(op, tuple) or len(op) != 3 or op[0] not in p2p.KINDS:
                raise ValueError(f"op {i} must be ('send' | 'recv', array, peer), got {op!r}")
            kind, arr, peer = op
            if kind == "send":
                postings.append(self._sending(arr, peer, compressor, tag, chunk_bytes))
            else:
                postings.append(self._receiving(arr, peer, compressor, tag, chunk_bytes))
        return self._handles(engine, postings, group=True)

    def _handles(
        self, engine: P2PEngine, postings: list[Posting], group: bool = False
    ) -> list[P2PHandle]:
        check = self._check_usable  # type: ignore[attr-defined]
        return [P2PHandle(engine, m, check) for m in engine.post(postings, group)]

    def p2p_over_nccl(self, device_id: int | None) -> bool:
        """Whether point-to-point messages of device data on GPU ``device_id`` travel
        over NCCL: False for host data (None), and on a communicator without NCCL or
        whose NCCL runs on another GPU."""
        nccl = self._nccl  # type: ignore[attr-defined]
        return device_id is not None and nccl is not None and device_id == nccl.device_id

    def _p2p_pools(self) -> list[Any]:
        """The pools of the point-to-point transport (its pinned staging buffers)."""
        return [] if self._p2p is None else self._p2p.transport.pools()

    # --------------------------------------------------------------- checks
    def _engine(self) -> P2PEngine:
        self._check_usable()  # type: ignore[attr-defined]
        if self._p2p is None:
            raise CocclError(
                "this communicator has no point-to-point transport (it was created "
                "without one: coccl.communicator.setup.create's make_p2p)"
            )
        return self._p2p

    def _refuse_self(self, peer: Any, what: str) -> None:
        # the peer checked as the posting checks it (numpy integers too), so that no
        # blocking call to this rank gets past the checks to wait COCCL_TIMEOUT_S for itself
        if self._check_peer(peer, "dst" if what == "send" else "src") == self.rank:
            raise ValueError(
                f"a blocking {what} to this rank itself ({peer}) can never be matched; "
                "post both ends with isend/irecv or batch_p2p"
            )

    def _check_peer(self, peer: Any, name: str) -> int:
        if isinstance(peer, bool) or not isinstance(peer, (int, np.integer)):
            raise ValueError(f"{name} must be a rank in 0..{self.size - 1}, got {peer!r}")
        if not 0 <= peer < self.size:
            raise ValueError(f"{name} must be a rank in 0..{self.size - 1}, got {peer!r}")
        return int(peer)

    def _sending(self, x: Any, dst: Any, compressor: Any, tag: Any, chunk_bytes: Any) -> Posting:
        """A send's checks and its posting: over NCCL for device data on a communicator
        with NCCL, else as host bytes (device data is copied to the host after the
        caller's stream)."""
        peer = self._check_peer(dst, "dst")
        src = as_flat(x, "x")
        streamed = self._streams(src)
        codec, sig = self._signature(src, compressor, tag, chunk_bytes, streamed)
        if streamed:
            return self._streamed("send", peer, codec, sig, src)
        if src.device_id is not None:
            return self._staged("send", peer, codec, sig, src)
        return self._posting("send", peer, codec, sig, src.data, lambda: None)

    def _receiving(
        self, out: Any, src: Any, compressor: Any, tag: Any, chunk_bytes: Any
    ) -> Posting:
        """A receive's checks and its posting: into ``out``, or through a host copy
        that is copied to ``out``'s device once the message is complete."""
        peer = self._check_peer(src, "src")
        require_writeable(out, "out")
        dst = as_flat(out, "out")
        streamed = self._streams(dst)
        codec, sig = self._signature(dst, compressor, tag, chunk_bytes, streamed)
        if streamed:
            return self._streamed("recv", peer, codec, sig, dst)
        if dst.device_id is not None:
            return self._staged("recv", peer, codec, sig, dst)
        return self._posting("recv", peer, codec, sig, dst.data, lambda: dst.obj)

    def _streams(self, flat: Flat) -> bool:
        """Whether ``flat`` travels over NCCL: device data on a communicator with NCCL
        (ValueError for data on another GPU than NCCL's)."""
        if flat.device_id is None:
            return False
        route, _ = self._planner.route(flat.device_id)  # type: ignore[attr-defined]
        return route == "nccl"

    def _signature(
        self, flat: Flat, compressor: Any, tag: Any, chunk_bytes: Any, streamed: bool
    ) -> tuple[Compressor, dict]:
        tag = agreement.check_tag(tag)
        check_chunk_bytes(chunk_bytes)
        codec = self._planner.codec(compressor)  # type: ignore[attr-defined]
        codec.check_dtype(flat.dtype)
        settings = self._settings  # type: ignore[attr-defined]
        wire = "nccl" if streamed else "mpi"
        chunk = chunk_bytes
        if chunk is None:
            chunk = p2p_chunk_bytes(
                wire,
                settings_chunk=settings.chunk_bytes,
                chunk_set=settings.chunk_bytes_set,
                compressed=not codec.lossless,
                itemsize=flat.dtype.itemsize,
                count=flat.size,
            )
        elems = chunk_elems(int(chunk), flat.dtype.itemsize, codec.alignment)
        name = dtype_name(flat.dtype)
        return codec, agreement.signature(flat.size, name, codec.get_config(), tag, elems, wire)

    def _p2p_args(
        self, kind: str, codec: Compressor, sig: dict, dtype: np.dtype, pool: Any
    ) -> algorithms.ScheduleArgs:
        """The schedule arguments of one message's rounds (every wire alike)."""
        runner = self._runner  # type: ignore[attr-defined]
        return algorithms.ScheduleArgs(
            rank=self.rank,
            size=self.size,
            codec=codec,
            dtype=dtype,
            op="sum",
            chunk_elems=sig["chunk_elems"],
            pool=pool,
            label=f"point-to-point {kind}",
            depth=self._p2p.depth,  # type: ignore[union-attr]
            call=runner.stream_call(codec, p2p=True) if kind == "send" else 0,
        )

    def _posting(
        self, kind: str, peer: int, codec: Compressor, sig: dict, data: Any, finish: Any
    ) -> Posting:
        runner = self._runner  # type: ignore[attr-defined]
        plan = self._p2p_args(kind, codec, sig, np.dtype(data.dtype), runner.host_pool)
        schedule = p2p.send if kind == "send" else p2p.recv
        executor = runner._executor(min(sig["chunk_elems"], data.size) * data.dtype.itemsize)
        return Posting(kind, peer, sig, lambda: schedule(plan, data, peer), executor, finish)

    def _staged(self, kind: str, peer: int, codec: Compressor, sig: dict, flat: Flat) -> Posting:
        """The posting of device data over MPI (see the module docstring): its rounds on
        the device's pool and compute stream, which waits for the caller's stream now;
        the caller's stream waits for it once the message is complete."""
        runner = self._runner  # type: ignore[attr-defined]
        refuse_p2p_capture(caller_stream(flat.obj), f"a point-to-point {kind}", "MPI")
        ctx = runner._device(flat.device_id)
        aware = self._p2p.transport.cuda_aware  # type: ignore[union-attr]
        with ctx.device:
            caller = caller_stream(flat.obj)
            ctx.enter(caller, all_streams=False, host=aware)
        plan = self._p2p_args(kind, codec, sig, flat.dtype, ctx.pool)
        schedule = p2p.send if kind == "send" else p2p.recv
        result = flat.obj if kind == "recv" else None

        def finish() -> Any:
            with ctx.device:
                caller.wait_event(ctx.event(ctx.compute))
            return result

        return Posting(
            kind, peer, sig, lambda: schedule(plan, flat.data, peer), GpuExecutor(ctx.compute),
            finish, stream=(ctx.device, ctx.compute),
        )  # fmt: skip

    def _streamed(self, kind: str, peer: int, codec: Compressor, sig: dict, flat: Flat) -> Posting:
        """The posting of a message over NCCL: its chunks from (or into) the caller's
        array, its stream state recorded now (``p2p_nccl``); launched by the engine."""
        refuse_p2p_capture(caller_stream(flat.obj), f"a point-to-point {kind}", "NCCL")
        runner = self._runner  # type: ignore[attr-defined]
        ctx = runner._device(flat.device_id)
        with ctx.device:
            caller = caller_stream(flat.obj)
            device = DeviceMessage(caller, ctx.event(caller))
        plan = self._p2p_args(kind, codec, sig, flat.dtype, ctx.pool)
        schedule = p2p.send if kind == "send" else p2p.recv
        result = flat.obj if kind == "recv" else None

        def finish() -> Any:
            device.order_caller()
            return result

        return Posting(
            kind, peer, sig, lambda: schedule(plan, flat.data, peer), InlineExecutor(), finish,
            streamed=True, device=device,
        )  # fmt: skip

    def _launch_group(self, postings: list[Posting]) -> None:
        """The engine's launch of a group of streamed messages (``p2p_nccl``)."""
        runner = self._runner  # type: ignore[attr-defined]
        nccl = self._nccl  # type: ignore[attr-defined]
        ctx = runner._device(nccl.device_id)
        depth = self._p2p.depth  # type: ignore[union-attr]
        launch_group(postings, nccl, ctx, depth, runner.resources.watchdog, "point-to-point")


def _output(out: Any, count: Any, dtype: Any, shape: Any) -> Any:
    """``out``, or a new host array of ``count`` elements of ``dtype`` shaped ``shape``;
    what is given must be consistent (ValueError/TypeError otherwise)."""
    if out is not None:
        flat = as_flat(out, "out")
        if shape is not None and tuple(int(s) for s in shape) != tuple(out.shape):
            raise ValueError(f"out has shape {tuple(out.shape)}, shape is {tuple(shape)}")
        if count is not None and count != flat.size:
            raise ValueError(f"out has {flat.size} elements, count is {count}")
        if dtype is not None and check_dtype(dtype, "dtype") != flat.dtype:
            raise TypeError(f"out has dtype {dtype_name(flat.dtype)}, dtype is {dtype}")
        return out
    if dtype is None or (count is None and shape is None):
        raise ValueError("recv needs out, or count (or shape) and dtype")
    dtype = check_dtype(dtype, "dtype")
    if shape is None:
        shape = (count,)
    shape = tuple(int(s) for s in shape)
    n = int(np.prod(shape, dtype=np.int64))
    if count is not None and (isinstance(count, bool) or count != n or count < 0):
        raise ValueError(f"count {count!r} does not match shape {shape} ({n} elements)")
    if any(s < 0 for s in shape):
        raise ValueError(f"shape {shape} has a negative dimension")
    return np.empty(shape, dtype=dtype)


def _launch_weakly(ref: weakref.ref, postings: list[Posting]) -> None:
    """The engine's launch of a streamed group, on the communicator if it still exists."""
    comm = ref()
    if comm is None:
        raise CocclError("the communicator of these point-to-point messages was collected")
    comm._launch_group(postings)


def _break_weakly(ref: weakref.ref, exc: BaseException) -> None:
    """The engine's failure callback: break the communicator if it still exists."""
    comm = ref()
    if comm is not None:
        comm._break(exc)
