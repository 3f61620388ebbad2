"""The tah codec's CUDA kernels (compressors/tah_gpu.py) against its CPU kernels, bit for bit.

Payload bytes identical (the low tokens, pivots, centres, steps and codes), decoded values
and accumulations identical bit for bit, NaNs compared as NaN-ness (FORMAT.md fixes the
NaN bits stored in payloads, not those of decoded NaNs). The encode and decode captured
in a CUDA graph (CuPy stream capture, no allocation allowed) and replayed on new data give
the eager bytes and values. Skips without CuPy and a GPU.
"""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import pytest

try:
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 1:
        raise RuntimeError("no CUDA device")
except Exception as exc:  # ImportError, no driver, no device
    pytest.skip(f"needs CuPy and a CUDA GPU ({exc})", allow_module_level=True)

from coccl.compressors import TahCompressor  # noqa: E402

from codec_reference import magnitude_sweep  # noqa: E402

pytestmark = pytest.mark.gpu

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float32), np.dtype(np.float16), BF16]
VARIANTS = [
    {"row": 256},
    {"row": 256, "pivot": "off"},
    {"row": 4096},
    {"row": 128, "tile": 32, "bits_high": 5, "bits_low": 2, "low_fraction": 0.5},
    {"row": 384, "tile": 128, "bits_high": 8, "bits_low": 4, "pivot_ratio": 4.0},
    {"row": 64, "low_fraction": 1.0},
]


def _id(cfg: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in cfg.items())


def to_dev(a: np.ndarray) -> cupy.ndarray:
    if a.dtype == BF16:
        return cupy.asarray(a.view(np.uint16)).view(BF16)
    return cupy.asarray(a)


def to_host(d: cupy.ndarray) -> np.ndarray:
    if np.dtype(d.dtype) == BF16:
        return cupy.asnumpy(d.view(cupy.uint16)).view(BF16)
    return cupy.asnumpy(d)


def assert_values_equal(got: np.ndarray, want: np.ndarray, msg: str) -> None:
    assert got.dtype == want.dtype, msg
    g, w = got.astype(np.float64), want.astype(np.float64)
    nan = np.isnan(w)
    np.testing.assert_array_equal(np.isnan(g), nan, err_msg=msg)
    bits = {2: np.uint16, 4: np.uint32}[want.dtype.itemsize]
    np.testing.assert_array_equal(got[~nan].view(bits), want[~nan].view(bits), err_msg=msg)


def make_data(rng: np.random.Generator, count: int, row: int, dtype: np.dtype) -> np.ndarray:
    """Tokens of varied magnitude, outlier channels, tiles of one dominant value, a NaN."""
    x = rng.standard_normal(count)
    tokens = -(-count // row)
    lo, hi = (-3, 3) if dtype == np.float16 else (-20, 20)
    x *= np.repeat(10.0 ** rng.uniform(lo, hi, tokens), row)[:count]
    spikes = rng.random(count) < 0.004
    x[spikes] *= 100.0
    if count > 1000:
        x[777] = np.nan
    return x.astype(dtype)


def with_special_tiles(x: np.ndarray) -> np.ndarray:
    """``x`` (at least 700 elements) with tiles holding +Inf, -Inf and -NaN, and the tile
    [600, 664) all zeros (its range 0)."""
    x[300], x[450], x[700] = np.inf, -np.inf, -np.nan
    x[600:664] = 0
    return x


def check_roundtrip(c: TahCompressor, x: np.ndarray, msg: str) -> None:
    rng = np.random.default_rng(x.size)
    n = x.size
    want = c.encode(x)
    got = c.encode(to_dev(x))
    np.testing.assert_array_equal(cupy.asnumpy(got), want, err_msg=f"{msg}: payload")
    for payload in (want, got):  # the GPU decodes the CPU's payload and its own
        dev = payload if isinstance(payload, cupy.ndarray) else cupy.asarray(payload)
        d = to_host(c.decode(dev, count=n, dtype=x.dtype))
        assert_values_equal(d, c.decode(want, count=n, dtype=x.dtype), f"{msg}: decode")
    acc = rng.standard_normal(n).astype(np.float32)
    want_a = c.decode(want, acc.copy(), count=n, dtype=x.dtype, accumulate=True)
    got_a = c.decode(got, cupy.asarray(acc), count=n, dtype=x.dtype, accumulate=True)
    assert_values_equal(cupy.asnumpy(got_a), want_a, f"{msg}: accumulate")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cfg", VARIANTS, ids=_id)
def test_gpu_matches_cpu(cfg: dict, dtype: np.dtype) -> None:
    c = TahCompressor(**cfg)
    rng = np.random.default_rng(zlib.crc32(_id(cfg).encode()))
    counts = [0, 1, 63, c.row - 1, c.row, 7 * c.row + 100, 300 * c.row + 33]
    for n in counts:
        check_roundtrip(c, make_data(rng, n, c.row, dtype), f"{cfg} {dtype} n={n}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cfg", VARIANTS[:2] + VARIANTS[3:5], ids=_id)
def test_gpu_whole_range(cfg: dict, dtype: np.dtype) -> None:
    c = TahCompressor(**{**cfg, "row": cfg.get("tile", 64)})
    x = magnitude_sweep(np.random.default_rng(3), c.tile, dtype).astype(dtype)
    check_roundtrip(c, x, f"{cfg} {dtype} sweep")


def test_gpu_large_message() -> None:
    # Many blocks and grid-stride iterations: 2^24 + 5 bfloat16 elements.
    c = TahCompressor(row=4096)
    x = make_data(np.random.default_rng(9), (1 << 24) + 5, 4096, BF16)
    check_roundtrip(c, x, "large")


def test_gpu_many_tokens() -> None:
    # More full tokens (20000) than the selection keeps in registers at once (16384):
    # its passes reload the scores chunk by chunk; the last token short.
    c = TahCompressor(row=64, low_fraction=0.3)
    x = make_data(np.random.default_rng(11), 20000 * 64 + 17, 64, np.dtype(np.float32))
    check_roundtrip(c, x, "many tokens")


@pytest.mark.parametrize("offset", [1, 2, 3, 4])
def test_gpu_unaligned_buffers(offset: int) -> None:
    # Payloads at any byte offset (unaligned scales), inputs and outputs off 16 bytes.
    c = TahCompressor(row=256)
    n = 5000
    x = make_data(np.random.default_rng(offset), n, 256, np.dtype(np.float32))
    want = c.encode(x)
    raw = cupy.zeros(want.size + 8, cupy.uint8)
    view = raw[offset : offset + want.size]
    xd = cupy.zeros(n + 1, cupy.float32)
    xd[1:] = cupy.asarray(x)
    c.encode(xd[1:], view)
    np.testing.assert_array_equal(cupy.asnumpy(view), want)
    out = cupy.zeros(n + 1, cupy.float32)
    c.decode(view, out[1:], count=n, dtype=np.float32)
    assert_values_equal(cupy.asnumpy(out[1:]), c.decode(want, count=n, dtype=np.float32), "")


WINDOWS = [
    {"row": 256, "window": 5},
    {"row": 4096, "window": 8},
    {"row": 128, "tile": 32, "bits_high": 5, "bits_low": 2, "low_fraction": 0.5, "window": 3},
    {"row": 64, "window": 300, "low_fraction": 0.3},  # more tokens than a block's threads
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cfg", WINDOWS, ids=_id)
def test_gpu_windows(cfg: dict, dtype: np.dtype) -> None:
    # The window option's encodes (the scores, the selection within windows and the
    # tiles) against the CPU's: a short last window and token, more spans than the grid's
    # blocks.
    c = TahCompressor(**cfg)
    rng = np.random.default_rng(zlib.crc32(_id(cfg).encode()))
    for n in [1, c.row - 1, 7 * c.row + 100, 3001 * c.row + 33]:
        check_roundtrip(c, make_data(rng, n, c.row, dtype), f"{cfg} {dtype} n={n}")


@pytest.mark.parametrize("offset", [1, 4])
def test_gpu_window_unaligned(offset: int) -> None:
    # A window encode into a payload at an unaligned offset, x off 16 bytes.
    c = TahCompressor(row=256, window=5)
    n = 40 * 256 + 100
    x = make_data(np.random.default_rng(offset), n, 256, np.dtype(np.float32))
    want = c.encode(x)
    xd = cupy.zeros(n + 1, cupy.float32)
    xd[1:] = cupy.asarray(x)
    raw = cupy.zeros(want.size + 8, cupy.uint8)
    view = raw[offset : offset + want.size]
    c.encode(xd[1:], view)
    np.testing.assert_array_equal(cupy.asnumpy(view), want)


def test_gpu_float64_goes_through_float32() -> None:
    c = TahCompressor(row=256)
    x = make_data(np.random.default_rng(4), 3000, 256, np.dtype(np.float64))
    np.testing.assert_array_equal(cupy.asnumpy(c.encode(cupy.asarray(x))), c.encode(x))


def _no_allocation(nbytes: int) -> None:
    raise AssertionError(f"the tah kernels allocated {nbytes} bytes under capture")


@pytest.mark.parametrize(
    "cfg", [VARIANTS[0], VARIANTS[2], VARIANTS[3], VARIANTS[5], WINDOWS[0]], ids=_id
)
def test_gpu_encode_and_decode_replay_from_a_cuda_graph(cfg: dict) -> None:
    c = TahCompressor(**cfg)
    assert c.graph_safe
    n = 7 * c.row + 100
    f32 = np.dtype(np.float32)
    x = cupy.asarray(make_data(np.random.default_rng(5), n, c.row, f32))
    payload = cupy.zeros(c.encoded_nbytes(n, f32), cupy.uint8)
    out = cupy.zeros(n, cupy.float32)
    acc = cupy.zeros(n, cupy.float32)
    c.encode(x, payload)  # compiles the kernels outside the capture
    c.decode(payload, out, count=n, dtype=f32)
    c.decode(payload, acc, count=n, dtype=f32, accumulate=True)
    cupy.cuda.Device().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream, cupy.cuda.using_allocator(_no_allocation):
        stream.begin_capture()
        try:
            c.encode(x, payload)
            c.decode(payload, out, count=n, dtype=f32)
            c.decode(payload, acc, count=n, dtype=f32, accumulate=True)
        finally:
            graph = stream.end_capture()
    for seed in (6, 7):
        new = make_data(np.random.default_rng(seed), n, c.row, f32)
        start = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
        x.set(new)
        acc.set(start)
        payload.fill(0xAB)
        out.fill(7.0)
        cupy.cuda.Device().synchronize()
        graph.launch(stream)
        stream.synchronize()
        eager = c.encode(cupy.asarray(new))
        want = c.encode(new)
        np.testing.assert_array_equal(cupy.asnumpy(payload), cupy.asnumpy(eager))
        np.testing.assert_array_equal(cupy.asnumpy(payload), want)
        expect = c.decode(want, count=n, dtype=f32)
        assert_values_equal(cupy.asnumpy(out), expect, f"{cfg} replay decode")
        expect = c.decode(want, start.copy(), count=n, dtype=f32, accumulate=True)
        assert_values_equal(cupy.asnumpy(acc), expect, f"{cfg} replay accumulate")


@pytest.mark.parametrize("multi", [False, True], ids=["one-block", "multi-block"])
def test_gpu_selection_over_many_tokens(monkeypatch, multi: bool) -> None:
    # 20000 full tokens of 32 (the multi-block selection's histograms fit the step region):
    # scores with many ties (constant and two-valued tokens) and spread ones; both selections.
    from coccl.compressors import tah_gpu

    monkeypatch.setattr(tah_gpu, "_SELECT_MULTI", multi)
    c = TahCompressor(row=32, tile=32)
    rng = np.random.default_rng(23)
    n = 20000 * 32 + 7
    x = rng.standard_normal(n).astype(np.float32)
    x[: 4000 * 32] = 1.0
    x[4000 * 32 : 6000 * 32 : 2] = 0.5
    x *= np.repeat(10.0 ** rng.uniform(-5, 5, -(-n // 32)), 32)[:n].astype(np.float32)
    want = c.encode(x)
    got = cupy.zeros(want.size, cupy.uint8)
    tah_gpu.tah_encode(
        to_dev(x), got, row=32, tile=32, bits_high=c.bits_high, bits_low=c.bits_low,
        low_fraction=c.low_fraction, window=0, pivot=c.pivot == "auto",
        pivot_ratio=c.pivot_ratio,
    )  # fmt: skip
    np.testing.assert_array_equal(cupy.asnumpy(got), want, err_msg=f"multi={multi}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pairs", [False, True], ids=["float32-levels", "pairs"])
@pytest.mark.parametrize("split", [False, True], ids=["one-kernel", "split"])
def test_gpu_scores_split_and_not(monkeypatch, split: bool, pairs: bool, dtype) -> None:
    # The scores in one kernel and in two (tah_gpu._SCORE_SPLIT), 16-bit types on pairs of
    # elements or not (_SCORE_PAIRS): the same payload, over tokens not live (zeros, a NaN,
    # an infinity), tiny ones (zeros on their own level), float16 tokens below 4 (the
    # float32 path), a short last token, many tokens (the multi-block selection), and an
    # unaligned payload.
    from coccl.compressors import tah_gpu

    if pairs and dtype == np.float32:
        pytest.skip("pairs are for 16-bit types")
    monkeypatch.setattr(tah_gpu, "_SCORE_SPLIT", split)
    monkeypatch.setattr(tah_gpu, "_SCORE_PAIRS", pairs)
    c = TahCompressor(row=4096)
    rng = np.random.default_rng(31)
    n = 9000 * 4096 + 1000
    x = make_data(rng, n, 4096, dtype).astype(np.float64)
    x[5 * 4096 : 6 * 4096] = 0.0
    x[7 * 4096 + 9] = np.nan
    x[8 * 4096 + 3] = np.inf
    if dtype != np.float16:
        x[9 * 4096 : 10 * 4096] *= 2.0**-110
        x[9 * 4096 : 10 * 4096 : 5] = 0.0
    else:  # largest |x| at and below 4, with zeros and subnormals
        for t, top in ((9, 4.0), (10, 3.99), (11, 2.1)):
            tok = x[t * 4096 : (t + 1) * 4096]
            tok *= top / np.abs(tok).max()
            tok[::9] = 0.0
            tok[1::9] = 2.0**-20
    x = x.astype(dtype)
    want = c.encode(x)
    for offset in (0, 3):
        raw = cupy.zeros(want.size + 8, cupy.uint8)
        got = raw[offset : offset + want.size]
        c.encode(to_dev(x), got)
        np.testing.assert_array_equal(cupy.asnumpy(got), want, err_msg=f"{split=} {offset=}")


# Each width 2..8 as the high and as the low tokens' (the encode's codes are packed at a
# width fixed at compile time).
WIDTH_PAIRS = [(2, 2), (3, 2), (4, 3), (5, 4), (6, 5), (7, 6), (8, 7), (8, 2)]


@pytest.mark.parametrize("epl", [16, 32])
@pytest.mark.parametrize("bits", WIDTH_PAIRS, ids=lambda b: f"BH{b[0]}-BL{b[1]}")
def test_gpu_encode_every_width(monkeypatch, bits: tuple[int, int], epl: int) -> None:
    # The launch's encode (32 elements a lane) and the previous one (16, at 5 blocks a SM:
    # tah_gpu's A/B switch), with NaN/Inf tiles, a tile of zeros and the whole range.
    from coccl.compressors import tah_gpu

    min_blocks = {16: 5, 32: 4}[epl]
    monkeypatch.setitem(tah_gpu._EPL, tah_gpu._ENCODE, epl)
    monkeypatch.setitem(tah_gpu._TILE_MIN_BLOCKS, tah_gpu._ENCODE, min_blocks)
    bh, bl = bits
    c = TahCompressor(row=128, tile=64, bits_high=bh, bits_low=bl, low_fraction=0.5)
    rng = np.random.default_rng(10 * bh + bl)
    for dtype in DTYPES:
        x = with_special_tiles(make_data(rng, 7 * c.row + 100, c.row, dtype))
        check_roundtrip(c, x, f"{bits} {dtype} EPL={epl}")
        sweep = TahCompressor(row=64, tile=64, bits_high=bh, bits_low=bl, low_fraction=0.5)
        xs = magnitude_sweep(np.random.default_rng(3), 64, dtype).astype(dtype)
        check_roundtrip(sweep, xs, f"{bits} {dtype} EPL={epl} sweep")


@pytest.mark.parametrize("prefix", [True, False], ids=["table", "walk"])
@pytest.mark.parametrize("min_blocks", [3, 4])
@pytest.mark.parametrize("ahead", [True, False], ids=["ahead", "not-ahead"])
@pytest.mark.parametrize("bits", [(4, 3), (8, 2), (5, 5)], ids=lambda b: f"BH{b[0]}-BL{b[1]}")
def test_gpu_decode_switches(
    monkeypatch, bits: tuple[int, int], ahead: bool, min_blocks: int, prefix: bool
):
    # Both decodes with and without the look-ahead (tah_gpu._DECODE_AHEAD) at 3 and 4 blocks
    # a SM (80 and 64 registers), the places from the blocks' tables or the bitmap walk
    # (_DECODE_PREFIX): many groups a warp (2000 tokens), low and high tokens, pivots,
    # NaN/Inf tiles, a zero tile, a short last token; accumulating too.
    from coccl.compressors import tah_gpu

    for kind in (tah_gpu._DECODE, tah_gpu._DECODE_ACC):
        monkeypatch.setitem(tah_gpu._DECODE_AHEAD, kind, ahead)
        monkeypatch.setitem(tah_gpu._TILE_MIN_BLOCKS, kind, min_blocks)
        monkeypatch.setitem(tah_gpu._DECODE_PREFIX, kind, prefix)
    bh, bl = bits
    c = TahCompressor(row=256, tile=64, bits_high=bh, bits_low=bl, low_fraction=0.4)
    rng = np.random.default_rng(7 * bh + bl)
    for dtype in DTYPES:
        x = with_special_tiles(make_data(rng, 2000 * c.row + 77, c.row, dtype))
        check_roundtrip(c, x, f"{bits} {dtype} {ahead=} {min_blocks=} {prefix=}")


@pytest.mark.parametrize("tokens", [8, 100])
def test_gpu_decode_blocks_past_their_table(monkeypatch, tokens: int):
    # The places from tables (switched on) of 8 or 100 tokens (_DECODE_TABLE_TOKENS), grids
    # of the default's size (the launcher's bound for them patched away): blocks of more
    # tokens than their table, the places past it from the bitmap; tokens of one tile and
    # of 32.
    from coccl.compressors import tah_gpu

    for kind in tah_gpu._DECODE_PREFIX:
        monkeypatch.setitem(tah_gpu._DECODE_PREFIX, kind, True)
    monkeypatch.setattr(tah_gpu, "_DECODE_TABLE_TOKENS", tokens)
    monkeypatch.setattr(tah_gpu, "_decode_groups_per_block", lambda kind, row, tile: 0)
    monkeypatch.setattr(tah_gpu, "_plans", {})  # the grid's bound is not in a plan's key
    for row in (64, 2048):
        c = TahCompressor(row=row, tile=64, bits_high=4, bits_low=3, low_fraction=0.4)
        rng = np.random.default_rng(row + tokens)
        for dtype in DTYPES:
            x = with_special_tiles(make_data(rng, 300000 + 77, c.row, dtype))
            check_roundtrip(c, x, f"{row=} {dtype} {tokens=}")
