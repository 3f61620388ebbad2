"""coccl as a torch.distributed backend: ``import coccl.torch`` registers ``"coccl"``.

TP code talks to ``torch.distributed`` (``dist.all_reduce``, ``reduce_scatter_tensor``,
``all_gather_into_tensor``, DeviceMesh, DTensor's ``parallelize_module``, Megatron's
process groups). A group created with ``backend="coccl"`` runs those three collectives
through a coccl Communicator, with the codec and schedule chosen per group, and so do
``all_to_all_single`` and point-to-point (``send``/``recv``, ``isend``/``irecv``,
``batch_isend_irecv``, with a codec per direction: ``coccl.torch.p2p``); it forwards
every other operation (broadcast, barrier, scatter, ...) to an inner Gloo group (CPU
tensors) or an inner NCCL group (CUDA tensors, created on first use,
``coccl.torch.forwarding``), so a training script runs unchanged::

    import coccl.torch
    import torch.distributed as dist

    coccl.torch.init_process_group()            # torchrun's env, or mpiexec's
    tp = dist.new_group(ranks, backend="coccl",
                        pg_options=coccl.torch.CocclOptions(compressor="taco"))
    dist.all_reduce(activations, group=tp)      # TACO FP8 on the wire
    with coccl.torch.options(tp, compressor="identity"):
        dist.all_reduce(exact_sum, group=tp)    # this call exact

What compresses (``CocclOptions``): AllReduce and ReduceScatter of floating tensors of at
least ``min_compress_bytes`` (64 KiB) with the group's codec; AllGather and all-to-all
stay exact unless ``compress`` names them (gathering parameters lossily is rarely
wanted); smaller messages
(a loss scalar, metrics), integer tensors, MAX / MIN / PRODUCT (a vocab-parallel logits
max) and the collectives not named take coccl's exact path (identity codec;
``algorithm="auto"`` where the group's codec is lossy). ReduceOps: SUM, AVG, MAX, MIN,
PRODUCT, and PREMUL_SUM where torch exposes its factor (2.13); other ops (BAND...) and
dtypes coccl does not carry (bool, complex) forward to the inner group.

A codec per level: with ``algorithm="hierarchical"`` the AllReduce and ReduceScatter run
the two-level schedule over nodes of ``COCCL_LOCAL_SIZE`` ranks (or each host's), and
``compressor`` may be an ``(intra, inter)`` pair, as the Communicator takes it (SDP4Bit's
8-bit inside the node, 4-bit across: ``("int8", {"id": "int", "bits": 4})``).

A codec per direction: ``backward_compressor`` carries the collectives issued while
autograd runs a backward pass (``in_backward()``), ``compressor`` the others. Over
DTensor's TP that puts the activations' AllReduces on one codec and the input
gradients' on another (issue #33's MXFP6 forward, NVFP4 backward)::

    mxfp6 = {"id": "mx", "element": "e2m3"}
    nvfp4 = {"id": "mx", "element": "e2m1", "block": 16, "scale": "e4m3"}
    tp = dist.new_group(ranks, backend="coccl", pg_options=coccl.torch.CocclOptions(
        compressor=mxfp6, backward_compressor=nvfp4, algorithm="two_shot"))

Every rank of a group runs the same program, so every rank issues a call in the same
direction. Ranks that do not are refused by coccl's agreement where every rank builds
the call's plan (a ``CocclError`` naming both codecs, at once), and with
``COCCL_CHECK_CALLS=1`` at every call. Unchecked, where some ranks hold their direction's
plan from earlier calls, the mismatch fails in the transport instead: a ``CocclError`` at
the group's timeout, or Gloo's own abort of a rank that receives a payload of another
size.

Under torchrun no MPI is initialized: coccl's bootstrap runs over torch's store and host
bytes over Gloo (building a group imports nothing that initializes MPI).

Data: CPU tensors travel over a private Gloo group (``coccl.torch.gloo_transport``); CUDA
tensors over coccl's NCCL transport when every rank has a GPU of its own and CuPy (the
Communicator's ``backend="auto"``), else a CUDA collective raises. A CUDA call is ordered on
the caller's current stream, as torch's NCCL is; ``Work.wait()`` makes the current stream
wait for it. A CPU call is queued on the Communicator's worker and returns at once, as
Gloo's do (``coccl.torch.work``): ``async_op=True`` overlaps it with the caller's work.
The group's ``timeout`` (and ``COCCL_TIMEOUT_S``, the smaller wins) bounds every wait.

Supported torch versions: ``coccl.torch.versions.TORCH_RANGE`` (checked when
``coccl.torch`` is imported; the backend uses ``Backend.register_backend(...,
extended_api=True)``, a Python ``ProcessGroup`` subclass and ``dist._Work``, as torchft
does).

The single-tensor collectives: torch 2.13's ``dist.all_gather_into_tensor`` and
``dist.reduce_scatter_tensor`` call a backend's ``all_gather_single`` /
``reduce_scatter_single`` (and their ``_coalesced`` forms), older versions and torch's C++
side ``_allgather_base`` / ``_reduce_scatter_base``: this group has both names, one
method each.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections import Counter
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from coccl import CallHandle, algorithms
from coccl.communicator.dp_plans import HIERARCHICAL_COLLECTIVES, is_pair
from coccl.config import settings
from coccl.torch import alltoall, p2p
from coccl.torch.forwarding import Forwarding
from coccl.torch.forwarding import or_default as _or
from coccl.torch.gloo_transport import GlooTransport, StoreBootstrap, as_timedelta
from coccl.torch.group_options import (
    COMPRESSIBLE,
    DEFAULT_MIN_COMPRESS_BYTES,
    CocclOptions,
    effective,
    in_backward,
    options,
)
from coccl.torch.work import CocclWork, Steps

log = logging.getLogger(__name__)

BACKEND = "coccl"
COLLECTIVES = algorithms.COLLECTIVES
P2P_WAITERS = 256  # point-to-point waits in flight at once (threads, started as needed)
_CARRIED = p2p.CARRIED  # the collectives forward other dtypes to the inner group
_EXACT_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.AVG: "avg",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.PRODUCT: "prod",
}


# ------------------------------------------------------------------ the group
class CocclProcessGroup(Forwarding, dist.ProcessGroup):
    """The process group behind ``backend="coccl"`` (build it through torch.distributed).

    Attributes:
        comm: the coccl Communicator that runs the group's collectives.
    """

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        size: int,
        timeout: timedelta,
        opts: CocclOptions,
    ) -> None:
        super().__init__(rank, size)
        self._store = store
        self._timeout = timeout
        self._options = opts
        self._group_name: str | None = None
        self._counts: Counter[str] = Counter()
        self._batch: list[p2p.Pending] | None = None  # messages of a coalesced batch
        self._coalesced: list[CallHandle] = []  # its collectives' calls in flight
        # Collective creation, in the same order on every rank: the Gloo group that
        # forwarded operations use, then the Communicator (its bootstrap over the store,
        # its own Gloo groups for host bytes and for point-to-point messages, so these
        # never meet the collectives', NCCL for device bytes where it can).
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, timeout)
        self._nccl: Any = None
        env = settings()
        env = dataclasses.replace(env, timeout_s=min(env.timeout_s, timeout.total_seconds()))

        def make_host(env: Any, prefix: str = "wire/", waiters: int | None = None) -> Any:
            wire_store = dist.PrefixStore(prefix, store)
            wire = dist.ProcessGroupGloo(wire_store, rank, size, as_timedelta(env.timeout_s))
            return GlooTransport(wire, env.timeout_s, env.pipeline_depth, waiters)

        from coccl.communicator import create  # noqa: PLC0415

        backend = {"auto": "auto", "nccl": "nccl", "none": "mpi"}[opts.device_backend]
        boot = StoreBootstrap(dist.PrefixStore("boot/", store), rank, size)
        make_p2p = functools.partial(make_host, prefix="p2p/", waiters=P2P_WAITERS)
        self.comm = create(boot, make_host, backend, env, make_p2p)  # keeps torch's threads

    # ------------------------------------------------------------ identity
    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND

    @property
    def group_name(self) -> str:
        if self._group_name is None:
            raise ValueError("this coccl process group has no name yet")
        return self._group_name

    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def options(self) -> CocclOptions:
        """The group's options (``pg_options``), before any ``options()`` override."""
        return self._options

    def stats(self) -> dict[str, int]:
        """Calls so far, by ``collective:path`` (``allreduce:compressed``,
        ``allreduce:exact``, ``forwarded:broadcast``...)."""
        return dict(self._counts)

    def note_call(self, collective: str, path: str) -> None:
        """Count a call that a coccl helper made through this group's Communicator
        (FSDP2's comm objects, ``coccl.torch.fsdp``) as the group's own calls are."""
        self._counts[f"{collective}:{path}"] += 1

    def __repr__(self) -> str:
        return f"CocclProcessGroup(rank={self.rank()}, size={self.size()}, {self._options})"

    # ------------------------------------------------------- coccl's own three
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        op = _reduce_op(opts)
        if not self._carries(tensors, op):
            return self._forward("allreduce", tensors, _or(opts, c10d.AllreduceOptions))
        return self._work(tensors, [self._run("allreduce", t, t, op) for t in tensors])

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        op = _reduce_op(opts)
        if not self._carries(tensors, op):
            return self._forward(
                "allreduce_coalesced", tensors, _or(opts, c10d.AllreduceCoalescedOptions)
            )
        return self._work(tensors, [self._run("allreduce", t, t, op) for t in tensors])

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None):
        op = _reduce_op(opts)
        if not self._carries([input], op):
            return self._forward(
                "_reduce_scatter_base", output, input, _or(opts, c10d.ReduceScatterOptions)
            )
        return self._work([output], [self._run("reduce_scatter", input, output, op)])

    def reduce_scatter_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Any:
        op = _reduce_op(opts)
        if not self._carries(inputs, op):
            return self._forward(
                "reduce_scatter_tensor_coalesced", outputs, inputs,
                _or(opts, c10d.ReduceScatterOptions),
            )  # fmt: skip
        pairs = zip(outputs, inputs, strict=True)
        return self._work(outputs, [self._run("reduce_scatter", x, out, op) for out, x in pairs])

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None):
        if not self._carries([input], ("sum", None)):
            return self._forward("_allgather_base", output, input, _or(opts, c10d.AllgatherOptions))
        return self._work([output], [self._run("allgather", input, output, ("sum", None))])

    def allgather_into_tensor_coalesced(
        self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None
    ) -> Any:
        if not self._carries(inputs, ("sum", None)):
            return self._forward(
                "allgather_into_tensor_coalesced", outputs, inputs,
                _or(opts, c10d.AllgatherOptions),
            )  # fmt: skip
        pairs = zip(outputs, inputs, strict=True)
        return self._work(
            outputs, [self._run("allgather", x, out, ("sum", None)) for out, x in pairs]
        )

    # torch 2.13's Python API calls these names; older versions (and torch's C++ side)
    # call the ones above.
    all_gather_single = _allgather_base
    reduce_scatter_single = _reduce_scatter_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def _carries(self, tensors: list[torch.Tensor], op: tuple[str, Any] | None) -> bool:
        """Whether coccl runs this call (else the inner group does): an op and dtypes it
        has (PREMUL_SUM's factor on floating tensors only, as it is applied after the
        sum: the inner group refuses it on the others before any byte moves)."""
        if op is None:
            return False
        if op[1] is not None and not all(t.is_floating_point() for t in tensors):
            return False
        return all(t.dtype in _CARRIED for t in tensors)

    def _run(
        self, collective: str, x: torch.Tensor, out: torch.Tensor, op: tuple
    ) -> CallHandle | None:
        """One coccl collective of ``x`` into ``out`` with the options in force; a
        non-contiguous (strided, a view's) ``x`` or ``out`` is copied in or out, counted
        as ``copied:<collective>``. CPU tensors: the call is queued on the Communicator
        and its handle returned (its last step copies a strided ``out`` back and applies
        PREMUL_SUM's factor). CUDA tensors: enqueued on the current stream; None."""
        name, factor = op
        self._check_device(x)
        path, kwargs = self.call_arguments(collective, x, name)
        self._counts[f"{collective}:{path}"] += 1
        src = x if x.is_contiguous() else x.contiguous()
        dst = (
            out
            if out.is_contiguous()
            else torch.empty(out.shape, dtype=out.dtype, device=out.device)
        )
        if src is not x or dst is not out:
            self._counts[f"copied:{collective}"] += 1
            if out is x:
                dst = src  # in place: the contiguous copy is the output too

        def finish() -> None:
            if dst is not out:
                out.copy_(dst)
            if factor is not None:  # PREMUL_SUM: the sum of factor * x is factor * the sum
                out.mul_(factor)

        if x.is_cuda:
            getattr(self.comm, collective)(src, dst, **kwargs)
            finish()
            return None
        comm = self.comm
        start = {"allreduce": comm.iallreduce, "reduce_scatter": comm.ireduce_scatter,
                 "allgather": comm.iallgather}[collective]  # fmt: skip
        return Steps([start(src, dst, **kwargs)], finish)

    def _work(self, outputs: list[torch.Tensor], handles: list[CallHandle | None]) -> CocclWork:
        """The Work of a call's pieces: complete when every queued piece is (CUDA
        pieces are on the current stream already). Inside a coalescing block the pieces
        belong to the block's Work too (torch keeps that one, not this)."""
        pending = [h for h in handles if h is not None]
        if self._batch is not None:
            self._coalesced += pending
        if not pending:
            return CocclWork(outputs)
        return CocclWork(outputs, handle=pending[0] if len(pending) == 1 else Steps(pending, None))

    def _check_device(self, x: torch.Tensor) -> None:
        if x.is_cuda and self.comm.backend != "nccl":
            raise ValueError(
                "this coccl group moves no CUDA tensors: its ranks do not each have a GPU of "
                "their own with CuPy, or device_backend='none' (CocclOptions)"
            )

    def call_arguments(
        self, collective: str, x: torch.Tensor, op: str = "sum", backward: bool | None = None
    ) -> tuple[str, dict[str, Any]]:
        """What this group passes to its Communicator for ``collective`` of ``x`` with the
        options in force: ``(path, keyword arguments)``, path ``"compressed"`` or
        ``"exact"`` (``coccl.torch.describe`` shows the plan). ``backward``: the
        direction (``backward_compressor`` or ``compressor``); None: ``in_backward()``."""
        opts = self._effective()
        if backward is None:
            backward = in_backward()
        codec_arg, codecs = opts.compressor_for(backward)
        lossy = not all(codec.lossless for codec in codecs)
        if lossy and not (
            collective in opts.compress and compressible(x, op, opts.min_compress_bytes)
        ):
            algorithm, compressor, path = "auto", "identity", "exact"
        else:
            algorithm, compressor = opts.algorithm, codec_arg
            path = "compressed" if lossy else "exact"
        one_level = collective not in HIERARCHICAL_COLLECTIVES
        if collective == "alltoall" or (one_level and algorithm == "hierarchical"):
            algorithm = "auto"  # all-to-all: one schedule; AllGather: no two-level one
        if one_level and is_pair(compressor):  # a lossless pair: CocclOptions lets no
            compressor = "identity"  # lossy one compress these
        kwargs: dict[str, Any] = {
            "algorithm": algorithm, "compressor": compressor, "chunk_bytes": opts.chunk_bytes,
        }  # fmt: skip
        if collective in ("allreduce", "reduce_scatter"):
            kwargs["op"] = op
        return path, kwargs

    def _effective(self) -> CocclOptions:
        """The group's options with the ``options()`` overrides in force for it."""
        return effective(self._options, self)

    def alltoall_base(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_splits: list[int],
        input_splits: list[int],
        opts: Any = None,
    ) -> Any:
        """``all_to_all_single`` through the Communicator (``coccl.torch.alltoall``)."""
        if not self._carries([input, output], ("sum", None)):
            return self._forward(
                "alltoall_base", output, input, output_splits, input_splits,
                _or(opts, c10d.AllToAllOptions),
            )  # fmt: skip
        self._check_device(input)
        path, kwargs = self.call_arguments("alltoall", input)
        self._counts[f"alltoall:{path}"] += 1
        if alltoall.run(self.comm, output, input, output_splits, input_splits, kwargs):
            self._counts["copied:alltoall"] += 1
        return CocclWork([output])

    all_to_all_single = alltoall_base  # torch 2.13's name

    # ----------------------------------------------------------- point to point
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Any:
        """Post a send through the Communicator with the direction's codec
        (``coccl.torch.p2p``); the Work completes with the message."""
        return self._post("send", tensors, dst, tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Any:
        """Post a receive (see ``send``)."""
        return self._post("recv", tensors, src, tag)

    def _post(self, kind: str, tensors: list[torch.Tensor], peer: int, tag: int) -> Any:
        pending = p2p.post(self.comm, self._effective(), kind, tensors, peer, tag, self._counts)
        if self._batch is not None:
            self._batch.append(pending)
        return CocclWork(list(tensors), handle=pending)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> Any:
        raise ValueError(
            "a coccl group pairs point-to-point messages by peer and posting order: a receive "
            "from any source cannot be paired; give recv a src"
        )

    def barrier(self, opts: Any = None) -> Any:
        """Every rank of the group has reached it, and this rank's coccl calls issued
        before it have completed, as a Gloo barrier waits for the group's earlier work:
        the Communicator's barrier, which keeps the issue order of its calls."""
        self._counts["barrier"] += 1
        self.comm.barrier()
        return CocclWork([])

    def _start_coalescing(self, device: Any) -> None:
        """torch's coalescing manager (``batch_isend_irecv`` of CUDA tensors in some torch
        versions, ``_coalescing_manager(device=...)``) opens a batch: the messages posted
        and the collectives issued until ``_end_coalescing``."""
        self._batch, self._coalesced = [], []

    def _end_coalescing(self, device: Any) -> Any:
        """One Work for every message and collective of the batch (each was posted or
        queued as it came): torch returns it in place of theirs."""
        batch, self._batch = self._batch or [], None
        calls, self._coalesced = self._coalesced, []
        if not calls:
            return CocclWork([], handle=p2p.Pending(batch))
        return CocclWork([], handle=Steps([p2p.Pending(batch), *calls], None))

    # ------------------------------------------------------------ lifecycle
    def shutdown(self) -> None:
        """Free the Communicator and the inner groups (torch calls this from
        ``destroy_process_group``): the Gloo groups are destroyed here, while the
        interpreter is alive, not at its exit (see ``GlooTransport.close``)."""
        self.comm.close()
        if self._nccl is not None:
            self._nccl.shutdown()
        self._gloo = self._nccl = None

    def abort(self) -> None:
        self.comm.close()
        if self._nccl is not None:
            self._nccl.abort()
        self._gloo = self._nccl = None


def compressible(x: torch.Tensor, op: str, min_compress_bytes: int) -> bool:
    """Whether a lossy codec may carry ``x``: a floating tensor of at least
    ``min_compress_bytes``, summed or averaged (``op`` ``"sum"`` for a gather); every
    other call of a lossy group runs exact."""
    return (
        x.is_floating_point()
        and x.numel() * x.element_size() >= min_compress_bytes
        and op in ("sum", "avg")
    )


def _reduce_op(opts: Any) -> tuple[str, Any] | None:
    """``(coccl op, premultiplier or None)`` of a torch options object, or None for an op
    coccl does not run (BAND, BOR, BXOR; PREMUL_SUM where torch hides the factor)."""
    op = dist.ReduceOp.SUM if opts is None else getattr(opts, "reduceOp", opts)
    if op == dist.ReduceOp.PREMUL_SUM:
        factor = getattr(op, "factor", None)  # torch >= 2.13 exposes it
        return None if factor is None else ("sum", factor)
    for known, name in _EXACT_OPS.items():
        if op == known:
            return name, None
    return None


# ------------------------------------------------------------- registration
def create_group(dist_opts: Any, pg_options: Any) -> CocclProcessGroup:
    """torch's creator for ``backend="coccl"`` (extended API: it gets ``pg_options``);
    the autoload entry point (``coccl_autoload``) calls it too."""
    if pg_options is None:
        pg_options = CocclOptions()
    if not isinstance(pg_options, CocclOptions):
        raise TypeError(
            f"pg_options of a coccl group must be coccl.torch.CocclOptions, got "
            f"{type(pg_options).__name__}"
        )
    return CocclProcessGroup(
        dist_opts.store, dist_opts.group_rank, dist_opts.group_size, dist_opts.timeout,
        pg_options,
    )  # fmt: skip


def register_backend() -> None:
    """Register ``"coccl"`` with torch.distributed (``import coccl.torch`` does it once)."""
    if BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, create_group, extended_api=True, devices=["cpu", "cuda"])


register_backend()


__all__ = [
    "BACKEND",
    "COMPRESSIBLE",
    "DEFAULT_MIN_COMPRESS_BYTES",
    "CocclOptions",
    "CocclProcessGroup",
    "CocclWork",
    "create_group",
    "in_backward",
    "options",
    "register_backend",
]
