"""Collectives on a list of arrays as one bucket: ``comm.allreduce([a, b, c])``.

A bucket's arrays are grouped by dtype (in the order each dtype first appears); each
group is copied into one staging buffer, runs as one call (one schedule, one plan, one
codec stream across the arrays' boundaries, as torch's ``all_reduce_coalesced`` and a
DDP bucket do), and is copied out into each array's result. A group of one array runs
on the array itself, without staging. Layouts follow NCCL's grouped calls:

* ``allreduce``: the arrays end to end; each result has its array's shape.
* ``reduce_scatter``: each array holds ``size * n_i`` elements; the staging buffer holds
  shard 0 of every array, then shard 1 of every array..., so that rank ``r``'s shard of
  the staged call is shard ``r`` of each array; each result is ``reduce_scatter``'s of
  its array.
* ``allgather``: each array's ``n_i`` elements end to end; rank ``r``'s gathered block
  holds every array's part, which goes to offset ``r * n_i`` of that array's result.

``out`` is None (new results of each array's kind, shape and device), a list of outputs
(one per array, each as the single call's ``out``, in place where the single call allows
it: the list ``x`` itself for ``allreduce``; no output may overlap another array of the
bucket), and the call returns the list of results. Every array and output is
checked before any byte moves (the codec against every dtype of the bucket too, so that
no group runs before another is refused); arrays of several devices are refused. An
empty list runs nothing and returns ``[]``; arrays of count 0 take part as any other.
Every rank must pass the same layout (the same dtypes and counts in the same order): the
ranks agree on it, and on any refusal, before the first group runs, at the first call
of each layout (every call with ``COCCL_CHECK_CALLS=1``), as a single call's signature.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

from coccl.communicator.collectives import KINDS, check_in_place
from coccl.compressors import get_compressor
from coccl.core.arrays import Flat, address, as_flat, caller_stream, require_writeable
from coccl.core.reduction import check_op

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather")


def run(
    call: Callable[..., Any],
    collective: str,
    rank: int,
    size: int,
    xs: Sequence[Any],
    out: Any,
    kwargs: dict[str, Any],
    agree: Callable[[str, Any, BaseException | None], None],
) -> list[Any]:
    """Run ``collective`` on the bucket ``xs`` through ``call(x, out, **kwargs)`` (the
    single-array call), one call per dtype; the list of results. ``agree(what, entry,
    error)`` agrees on the bucket with every rank (raising every rank's refusal)."""
    error: BaseException | None = None
    try:
        flats, outs = _checked(collective, rank, size, xs, out, kwargs)
        entry: Any = {
            "collective": f"{collective} of a bucket",
            "arrays": [f"{f.dtype.name}[{f.size}]" for f in flats],
        }
    except (TypeError, ValueError) as exc:
        error, entry = exc, ("error", f"{type(exc).__name__}: {exc}")
    agree(collective, entry, error)
    groups: dict[Any, list[int]] = {}
    for i, f in enumerate(flats):
        groups.setdefault(f.dtype, []).append(i)
    for members in groups.values():
        srcs, dsts = [flats[i] for i in members], [outs[i] for i in members]
        if len(members) == 1:
            call(srcs[0].obj, dsts[0].obj, **kwargs)
        else:
            _staged(call, collective, size, srcs, dsts, kwargs)
    return [o.obj for o in outs]


def _checked(
    collective: str, rank: int, size: int, xs: Sequence[Any], out: Any, kwargs: dict[str, Any]
) -> tuple[list[Flat], list[Flat]]:
    """This rank's checks of a bucket (TypeError, ValueError): its arrays, and their
    outputs."""
    flats = [as_flat(x, f"x[{i}]") for i, x in enumerate(xs)]
    if len({f.device_id for f in flats}) > 1:
        raise ValueError("a bucket's arrays must all be on one device")
    _check_state(kwargs, flats)
    kind = KINDS[collective]
    for i, f in enumerate(flats):
        try:
            kind.check_count(f.size, size)
        except ValueError as exc:
            raise ValueError(f"x[{i}]: {exc}") from None
    _check_codecs(kwargs, flats, kind.reduces)
    outs = _outputs(collective, size, flats, out)
    if out is not None:
        _check_overlaps(collective, rank, flats, outs)
    return flats, outs


def _check_overlaps(collective: str, rank: int, flats: list[Flat], outs: list[Flat]) -> None:
    """Refuse outputs that overlap an input or each other, but for an array's output in
    place as the single call allows it (``check_in_place``): a dtype group writes its
    outputs before a later group reads its inputs."""
    spans = sorted(
        (start, start + a.data.nbytes, role, i)
        for role, arrays in (("x", flats), ("out", outs))
        for i, a in enumerate(arrays)
        if a.data.nbytes
        for start in (address(a.data),)
    )
    for k, (_, end, role, i) in enumerate(spans):
        for start, _, other, j in spans[k + 1 :]:
            if start >= end:
                break
            if role == other == "x":
                continue  # inputs are only read
            if {role, other} == {"x", "out"} and i == j:
                x, o = flats[i], outs[i]
                check_in_place(
                    collective, rank, x.data, x.data.nbytes, o.data, o.data.nbytes,
                    call=f"{collective} of x[{i}] into out[{i}]",
                )  # fmt: skip
                continue
            raise ValueError(
                f"{role}[{i}] overlaps {other}[{j}]: a bucket's outputs must not overlap "
                "another array of it"
            )


def _check_codecs(kwargs: dict[str, Any], flats: list[Flat], reduces: bool) -> None:
    """The codec (or each of a pair) against every dtype of the bucket and the op, as
    each group's call will check them: a refusal of a later group must come before the
    first group's bytes move."""
    spec = kwargs.get("compressor", "identity")
    specs = spec if isinstance(spec, (tuple, list)) else (spec,)
    dtypes = dict.fromkeys(f.dtype for f in flats)
    for codec in [get_compressor(s) for s in specs]:
        for dtype in dtypes:
            codec.check_dtype(dtype)
        if reduces:
            codec.check_op(check_op(kwargs.get("op", "sum")))


def _check_state(kwargs: dict[str, Any], flats: list[Flat]) -> None:
    """A caller-kept state with a bucket, refused before any byte moves where it cannot
    work: a delta state's replica is the output of every call, and a bucket stages into
    new buffers at each call (so its second call would find another replica); a
    Feedback carries one call's residual, and each dtype of a bucket is a call."""
    if kwargs.get("delta") is not None:
        raise ValueError(
            "delta= takes one array, not a list: its replica is the output of every call; "
            "gather one flat buffer (the parameters may be views of it)"
        )
    if kwargs.get("feedback") is not None and len({f.dtype for f in flats}) > 1:
        raise ValueError(
            "feedback= with a bucket of several dtypes: a Feedback carries one call, and "
            "each dtype of a bucket is a call of its own; keep one Feedback per dtype"
        )


def _outputs(collective: str, size: int, flats: list[Flat], out: Any) -> list[Flat]:
    """Each array's output: new ones for ``out=None``, else ``out``'s, checked."""
    kind = KINDS[collective]
    if out is None:
        return [_new(f, kind.result_shape(f.shape, size)) for f in flats]
    if not isinstance(out, (list, tuple)) or len(out) != len(flats):
        raise ValueError(f"out must be None or a list of {len(flats)} outputs, one per array")
    outs = []
    for i, (f, o) in enumerate(zip(flats, out, strict=True)):
        name = f"out[{i}]"
        require_writeable(o, name)
        d = as_flat(o, name)
        if d.dtype != f.dtype:
            raise TypeError(f"{name} has dtype {d.dtype.name}, x[{i}] has {f.dtype.name}")
        wanted = kind.out_count(f.size, size)
        if d.size != wanted:
            raise ValueError(f"{name} has {d.size} elements; {collective} needs {wanted}")
        if d.device_id != f.device_id:
            raise ValueError(f"{name} must be on the same device as x[{i}]")
        outs.append(d)
    return outs


def _new(f: Flat, shape: tuple[int, ...]) -> Flat:
    data, obj = f.new(shape)
    return Flat(data, obj, f.kind, tuple(shape), f.new)


def _staged(
    call: Callable[..., Any],
    collective: str,
    size: int,
    srcs: list[Flat],
    dsts: list[Flat],
    kwargs: dict[str, Any],
) -> None:
    """One call of a dtype group through staging buffers of the first array's kind (so
    that a device call orders itself on that framework's current stream, as the copies
    here do)."""
    counts = [f.size for f in srcs]
    if collective == "reduce_scatter":
        counts = [c // size for c in counts]
    total = sum(counts)
    offsets = [sum(counts[:i]) for i in range(len(counts))]
    first = srcs[0]
    in_count = total * size if collective == "reduce_scatter" else total
    out_count = KINDS[collective].out_count(in_count, size)
    stage_in = _new(first, (in_count,))
    stage_out = stage_in if collective == "allreduce" else _new(first, (out_count,))
    with _on_caller_stream(first):
        for f, a, n in zip(srcs, offsets, counts, strict=True):
            if collective == "reduce_scatter":
                stage_in.data.reshape(size, total)[:, a : a + n] = f.data.reshape(size, n)
            else:
                stage_in.data[a : a + n] = f.data
    call(stage_in.obj, stage_out.obj, **kwargs)
    with _on_caller_stream(first):
        for d, a, n in zip(dsts, offsets, counts, strict=True):
            if collective == "allgather":
                d.data.reshape(size, n)[...] = stage_out.data.reshape(size, total)[:, a : a + n]
            else:
                d.data[...] = stage_out.data[a : a + n]


def _on_caller_stream(f: Flat) -> Any:
    """Device copies on the current stream of ``f``'s framework, on its device."""
    if f.device_id is None:
        return contextlib.nullcontext()
    import cupy  # noqa: PLC0415

    stack = contextlib.ExitStack()
    stack.enter_context(cupy.cuda.Device(f.device_id))
    stack.enter_context(caller_stream(f.obj))
    return stack
