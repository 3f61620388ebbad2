"""The point-to-point progress engine: every message this rank has posted and not yet
finished, polled together, so nonblocking sends and receives progress concurrently
(two ranks that both isend and then irecv never wait on each other).

A message (``Message``) is one end of one point-to-point message: its header
exchange (``coccl.communicator.p2p_agreement``), then the rounds of its schedule
(``coccl.algorithms.p2p``), at most ``depth`` in flight, advanced by the polling
engine's ``advance``. The engine polls every message each time a handle is waited for
or tested, and when a new message is posted. A wait that makes no progress for
COCCL_TIMEOUT_S raises ``CocclError`` naming the peer; any failure gives up every
message in flight (their receives are cancelled) and breaks the communicator.

Host messages also progress in the background, as MPI's and Gloo's do while their rank
is busy elsewhere (in a collective, a barrier, its own compute): while any is in flight,
a daemon thread polls them whenever no caller is inside the engine or waiting (a wait
polls itself), backing off while nothing moves. Without it a receive that has not
posted its data receives, or a message of more chunks than ``depth``, would stall a
peer's blocking send for as long as this rank does not call the engine. One lock
serialises the engine, held for one poll at a time (a wait polls, then lets go), so
other threads post and test meanwhile. The thread never launches, times out or raises:
a failure it meets gives the messages up as a caller's poll does, and their handles
raise it. It runs only on a transport that two threads may use at once (MPI at
``MPI_THREAD_MULTIPLE``, Gloo), with the communicator's codec threads. Device data
(staged over MPI, or over NCCL) moves at the calls only, and so does every later message
of its (peer, direction).

Device data over NCCL (a *streamed* message) exchanges its header the same way, over
the engine's polling transport, but its chunks travel over NCCL, stream-ordered: the
engine does not poll them. NCCL pairs sends and receives in posting order and a send
waits on the device until its receive is posted, so two ranks whose NCCL operations are
launched one at a time could each wait on the other (both isend, then irecv). The
engine therefore launches streamed messages in *groups*: the ones posted since the last
launch form one group, launched (``launch``: every chunk round of the group's messages
as one NCCL group) at the next ``wait``/``test`` of any handle, or at once for a
``batch_p2p``. A streamed message is finished once its group is launched and both ends'
headers matched; its data is then ordered on the caller's stream.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coccl.communicator import p2p_agreement as agreement
from coccl.core.rounds import Round
from coccl.core.transport import Handle, PollingTransport
from coccl.engine.graphs import ignore_other_threads_captures
from coccl.engine.polling import advance, limit_numba_threads
from coccl.errors import CocclError


@dataclass(eq=False)
class Posting:
    """One message as checked and prepared by the caller's end, before it is posted.

    ``rounds()`` makes its schedule's rounds; ``finish()`` runs once it is complete
    (copies a staged receive to the caller's device) and returns what ``wait`` returns.
    """

    kind: str  # "send" or "recv"
    peer: int
    sig: dict
    rounds: Callable[[], Iterator[Round]]
    executor: Any
    finish: Callable[[], Any]
    streamed: bool = False  # its chunks travel over NCCL, launched in a group
    device: Any = None  # a streamed message's stream state (p2p_nccl.DeviceMessage)
    # staged device data: (device, compute stream), current while its rounds advance, so
    # the transport's staging copies run on the stream of the codec's kernels
    stream: Any = None


@dataclass(eq=False)
class Message:
    """One end of one message in flight (see the module docstring)."""

    posting: Posting
    seq: int
    slots: int
    depth: int
    sealed: agreement.Sealed
    # the signatures agreed on this message's (peer, direction), by digest: the same on
    # both ends, shared by the engine's messages of that channel
    agreed: dict[bytes, dict]
    started: bool = False
    early: bool = False  # a receive of an agreed signature: its data receives go at once
    verified: bool = False
    finished: bool = False
    result: Any = None
    error: BaseException | None = None
    sig_send: Handle | None = None
    peer_sig: Handle | None = None
    peer_buf: Any = None
    source: Iterator[Round] | None = None
    active: list[Round] = field(default_factory=list)
    chunks: int = 0
    launched: bool = False  # a streamed message's group was launched

    @property
    def channel(self) -> tuple[int, str]:
        return self.posting.peer, self.posting.kind

    @property
    def on_host(self) -> bool:
        """Host data over the polling transport: the background thread may move it."""
        return not self.posting.streamed and self.posting.stream is None

    def _tag(self, slot: int) -> int:
        return agreement.tag_of(self.seq, slot, self.slots)

    def start(self, transport: PollingTransport) -> None:
        """Post the header exchange (the whole signature only if it is new on this
        channel); a send's data goes at once, a receive's once the sender's header
        matches, or at once if its signature was agreed before (it then decodes only once
        the header matches)."""
        p = self.posting
        mine, theirs = (0, 1) if p.kind == "send" else (1, 0)
        self.peer_buf = np.empty(agreement.HEADER_BYTES, dtype=np.uint8)
        self.peer_sig = transport.irecv(self.peer_buf, p.peer, self._tag(theirs))
        known = self.sealed.digest in self.agreed
        header = agreement.encode_header(self.sealed, whole=not known)
        self.sig_send = transport.isend(header, p.peer, self._tag(mine))
        transport.bytes_sent -= header.size  # statistics count payloads, not headers
        self.early = p.kind == "recv" and known
        if not p.streamed and (p.kind == "send" or self.early):
            self.source = p.rounds()
        self.started = True

    def poll(self, transport: PollingTransport, rank: int) -> bool:
        """Move the message as far as it can go without blocking; True on progress."""
        if self.posting.stream is None:
            return self._poll(transport, rank)
        device, stream = self.posting.stream
        with device, stream:
            return self._poll(transport, rank)

    def _poll(self, transport: PollingTransport, rank: int) -> bool:
        progressed = False
        if not self.verified and self.peer_sig.test():
            self._verify(rank)
            progressed = True
        progressed |= self._admit(transport)
        if self.verified or self.posting.kind == "send":  # a receive decodes once agreed
            for rnd in self.active:
                if not rnd.finished:
                    progressed |= advance(rnd, transport, self.posting.executor)
        while self.active and self.active[0].finished:
            self.active.pop(0).release()
        data_done = self.launched if self.posting.streamed else not self.active
        if self.verified and self.source is None and data_done and self.sig_send.test():
            self.result = self.posting.finish()
            self.finished = progressed = True
        return progressed

    def _verify(self, rank: int) -> None:
        p = self.posting
        digest, theirs = agreement.decode_header(self.peer_buf, p.peer)
        if digest != self.sealed.digest:
            raise CocclError(self._difference(rank, theirs or self.agreed.get(digest)))
        if digest not in self.agreed:
            self.agreed[digest] = self.sealed.fields()
        if p.kind == "recv" and not p.streamed and not self.early:
            self.source = p.rounds()
        self.verified = True

    def _difference(self, rank: int, theirs: dict | None) -> str:
        """What the two ends' signatures differ in (``theirs`` None: the peer's is one
        it agreed on an earlier message whose header this end has not read yet)."""
        p = self.posting
        mine = self.sealed.fields()
        sender, receiver = (rank, p.peer) if p.kind == "send" else (p.peer, rank)
        if theirs is not None:
            sent, expected = (mine, theirs) if p.kind == "send" else (theirs, mine)
            problem = agreement.mismatch(sender, receiver, sent, expected)
            if problem is not None:
                return problem
        return (
            f"point-to-point message from rank {sender} to rank {receiver}: the two ends "
            f"do not agree (rank {p.peer}'s signature, agreed on an earlier message, is "
            f"not this rank's {mine}); both ends must post the same messages in the same order"
        )

    def _admit(self, transport: PollingTransport) -> bool:
        """Admit rounds up to the depth, posting their receives under the message's tags."""
        admitted = False
        while self.source is not None and len(self.active) < self.depth:
            rnd = next(self.source, None)
            if rnd is None:
                self.source = None
                break
            rnd.tag = self._tag(agreement.chunk_slot(self.chunks))
            self.chunks += 1
            rnd.recv_handles = [transport.irecv(buf, peer, rnd.tag) for peer, buf in rnd.recvs]
            self.active.append(rnd)
            admitted = True
        return admitted

    def handles(self) -> list[Any]:
        recvs = [h for rnd in self.active for h in rnd.recv_handles]
        return recvs + ([self.peer_sig] if self.peer_sig is not None else [])

    def waiting_for(self) -> str:
        p = self.posting
        what = f"point-to-point {p.kind} {'to' if p.kind == 'send' else 'from'} rank {p.peer}"
        if not self.started:
            return f"{what}: waiting for earlier messages with rank {p.peer} to finish"
        if not self.verified:
            other = "recv" if p.kind == "send" else "send"
            if p.streamed and not self.launched:
                return f"{what}: its NCCL group was not launched"
            return f"{what} (tag {p.sig['tag']}): rank {p.peer} has not posted the matching {other}"
        return f"{what}: waiting for chunk {self.chunks - len(self.active) + 1}'s transfer"

    def device_done(self) -> bool:
        """Whether a finished streamed message's device work has ended (True otherwise)."""
        device = self.posting.device
        return device is None or device.done_event is None or bool(device.done_event.done)


class P2PEngine:
    """Every message in flight of one communicator (see the module docstring).

    Args:
        rank: this rank.
        transport: a polling transport used by nothing else (its tags are the engine's).
        tag_ub: the largest tag the transport takes.
        timeout_s: how long a wait may make no progress (COCCL_TIMEOUT_S).
        depth: rounds of one message in flight.
        on_failure: called with the exception when a message fails (bytes have moved).
        launch: enqueues a group of streamed messages' chunks (over NCCL); None: the
            communicator has no NCCL, and no message is streamed.
        codec_threads: numba threads of the codec kernels the background thread runs
            (None: numba's default).
    """

    def __init__(
        self,
        rank: int,
        transport: PollingTransport,
        tag_ub: int,
        timeout_s: float,
        depth: int,
        on_failure: Callable[[BaseException], None],
        launch: Callable[[list[Posting]], None] | None = None,
        codec_threads: int | None = None,
    ) -> None:
        self.rank = rank
        self.transport = transport
        self.slots = agreement.window(tag_ub)
        self.timeout_s = timeout_s
        self.depth = max(1, min(depth, agreement.MAX_DEPTH))
        self.on_failure = on_failure
        self.launch = launch
        self._seqs: dict[tuple[int, str], int] = {}
        self._agreed: dict[tuple[int, str], dict[bytes, dict]] = {}
        self._messages: list[Message] = []
        self._group: list[Message] = []  # streamed messages posted, not yet launched
        self._failed = False  # messages were given up after a failure
        self._stalled_since: float | None = None  # test()'s polls since the last progress
        self._last_progress = time.monotonic()  # any poll's, by any thread
        # held by whoever is inside the engine (a caller, or the background thread), for
        # one poll at a time
        self._lock = threading.RLock()
        self._background: threading.Thread | None = None  # set and cleared under _lock
        self._background_ok = transport.thread_safe
        self._waiting = 0  # callers in wait(), polling themselves: the thread stands by
        self.codec_threads = codec_threads
        self._closed = False

    def post(self, postings: list[Posting], group: bool = False) -> list[Message]:
        """Number and start the messages (in order), then poll them all once.

        ``group``: launch the streamed ones among them at once, as one group of their
        own (``batch_p2p``), after the group still open; otherwise they join the open
        group, launched at the next ``wait`` or ``test``.

        Raises ValueError, before any message is numbered, if a signature cannot fit a
        header."""
        with self._lock:
            messages = self._post(postings, group)
            if self._background_ok and any(m.on_host for m in self._messages):
                self._start_background()
            return messages

    def _post(self, postings: list[Posting], group: bool) -> list[Message]:
        sealed = [agreement.seal(p.sig) for p in postings]
        messages = []
        for p, seal in zip(postings, sealed, strict=True):
            channel = (p.peer, p.kind)
            seq = self._seqs.get(channel, 0)
            self._seqs[channel] = seq + 1
            agreed = self._agreed.setdefault(channel, {})
            messages.append(Message(p, seq, self.slots, self.depth, seal, agreed))
        self._messages.extend(messages)
        streamed = [m for m in messages if m.posting.streamed]
        if group:
            self._flush()
        self._group.extend(streamed)
        if group:
            self._flush()
        self.poll()
        return messages

    @property
    def agreements(self) -> int:
        """How many (peer, direction, signature) this rank has agreed on: one whole
        signature exchange each."""
        return sum(len(agreed) for agreed in self._agreed.values())

    def flush(self) -> None:
        """Launch the open group of streamed messages (see the module docstring)."""
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        if not self._group:
            return
        # signatures that already arrived are checked first: a mismatch found now raises
        # before the group's bytes move (one found later raises at the wait, and aborts)
        self.poll()
        group, self._group = self._group, []
        group = [m for m in group if m.error is None]
        if not group:
            return
        if self.launch is None:  # p2p_calls streams nothing without NCCL
            raise CocclError("a streamed point-to-point message on a communicator without NCCL")
        try:
            self.launch([m.posting for m in group])
        except BaseException as exc:
            self.fail(exc)
            raise
        for m in group:
            m.launched = True

    def poll(self, host_only: bool = False) -> bool:
        """Advance every message once; True if any made progress. ``host_only``: the
        host messages alone, each (peer, direction) up to its first other message."""
        with self._lock:
            try:
                return self._poll(host_only)
            except BaseException as exc:
                self.fail(exc)
                raise

    def _poll(self, host_only: bool) -> bool:
        progressed = False
        heads: dict[tuple[int, str], int] = {}
        held: set[tuple[int, str]] = set()  # host_only: channels behind device data
        for m in self._messages:
            head = heads.setdefault(m.channel, m.seq)
            if host_only and (m.channel in held or not m.on_host):
                held.add(m.channel)
                continue
            if not m.started and m.seq - head < self.slots:
                m.start(self.transport)
                progressed = True
            if m.started:
                progressed |= m.poll(self.transport, self.rank)
        self._messages = [m for m in self._messages if not m.finished]
        if progressed:
            self._stalled_since = None
            self._last_progress = time.monotonic()
        return progressed

    def _start_background(self) -> None:
        """Start the background thread unless it runs (under ``_lock``)."""
        if self._background is None:
            self._background = threading.Thread(
                target=_background_progress, args=(weakref.ref(self),), daemon=True,
                name=f"coccl-p2p-progress-{self.rank}",
            )  # fmt: skip
            self._background.start()

    def background_poll(self) -> bool | None:
        """The background thread's step: poll the host messages once unless a caller is
        inside the engine; whether that made progress, or None once no host message is
        left (or the engine is closed, or failed): the thread then ends."""
        if self._waiting or not self._lock.acquire(blocking=False):
            return False
        try:
            if self._closed or not any(m.on_host for m in self._messages):
                self._background = None
                return None
            try:
                return self.poll(host_only=True)
            except BaseException:  # noqa: BLE001  (given up: the handles raise it)
                self._background = None
                return None
        finally:
            self._lock.release()

    def wait(self, message: Message) -> Any:
        """Poll until ``message`` is finished; its result (CocclError after a timeout).
        Launches the open group of streamed messages first."""
        if not message.finished:
            self.flush()
        start = time.monotonic()
        spins = 0
        with self._lock:
            self._waiting += 1
        try:
            while True:
                with self._lock:  # one poll at a time: other threads post and test between
                    if self._check(message):
                        return message.result
                    if self.poll():
                        spins = 0
                        continue
                    spins += 1
                    # no message moved, in this wait's polls or anyone's, for timeout_s
                    if spins % 64 == 0 and (
                        time.monotonic() - max(start, self._last_progress) > self.timeout_s
                    ):
                        self._time_out(message)
                message.posting.executor.idle(spins)
        finally:
            with self._lock:
                self._waiting -= 1

    def test(self, message: Message) -> bool:
        """Poll once (after launching the open group of streamed messages); whether
        ``message`` is finished, and its device work too. A loop of tests times out as a
        wait does: once no message made progress in the tests of ``timeout_s``."""
        if message.finished and message.error is None:  # stays so: no lock to wait for
            return message.device_done()
        with self._lock:
            if not self._check(message):
                self._flush()
                if not self.poll():
                    now = time.monotonic()
                    if self._stalled_since is None:
                        self._stalled_since = now
                    elif now - self._stalled_since > self.timeout_s:
                        self._time_out(message)
            return self._check(message) and message.device_done()

    def _time_out(self, message: Message) -> None:
        """Give up every message: ``message`` made no progress in ``timeout_s``."""
        exc = CocclError(
            f"{message.waiting_for()}: timed out after {self.timeout_s:g} s (COCCL_TIMEOUT_S)"
        )
        self.fail(exc)
        raise exc

    @staticmethod
    def _check(message: Message) -> bool:
        if message.error is not None:
            raise CocclError(
                f"this point-to-point {message.posting.kind} with rank "
                f"{message.posting.peer} was given up: {message.error}"
            ) from message.error
        return message.finished

    def close(self, abandoned: bool = False) -> None:
        """Give up the messages still in flight (their receives cancelled; their handles
        then raise as the closed communicator's calls do) and close the transport. It is
        closed as abandoned (``PollingTransport.close``: what may stay unmatched is held) if
        ``abandoned`` (the communicator failed), if a message failed here, or if messages
        were given up now."""
        with self._lock:
            self._closed = True
            messages, self._messages = self._messages, []
            self._group = []
            self.transport.cancel([h for m in messages for h in m.handles()])
            self.transport.close(abandoned=abandoned or self._failed or bool(messages))
            closed = CocclError("the communicator was closed while the message was in flight")
            for m in messages:  # a wait on another thread ends now, and raises this
                m.error = m.error or closed

    def fail(self, exc: BaseException) -> None:
        """Give up every message in flight (their receives cancelled) after ``exc``."""
        with self._lock:
            messages, self._messages = self._messages, []
            self._group = []
            self._failed = True
            self.transport.cancel([h for m in messages for h in m.handles()])
            for m in messages:
                m.error = exc
        self.on_failure(exc)


# The background thread's pauses: short while messages move, doubling to the longest
# while none does (a poll costs a few microseconds of the GIL per message in flight, so a
# thousand receives that wait for their senders cost a few percent of a core).
_BACKGROUND_MIN_S = 50e-6
_BACKGROUND_MAX_S = 10e-3


def _background_progress(ref: weakref.ref) -> None:
    """The background thread of one engine (held weakly: a dropped communicator's
    finalizer closes its engine, and the thread then ends)."""
    engine = ref()
    if engine is None:
        return
    limit_numba_threads(engine.codec_threads)
    ignore_other_threads_captures()  # staged device sends' events are queried here too
    del engine
    pause = _BACKGROUND_MIN_S
    while True:
        engine = ref()
        if engine is None:
            return
        progressed = engine.background_poll()
        del engine
        if progressed is None:
            return
        pause = _BACKGROUND_MIN_S if progressed else min(2 * pause, _BACKGROUND_MAX_S)
        time.sleep(pause)
