"""The compressor contract, and the registry that maps names to compressors.

A compressor (codec) turns a flat array into one self-contained, little-endian ``uint8``
payload and back. It knows nothing about ranks or wires: the algorithms call it on each
chunk they send, and a user can call it alone on one process.

Contract, for every codec (in the spirit of numcodecs' ``Codec``):

* ``codec_id`` names it in the registry; ``get_config()`` returns a JSON-serialisable dict
  ``{"id": codec_id, **options}`` and ``from_config(config)`` rebuilds an equal codec;
  ``==``, ``hash`` and ``repr`` come from the config.
* ``dtypes`` and ``ops`` declare what it supports; the Communicator refuses anything else
  before a byte moves. ``lossless`` says whether decode(encode(x)) == x.
* ``alignment`` is the element multiple that chunk boundaries should fall on (the group
  size), so that chunking never changes which elements share a group.
* ``payload_scoped`` says whether a group's encoding depends on the rest of its payload
  (other groups' values, or its position in the payload): then where the payloads are cut
  changes the result, and chunks of a message, or one payload per shard against one for
  several shards, decode to different values. False (the default) promises that every
  group of ``alignment`` elements is encoded from its own values alone (the last one
  zero-padded), so any cut on multiples of ``alignment`` decodes alike. True for mx with
  ``scale="e4m3"`` (one float32 scale ``S`` per payload, from the payload's largest
  block), tah with ``window=0`` (a payload's lowest-entropy share of tokens is coded at
  fewer bits; with a window, a share of each window of ``alignment`` elements) and int
  with ``rounding="stochastic"`` (the random stream is indexed by the element's position
  in the payload). An instance property where it depends on the options.
* ``encoded_nbytes(count, dtype)`` is the exact payload size, known before encoding, so
  buffers can be preallocated.
* ``encode(x, out=None, *, dtype=None, salt=0)`` returns the payload on ``x``'s device.
  ``dtype`` is the element type the payload stands for (default ``x.dtype``): the lossless
  ``identity`` codec stores that type, lossy codecs ignore it (their payload does not
  depend on it), so an algorithm can encode a float32 partial sum of bfloat16 data.
* ``stochastic`` says whether the codec draws random bits (stochastic rounding). Such a
  codec's payload is a pure function of the data, its options and the ``salt`` of the
  encode (0 to 2^64 - 1), which callers set so that every rank's, call's, chunk's and
  step's stream differs; deterministic codecs ignore ``salt``, and their ``encode_into``
  does not take it.
* ``decode(buf, out=None, *, count, dtype, accumulate=False)`` writes ``count`` values
  into ``out`` (allocated with ``dtype`` when None); with ``accumulate=True`` it adds them
  into ``out`` instead: the fused decode-reduce of a ReduceScatter.
* ``rel_error_bound`` and ``abs_error_floor`` bound one encode/decode roundtrip: for every
  group of ``n`` (at most ``alignment``) finite values ``x``,
  ``||decode(encode(x)) - x||_2 <= rel_error_bound * ||x||_2 + sqrt(n) * abs_error_floor``,
  over the whole float32 range (a codec states any narrower range it has), for the values
  decoded in float32 (a float16/bfloat16 output adds its own rounding). A codec whose
  scales are relative to its payload's largest value (mx with ``scale="e4m3"``) has a
  larger floor for groups far below it: ``payload_floor(amax)`` is the floor for a
  payload whose largest finite ``|x|`` is ``amax`` (``abs_error_floor`` for the others).
  ``rel_error_typical`` is the error to expect on Gaussian data. Tests and error models
  use these, nothing else.
* ``graph_safe`` says whether its GPU encode/decode allocate nothing and synchronise
  nothing per call, so a CUDA graph may capture them (for the dtypes its kernels take:
  float64 data and float16/bfloat16 accumulators pass through ``_dispatch``'s
  temporaries, for every codec). Under an active capture a codec that is not graph_safe
  raises ``GraphCaptureError`` (``require_graph_safe``) instead of running, and the
  Communicator replays no plan of it from a graph.

Payloads encoded on the CPU decode on the GPU and the other way round: one wire format.
The internal entry points ``encode_into``/``decode_into`` take flat numpy or CuPy arrays
that the caller has already validated; the public ``encode``/``decode`` check and adapt.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from coccl.core.arrays import FLOAT_DTYPES, as_flat, dtype_name, require_writeable
from coccl.errors import GraphCaptureError

SUM_OPS = frozenset({"sum", "avg"})
ALL_OPS = frozenset({"sum", "avg", "max", "min", "prod"})

# The abs_error_floor of the lossy codecs: two steps of float32's subnormal spacing, from
# rounding a subnormal value (float64 input to float32, and the decoded value). It matters
# only for groups whose norm is below about 1e-36.
LOSSY_ABS_ERROR_FLOOR = 2.0**-148


class Compressor(abc.ABC):
    """Base class of every codec; see the module docstring for the contract."""

    codec_id: ClassVar[str]
    dtypes: ClassVar[tuple[np.dtype, ...]] = FLOAT_DTYPES
    ops: ClassVar[frozenset[str]] = SUM_OPS
    lossless: ClassVar[bool] = False
    # Its GPU encode/decode allocate nothing and synchronise nothing per call, so a CUDA
    # graph may capture them.
    graph_safe: ClassVar[bool] = True
    stochastic: bool = False  # draws random bits: encode_into then takes a salt keyword
    # A group's encoding depends on the rest of its payload: where payloads are cut
    # changes the result (the module docstring lists who).
    payload_scoped: bool = False
    rel_error_bound: float = 0.0
    rel_error_typical: float = 0.0
    abs_error_floor: float = 0.0

    # ----------------------------------------------------------------- configuration
    @abc.abstractmethod
    def get_config(self) -> dict[str, Any]:
        """``{"id": codec_id, **options}``, JSON-serialisable."""

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Compressor:
        """Build a codec from ``get_config()``'s output."""
        options = dict(config)
        codec_id = options.pop("id", cls.codec_id)
        if codec_id != cls.codec_id:
            raise ValueError(f"config id {codec_id!r} is not {cls.codec_id!r}")
        return cls(**options)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Compressor) and self.get_config() == other.get_config()

    def __hash__(self) -> int:
        return hash(json.dumps(self.get_config(), sort_keys=True))

    def __repr__(self) -> str:
        options = {k: v for k, v in self.get_config().items() if k != "id"}
        args = ", ".join(f"{k}={v!r}" for k, v in options.items())
        return f"{type(self).__name__}({args})"

    # ------------------------------------------------------------------- properties
    @property
    def alignment(self) -> int:
        """Element multiple that chunk boundaries should fall on."""
        return 1

    @abc.abstractmethod
    def encoded_nbytes(self, count: int, dtype: Any) -> int:
        """Exact size in bytes of the payload of ``count`` elements of ``dtype``; a bad
        count (ValueError) or a dtype the codec refuses (TypeError) raises, as in
        ``encode`` (implementations begin with ``size_args``)."""

    def size_args(self, count: Any, dtype: Any) -> tuple[int, np.dtype]:
        """``encoded_nbytes``' arguments checked: ``count`` a non-negative int, ``dtype``
        one the codec takes."""
        return _check_count(count), self.check_dtype(dtype)

    def payload_floor(self, payload_amax: float) -> float:
        """The per-element absolute floor of the bound for the groups of a payload whose
        largest finite ``|x|`` is ``payload_amax``: ``abs_error_floor``, unless the codec's
        scales are relative to that value (see the module docstring)."""
        return self.abs_error_floor

    def check_dtype(self, dtype: Any) -> np.dtype:
        """Return ``dtype`` as np.dtype, or raise TypeError if this codec refuses it."""
        dtype = np.dtype(dtype)
        if dtype not in self.dtypes:
            names = ", ".join(dtype_name(d) for d in self.dtypes)
            raise TypeError(
                f"compressor {self.codec_id!r} does not support dtype {dtype_name(dtype)} "
                f"(it takes {names})"
            )
        return dtype

    def check_op(self, op: str) -> None:
        """Raise ValueError if this codec cannot carry a reduction with ``op``."""
        if op not in self.ops:
            raise ValueError(
                f"compressor {self.codec_id!r} does not support op {op!r} "
                f"(it takes {', '.join(sorted(self.ops))})"
            )

    # ------------------------------------------------------------- internal kernels
    @abc.abstractmethod
    def encode_into(self, x: Any, payload: Any, dtype: np.dtype) -> None:
        """Encode flat ``x`` (numpy or CuPy) into ``payload`` (uint8, exact size, same
        device). ``x`` may be a float32/float64 accumulator standing for ``dtype`` data.
        On the GPU the kernels run on CuPy's current stream. A ``stochastic`` codec's
        takes a keyword ``salt`` too (an int in 0..2^64-1, default 0)."""

    @abc.abstractmethod
    def decode_into(self, payload: Any, out: Any, dtype: np.dtype, accumulate: bool) -> None:
        """Decode ``payload`` (encoded from ``out.size`` elements standing for ``dtype``)
        into flat ``out``, or add into it when ``accumulate``. ``out`` may be of ``dtype``
        or a float32/float64 accumulator."""

    def reduce_encode_kernel(self, like: Any, dtype: np.dtype) -> Any:
        """A fused kernel for one hop of a ring ReduceScatter, or None.

        The callable, ``hop(own, payload, out, decoded=None)``, writes ``out =
        encode(own + decode(payload))`` for ``dtype`` data ``own`` and payloads of
        ``own.size`` elements, bitwise what ``decode_into(payload, acc, dtype, True)`` on a
        float32 copy ``acc`` of ``own`` followed by ``encode_into(acc, out, dtype)`` gives;
        given ``decoded`` (an array like ``own``: ``own`` itself or disjoint from it), it
        also writes ``decoded = decode(out)``, bitwise ``decode_into(out, decoded, dtype,
        False)`` (the last hop of an AllReduce, whose owner keeps what it sends). None
        (the default) where the codec has no such kernel for arrays like ``like``: the
        schedules then run those steps one by one.
        """
        return None

    # ------------------------------------------------------------------ public API
    def encode(self, x: Any, out: Any = None, *, dtype: Any = None, salt: int = 0) -> Any:
        """Encode an array into one payload.

        Args:
            x: contiguous numpy/CuPy/numba-device array or torch tensor.
            out: optional preallocated uint8 payload of ``encoded_nbytes`` bytes.
            dtype: the element type the payload stands for (default ``x.dtype``).
            salt: a ``stochastic`` codec's stream selector, 0 to 2^64 - 1 (ignored by
                the others).

        Returns:
            The payload: a uint8 array of the caller's kind, on ``x``'s device.

        Raises:
            TypeError: a dtype the codec does not take, an ``out`` that is not uint8, or a
                ``salt`` that is not an int.
            ValueError: a non-contiguous array, an ``out`` of the wrong size, on another
                device or read-only, or a ``salt`` out of range; all checked before any
                work.
        """
        salt = _check_salt(salt)
        src = as_flat(x, "x")
        dtype = self.check_dtype(src.dtype if dtype is None else dtype)
        if src.dtype not in FLOAT_DTYPES and src.dtype != dtype:
            raise TypeError(f"cannot encode {dtype_name(src.dtype)} data as {dtype_name(dtype)}")
        nbytes = self.encoded_nbytes(src.size, dtype)
        if out is None:
            payload, obj = src.new((nbytes,), np.uint8)
        else:
            dst = as_flat(out, "out")
            _check_payload(dst, nbytes, src, "out")
            require_writeable(dst.obj, "out")
            payload, obj = dst.data, dst.obj
        if self.stochastic:
            self.encode_into(src.data, payload, dtype, salt=salt)
        else:
            self.encode_into(src.data, payload, dtype)
        return obj

    def decode(
        self,
        buf: Any,
        out: Any = None,
        *,
        count: int,
        dtype: Any,
        accumulate: bool = False,
    ) -> Any:
        """Decode one payload.

        Args:
            buf: a payload from ``encode`` (uint8, exactly ``encoded_nbytes`` bytes).
            out: optional destination of ``count`` elements; required with ``accumulate``.
            count: how many elements the payload holds.
            dtype: the element type the payload stands for; a new ``out`` gets it.
            accumulate: add the decoded values into ``out`` instead of overwriting it.

        Returns:
            ``out``, or a new numpy/CuPy array on ``buf``'s device.

        Raises:
            TypeError: a dtype the codec does not take, or ``out`` of another dtype than
                ``dtype`` or a float32/float64 accumulator.
            ValueError: a bad ``count``, a ``buf`` of the wrong size, an ``out`` of the
                wrong size, on another device or read-only, or ``accumulate`` without
                ``out``; all checked before any work.
        """
        count = _check_count(count)
        dtype = self.check_dtype(dtype)
        src = as_flat(buf, "buf")
        _check_payload(src, self.encoded_nbytes(count, dtype), None, "buf")
        if out is None:
            if accumulate:
                raise ValueError("accumulate=True needs an out array to add into")
            xp = src.xp
            if xp is np:
                data = np.empty(count, dtype=dtype)
            else:
                with src.data.device:
                    data = xp.empty(count, dtype=dtype)
            obj = data
        else:
            dst = as_flat(out, "out")
            if dst.size != count:
                raise ValueError(f"out has {dst.size} elements, expected count={count}")
            require_writeable(dst.obj, "out")
            if dst.xp is not src.xp:
                raise ValueError("out and buf must be on the same kind of device")
            if dst.dtype != dtype and dst.dtype not in (np.float32, np.float64):
                raise TypeError(
                    f"out has dtype {dtype_name(dst.dtype)}; expected {dtype_name(dtype)} "
                    "or a float32/float64 accumulator"
                )
            data, obj = dst.data, dst.obj
        self.decode_into(src.data, data, dtype, accumulate)
        return obj


def require_graph_safe(codec: Compressor, where: str) -> None:
    """Raise ``GraphCaptureError`` if ``codec`` is not ``graph_safe``; call it only while
    the stream that ``where`` (a phrase naming the caller) runs on is capturing."""
    if not codec.graph_safe:
        raise GraphCaptureError(
            f"compressor {codec.codec_id!r} is not graph_safe (its GPU kernels allocate or "
            f"synchronise per call), so a CUDA graph may not capture it: {where} ran under "
            "an active stream capture; run it eagerly or pick a graph_safe codec"
        )


def _check_salt(salt: Any) -> int:
    if isinstance(salt, bool) or not isinstance(salt, (int, np.integer)):
        raise TypeError(f"salt must be an int, got {salt!r}")
    if not 0 <= int(salt) < 1 << 64:
        raise ValueError(f"salt must be in 0..2^64-1, got {salt!r}")
    return int(salt)


def _check_count(count: Any) -> int:
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
        raise ValueError(f"count must be a non-negative integer, got {count!r}")
    return int(count)


def _check_payload(p: Any, nbytes: int, like: Any, name: str) -> None:
    if p.dtype != np.uint8:
        raise TypeError(f"{name} must be a uint8 payload, got {dtype_name(p.dtype)}")
    if p.size != nbytes:
        raise ValueError(f"{name} holds {p.size} bytes; the payload is {nbytes} bytes")
    if like is not None and p.xp is not like.xp:
        raise ValueError(f"{name} must be on the same kind of device as x")


# ---------------------------------------------------------------------- registry
_REGISTRY: dict[str, type[Compressor]] = {}


def register_compressor(cls: type[Compressor]) -> type[Compressor]:
    """Register a Compressor subclass under its ``codec_id`` (usable as a decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Compressor)):
        raise TypeError("register_compressor takes a Compressor subclass")
    codec_id = getattr(cls, "codec_id", None)
    if not isinstance(codec_id, str) or not codec_id:
        raise ValueError(f"{cls.__name__} needs a non-empty string codec_id")
    _REGISTRY[codec_id] = cls
    return cls


def available_compressors() -> list[str]:
    """Names of the registered compressors."""
    return sorted(_REGISTRY)


def _label_value(text: str) -> bool | int | float | str:
    """``true``/``False`` -> bool, ``32`` -> int, ``0.5`` -> float, else the text."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_label(label: str) -> dict[str, Any]:
    """A codec's config from its label, the form the command-line tools take:
    ``"taco"`` -> ``{"id": "taco"}``; ``"int:bits=4,group_size=32"`` -> ``{"id": "int",
    "bits": 4, "group_size": 32}`` (values: true/false as bools, numbers as int or float,
    anything else as text).

    Raises:
        ValueError: an option that is not ``key=value``, or a key given twice.
    """
    name, _, options = label.partition(":")
    config: dict[str, Any] = {"id": name.strip()}
    for option in (o.strip() for o in options.split(",") if options.strip()):
        key, eq, value = option.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ValueError(f"compressor {label!r}: expected key=value, got {option!r}")
        if key in config:
            raise ValueError(f"compressor {label!r}: {key!r} given twice")
        config[key] = _label_value(value.strip())
    return config


def get_compressor(spec: str | Mapping[str, Any] | Compressor, **options: Any) -> Compressor:
    """Return a codec from a name or label (with options), a config dict, or a codec itself.

    ``get_compressor("taco", group_size=128)``, ``get_compressor("taco:group_size=128")``
    and ``get_compressor({"id": "taco", "group_size": 128})`` are the same codec.

    Raises:
        ValueError: an unknown name, a malformed label, or an option the codec refuses.
    """
    if isinstance(spec, Compressor):
        if options:
            raise ValueError("options cannot be given together with a compressor instance")
        return spec
    if isinstance(spec, Mapping):
        config = {**spec, **options}
        name = config.get("id")
    elif isinstance(spec, str):
        config = {**parse_label(spec), **options}
        name = config["id"]
    else:
        raise ValueError(f"compressor must be a name, a config dict or a Compressor, got {spec!r}")
    cls = _REGISTRY.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(
            f"unknown compressor {name!r}; available: {', '.join(available_compressors())}"
        )
    return cls.from_config(config)
