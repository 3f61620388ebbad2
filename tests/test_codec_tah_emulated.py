"""The tah CUDA kernels (compressors/tah_kernels.cu, tah_encode.cu, tah_decode.cu,
tah_score.cu) run on the CPU through a host emulation of the CUDA built-ins
(tests/cuda_emulation/), against the numba kernels, bit for bit.

This checks the kernels' logic (lanes, shuffles, packing, the pivot's swaps, the scores,
the choice of low tokens, the bitmap prefixes) where there is no GPU;
tests/test_codec_gpu_tah.py checks the real thing on one. The launches are tah_gpu's: an
encode is the score, selection and encode kernels on the payload alone, a decode one
kernel; the encode and decode kernels run on grids of several blocks (each block its own
range of tiles, counting the low tokens before it), the selection on one block, also with
fewer scores a thread than on the GPU (so that a payload has several chunks of them).
Skips without a C++20 compiler.
"""

from __future__ import annotations

import ctypes
import re

import ml_dtypes
import numpy as np
import pytest

from coccl.compressors import TahCompressor
from coccl.compressors.tah_cpu import low_prefix, token_keys
from coccl.compressors.tah_format import SCORE_W, SCORE_WL, tah_layout
from coccl.compressors.tah_gpu import (  # launches' lane sizes, the selection's histograms
    _DECODE,
    _DECODE_ACC,
    _DECODE_AHEAD,
    _DECODE_PREFIX,
    _DECODE_TABLE_TOKENS,
    _ENCODE,
    _EPL,
    _SELECT_BINS,
    _SELECT_DIGITS,
    _score_sums,
)

from codec_reference import magnitude_sweep
from emulation import CXX, EMULATION, KERNELS, builder

if CXX is None:
    pytest.skip("needs g++ for the CUDA host emulation", allow_module_level=True)

SOURCES = [
    EMULATION / "emu.h",
    KERNELS / "codec_kernels.cu",
    KERNELS / "codec_tile_helpers.cu",
    KERNELS / "tah_tables.cu",
    KERNELS / "tah_select.cu",
    KERNELS / "tah_kernels.cu",
    KERNELS / "tah_encode.cu",
    KERNELS / "tah_decode.cu",
    KERNELS / "tah_score.cu",
    EMULATION / "launch.cpp",
]
BF16 = np.dtype(ml_dtypes.bfloat16)
DECODE_EPLS = sorted({_EPL[_DECODE], _EPL[_DECODE_ACC], 16, 32})
ENCODE_EPLS = sorted({_EPL[_ENCODE], 16, 32})
XT32 = np.dtype(np.float32)
XT = {XT32: 0, np.dtype(np.float16): 1, BF16: 2}
CASES = [
    ({"row": 256}, np.dtype(np.float32)),
    ({"row": 256}, BF16),
    ({"row": 128, "tile": 32, "bits_high": 5, "bits_low": 2, "low_fraction": 0.5}, np.float16),
    ({"row": 384, "tile": 128, "bits_high": 8, "bits_low": 4, "pivot_ratio": 4.0}, np.float32),
]


# launch.cpp's entry points
ARGTYPES = {
    "emu_launch": [ctypes.c_void_p] * 2 + [ctypes.c_longlong] * 5,
    "emu_launch8": [ctypes.c_void_p] * 2 + [ctypes.c_longlong] * 6,
    "emu_set_grid": [ctypes.c_int],
}


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """A function from a variant's defines to its compiled emulation (cached)."""
    return builder(tmp_path_factory.mktemp("tah_emulation"), SOURCES, ARGTYPES, {"OP": 0})


def _variant(c: TahCompressor, epl: int) -> dict:
    return {"ROW": c.row, "TILE": c.tile, "BH": c.bits_high, "BL": c.bits_low, "EPL": epl}


def launch(lib: ctypes.CDLL, grid: int, *args) -> None:
    lib.emu_set_grid(grid)
    lib.emu_launch(*args)


SELECT_WORDS = _SELECT_DIGITS * _SELECT_BINS  # the multi-block selection's histograms


def emulated_scores(
    build,
    x: np.ndarray,
    payload: np.ndarray,
    row: int,
    lay,
    split: bool,
    threads: int = 32,
    cache: int = 2,
    hist: tuple[int, int] = (0, 0),
    pair: bool = True,
) -> int:
    """tah_gpu's scores launches on a grid of three blocks of ``threads`` threads (blocks
    that take several tokens, one none where there are two): with ``split`` and room for
    the sums (tah_gpu's rule) kernel 1 storing its warps' sums and kernel 6 adding them,
    else kernel 1 alone. ``hist``: the histograms' (byte offset, words) to zero; ``pair``:
    16-bit types on pairs of elements (SC_PAIR, tah_gpu's default). Returns the sums'
    offset (0: one kernel)."""
    sums = _score_sums(payload.ctypes.data, lay, threads // 32) if split else 0
    defs = {"TAH_OP": 1, "XT": XT[x.dtype], "SC_CACHE": cache, "THREADS": threads, "ROW": row}
    score = build({**defs, "SC_SPLIT": int(sums > 0), "SC_PAIR": int(pair and x.dtype != XT32)})
    score.emu_set_grid(3)
    score.emu_launch8(x.ctypes.data, payload.ctypes.data, x.size, row, lay.tokens, *hist, sums)
    if sums:  # two blocks of 32 threads: one thread a token, grid-stride past 64 tokens
        launch(build({"TAH_OP": 6}), 2, payload.ctypes.data, None, lay.tokens, sums,
               threads // 32, 0, 0)  # fmt: skip
    return sums


def emulated_select(build, payload: np.ndarray, lay, cache: int = 16, hist0: int = 0) -> None:
    """The selection: the scores at the payload's start into its token bitmap; with hist0
    (the byte offset of zeroed histograms) tah_gpu's multi-block launches first, each digit
    on a grid of three blocks of 64 threads (blocks that take several scores, one none)."""
    if hist0 and lay.low_tokens > 0:
        digit = build({"TAH_OP": 5, "THREADS": 64})
        for d in range(_SELECT_DIGITS):
            args = (lay.full_tokens, lay.low_tokens, hist0, d, 0, 0)
            launch(digit, 3, payload.ctypes.data, None, *args)
    launch(
        build({"TAH_OP": 4, "SEL_CACHE": cache}), 1, payload.ctypes.data, None, lay.tokens,
        lay.full_tokens, lay.low_tokens, lay.bitmap_offset, hist0 if lay.low_tokens else 0,
    )  # fmt: skip


def scratch_payload(lay, multi: bool) -> tuple[np.ndarray, int]:
    """A payload of 0xAB bytes (every byte must be written) and the histograms' offset:
    past the payload, in the same buffer (these payloads' step regions are smaller than
    the histograms, which the GPU takes only where K >= their words), 4-byte aligned."""
    if not multi:
        return np.full(lay.nbytes, 0xAB, np.uint8), 0
    hist0 = -(-lay.nbytes // 4) * 4
    buf = np.full(hist0 + 4 * SELECT_WORDS, 0xAB, np.uint8)
    return buf, hist0


def tile_grid(lay, tile: int, epl: int) -> int:
    """Blocks for the tile kernels: several, some ranges short or empty."""
    groups = -(-lay.tiles // (32 // (tile // epl)))
    return min(5, groups)


def emulated_encode(
    build,
    c: TahCompressor,
    x: np.ndarray,
    cache: int = 16,
    multi: bool = False,
    epl: int | None = None,
) -> np.ndarray:
    n = x.size
    lay = tah_layout(n, c.row, c.tile, c.bits_high, c.bits_low, c.low_fraction)
    buf, hist0 = scratch_payload(lay, multi)
    payload = buf[: lay.nbytes]
    if lay.tiles == 0:
        return payload
    hwords = SELECT_WORDS if hist0 else 0
    # One warp keeping one chunk a thread: tokens beyond 256 elements are read twice; then
    # two chunks a thread (512 elements: a token's second chunk may be past its end). Three
    # blocks: a block's next token loaded ahead of its sums. Each in one kernel and split
    # (where the payload has room for the sums), the split last, as tah_gpu's default;
    # 16-bit types also without SC_PAIR (every element through float32).
    want = token_keys(x.astype(np.float32), c.row) >> 32
    forms = [(2, False, False), (1, True, False)] if x.dtype != XT32 else []
    forms += [(2, False, True), (1, False, True), (1, True, True), (2, True, True)]
    for sc_cache, split, pair in forms:
        hist = (hist0, hwords)
        emulated_scores(build, x, payload, c.row, lay, split, 32, sc_cache, hist, pair)
        scores = payload[: 4 * lay.tokens].view(np.uint32).astype(np.int64)
        msg = f"SC_CACHE={sc_cache} {split=} {pair=}"
        np.testing.assert_array_equal(scores, want, err_msg=msg)
    if hist0:  # the scores kernel zeroed the histograms
        assert not buf[hist0:].any()
    emulated_select(build, buf, lay, cache, hist0)
    ratio = f"{int(np.float32(c.pivot_ratio).view(np.uint32)):#010x}u"
    defs = {"TAH_OP": 2, "XT": XT[x.dtype], "PIVOT": int(c.pivot == "auto"), "RATIO_BITS": ratio}
    epl = _EPL[_ENCODE] if epl is None else epl
    launch(
        build({**defs, **_variant(c, epl)}), tile_grid(lay, c.tile, epl), x.ctypes.data,
        buf.ctypes.data, n, c.row, lay.tiles, lay.pivot_offset, lay.bitmap_offset,
    )  # fmt: skip
    return payload.copy()


def emulated_decode(
    build,
    c,
    payload,
    out: np.ndarray,
    accumulate: bool,
    epl: int | None = None,
    ahead: int | None = None,
    threads: int | None = None,
    grid: int | None = None,
    pre: int | None = None,
    npre: int = _DECODE_TABLE_TOKENS,
) -> np.ndarray:
    """The decode kernel (tah_gpu's defines unless given): ``ahead`` its DEC_AHEAD, ``pre``
    its DEC_PRE and ``npre`` the tokens of its table, ``threads`` a block's, ``grid`` the
    blocks (tile_grid's by default)."""
    n = out.size
    lay = tah_layout(n, c.row, c.tile, c.bits_high, c.bits_low, c.low_fraction)
    if lay.tiles == 0:
        return out
    if epl is None:  # the launch's
        epl = _EPL[_DECODE_ACC if accumulate else _DECODE]
    defs = {"TAH_OP": 3, "XT": XT[out.dtype], "ACC": int(accumulate), **_variant(c, epl)}
    kind = _DECODE_ACC if accumulate else _DECODE
    defs["DEC_AHEAD"] = int(_DECODE_AHEAD[kind] if ahead is None else ahead)
    defs["DEC_PRE"] = int(_DECODE_PREFIX[kind] if pre is None else pre)
    if defs["DEC_PRE"]:
        defs["NPRE"] = npre
    if threads is not None:
        defs["THREADS"] = threads
    grid = tile_grid(lay, c.tile, epl) if grid is None else grid
    launch(
        build(defs), grid, payload.ctypes.data, out.ctypes.data, n, c.row, lay.tiles,
        lay.pivot_offset, lay.bitmap_offset,
    )  # fmt: skip
    return out


def assert_values_equal(got: np.ndarray, want: np.ndarray, msg: str) -> None:
    nan = np.isnan(want.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float64)), nan, err_msg=msg)
    bits = {2: np.uint16, 4: np.uint32}[want.dtype.itemsize]
    np.testing.assert_array_equal(got[~nan].view(bits), want[~nan].view(bits), err_msg=msg)


def data(rng: np.random.Generator, n: int, row: int, dtype: np.dtype) -> np.ndarray:
    x = rng.standard_normal(n)
    lo, hi = (-3, 3) if dtype == np.float16 else (-20, 20)
    x *= np.repeat(10.0 ** rng.uniform(lo, hi, -(-n // row)), row)[:n]
    x[rng.random(n) < 0.01] *= 100.0  # outliers: pivot tiles and low tokens
    if n > 1000:
        x[777] = np.nan
    return x.astype(dtype)


@pytest.mark.parametrize("cfg, dtype", CASES, ids=lambda v: str(v))
def test_emulated_kernels_match_cpu(build, cfg: dict, dtype) -> None:
    dtype = np.dtype(dtype)
    c = TahCompressor(**cfg)
    rng = np.random.default_rng(c.row + c.tile)
    inputs = [data(rng, n, c.row, dtype) for n in (1, 63, c.row - 1, 7 * c.row + 100)]
    sweep = TahCompressor(**{**cfg, "row": c.tile})
    inputs.append(magnitude_sweep(np.random.default_rng(3), c.tile, dtype).astype(dtype))
    for i, x in enumerate(inputs):
        codec = sweep if i == len(inputs) - 1 else c
        msg = f"{cfg} {dtype} n={x.size}"
        want = codec.encode(x)
        for multi in (False, True):
            got = emulated_encode(build, codec, x, multi=multi)
            np.testing.assert_array_equal(got, want, err_msg=f"{msg} multi={multi}")
        for epl in ENCODE_EPLS:  # the launch's (above) and the other
            if epl != _EPL[_ENCODE] and epl <= codec.tile:
                got = emulated_encode(build, codec, x, epl=epl)
                np.testing.assert_array_equal(got, want, err_msg=f"{msg} EPL={epl}")
        expect = codec.decode(want, count=x.size, dtype=dtype)
        acc = rng.standard_normal(x.size).astype(np.float32)
        expect_acc = codec.decode(want, acc.copy(), count=x.size, dtype=dtype, accumulate=True)
        for epl in DECODE_EPLS:  # the launches' (32 and 16), each with and without ACC
            out = np.full(x.size, 7, dtype)
            got = emulated_decode(build, codec, want, out, False, epl)
            assert_values_equal(got, expect, f"{msg} EPL={epl}")
            got = emulated_decode(build, codec, want, acc.copy(), True, epl)
            assert_values_equal(got, expect_acc, f"{msg} EPL={epl} accumulate")


def test_the_kernels_score_tables_are_tah_formats() -> None:
    text = (KERNELS / "tah_tables.cu").read_text()
    for name, want in (("TAH_SCORE_W", SCORE_W), ("TAH_SCORE_WL", SCORE_WL)):
        body = re.search(name + r"\[[^]]*\] = \{([^}]*)\}", text).group(1)
        np.testing.assert_array_equal(np.array(body.split(","), np.int64), want, err_msg=name)


@pytest.mark.parametrize("tokens", [1, 7, 8, 9, 255, 256, 257, 700, 1500])
@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("spread", [1, 3, 1 << 26, 1 << 31])
@pytest.mark.parametrize("multi", [False, True], ids=["one-block", "multi-block"])
def test_emulated_selection_is_the_cpu_sort(
    build, tokens: int, fraction: float, spread, multi: bool
) -> None:
    # One score, few distinct ones (most keys tie on the score and the token index
    # decides), or scores over all three radix digits (up to 2^31: the CPU's keys are
    # int64); the last token short (never low) for odd counts. Two scores a thread: 512 a
    # chunk, so the larger payloads have several.
    row, rng = 32, np.random.default_rng(tokens)
    count = tokens * row - (tokens % 2) * 5
    lay = tah_layout(count, row, 32, 4, 3, fraction)
    scores = rng.integers(0, spread, lay.tokens).astype(np.uint32)
    if spread > 3:
        scores[rng.random(lay.tokens) < 0.3] = scores[0]  # ties at a wide score too
    buf, hist0 = scratch_payload(lay, multi)
    buf[hist0:] = 0  # the scores kernel's zeroing (emulated_encode checks that one)
    payload = buf[: lay.nbytes]
    payload[: 4 * lay.tokens] = scores.view(np.uint8)
    emulated_select(build, buf, lay, cache=2, hist0=hist0)
    keys = (scores.astype(np.int64) << 32) | np.arange(lay.tokens)
    lb = low_prefix(keys, lay.full_tokens, fraction)
    want = np.packbits((lb[1:] - lb[:-1]).astype(np.uint8), bitorder="little")
    np.testing.assert_array_equal(payload[lay.bitmap_offset :], want)


@pytest.mark.parametrize("cfg, dtype", [CASES[0], CASES[3]], ids=lambda v: str(v))
def test_emulated_kernels_match_cpu_over_many_tokens(build, cfg: dict, dtype) -> None:
    # 70 tokens: a tile's place counts several bitmap bytes, the blocks' ranges start in
    # different bytes (float32 variants of test_emulated_kernels_match_cpu, already built).
    dtype = np.dtype(dtype)
    c = TahCompressor(**cfg)
    x = data(np.random.default_rng(c.row), 70 * c.row - 3, c.row, dtype)
    want = c.encode(x)
    np.testing.assert_array_equal(emulated_encode(build, c, x), want, err_msg=str(cfg))
    expect = c.decode(want, count=x.size, dtype=dtype)
    got = emulated_decode(build, c, want, np.full(x.size, 7, dtype), False)
    assert_values_equal(got, expect, str(cfg))


@pytest.mark.parametrize("cfg, dtype", [CASES[0], CASES[1]], ids=lambda v: str(v))
def test_emulated_kernels_match_cpu_unaligned(build, cfg: dict, dtype) -> None:
    # x and out one element past a 16-byte boundary and the payload one byte past a word:
    # the element-by-element loads and stores and the byte-wise scales and scores.
    dtype = np.dtype(dtype)
    c = TahCompressor(**cfg)
    n = 5 * c.row + 40
    buf = np.empty(n + 1, dtype)
    x = buf[1:]
    x[:] = data(np.random.default_rng(7), n, c.row, dtype)
    want = c.encode(x)
    lay = tah_layout(n, c.row, c.tile, c.bits_high, c.bits_low, c.low_fraction)
    pbuf = np.full(lay.nbytes + 1, 0xAB, np.uint8)
    payload = pbuf[1:]
    payload[:] = emulated_encode(build, c, x)  # the aligned encode checked first
    np.testing.assert_array_equal(payload, want)
    got = np.full(lay.nbytes + 1, 0xAB, np.uint8)[1:]
    # the encode on the unaligned x into the unaligned payload, its sums realigned
    sums = emulated_scores(build, x, got, c.row, lay, True)
    assert sums > 0 and (got.ctypes.data + sums) % 8 == 0
    scores = got[: 4 * lay.tokens].copy().view(np.uint32).astype(np.int64)
    np.testing.assert_array_equal(scores, token_keys(x.astype(np.float32), c.row) >> 32)
    emulated_select(build, got, lay)
    ratio = f"{int(np.float32(c.pivot_ratio).view(np.uint32)):#010x}u"
    defs = {"TAH_OP": 2, "XT": XT[dtype], "PIVOT": int(c.pivot == "auto"), "RATIO_BITS": ratio}
    epl = _EPL[_ENCODE]
    launch(
        build({**defs, **_variant(c, epl)}), tile_grid(lay, c.tile, epl), x.ctypes.data,
        got.ctypes.data, n, c.row, lay.tiles, lay.pivot_offset, lay.bitmap_offset,
    )  # fmt: skip
    np.testing.assert_array_equal(got, want, err_msg=f"{cfg} unaligned encode")
    expect = c.decode(want, count=n, dtype=dtype)
    out = np.full(n + 1, 7, dtype)[1:]
    assert_values_equal(emulated_decode(build, c, got, out, False), expect, f"{cfg} unaligned")


def score_data(rng: np.random.Generator, tokens: int, row: int, dtype: np.dtype) -> np.ndarray:
    """Tokens of every kind the scores tell apart: ordinary ones, all zeros, one with a
    NaN, one with an infinity, one of magnitudes below 2^-94 (whose zeros need their own
    level: the kernel's Z variant) with some zeros, and one short last token."""
    x = data(rng, tokens * row - row // 3, row, dtype).astype(np.float32)
    x[np.isnan(x)] = 1.0
    kinds = [lambda t: t.fill(0.0), lambda t: t.__setitem__(5, np.nan),
             lambda t: t.__setitem__(-1, -np.inf), lambda t: t.__imul__(2.0**-110)]  # fmt: skip
    for k, t in enumerate(rng.permutation(tokens - 1)[: len(kinds)]):
        kinds[k](x[t * row : (t + 1) * row])
    if dtype != np.float16:  # float16 has no magnitudes that small (they flush to zero)
        tiny = x[row * (tokens // 2) : row * (tokens // 2 + 1)]
        tiny *= 2.0**-110
        tiny[::7] = 0.0
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float16), BF16], ids=str)
@pytest.mark.parametrize("tokens", [1, 2, 9])
@pytest.mark.parametrize("threads, row", [(32, 256), (64, 1024), (128, 512)])
def test_emulated_split_scores(build, dtype, tokens: int, threads: int, row: int) -> None:
    # The scores in two launches (kernel 1's per-warp sums, kernel 6's adds) against the
    # CPU's, and in one: tokens not live (zeros, NaN, infinity: score 0), the Z variant,
    # a short last token, one token;
    # 2 and 4 warps a block (several sums a token), some warps past a short token's end.
    dtype = np.dtype(dtype)
    x = score_data(np.random.default_rng(tokens * row), tokens, row, dtype)
    lay = tah_layout(x.size, row, 64, 4, 3, 0.2)
    want = token_keys(x.astype(np.float32), row) >> 32
    for split in (True, False):
        payload = np.full(lay.nbytes, 0xAB, np.uint8)
        sums = emulated_scores(build, x, payload, row, lay, split, threads, cache=1)
        assert sums > 0 or not split
        got = payload[: 4 * lay.tokens].view(np.uint32).astype(np.int64)
        np.testing.assert_array_equal(got, want, err_msg=f"{split=} {sums=}")
    if tokens == 9:
        assert (want == 0).sum() >= 3  # the zero, NaN and infinity tokens


@pytest.mark.parametrize("cfg, dtype", [CASES[1], CASES[3]], ids=lambda v: str(v))
def test_emulated_split_scores_many_tokens(build, cfg: dict, dtype) -> None:
    # The whole encode over more tokens than the multi-block selection's threshold would
    # take on the GPU (with its histograms here past the payload), the scores split.
    dtype = np.dtype(dtype)
    c = TahCompressor(**{**cfg, "row": 64, "tile": 64})
    x = score_data(np.random.default_rng(5), 600, c.row, dtype)
    want = c.encode(x)
    got = emulated_encode(build, c, x, multi=True)
    np.testing.assert_array_equal(got, want, err_msg=str(cfg))


def pair_edge_tokens(rng: np.random.Generator, dtype: np.dtype, row: int) -> np.ndarray:
    """16-bit tokens around SC_PAIR's bound (PAIR_MIN: bfloat16 bits 0x0800, float16
    0x4400 = 4.0), each with zeros, -0, the smallest magnitudes (float16 subnormals) and
    random bits below its largest: at the bound, one above and below it, the largest
    finite, and below the bound where the 16-bit form would be wrong (float16: a zero's
    level under 0x4000, subnormals' levels under 0x4400; bfloat16: a zero's level);
    float16 tokens of normal values only, at any largest |x|, and one with a subnormal."""
    top = {
        BF16: (0x0800, 0x07FF, 0x7F7F, 0x0801, 0x0400),
        np.dtype(np.float16): (0x4400, 0x43FF, 0x7BFF, 0x4401, 0x4100, 0x3FFF),
    }
    toks = []
    for hi in top[dtype]:
        h = rng.integers(0, hi + 1, row, dtype=np.uint16)
        h[rng.random(row) < 0.5] >>= np.uint16(rng.integers(1, 15))  # spread over exponents
        h[:8] = (hi, 0, 0, 1, 2, 0x3FF, 0x400, 0x401)
        h |= (rng.random(row) < 0.5).astype(np.uint16) << 15  # signs, -0 among them
        toks.append(rng.permutation(h))
    if dtype == np.float16:  # all normal (the pairs at any largest |x|), then one subnormal
        for hi in (0x3FFF, 0x0800, 0x0400, 0x3C00):
            h = rng.integers(0x400, hi + 1, row, dtype=np.uint16)
            h |= (rng.random(row) < 0.5).astype(np.uint16) << 15
            toks.append(h)
        toks.append(toks[-1].copy())
        toks[-1][rng.integers(row)] = 0x3FF
    return np.concatenate(toks).view(dtype)


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=str)
@pytest.mark.parametrize("threads, row, cache", [(32, 256, 1), (64, 512, 1), (32, 256, 2)])
def test_emulated_pair_scores_at_the_bound(build, dtype, threads: int, row: int, cache) -> None:
    # The pairs' form exactly where it starts (a zero's level 256, float16 subnormals far
    # enough below) and the float32 path one step under it, against the CPU's scores;
    # with one chunk a thread cached, tokens longer than the cache (chunk_pairs' sweeps).
    x = pair_edge_tokens(np.random.default_rng(row + threads), dtype, row)
    lay = tah_layout(x.size, row, 64, 4, 3, 0.2)
    want = token_keys(x.astype(np.float32), row) >> 32
    assert (want > 0).all()
    for split in (True, False):
        payload = np.full(lay.nbytes, 0xAB, np.uint8)
        emulated_scores(build, x, payload, row, lay, split, threads, cache)
        got = payload[: 4 * lay.tokens].view(np.uint32).astype(np.int64)
        np.testing.assert_array_equal(got, want, err_msg=f"{split=}")


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), BF16], ids=str)
def test_emulated_scores_long_rows(build, dtype) -> None:
    # Rows of more than 2^11 elements a thread (32 threads, 2^17 elements): the warps'
    # sums in 16-bit pieces (four reductions), most chunks read twice.
    row = 1 << 17
    x = data(np.random.default_rng(17), 2 * row - 100, row, dtype)
    x[np.isnan(x.astype(np.float32))] = 0
    lay = tah_layout(x.size, row, 64, 4, 3, 0.2)
    want = token_keys(x.astype(np.float32), row) >> 32
    for split in (True, False):
        payload = np.full(lay.nbytes, 0xAB, np.uint8)
        emulated_scores(build, x, payload, row, lay, split, 32, 2)
        got = payload[: 4 * lay.tokens].view(np.uint32).astype(np.int64)
        np.testing.assert_array_equal(got, want, err_msg=f"{split=}")


def test_split_scores_scratch() -> None:
    # The sums lie 8-byte aligned at or after the codes region and inside the payload, or
    # nowhere (0: the scores in one kernel) where they do not fit (tokens of 32 two-bit codes).
    lay = tah_layout(4096 * 9 + 5, 4096, 64, 4, 3, 0.2)
    for ptr in range(8):
        sums = _score_sums(ptr, lay)
        assert sums >= 8 * lay.tiles and (ptr + sums) % 8 == 0
        assert sums + 16 * 8 * lay.tokens <= lay.nbytes
    assert _score_sums(0, tah_layout(32 * 50, 32, 32, 2, 2, 0.2)) == 0


# Each width 2..8 as the high and as the low tokens' (the encode packs codes at a width
# fixed at compile time, straddling words where 32 is not a multiple of it).
WIDTH_PAIRS = [(2, 2), (3, 2), (4, 3), (5, 4), (6, 5), (7, 6), (8, 7), (8, 2)]


@pytest.mark.parametrize("bits", WIDTH_PAIRS, ids=lambda b: f"BH{b[0]}-BL{b[1]}")
@pytest.mark.parametrize("epl", ENCODE_EPLS)
def test_emulated_encode_every_width(build, bits: tuple[int, int], epl: int) -> None:
    # Pivot tiles (outliers), NaN/Inf tiles, a short last token and tile, half the tokens
    # low; bfloat16 (the 16-bit range reductions) and float32.
    bh, bl = bits
    c = TahCompressor(row=128, tile=64, bits_high=bh, bits_low=bl, low_fraction=0.5)
    rng = np.random.default_rng(10 * bh + bl)
    for dtype in (BF16, np.dtype(np.float32)):
        x = data(rng, 7 * c.row + 100, c.row, dtype)
        x[300] = np.inf
        x[450] = -np.inf
        x[600:664] = 0  # a tile whose range is 0
        x[700] = -np.nan
        want = c.encode(x)
        got = emulated_encode(build, c, x, epl=epl)
        np.testing.assert_array_equal(got, want, err_msg=f"{bits} {dtype} EPL={epl}")
        expect = c.decode(want, count=x.size, dtype=dtype)
        out = emulated_decode(build, c, want, np.full(x.size, 7, dtype), False)
        assert_values_equal(out, expect, f"{bits} {dtype} decode")


@pytest.mark.parametrize("b", range(2, 9))
def test_step_fixup_without_division(b: int) -> None:
    # The encode's test of FORMAT.md's RN(r / step) > qh: r > step (qh + ulp(qh) / 2) in
    # float64, over ranges from subnormal to the top of float32 and steps a few ulps
    # around RN(r / qh).
    rng = np.random.default_rng(b)
    qh = np.float32((2**b - 1) * 0.5)
    qhm = np.float64(qh) + 2.0 ** (b - 26)
    bits = rng.integers(1, 0x7F7FFFFF, 200_000, dtype=np.uint32)
    rr = bits.view(np.float32)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        step0 = (rr / qh).view(np.uint32).astype(np.int64)
        for d in (-2, -1, 0, 1, 2):
            s = np.clip(step0 + d, 0, 0x7F7FFFFF).astype(np.uint32).view(np.float32)
            want = (s == 0) | (rr / s > qh)
            got = rr.astype(np.float64) > s.astype(np.float64) * qhm
            np.testing.assert_array_equal(got, want, err_msg=f"b={b} d={d}")


# (dtype, EPL, DEC_AHEAD): both EPLs with and without the look-ahead for bfloat16 and
# float32, float16 at the default launch's.
MANY_GROUPS = [(d, e, a) for d in (BF16, XT32) for e in DECODE_EPLS for a in (1, 0)]
MANY_GROUPS.append((np.dtype(np.float16), _EPL[_DECODE], int(_DECODE_AHEAD[_DECODE])))


@pytest.mark.parametrize("pre", [1, 0], ids=["table", "walk"])
@pytest.mark.parametrize("dtype, epl, ahead", MANY_GROUPS, ids=str)
def test_emulated_decode_many_groups_a_warp(build, pre: int, ahead: int, epl: int, dtype) -> None:
    # Two warps a block and at most three blocks, so that each warp decodes many tile
    # groups in turn (with DEC_AHEAD the next one's loads before this one's stores), the
    # places from the block's table (DEC_PRE) or the walk over the bitmap: low and high
    # tokens in one warp's group (row 128), pivot tiles, a NaN, infinities beyond the
    # float32 range's steps (the sat vote), a zero tile, the short last token and tile; out
    # whole (the chunked staging) and one element past 16 bytes (every group from registers);
    # accumulating and not.
    c = TahCompressor(row=128, tile=64, bits_high=5, bits_low=3, low_fraction=0.5)
    rng = np.random.default_rng(epl + ahead)
    n = 41 * c.row + 70
    with np.errstate(over="ignore"):  # float16: outliers past its range, infinities
        x = data(rng, n, c.row, dtype)
    x[300], x[450], x[600:664] = np.inf, -np.inf, 0
    if dtype == np.float32:
        x[2000:2064] = rng.choice([-3.0e38, 3.0e38], 64)  # steps near the top: sat
    want = c.encode(x)
    expect = c.decode(want, count=n, dtype=dtype)
    acc = rng.standard_normal(n).astype(np.float32)
    expect_acc = c.decode(want, acc.copy(), count=n, dtype=dtype, accumulate=True)
    for grid in (1, 3):
        for shift in (0, 1):
            msg = f"{dtype} EPL={epl} {ahead=} {pre=} {grid=} {shift=}"
            out = np.full(n + shift, 7, dtype)[shift:]
            got = emulated_decode(build, c, want, out, False, epl, ahead, 64, grid, pre)
            assert_values_equal(got, expect, msg)
            if dtype == np.float32:
                out = np.empty(n + shift, np.float32)[shift:]
                out[:] = acc
                got = emulated_decode(build, c, want, out, True, epl, ahead, 64, grid, pre)
                assert_values_equal(got, expect_acc, msg + " accumulate")


@pytest.mark.parametrize("npre", [1, 5, 16])
@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float32)], ids=str)
def test_emulated_decode_blocks_past_their_table(build, npre: int, dtype) -> None:
    # Blocks of more tokens than their table holds (tah_gpu's grids never make them): the
    # places past it from the bitmap (far_entry), tokens of one tile (row 64) and of two
    # groups (row 2048), one and three blocks, low and high tokens, pivots, NaN/Inf, a short
    # last token; both EPLs, accumulating and not, out aligned and not.
    rng = np.random.default_rng(npre)
    for row in (64, 2048):
        c = TahCompressor(row=row, tile=64, bits_high=4, bits_low=3, low_fraction=0.4)
        n = 9000 + 77 if row == 64 else 40 * row + 77
        x = data(rng, n, c.row, dtype)
        x[100], x[5000] = np.inf, np.nan
        want = c.encode(x)
        expect = c.decode(want, count=n, dtype=dtype)
        acc = rng.standard_normal(n).astype(np.float32)
        expect_acc = c.decode(want, acc.copy(), count=n, dtype=dtype, accumulate=True)
        for grid, shift, epl in ((1, 0, 32), (3, 1, 32), (3, 0, 16)):
            msg = f"{dtype} {row=} {npre=} {grid=} {shift=} {epl=}"
            out = np.full(n + shift, 7, dtype)[shift:]
            got = emulated_decode(build, c, want, out, False, epl, 1, 64, grid, 1, npre)
            assert_values_equal(got, expect, msg)
            if dtype == np.float32:
                out = np.empty(n + shift, np.float32)[shift:]
                out[:] = acc
                got = emulated_decode(build, c, want, out, True, epl, 0, 64, grid, 1, npre)
                assert_values_equal(got, expect_acc, msg + " accumulate")
