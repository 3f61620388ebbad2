"""The rooted collectives: ``broadcast``, ``reduce``, ``gather`` and ``scatter``.

They are exact (no codec applies: every byte arrives as sent) and run as one star of
point-to-point messages between the root and every other rank, over the transport that
carries the data: host data over the host transport (MPI, or Gloo under torchrun),
device data over NCCL (one grouped send/receive) or staged over the host transport.
``reduce`` combines at the root in rank order, in the accumulate dtype
(``coccl.core.arrays.accumulate_dtype``), so its result is the same bitwise over every
transport and for every root. The root holds ``size - 1`` copies of ``x`` while it
reduces or gathers.

Layouts are NCCL's and MPI's: ``gather`` puts rank ``r``'s ``n`` elements at offset
``r * n`` of the root's ``size * n``; ``scatter`` sends shard ``r`` of the root's
``size * n`` elements to rank ``r``. As in MPI, a result lives on the root only
(``reduce``, ``gather``: the other ranks return None and write nothing) and the input
matters on the root only (``scatter``: the other ranks may pass ``x=None`` with an
``out``). Every rank checks its arguments before any byte moves, and the ranks agree on the
call (root, dtype, count, op) at the first call of each signature, as for the other
collectives (every call with ``COCCL_CHECK_CALLS=1``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from coccl.communicator.collectives import KINDS, check_in_place
from coccl.communicator.runner import refuse_staged_capture
from coccl.core.arrays import Flat, accumulate_dtype, as_flat, caller_stream, require_writeable
from coccl.core.reduction import check_op, combine, finalize
from coccl.core.rounds import Round
from coccl.engine.polling import GpuExecutor, InlineExecutor, run_polling
from coccl.engine.streamed import run_streamed

EXACT_CALLS = ("broadcast", "reduce", "gather", "scatter")


class ExactCalls:
    """The Communicator's rooted collectives (see the module docstring)."""

    rank: int
    size: int

    def broadcast(self, x: Any, *, root: int = 0) -> Any:
        """Copy the root's ``x`` into every rank's ``x``, in place (``MPI_Bcast``,
        ``ncclBroadcast``).

        Args:
            x: a contiguous, writeable array or tensor of the same dtype and size on every
                rank.
            root: the rank whose ``x`` is sent.

        Returns:
            ``x``.
        """
        src = self._exact_begin("broadcast", x, None, root, "sum", writes_x=True)
        n = src.size
        view = _bytes(src.data)
        if self.rank == root:
            sends = [(p, view) for p in range(self.size) if p != root and n]
            self._exact_run("broadcast", src, Round("broadcast", 0, sends=sends))
        elif n:
            self._exact_run("broadcast", src, Round("broadcast", 0, recvs=[(root, view)]))
        return x

    def reduce(self, x: Any, out: Any = None, *, root: int = 0, op: Any = "sum") -> Any:
        """Reduce every rank's ``x`` into the root's ``out`` (``MPI_Reduce``,
        ``ncclReduce``), combined in rank order in the accumulate dtype.

        Args:
            x: a contiguous array or tensor, the same dtype and size on every rank.
            out: the root's output (``x``'s size, dtype, device; may be ``x``); on other
                ranks it is checked the same way but not written.
            root: the rank that gets the result.
            op: ``"sum"``, ``"avg"``, ``"max"``, ``"min"``, ``"prod"``, or mpi4py's or
                torch's constant of one.

        Returns:
            On the root, ``out`` or a new array of ``x``'s kind and shape; else None.
        """
        src = self._exact_begin("reduce", x, out, root, op)
        name = check_op(op)
        dst = self._exact_out("reduce", src, out) if self.rank == root else None
        if self.rank != root:
            if src.size:
                self._exact_run("reduce", src, Round("reduce", 0, sends=[(root, _bytes(src.data))]))
            return None
        assert dst is not None
        peers = [p for p in range(self.size) if p != root]
        landed = {p: src.xp.empty(src.size, dtype=src.dtype) for p in peers}

        def post() -> None:
            parts = [src.data if p == root else landed[p] for p in range(self.size)]
            acc = parts[0].astype(accumulate_dtype(src.dtype))
            for part in parts[1:]:
                combine(acc, part, name)
            finalize(acc, name, self.size)
            dst.data[...] = acc.astype(src.dtype, copy=False)

        recvs = [(p, _bytes(b)) for p, b in landed.items() if src.size]
        self._exact_run("reduce", src, Round("reduce", 0, recvs=recvs, post=post))
        return dst.obj

    def gather(self, x: Any, out: Any = None, *, root: int = 0) -> Any:
        """Gather every rank's ``x`` (``n`` elements) into the root's ``out`` (``size *
        n``), rank ``r``'s at offset ``r * n`` (``MPI_Gather``). A new result has
        ``allgather``'s shape. Other ranks return None; ``out`` is checked on every rank.

        Returns:
            On the root, ``out`` or a new array; else None.
        """
        src = self._exact_begin("gather", x, out, root, "sum")
        n = src.size
        if self.rank != root:
            if n:
                self._exact_run("gather", src, Round("gather", 0, sends=[(root, _bytes(src.data))]))
            return None
        dst = self._exact_out("gather", src, out)
        slots = [dst.data[p * n : (p + 1) * n] for p in range(self.size)]

        def pre() -> None:
            slots[root][...] = src.data

        recvs = [(p, _bytes(slots[p])) for p in range(self.size) if p != root and n]
        self._exact_run("gather", src, Round("gather", 0, recvs=recvs, pre=pre))
        return dst.obj

    def scatter(self, x: Any, out: Any = None, *, root: int = 0) -> Any:
        """Send shard ``r`` of the root's ``x`` (``size * n`` elements) to rank ``r``
        (``MPI_Scatter``). A new result has ``reduce_scatter``'s shape. On other ranks
        ``x`` is only read for its dtype, size and device, and may be None when ``out``
        is given.

        Returns:
            ``out``, or a new array of ``x``'s kind holding this rank's shard.
        """
        src = self._exact_begin("scatter", x, out, root, "sum")
        dst = self._exact_out("scatter", src, out)
        n = dst.size
        if self.rank != root:
            if n:
                self._exact_run(
                    "scatter", src, Round("scatter", 0, recvs=[(root, _bytes(dst.data))])
                )
            return dst.obj
        shards = [src.data[p * n : (p + 1) * n] for p in range(self.size)]

        def pre() -> None:
            dst.data[...] = shards[root]

        sends = [(p, _bytes(shards[p])) for p in range(self.size) if p != root and n]
        self._exact_run("scatter", src, Round("scatter", 0, sends=sends, pre=pre))
        return dst.obj

    # ------------------------------------------------------------- plumbing
    def _exact_begin(
        self, what: str, x: Any, out: Any, root: Any, op: Any, writes_x: bool = False
    ) -> Flat:
        """Check a rooted call on this rank and agree on it with every rank (a refusal
        anywhere is raised everywhere); returns ``x`` as a flat view (for a non-root
        ``scatter`` with ``x=None``: ``out``'s, standing for ``x``)."""
        self._check_usable()  # type: ignore[attr-defined]
        error: BaseException | None = None
        src: Flat | None = None
        try:
            src, entry = self._exact_check(what, x, out, root, op, writes_x)
        except (TypeError, ValueError) as exc:
            error, entry = exc, ("error", f"{type(exc).__name__}: {exc}")
        self._agreement.agree_once(what, entry, error)  # type: ignore[attr-defined]
        assert src is not None
        return src

    def _exact_check(
        self, what: str, x: Any, out: Any, root: Any, op: Any, writes_x: bool
    ) -> tuple[Flat, dict[str, Any]]:
        """The argument checks of a rooted call, and the entry every rank must match."""
        if isinstance(root, bool) or not isinstance(root, int | np.integer):
            raise TypeError(f"root must be an int, got {type(root).__name__}")
        if not 0 <= root < self.size:
            raise ValueError(f"root {root} is not a rank of this communicator (size {self.size})")
        name = check_op(op)
        if x is None and what == "scatter" and self.rank != root and out is not None:
            shard = as_flat(out, "out")
            count = shard.size * self.size
            src = Flat(shard.data, out, shard.kind, (count,), shard.new)
        else:
            src = as_flat(x, "x")
            count = src.size
        if what == "reduce" and src.device_id is not None and src.dtype.name == "bfloat16":
            # CuPy has no bfloat16 arithmetic for the root's combine
            raise TypeError("reduce of bfloat16 device data is not done yet; use allreduce")
        if writes_x and self.rank != root:
            require_writeable(x, "x")
        if what == "scatter" and count % self.size:
            raise ValueError(
                f"scatter needs a multiple of the rank count ({self.size}) elements, x has {count}"
            )
        if out is not None:
            self._exact_check_out(what, src, count, out, int(root))
        self._planner.route(src.device_id)  # type: ignore[attr-defined]  # the GPU check
        entry = {
            "collective": what, "root": int(root), "dtype": src.dtype.name, "count": count,
            "op": name,
        }  # fmt: skip
        return src, entry

    def _exact_check_out(self, what: str, src: Flat, count: int, out: Any, root: int) -> None:
        require_writeable(out, "out")
        dst = as_flat(out, "out")
        wanted = {"reduce": count, "gather": count * self.size, "scatter": count // self.size}
        if dst.dtype != src.dtype:
            raise TypeError(f"out has dtype {dst.dtype.name}, x has {src.dtype.name}")
        if dst.size != wanted[what]:
            raise ValueError(f"out has {dst.size} elements; {what} needs {wanted[what]}")
        if dst.device_id != src.device_id:
            raise ValueError("out must be on the same device as x")
        if self.rank == root and src.obj is not out:  # x and out meet on the root only
            # in place as the collective of the same layout (MPI_IN_PLACE's forms)
            kind = {"reduce": "allreduce", "gather": "allgather", "scatter": "reduce_scatter"}
            itemsize = src.dtype.itemsize
            check_in_place(
                kind[what], root, src.data, count * itemsize, dst.data, dst.size * itemsize,
                call=what,
            )  # fmt: skip

    def _exact_out(self, what: str, src: Flat, out: Any) -> Flat:
        """The call's output: ``out`` (checked already), or a new array."""
        if out is not None:
            return as_flat(out, "out")
        kind = {"reduce": "allreduce", "gather": "allgather", "scatter": "reduce_scatter"}[what]
        shape = KINDS[kind].result_shape(src.shape, self.size)
        data, obj = src.new(shape)
        return Flat(data, obj, src.kind, tuple(shape), src.new)

    def _exact_run(self, what: str, src: Flat, rnd: Round) -> None:
        """Run one round over the transport that carries ``src``'s data; a failure breaks
        the communicator (its peers' state is unknown)."""
        runner = self._runner  # type: ignore[attr-defined]
        timeout_s = self._settings.timeout_s  # type: ignore[attr-defined]
        if src.device_id is not None and runner.nccl is None:
            # before anything is enqueued, and without breaking the communicator
            refuse_staged_capture(caller_stream(src.obj), f"a Communicator {what}")
        try:
            if src.device_id is None:
                run_polling([rnd], runner.host, InlineExecutor(), depth=1, timeout_s=timeout_s,
                            label=what)  # fmt: skip
                runner.host.finish()
                return
            ctx = runner._device(src.device_id)
            caller = caller_stream(src.obj)
            with ctx.device:
                ctx.enter(caller)
                if runner.nccl is not None:
                    run_streamed([rnd], runner.nccl, ctx, depth=1)
                else:
                    with ctx.compute:
                        run_polling([rnd], runner.host, GpuExecutor(ctx.compute), depth=1,
                                    timeout_s=timeout_s, label=what)  # fmt: skip
                    runner.host.finish()
                ctx.leave(caller)
            if runner.nccl is not None:
                runner.resources.watchdog.track(caller, what)
        except BaseException as exc:
            self._break(exc)  # type: ignore[attr-defined]
            raise


def _bytes(a: Any) -> Any:
    """A flat array's bytes, as the transports move them."""
    return a.view(np.uint8)
