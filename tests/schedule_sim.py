"""An in-process stand-in for a transport: runs N ranks' schedules in one process.

Each rank's schedule is an iterator of pipeline ``Round``s (``coccl.core.rounds``). The
simulator plays the polling engine's rules on every rank at once, with a window of
``depth`` admitted rounds per rank:

* admitting a round posts its receives (its ``deps`` must be rounds the same rank yielded
  earlier);
* compute runs on one FIFO executor per rank, as the polling engine's: ``pre`` is
  submitted once every dependency is ready (its receives landed and its ``post``, if it
  has one, was submitted; a dependency without dependencies of its own has submitted its
  ``pre`` too, as the engine's in-order polls ensure), and after the ``pre`` of every
  earlier round of the window whose dependencies are ready (the engine advances a
  window's rounds in order on every poll, so such a round submits first); ``post`` once
  ``pre`` was submitted and the receives landed;
* the sends are posted after ``pre`` ran; a send's bytes are read when it is matched, and
  they must not change between posting and matching (a buffer rewritten in flight is a
  schedule bug);
* a receive is paired with the send of the same (src, dst, tag), in posting order, and
  their byte counts must be equal;
* a round that exchanges through the transport's AllGather (``Round.gather``) posts its
  slot after ``pre``; the k-th such round of every rank (in round order, as a stream
  runs them) completes together, once all have posted, with slots of one size;
* a round is finished when its ``post`` ran and its sends were taken, and rounds retire
  (releasing their pool blocks) in order.

With a ``seed`` the next step is drawn at random among every enabled one on every rank, so
a missing dependency shows up as a wrong result; without one, the first enabled step is
taken (deterministic). No enabled step while rounds remain is a deadlock and fails.

After the run, the stream-ordered engine's (NCCL's) rule is checked as well: on every
(src, dst) pair the k-th send in the sender's round order pairs with the k-th receive in
the receiver's round order (same tag, same size), and every rank's tags increase, so
rounds matched in tag order cannot wait on each other in a cycle.
"""

from __future__ import annotations

import random
from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coccl.core.rounds import Round


def _bytes(buf: Any) -> np.ndarray:
    return np.asarray(buf).reshape(-1).view(np.uint8)


@dataclass(eq=False)
class _Msg:
    rank: int  # the rank that posted it
    peer: int
    tag: int
    buf: Any
    state: _State
    snapshot: np.ndarray | None = None  # a send's bytes when it was posted
    matched: bool = False


@dataclass(eq=False)
class _State:
    rnd: Round
    rank: int
    recvs: list[_Msg] = field(default_factory=list)
    sends: list[_Msg] = field(default_factory=list)
    pre_submitted: bool = False
    pre_done: bool = False
    sends_posted: bool = False
    post_submitted: bool = False
    post_done: bool = False
    finished: bool = False
    gathered: bool = False
    snapshot: np.ndarray | None = None  # an AllGather round's slot when it was posted

    @property
    def received(self) -> bool:
        return all(m.matched for m in self.recvs) and (self.rnd.gather is None or self.gathered)

    @property
    def ready(self) -> bool:
        # The polling engine's Round.ready: received, and post submitted if it has one.
        # The engine advances rounds in order on every poll, so a round without
        # dependencies has also submitted its pre before a later round looks at it; a
        # round with dependencies and no post is ready before its pre ran.
        started = self.pre_submitted or bool(self.rnd.deps)
        return self.received and started and (self.rnd.post is None or self.post_submitted)


@dataclass
class SimStats:
    """What a run moved: rounds per rank and messages (sends) per rank."""

    rounds: list[int]
    messages: list[int]
    nbytes: list[int]


class _Sim:
    def __init__(self, schedules: Sequence[Iterable[Round]], depth: int, seed: int | None):
        self.n = len(schedules)
        self.gens = [iter(s) for s in schedules]
        self.depth = depth
        self.rng = random.Random(seed) if seed is not None else None
        self.windows: list[deque[_State]] = [deque() for _ in range(self.n)]
        self.executors: list[deque[tuple[str, _State]]] = [deque() for _ in range(self.n)]
        # AllGather rounds in round order: a collective pairs the k-th of every rank
        self.gathers: list[deque[_State]] = [deque() for _ in range(self.n)]
        self.exhausted = [False] * self.n
        self.states: dict[int, _State] = {}  # id(round) -> state, for deps
        self.yielded: list[list[Round]] = [[] for _ in range(self.n)]
        # (src, dst, tag) -> messages in posting order
        self.posted_sends: dict[tuple[int, int, int], deque[_Msg]] = defaultdict(deque)
        self.posted_recvs: dict[tuple[int, int, int], deque[_Msg]] = defaultdict(deque)
        self.stats = SimStats([0] * self.n, [0] * self.n, [0] * self.n)

    # ------------------------------------------------------------------ steps
    def steps(self) -> list[tuple[str, Any]]:
        """Every step that may run now."""
        found: list[tuple[str, Any]] = []
        for r in range(self.n):
            if not self.exhausted[r] and len(self.windows[r]) < self.depth:
                found.append(("admit", r))
            if self.executors[r]:
                found.append(("compute", r))
            earlier = False  # an earlier round of the window may submit its pre
            for st in self.windows[r]:
                if st.finished:
                    continue
                if not st.pre_submitted and all(self.states[id(d)].ready for d in st.rnd.deps):
                    if not earlier:  # the engine's polls advance rounds in order
                        found.append(("submit pre", st))
                    earlier = True
                if st.pre_done and not st.sends_posted:
                    found.append(("send", st))
                if st.pre_submitted and not st.post_submitted and st.received:
                    found.append(("submit post", st))
                if st.post_done and st.sends_posted and all(m.matched for m in st.sends):
                    found.append(("finish", st))
        if all(q and q[0].snapshot is not None for q in self.gathers):
            found.append(("gather", None))
        for key, recvs in self.posted_recvs.items():
            sends = self.posted_sends.get(key)
            if recvs and sends:
                found.append(("match", key))
        return found

    def admit(self, r: int) -> None:
        rnd = next(self.gens[r], None)
        if rnd is None:
            self.exhausted[r] = True
            return
        for dep in rnd.deps:
            owner = self.states.get(id(dep))
            assert owner is not None and owner.rank == r, (
                f"rank {r} {rnd.label}: depends on a round it did not yield before"
            )
        st = _State(rnd, r)
        self.states[id(rnd)] = st
        self.yielded[r].append(rnd)
        self.stats.rounds[r] += 1
        for peer, buf in rnd.recvs:
            self._check_peer(r, peer, rnd)
            msg = _Msg(r, peer, rnd.tag, buf, st)
            st.recvs.append(msg)
            self.posted_recvs[(peer, r, rnd.tag)].append(msg)
        self.windows[r].append(st)
        if rnd.gather is not None:
            self.gathers[r].append(st)

    def _check_peer(self, r: int, peer: int, rnd: Round) -> None:
        assert isinstance(peer, int) and 0 <= peer < self.n, (
            f"rank {r} {rnd.label}: peer {peer!r} is not a rank of {self.n}"
        )

    def post_sends(self, st: _State) -> None:
        for peer, buf in st.rnd.sends:
            self._check_peer(st.rank, peer, st.rnd)
            msg = _Msg(st.rank, peer, st.rnd.tag, buf, st, snapshot=_bytes(buf).copy())
            st.sends.append(msg)
            self.posted_sends[(st.rank, peer, st.rnd.tag)].append(msg)
            self.stats.messages[st.rank] += 1
            self.stats.nbytes[st.rank] += msg.snapshot.size
        if st.rnd.gather is not None:
            st.snapshot = _bytes(st.rnd.gather[0]).copy()
        st.sends_posted = True

    def match(self, key: tuple[int, int, int]) -> None:
        send = self.posted_sends[key].popleft()
        recv = self.posted_recvs[key].popleft()
        for queues in (self.posted_sends, self.posted_recvs):
            if not queues[key]:
                del queues[key]
        data = _bytes(send.buf)
        src, dst, tag = key
        where = (
            f"rank {src} -> rank {dst} tag {tag} ({send.state.rnd.label} / {recv.state.rnd.label})"
        )
        assert np.array_equal(data, send.snapshot), f"{where}: send buffer changed in flight"
        target = _bytes(recv.buf)
        assert target.size == data.size, f"{where}: {data.size} bytes sent, {target.size} expected"
        target[...] = data
        send.matched = recv.matched = True

    def gather(self) -> None:
        """Every rank's oldest posted AllGather round, completed together."""
        group = [queue.popleft() for queue in self.gathers]
        slot = group[0].snapshot.size
        labels = ", ".join(f"rank {st.rank} {st.rnd.label}" for st in group)
        assert all(st.snapshot.size == slot for st in group), f"AllGather slots differ: {labels}"
        for st in group:
            recv = _bytes(st.rnd.gather[1])
            assert recv.size == self.n * slot, f"rank {st.rank} {st.rnd.label}: receive size"
            assert np.array_equal(_bytes(st.rnd.gather[0]), st.snapshot), (
                f"rank {st.rank} {st.rnd.label}: AllGather slot changed in flight"
            )
        for st in group:
            recv = _bytes(st.rnd.gather[1])
            for j, other in enumerate(group):
                recv[j * slot : (j + 1) * slot] = other.snapshot
            st.gathered = True

    def step(self, kind: str, arg: Any) -> None:
        if kind == "admit":
            self.admit(arg)
        elif kind == "submit pre":
            arg.pre_submitted = True
            self.executors[arg.rank].append(("pre", arg))
        elif kind == "submit post":
            arg.post_submitted = True
            self.executors[arg.rank].append(("post", arg))
        elif kind == "compute":
            self.compute(*self.executors[arg].popleft())
        elif kind == "send":
            self.post_sends(arg)
        elif kind == "match":
            self.match(arg)
        elif kind == "gather":
            self.gather()
        else:  # finish, then retire in order
            arg.finished = True
            window = self.windows[arg.rank]
            while window and window[0].finished:
                window.popleft().rnd.release()

    @staticmethod
    def compute(which: str, st: _State) -> None:
        fn = st.rnd.pre if which == "pre" else st.rnd.post
        if fn is not None:
            fn()
        if which == "pre":
            st.pre_done = True
        else:
            st.post_done = True

    def run(self) -> SimStats:
        while True:
            found = self.steps()
            if not found:
                break
            kind, arg = self.rng.choice(found) if self.rng else found[0]
            self.step(kind, arg)
        stuck = [(r, st) for r in range(self.n) for st in self.windows[r]]
        if stuck:
            raise AssertionError("deadlock: " + "; ".join(_describe(r, st) for r, st in stuck))
        self.check_stream_order()
        return self.stats

    # ----------------------------------------------------------- NCCL's order
    def check_stream_order(self) -> None:
        sends: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
        recvs: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
        for r, rounds in enumerate(self.yielded):
            tags = [rnd.tag for rnd in rounds if rnd.exchanges]
            assert all(a < b for a, b in zip(tags, tags[1:], strict=False)), (
                f"rank {r}: tags do not increase in round order: {tags}"
            )
            for rnd in rounds:
                for peer, buf in rnd.sends:
                    sends[(r, peer)].append((rnd.tag, _bytes(buf).size))
                for peer, buf in rnd.recvs:
                    recvs[(peer, r)].append((rnd.tag, _bytes(buf).size))
        for pair in set(sends) | set(recvs):
            assert sends.get(pair, []) == recvs.get(pair, []), (
                f"rank {pair[0]} -> rank {pair[1]}: sends (tag, bytes) {sends.get(pair)} do not "
                f"pair in order with receives {recvs.get(pair)}"
            )


def _describe(r: int, st: _State) -> str:
    waiting = [f"recv from {m.peer} tag {m.tag}" for m in st.recvs if not m.matched]
    waiting += [f"send to {m.peer} tag {m.tag}" for m in st.sends if not m.matched]
    if not st.pre_submitted:
        waiting.append("its dependencies")
    return f"rank {r} {st.rnd.label} waits for {', '.join(waiting) or 'nothing'}"


def run_ranks(
    schedules: Sequence[Iterable[Round]], *, depth: int = 4, seed: int | None = None
) -> SimStats:
    """Run one schedule per rank (list index = rank) to completion; see the module
    docstring for the rules checked. Raises AssertionError on any violation."""
    return _Sim(schedules, depth, seed).run()
