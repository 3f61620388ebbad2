"""CUDA kernels of the ``taco`` and ``int8`` codecs, for CuPy arrays.

The GPU twin of ``cpu_kernels``: the same four functions with the same signatures, on flat
contiguous CuPy arrays, producing payloads and decoded values that are bitwise identical
to the CPU kernels' (FORMAT.md's canonical float32 arithmetic). The CUDA source is
:data:`CODEC_SOURCES`, five files beside this one compiled as one text (the float helpers,
the memory and Hadamard helpers, the encode kernels, the EPL encode and hop, the decode
kernels and hops); each variant (operation, group size, dtype, FP8
format, switches) is compiled on first use by NVRTC through ``cupy.RawModule`` with
``-D`` defines, cached per device in this process and on disk by CuPy. Kernels run on
CuPy's current stream of the arrays' device.

:func:`set_tuning`, the context manager :func:`tuning` and :func:`get_tuning` change how
the kernels are compiled and launched (never what they compute), for benchmarks and tests;
:func:`last_kernel_attributes` reports the registers and memory of the last kernel.

Importing this module touches neither CuPy nor the GPU.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .gpu_build import (
    KERNEL_DTYPES,
    as_int,
    check_accumulate,
    check_disjoint,
    check_payload,
    compile_function,
    cupy_module,
    element_type,
    last_kernel_attributes,
    note_launch,
    overlap,
    sm_count,
)
from .intq_gpu import int_encode
from .layout import GROUP_SIZES, int8_layout, num_groups, taco_nbytes

__all__ = [
    "CODEC_SOURCES",
    "get_tuning",
    "int8_decode",
    "int8_encode",
    "int8_reduce_encode",
    "last_kernel_attributes",
    "ring_hop",
    "set_tuning",
    "taco_decode",
    "taco_encode",
    "taco_reduce_encode",
    "tuning",
]

# The taco and int8 kernels' CUDA source, in this order: codec_kernels.cu (the defines,
# float32 arithmetic and conversions) and codec_tile_helpers.cu (memory helpers, reductions
# and the Hadamard), which the int and tah kernels also build on, then the encode kernels,
# the EPL encode and hop, and the decodes and hops.
CODEC_SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in (
        "codec_kernels.cu",
        "codec_tile_helpers.cu",
        "codec_encode_kernels.cu",
        "codec_epl_kernels.cu",
        "codec_decode_kernels.cu",
    )
)
_FMT = {"e4m3": 0, "e5m2": 1}
_INT8_FAST_GROUPS = (32, 64, 128, 256, 512, 1024)
_TILE = 1024  # elements one warp handles per step in the fast kernels

# Kernel 3 (int8's 32-per-lane encode) is no longer launched: int8_encode runs the int
# codec's staged 8-bit kernel for these groups.
_OP_TACO_ENC, _OP_TACO_DEC, _OP_INT8_DEC = 1, 2, 4
_OP_INT8_ENC_ANY, _OP_INT8_DEC_ANY = 5, 6
_OP_TACO_ENC_EPL = 7  # taco encode with up to a whole group per lane
_OP_TACO_HOP = 8  # taco ring hop: encode(own + decode(payload)) in one kernel
_OP_INT8_HOP = 9  # the same for int8
_OP_TACO_HOP_EPL = 10  # the taco ring hop with up to a whole group per lane
_EPL_OPS = (_OP_TACO_ENC_EPL, _OP_TACO_HOP_EPL)

# Launch tuning (set_tuning documents the keys; bench/NOTES.md records the measurements
# behind these defaults). ``resident``: 1024 keeps encode and plain decode at 64 registers
# without spills, 512 gives decode-accumulate its ~120 registers.
_TUNING: dict[str, Any] = {
    "threads": 256,
    "stage": {"encode": 0, "decode": 1, "accumulate": 1, "hop": 1},
    "prefetch": {"encode": 1, "decode": 0, "accumulate": 0, "hop": 0},
    "resident": {"encode": 768, "decode": 1024, "accumulate": 512, "hop": 512},
    "blocks_per_sm": 16,
    "sw_cvt": 0,
    "raw_check": 0,
    "encode_epl": 64,
    "hop_epl": 64,
    "hop_epl_from": 1 << 22,
    "epl_threads": {"encode": 128, "decode": 128, "accumulate": 128, "hop": 128},
    "epl_resident": {"encode": 512, "decode": 512, "accumulate": 512, "hop": 512},
}
_KINDS = ("encode", "decode", "accumulate", "hop")

# (device, kind, defines) -> (kernel, threads, warps per block, largest grid): the launch of
# a chunk-sized message is a few microseconds of GPU time, so its host cost matters.
_launches: dict[tuple, tuple[Any, int, int, int]] = {}


# ----------------------------------------------------------------------- public API
def taco_encode(
    x: Any,
    payload: Any,
    *,
    group_size: int,
    fp8_format: str,
    ash: bool,
    dual_scale: bool,
    coccl_clamps: bool = False,
) -> None:
    """Encode flat ``x`` (float32/float16/bfloat16) into ``payload`` (uint8, exact size);
    with ``coccl_clamps`` COCCL's clamps apply to every group (no extended range)."""
    cp = cupy_module()
    count, K, defs = _taco_variant(
        cp, _OP_TACO_ENC, x, "x", (payload,), group_size, fp8_format, ash, dual_scale
    )
    defs["EXT"] = _extended_range(dual_scale, coccl_clamps)
    if count == 0:
        return
    G = defs["GS"]
    # two buffers of a tile's elements
    epl = _elements_per_lane(G, "encode_epl", "encode", 2 * x.dtype.itemsize)
    if epl >= 32:
        defs.update(OP=_OP_TACO_ENC_EPL, EPL=epl)
        _launch(cp, defs, "encode", (x, payload), count, K, warps=-(-K * G // (32 * epl)))
    else:
        _launch(cp, defs, "encode", (x, payload), count, K, warps=-(-K * G // _TILE))


def taco_decode(
    payload: Any,
    out: Any,
    *,
    group_size: int,
    fp8_format: str,
    ash: bool,
    dual_scale: bool,
    accumulate: bool,
) -> None:
    """Decode ``payload`` into flat ``out`` (float32/float16/bfloat16); with
    ``accumulate`` add into ``out`` (float32 only)."""
    cp = cupy_module()
    count, K, defs = _taco_variant(
        cp, _OP_TACO_DEC, out, "out", (payload,), group_size, fp8_format, ash, dual_scale
    )
    check_accumulate(out, accumulate)
    if count == 0:
        return
    defs["ACC"] = int(bool(accumulate))
    kind = "accumulate" if accumulate else "decode"
    _launch(cp, defs, kind, (payload, out), count, K, warps=-(-count // _TILE))


def taco_reduce_encode(
    own: Any,
    payload: Any,
    out: Any,
    decoded: Any = None,
    *,
    group_size: int,
    fp8_format: str,
    ash: bool,
    dual_scale: bool,
    coccl_clamps: bool = False,
) -> None:
    """One ring hop in one kernel: ``out = taco_encode(float32(own) + taco_decode(payload))``.

    ``own`` holds float32/float16/bfloat16 data; ``payload`` and ``out`` are taco payloads
    of ``own.size`` elements (distinct buffers). Bitwise what decoding ``payload`` with
    ``accumulate`` into a float32 copy of ``own`` and encoding that copy give, without the
    copy and with one launch instead of three. With ``decoded`` (an array like ``own``,
    ``own`` itself or disjoint from it) the same pass also writes ``decoded =
    taco_decode(out)``, bitwise what the decode kernel gives, without reading ``out`` back.
    """
    cp = cupy_module()
    count, K, defs = _taco_variant(
        cp, _OP_TACO_HOP, own, "own", (payload, out), group_size, fp8_format, ash, dual_scale
    )
    defs["EXT"] = _extended_range(dual_scale, coccl_clamps)
    check_disjoint(payload, out)
    arrays = _hop_arrays(cp, defs, own, payload, out, decoded)
    if count == 0:
        return
    G = defs["GS"]
    # one buffer of a tile's own elements, two of its codes
    epl = _elements_per_lane(G, "hop_epl", "hop", own.dtype.itemsize + 2)
    if epl >= 32 and count >= int(_TUNING["hop_epl_from"]):
        defs.update(OP=_OP_TACO_HOP_EPL, EPL=epl)
        _launch(cp, defs, "hop", arrays, count, K, warps=-(-K * G // (32 * epl)))
    else:
        _launch(cp, defs, "hop", arrays, count, K, warps=-(-K * G // _TILE))


def _elements_per_lane(G: int, key: str, kind: str, smem_bytes: int) -> int:
    """The elements per lane of an EPL kernel (tuning ``key``; 0: the 32-per-lane kernel)
    of kernel kind ``kind``: at most G, and the warps' shared-memory buffers (threads x
    elements per lane x ``smem_bytes`` bytes per element) must fit the 48 KiB a block gets
    by default."""
    epl = min(G, int(_TUNING[key]))
    threads = int(_TUNING["epl_threads"][kind])
    while epl >= 32 and threads * epl * smem_bytes > 48 * 1024:
        epl //= 2
    return epl


def int8_encode(x: Any, payload: Any, *, group_size: int) -> None:
    """Encode flat ``x`` (float32/float16/bfloat16) into ``payload`` (uint8, exact size)."""
    cp = cupy_module()
    G = _int8_group(group_size)
    xt = element_type(cp, x, "x")
    count = int(x.size)
    layout = int8_layout(count, G)
    K = layout.groups
    check_payload(cp, payload, layout.nbytes, x)
    if count == 0:
        return
    if G in _INT8_FAST_GROUPS:
        # The int codec's 8-bit encode without rotation is int8's arithmetic byte for byte
        # (FORMAT.md), and its kernel stages whole tiles through shared memory ahead
        # (faster than kernel 3's lane-strided loads, for float32 most).
        int_encode(x, payload, bits=8, group_size=G, hadamard=0, stochastic=False, key=0)
        return
    defs = {"OP": _OP_INT8_ENC_ANY, "GS": G, "XT": xt}
    _launch(cp, defs, "encode", (x, payload), count, K, warps=K)


def int8_decode(payload: Any, out: Any, *, group_size: int, accumulate: bool) -> None:
    """Decode ``payload`` into flat ``out`` (float32/float16/bfloat16); with
    ``accumulate`` add into ``out`` (float32 only)."""
    cp = cupy_module()
    G = _int8_group(group_size)
    xt = element_type(cp, out, "out")
    check_accumulate(out, accumulate)
    count = int(out.size)
    layout = int8_layout(count, G)
    K = layout.groups
    check_payload(cp, payload, layout.nbytes, out)
    if count == 0:
        return
    op = _OP_INT8_DEC if G in _INT8_FAST_GROUPS else _OP_INT8_DEC_ANY
    defs = {"OP": op, "GS": G, "XT": xt, "ACC": int(bool(accumulate))}
    warps = -(-count // (_TILE if op == _OP_INT8_DEC else 32))
    kind = "accumulate" if accumulate else "decode"
    _launch(cp, defs, kind, (payload, out), count, K, warps=warps)


def int8_reduce_encode(
    own: Any, payload: Any, out: Any, decoded: Any = None, *, group_size: int
) -> None:
    """One int8 ring hop in one kernel: ``out = int8_encode(float32(own) +
    int8_decode(payload))``, bitwise the three-step path, and with ``decoded`` also
    ``decoded = int8_decode(out)`` (see ``taco_reduce_encode``). ``group_size`` must be a
    power of two from 32 to 1024 (the fast kernels' groups)."""
    cp = cupy_module()
    G = _int8_group(group_size)
    if G not in _INT8_FAST_GROUPS:
        raise ValueError(f"the int8 ring hop takes group_size in {_INT8_FAST_GROUPS}, got {G}")
    xt = element_type(cp, own, "own")
    count = int(own.size)
    layout = int8_layout(count, G)
    K = layout.groups
    for p in (payload, out):
        check_payload(cp, p, layout.nbytes, own)
    check_disjoint(payload, out)
    defs = {"OP": _OP_INT8_HOP, "GS": G, "XT": xt}
    arrays = _hop_arrays(cp, defs, own, payload, out, decoded)
    if count == 0:
        return
    _launch(cp, defs, "hop", arrays, count, K, warps=-(-count // _TILE))


def _hop_arrays(
    cp: Any, defs: dict[str, Any], own: Any, payload: Any, out: Any, decoded: Any
) -> tuple:
    """A ring hop's kernel arguments; with ``decoded`` (checked: like ``own``, and ``own``
    itself or disjoint from it and from both payloads) the DEC variant that writes it."""
    if decoded is None:
        return (own, payload, out)
    element_type(cp, decoded, "decoded")
    if decoded.dtype != own.dtype or decoded.size != own.size:
        raise ValueError(
            f"decoded must be like own ({own.size} {own.dtype.name}), got "
            f"{decoded.size} {decoded.dtype.name}"
        )
    if decoded.data.device_id != own.data.device_id:
        raise ValueError("decoded and own must be on the same device")
    for other, name in ((payload, "payload"), (out, "out")):
        if overlap(decoded, other):
            raise ValueError(f"decoded and {name} must not overlap")
    if decoded.data.ptr != own.data.ptr and overlap(decoded, own):
        raise ValueError("decoded must be own itself or not overlap it")
    defs["DEC"] = 1
    return (own, payload, out, decoded)


def ring_hop(like: Any, dtype: Any, hop: Any, **options: Any) -> Any:
    """``hop`` (``taco_reduce_encode`` or ``int8_reduce_encode``) with ``options`` bound,
    for a codec's ``reduce_encode_kernel``: None for host arrays and for element types the
    kernels do not read (float64 takes the three-step path, whose accumulator is float64)."""
    if isinstance(like, np.ndarray) or np.dtype(dtype) not in KERNEL_DTYPES:
        return None
    return functools.partial(hop, **options)


# ------------------------------------------------------------------ validation
def _taco_variant(
    cp: Any,
    op: int,
    data: Any,
    name: str,
    payloads: tuple,
    group_size: Any,
    fp8_format: Any,
    ash: Any,
    dual_scale: Any,
) -> tuple[int, int, dict[str, Any]]:
    """Check a taco kernel's arguments (``data``, the elements, called ``name``;
    ``payloads``, taco payloads of ``data.size`` elements) and return the element count,
    the group count and the kernel variant's defines for operation ``op``."""
    G = _taco_group(group_size)
    fmt = _fp8_format(fp8_format)
    xt = element_type(cp, data, name)
    count = int(data.size)
    K = num_groups(count, G)
    nbytes = taco_nbytes(count, G, bool(ash), bool(dual_scale))
    for payload in payloads:
        check_payload(cp, payload, nbytes, data)
    defs = {
        "OP": op,
        "GS": G,
        "XT": xt,
        "FMT": fmt,
        "ASH": int(bool(ash)),
        "DUAL": int(bool(dual_scale)),
        "CINV_BITS": _inv_sqrt_bits(G),
    }
    return count, K, defs


def _extended_range(dual_scale: Any, coccl_clamps: Any) -> int:
    """The EXT define of a taco encode variant: FORMAT.md's step 4b needs dual_scale."""
    if not isinstance(coccl_clamps, (bool, np.bool_)):
        raise ValueError(f"coccl_clamps must be a bool, got {coccl_clamps!r}")
    return int(bool(dual_scale) and not coccl_clamps)


def _taco_group(group_size: Any) -> int:
    G = as_int(group_size, "group_size")
    if G not in GROUP_SIZES:
        raise ValueError(f"taco group_size must be one of {GROUP_SIZES}, got {group_size!r}")
    return G


def _int8_group(group_size: Any) -> int:
    G = as_int(group_size, "group_size")
    if G < 1:
        raise ValueError(f"int8 group_size must be a positive integer, got {group_size!r}")
    return G


def _fp8_format(fmt: Any) -> int:
    if fmt not in _FMT:
        raise ValueError(f"fp8_format must be 'e4m3' or 'e5m2', got {fmt!r}")
    return _FMT[fmt]


@functools.cache
def _inv_sqrt_bits(G: int) -> str:
    # FORMAT.md: (float)(1 / sqrt(G)), computed in double and rounded once.
    return f"{int(np.float32(1.0 / math.sqrt(G)).view(np.uint32)):#010x}u"


# ---------------------------------------------------------------- compile, launch


def _variant_defines(defs: dict[str, Any], kind: str) -> dict[str, Any]:
    out = dict(defs)
    if defs["OP"] in _EPL_OPS:
        threads = int(_TUNING["epl_threads"][kind])
        out["MIN_BLOCKS"] = max(1, int(_TUNING["epl_resident"][kind]) // threads)
    else:
        threads = int(_TUNING["threads"])
        out["STAGE"] = int(_TUNING["stage"][kind])
        out["PREFETCH"] = int(_TUNING["prefetch"][kind])
        out["MIN_BLOCKS"] = max(1, int(_TUNING["resident"][kind]) // threads)
    out["THREADS"] = threads
    if _TUNING["sw_cvt"]:
        out["SW_CVT"] = 1
    if _TUNING["raw_check"] and defs["OP"] in (_OP_TACO_ENC, _OP_TACO_ENC_EPL):
        out["RAW_CHECK"] = 1
    return out


def _launch(
    cp: Any, defs: dict[str, Any], kind: str, arrays: tuple, count: int, K: int, warps: int
) -> None:
    """Launch the variant ``defs`` on ``arrays`` (all on one device) and ``count``, ``K``,
    on the current stream of the arrays' device."""
    device_id = arrays[0].data.device_id
    if cp.cuda.runtime.getDevice() == device_id:  # the usual case: skip a device switch
        _launch_here(cp, defs, kind, arrays, count, K, warps, device_id)
    else:
        with cp.cuda.Device(device_id):
            _launch_here(cp, defs, kind, arrays, count, K, warps, device_id)


def _launch_here(
    cp: Any,
    defs: dict[str, Any],
    kind: str,
    arrays: tuple,
    count: int,
    K: int,
    warps: int,
    device_id: int,
) -> None:
    key = (device_id, kind, *defs.items())
    cached = _launches.get(key)
    if cached is None:
        full = _variant_defines(defs, kind)
        threads = full["THREADS"]
        grid_cap = sm_count(cp) * int(_TUNING["blocks_per_sm"])
        cached = (compile_function(CODEC_SOURCES, full), threads, threads // 32, grid_cap)
        _launches[key] = cached
    kern, threads, per_block, grid_cap = cached
    blocks = max(1, min(-(-warps // per_block), grid_cap))
    kern((blocks,), (threads,), (*arrays, np.int64(count), np.int64(K)))
    note_launch(kern)


# ------------------------------------------------------------------- tuning hooks
# keys holding one value per kernel kind (epl_*: only encode and hop have EPL kernels)
_PER_KIND = ("stage", "prefetch", "resident", "epl_threads", "epl_resident")
_FLAGS = ("stage", "prefetch", "sw_cvt", "raw_check")  # 0/1 switches


def get_tuning() -> dict[str, Any]:
    """The launch tuning in effect now (a copy; see :func:`set_tuning` for the keys)."""
    return {k: dict(v) if isinstance(v, dict) else v for k, v in _TUNING.items()}


def set_tuning(**changes: Any) -> dict[str, Any]:
    """Change how the kernels are compiled and launched; returns the previous values.

    For benchmarks and tests: the tuning is process-wide, so change it while no other
    thread launches codec kernels. Results never depend on it (every variant is bitwise
    the same codec); speed does. Kernels are recompiled for a new setting on first use.

    Keys (defaults in ``get_tuning()``; bench/NOTES.md has the measurements behind them):
        threads: threads per block of the 32-elements-per-lane kernels (a multiple of 32
            in 32..1024).
        stage: 1 stages global accesses through shared memory (fully coalesced), 0 lets
            each lane access its own 32 elements; per kernel kind.
        prefetch: 1 loads the next tile while computing this one (encode); per kind.
        resident: threads per SM the register budget is sized for
            (``__launch_bounds__`` min blocks = resident // threads); per kind.
        blocks_per_sm: the grid is at most this many blocks per SM.
        sw_cvt: 1 uses the software FP8/bfloat16/float16 conversions even where the GPU
            has instructions for them.
        raw_check: 1 makes taco encode look for NaN/Inf in every group, not only in groups
            whose energy is not finite (the same result).
        encode_epl: elements per lane of the taco encode kernel (32, 64 or 128, at most
            G); 0 selects the 32-elements-per-lane kernel.
        hop_epl: the same for the taco ring hop, from ``hop_epl_from`` elements on (the
            EPL hop measured faster from 4M bfloat16 elements, slower at 1M:
            bench/NOTES.md, session 18).
        epl_threads, epl_resident: threads per block and resident threads per SM of
            those kernels; per kind (encode, hop). Blocks of 64 threads let the hop keep a
            whole group of 128 a lane (``hop_epl=128``) within the 48 KiB: no shuffles in
            a 128-group's transforms.

    The per-kind keys (kinds: encode, decode, accumulate = decode-accumulate, hop = the
    fused ring hop) take one value for every kind, or a dict that changes only the kinds
    it names.

    Args:
        **changes: the keys to change, with their new values.

    Returns:
        The previous values of the changed keys (whole per-kind dicts), so that
        ``set_tuning(**previous)`` restores them.

    Raises:
        ValueError: an unknown key or kind, or a value out of range; nothing is changed.
    """
    new = {key: _checked_tuning(key, value) for key, value in changes.items()}
    previous = {key: get_tuning()[key] for key in new}
    for key, value in new.items():
        if key in _PER_KIND:
            _TUNING[key] = {**_TUNING[key], **value}
        else:
            _TUNING[key] = value
    _launches.clear()
    return previous


@contextlib.contextmanager
def tuning(**changes: Any) -> Iterator[dict[str, Any]]:
    """``set_tuning(**changes)`` for the duration of a ``with`` block, then restored.

    Example::

        with gpu_kernels.tuning(encode_epl=0, stage={"encode": 1}):
            codec.encode(x)  # the 32-elements-per-lane encode kernel, staged

    Yields:
        The tuning in effect inside the block (a copy).
    """
    previous = set_tuning(**changes)
    try:
        yield get_tuning()
    finally:
        set_tuning(**previous)


def _checked_tuning(key: str, value: Any) -> Any:
    if key not in _TUNING:
        raise ValueError(f"unknown tuning key {key!r}; known: {', '.join(sorted(_TUNING))}")
    if key in _PER_KIND:
        if not isinstance(value, dict):
            return {kind: _checked_value(key, value) for kind in _KINDS}
        unknown = set(value) - set(_KINDS)
        if unknown:
            raise ValueError(f"tuning {key!r}: unknown kernel kinds {sorted(unknown)}")
        return {kind: _checked_value(key, v) for kind, v in value.items()}
    return _checked_value(key, value)


def _checked_value(key: str, value: Any) -> int:
    if isinstance(value, bool):
        value = int(value)
    if not isinstance(value, (int, np.integer)):
        raise ValueError(f"tuning {key!r} takes an int, got {value!r}")
    v = int(value)
    if key in _FLAGS:
        ok = v in (0, 1)
    elif key in ("threads", "epl_threads"):
        ok = v % 32 == 0 and 32 <= v <= 1024
    elif key in ("encode_epl", "hop_epl"):
        ok = v in (0, 32, 64, 128)
    elif key == "hop_epl_from":
        ok = v >= 0
    else:  # resident, epl_resident, blocks_per_sm
        ok = v >= 1
    if not ok:
        raise ValueError(f"tuning {key!r}: {value!r} is out of range")
    return v
