"""The tah codec (compressors/tah.py) against an independent float64 reference.

The reference parses the payload by FORMAT.md's layout, decodes it with explicit Hadamard
matrices in float64, and re-derives what encoding must have chosen: each tile's centre
and step from its min and max, its pivot from its top two magnitudes, its codes, and the
low tokens from the entropy proxy computed in float64. Plus the bound per tile over the
whole float32 range, fixed payload sizes and any count.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from coccl.compressors import TahCompressor, get_compressor
from coccl.compressors.tah_cpu import low_prefix
from coccl.compressors.tah_format import SCORE_W, SCORE_WL, tah_layout

from codec_reference import (
    assert_within_bound,
    group_errors,
    hadamard,
    magnitude_sweep,
    seed_for,
)

FLT_MAX = float(np.finfo(np.float32).max)
F32 = np.dtype(np.float32)

VARIANTS = [
    {"row": 256},
    {"row": 256, "pivot": "off"},
    {"row": 128, "tile": 32, "bits_high": 5, "bits_low": 2, "low_fraction": 0.5},
    {"row": 384, "tile": 128, "bits_high": 8, "bits_low": 4, "pivot_ratio": 4.0},
    {"row": 64, "low_fraction": 1.0},
    {"row": 192, "low_fraction": 0.0},
    {"row": 64, "window": 4, "low_fraction": 0.4},  # windows of 4: 7 tokens 4 + 3, 9: 4 + 4 + 1
]


def _id(cfg: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in cfg.items())


def activations(rng: np.random.Generator, count: int, row: int) -> np.ndarray:
    """Gaussian tokens of varied magnitude, with outlier channels in some tokens and a few
    tiles of one dominant value (the pivot's case)."""
    x = rng.standard_normal(count)
    tokens = -(-count // row)
    x *= np.repeat(10.0 ** rng.uniform(-2, 2, tokens), row)[:count]
    spikes = rng.random(count) < 0.004
    x[spikes] *= rng.uniform(20, 200, int(spikes.sum()))
    return x.astype(np.float32)


# ------------------------------------------------------------------- reference
def windows(full: int, window: int) -> list[range]:
    """FORMAT.md's windows of ``full`` full tokens: runs of ``window`` from token 0, the
    last one shorter; one run of them all for window 0 or window >= full."""
    size = full if window == 0 or window >= full else window
    return [range(a, min(a + size, full)) for a in range(0, full, max(size, 1))]


def low_count(n: int, f: float) -> int:
    return math.floor(f * n)  # Python floats are doubles


def low_flags(scores: list[int], full: int, f: float, window: int) -> list[int]:
    """The low tokens by FORMAT.md, window by window: sorted by score, then index."""
    flags = [0] * len(scores)
    for w in windows(full, window):
        for t in sorted(w, key=lambda t: (scores[t], t))[: low_count(len(w), f)]:
            flags[t] = 1
    return flags


def parse(c: TahCompressor, payload: np.ndarray, count: int) -> dict:
    """The parts of a payload, by FORMAT.md: per tile c, step and pivot byte; per token
    its flag; per element its code. Checks the flags' count in every window."""
    lay = tah_layout(count, c.row, c.tile, c.bits_high, c.bits_low, c.low_fraction, c.window)
    assert payload.size == lay.nbytes
    k = lay.tiles
    flags = np.unpackbits(payload[lay.bitmap_offset :], bitorder="little")[: lay.tokens]
    assert not flags[lay.full_tokens :].any() and int(flags.sum()) == lay.low_tokens
    for w in windows(lay.full_tokens, c.window):
        assert int(flags[w.start : w.stop].sum()) == low_count(len(w), c.low_fraction)
    codes = np.zeros(count, np.int64)
    bits = np.zeros(count, np.int64)
    off = lay.codes_offset
    for t in range(lay.tokens):
        n = min(c.row, count - t * c.row)
        b = c.bits_low if flags[t] else c.bits_high
        nb = -(-n * b // 8)
        raw = np.unpackbits(payload[off : off + nb], bitorder="little")[: n * b]
        codes[t * c.row : t * c.row + n] = raw.reshape(n, b) @ (1 << np.arange(b))
        bits[t * c.row : t * c.row + n] = b
        off += nb
    assert off == lay.pivot_offset
    return {
        "c": payload[: 4 * k].copy().view("<f4").astype(np.float64),
        "step": payload[4 * k : 8 * k].copy().view("<f4").astype(np.float64),
        "pivot": payload[lay.pivot_offset : lay.bitmap_offset].astype(np.int64),
        "flags": flags,
        "codes": codes,
        "bits": bits,
    }


def decode_ref(c: TahCompressor, parts: dict, count: int) -> np.ndarray:
    """FORMAT.md's decoding in float64."""
    t = c.tile
    out = np.empty(count)
    h = hadamard(t)
    for k in range(parts["c"].size):
        s = slice(k * t, min(count, (k + 1) * t))
        qh = (2.0 ** parts["bits"][s.start] - 1) / 2
        v = parts["c"][k] + (parts["codes"][s] - qh) * parts["step"][k]
        p = parts["pivot"][k]
        if p & 0x80:
            v = h @ v / t
            j = p & 0x7F
            v[0], v[j] = v[j], v[0]
        out[s] = v
    return out


def entropy_proxy(x32: np.ndarray, row: int) -> np.ndarray:
    """FORMAT.md's token score in float64: log2(S) + M / S from the integer tables."""
    bits = x32.view(np.uint32).astype(np.int64) & 0x7FFFFFFF
    out = []
    for t in range(-(-x32.size // row)):
        a = bits[t * row : (t + 1) * row]
        amax = a.max()
        if amax == 0 or amax >= 0x7F800000:
            out.append(-16.0)
            continue
        lev = np.where(a == 0, 256, np.minimum((amax - a) >> 19, 256))
        s, m = SCORE_W[lev].sum(), SCORE_WL[lev].sum()
        out.append(math.log2(s) + m / s - 16.0)
    return np.array(out)


# ----------------------------------------------------------------------- tests
@pytest.mark.parametrize("cfg", VARIANTS, ids=_id)
@pytest.mark.parametrize("tokens, extra", [(0, 0), (0, 1), (0, 63), (1, -1), (7, 0), (9, 100)])
def test_payload_matches_reference(cfg: dict, tokens: int, extra: int, request) -> None:
    seed = seed_for(request)
    c = TahCompressor(**cfg)
    count = tokens * c.row + extra
    x = activations(np.random.default_rng(seed), count, c.row)
    payload = c.encode(x)
    assert payload.size == c.encoded_nbytes(count, F32)
    y = c.decode(payload, count=count, dtype=np.float32)
    msg = f"{cfg} count={count} seed={seed}"
    if count == 0:
        assert payload.size == 0 and y.size == 0
        return
    parts = parse(c, payload, count)
    ref = decode_ref(c, parts, count)
    scale = np.repeat([np.abs(ref[i : i + c.tile]).max() for i in range(0, count, c.tile)], c.tile)[
        :count
    ]
    assert (np.abs(y - ref) <= 4e-7 * c.tile * scale).all(), msg
    x64 = x.astype(np.float64)
    assert_within_bound(y, x64, c.tile, c.rel_error_bound, c.abs_error_floor, msg)
    _check_tiles(c, x64, parts, msg)
    _check_low_tokens(c, x, parts["flags"], msg)


def _check_tiles(c: TahCompressor, x64: np.ndarray, parts: dict, msg: str) -> None:
    """Each tile's pivot decision, centre, step and codes as FORMAT.md derives them."""
    t, count = c.tile, x64.size
    mismatched = 0
    for k in range(parts["c"].size):
        v = x64[k * t : (k + 1) * t].copy()
        a = np.sort(np.abs(v))[::-1]
        second = a[1] if a.size > 1 else 0.0
        gate = v.size == t and 2.0**-64 <= a[0] < 2.0**64 and c.pivot == "auto"
        p = parts["pivot"][k]
        if gate and abs(a[0] - c.pivot_ratio * second) > 1e-6 * a[0]:
            assert bool(p & 0x80) == (a[0] >= c.pivot_ratio * second), f"{msg} tile {k}"
        if p & 0x80:
            j = p & 0x7F
            assert abs(v[j]) == a[0] and (np.abs(v[:j]) < a[0]).all(), f"{msg} tile {k}"
            v[0], v[j] = v[j], v[0]
            v = hadamard(t) @ v
        else:
            assert p == 0 or not gate
        lo, hi = v.min(), v.max()
        qh = (2.0 ** parts["bits"][k * t] - 1) / 2
        ck, step = parts["c"][k], parts["step"][k]
        # float32 rounding (of the transform too, on the pivot path) against float64
        tol = (2.0**-19 if p & 0x80 else 2.0**-22) * max(abs(lo), abs(hi)) + 2.0**-148
        assert abs(ck - (lo + hi) / 2) <= tol, f"{msg} tile {k}"
        r = max(hi - ck, ck - lo)
        assert r - tol <= step * qh <= r * (1 + 2.0**-22) + tol, f"{msg} tile {k}"
        if step > 0:
            q = np.clip(np.rint((v - ck) / step + qh), 0, 2 * qh)
            diff = np.abs(q - parts["codes"][k * t : k * t + v.size])
            assert diff.max() <= 1, f"{msg} tile {k}"
            mismatched += int((diff > 0).sum())
    assert mismatched <= max(2, count // 1000), msg


def _check_low_tokens(c: TahCompressor, x: np.ndarray, flags: np.ndarray, msg: str) -> None:
    """The low tokens are each window's full tokens of lowest score (float64 proxy, ties
    aside)."""
    h = entropy_proxy(x, c.row)
    for w in windows(x.size // c.row, c.window):
        low = flags[w.start : w.stop].astype(bool)
        if low.any() and not low.all():
            hw = h[w.start : w.stop]
            assert hw[low].max() <= hw[~low].min() + 1e-5, f"{msg} window {w}"


def test_token_scores_match_float64_proxy(request) -> None:
    from coccl.compressors.tah_cpu import token_keys

    seed = seed_for(request)
    x = activations(np.random.default_rng(seed), 300 * 64, 64)
    x[64:128] = 0.0  # an all-zero token: score 0
    keys = token_keys(x, 64)
    np.testing.assert_array_equal(keys & 0xFFFFFFFF, np.arange(300))
    score = (keys >> 32) / 2.0**20 - 16.0
    ref = entropy_proxy(x, 64)
    assert score[1] == -16.0 and ref[1] == -16.0
    assert np.abs(score - ref).max() <= 2.0**-18, f"seed={seed}"


def test_proxy_ranks_like_tah_quants_entropy(request) -> None:
    # TAH-Quant's entropy of a token's normalised magnitudes, -sum p log p, in float64,
    # against the proxy: the orders agree closely on tokens of varied concentration.
    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    row = 512
    x = rng.standard_normal((200, row)) * np.exp(rng.uniform(0, 3, (200, row)) ** 2 / 4)
    x = x.astype(np.float32)
    p = np.abs(x.astype(np.float64))
    p /= p.sum(axis=1, keepdims=True)
    tah = -(p * np.log2(np.where(p > 0, p, 1))).sum(axis=1)
    proxy = entropy_proxy(x.ravel(), row)
    rank = np.argsort(np.argsort(tah)), np.argsort(np.argsort(proxy))
    rho = np.corrcoef(rank[0], rank[1])[0, 1]
    assert rho > 0.95, f"rank correlation {rho}; seed={seed}"


@pytest.mark.parametrize("cfg", VARIANTS, ids=_id)
def test_payload_size_is_fixed(cfg: dict) -> None:
    c = TahCompressor(**cfg)
    for count in (0, 1, c.row - 1, c.row, 5 * c.row + 3, 20 * c.row):
        rng = np.random.default_rng(count)
        sizes = {c.encode(activations(rng, count, c.row)).size for _ in range(3)}
        sizes.add(c.encode(np.zeros(count, np.float32)).size)
        assert sizes == {c.encoded_nbytes(count, F32)}
        full = count // c.row
        low = sum(low_count(len(w), c.low_fraction) for w in windows(full, c.window))
        tiles = -(-count // c.tile)
        rem = count - full * c.row
        code_bits = ((full - low) * c.bits_high + low * c.bits_low) * c.row
        tokens = -(-count // c.row)
        expect = 9 * tiles + code_bits // 8 + -(-rem * c.bits_high // 8) + -(-tokens // 8)
        assert c.encoded_nbytes(count, F32) == expect


def test_pivot_tiles_gain_accuracy(request) -> None:
    # Tiles of one dominant value: with the pivot their small values survive at 3 bits.
    seed = seed_for(request)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(40 * 64).astype(np.float32)
    x[::64] = 1000.0 * rng.choice([-1, 1], 40)
    on, off = TahCompressor(row=64), TahCompressor(row=64, pivot="off")
    parts = parse(on, on.encode(x), x.size)
    assert (parts["pivot"] == 0x80).all()  # the dominant value is already first
    x[5 * 64 + 17], x[5 * 64] = x[5 * 64], x[5 * 64 + 17]
    parts = parse(on, on.encode(x), x.size)
    assert parts["pivot"][5] == 0x80 | 17
    err_on, norm, _ = group_errors(on.decode(on.encode(x), count=x.size, dtype=F32), x, 64)
    err_off, _, _ = group_errors(off.decode(off.encode(x), count=x.size, dtype=F32), x, 64)
    assert (err_on < 0.25 * err_off).all(), f"seed={seed}"
    assert (err_on <= on.rel_error_bound * norm).all()


@pytest.mark.parametrize("cfg", VARIANTS[:4], ids=_id)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=str)
def test_whole_float32_range(cfg: dict, dtype, request) -> None:
    # Tiles from the smallest subnormal to FLT_MAX (row = tile so that every token is one
    # sweep group): each within the bound, none non-finite.
    seed = seed_for(request)
    c = TahCompressor(**{**cfg, "row": cfg.get("tile", 64)})
    x64 = magnitude_sweep(np.random.default_rng(seed), c.tile, np.dtype(dtype))
    x = x64.astype(dtype)
    acc = np.float64 if dtype == np.float64 else np.float32
    y = c.decode(c.encode(x), np.zeros(x.size, acc), count=x.size, dtype=dtype)
    assert np.isfinite(y).all()
    with np.errstate(over="ignore"):
        x64 = x64.astype(np.float32).astype(np.float64)  # what the codec sees
    assert_within_bound(y, x64, c.tile, c.rel_error_bound, c.abs_error_floor, f"seed={seed}")


def test_range_overflow_tiles() -> None:
    # max - min beyond FLT_MAX: the centre/step form keeps every value finite.
    c = TahCompressor(row=64)
    x = np.full(3 * 64, FLT_MAX, np.float32)
    x[1:64:2] = -FLT_MAX
    x[64:128] = np.linspace(-FLT_MAX, FLT_MAX, 64, dtype=np.float64).astype(np.float32)
    x[128:] = np.float32(-3e38)
    x[130] = FLT_MAX
    y = c.decode(c.encode(x), count=x.size, dtype=np.float32)
    assert np.isfinite(y).all()
    assert_within_bound(y, x.astype(np.float64), 64, c.rel_error_bound, c.abs_error_floor, "")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_nonfinite_tile_is_nan_and_only_it(bad: float) -> None:
    c = TahCompressor(row=256)
    x = activations(np.random.default_rng(1), 4 * 256 + 50, 256)
    x[64 + 3] = bad  # tile 1 of token 0
    x[4 * 256 + 49] = bad  # the short last token's partial tile
    y = c.decode(c.encode(x), count=x.size, dtype=np.float32)
    nan = np.zeros(x.size, bool)
    nan[64:128] = nan[4 * 256 + 0 : 4 * 256 + 50] = True
    np.testing.assert_array_equal(np.isnan(y), nan)


def _malformed(name: str, payload: np.ndarray, lay) -> None:
    """Bytes of ``payload``'s bitmap or pivots set as no encoder writes them (in place)."""
    pivots = payload[lay.pivot_offset : lay.bitmap_offset]
    bitmap = payload[lay.bitmap_offset :]
    if name == "pivot_index":  # 0x80 | p with p >= tile: the swap would leave the tile
        pivots[1] = 0xFF
    elif name == "pivot_unflagged":
        pivots[0] = 0x05
    elif name == "pivot_short_tile":  # the short last tile never pivots
        pivots[-1] = 0x80
    elif name == "fewer_low":  # codes' places run past the payload's end
        bitmap[0] &= bitmap[0] - 1
    elif name == "more_low":
        bitmap[0] |= ~bitmap[0] & (bitmap[0] + 1)
    elif name == "low_short_token":  # a low bit past the full tokens
        bitmap[-1] |= 0x80


@pytest.mark.parametrize(
    "name",
    ["pivot_index", "pivot_unflagged", "pivot_short_tile", "fewer_low", "more_low",
     "low_short_token"],
)  # fmt: skip
def test_malformed_payload_is_refused(name: str) -> None:
    # The decode takes its codes' places from the bitmap and swaps at the pivot's index,
    # so bytes no encoder writes are refused before it runs, and out stays as it was.
    c = TahCompressor(row=64, tile=32, low_fraction=0.5)
    n = 7 * 64 + 20  # 7 full tokens (3 low), a short one; the last tile short
    lay = tah_layout(n, 64, 32, 4, 3, 0.5)
    assert lay.low_tokens == 3
    payload = c.encode(activations(np.random.default_rng(2), n, 64))
    _malformed(name, payload, lay)
    out = np.full(n, 7.0, np.float32)
    with pytest.raises(ValueError, match="malformed tah payload"):
        c.decode(payload, out, count=n, dtype=np.float32, accumulate=True)
    assert (out == 7.0).all()


def test_low_tokens_are_the_concentrated_ones() -> None:
    # Tokens whose mass sits in few channels (TAH-Quant's low-entropy tokens) go low.
    rng = np.random.default_rng(5)
    x = rng.standard_normal((10, 256)).astype(np.float32)
    x[[2, 7], :8] *= 300.0
    c = TahCompressor(row=256)
    flags = parse(c, c.encode(x.ravel()), x.size)["flags"]
    np.testing.assert_array_equal(np.nonzero(flags)[0], [2, 7])


def test_ties_go_to_the_lower_token() -> None:
    c = TahCompressor(row=64, low_fraction=0.5)
    x = np.tile(np.linspace(-1, 1, 64, dtype=np.float32), 6)
    flags = parse(c, c.encode(x), x.size)["flags"]
    np.testing.assert_array_equal(flags, [1, 1, 1, 0, 0, 0])


# ---------------------------------------------------------------------- windows
@pytest.mark.parametrize("fraction", [0.0, 0.2, 0.5, 1.0])
@pytest.mark.parametrize("window", [0, 1, 3, 7, 23, 50])
def test_low_prefix_by_windows(window: int, fraction: float) -> None:
    # 23 full tokens (23 mod 3 = 23 mod 7 = 2; 23 and 50: one window) and a short one;
    # scores of 6 values, so that many tie.
    full = 23
    scores = np.random.default_rng([window, round(10 * fraction)]).integers(0, 6, full + 1)
    keys = (scores.astype(np.int64) << 32) | np.arange(full + 1)
    expect = low_flags(scores.tolist(), full, fraction, window)
    lb = low_prefix(keys, full, fraction, window)
    np.testing.assert_array_equal(lb, np.concatenate([[0], np.cumsum(expect)]))
    assert tah_layout(full * 64 + 5, 64, 64, 4, 3, fraction, window).low_tokens == sum(expect)


def test_low_token_count_formula() -> None:
    # FORMAT.md's L against the windows' counts summed, and the payload size it gives.
    for full in range(41):
        for window in (0, 1, 2, 3, 5, 8, 40, 41, 1024):
            for f in (0.0, 0.2, 1 - 0.8, 0.4, 0.5, 1.0):
                if window == 0 or window >= full:
                    want = low_count(full, f)
                else:
                    want = full // window * low_count(window, f) + low_count(full % window, f)
                assert want == sum(low_count(len(w), f) for w in windows(full, window))
                lay = tah_layout(full * 128 + 7, 128, 64, 5, 2, f, window)
                assert lay.low_tokens == want, (full, window, f)
                k = -(-(full * 128 + 7) // 64)
                codes = ((full - want) * 5 + want * 2) * 16 + 5  # the short token: 7 x 5 bits
                assert lay.nbytes == 9 * k + codes + -(-(full + 1) // 8)


def test_window_past_the_payload_is_window_zero(request) -> None:
    seed = seed_for(request)
    x = activations(np.random.default_rng(seed), 20 * 64 + 30, 64)
    old = TahCompressor(row=64, low_fraction=0.3).encode(x)
    for window in (20, 21, 1024):  # one window of the 20 full tokens
        np.testing.assert_array_equal(
            TahCompressor(row=64, low_fraction=0.3, window=window).encode(x), old
        )


@pytest.mark.parametrize("window", [1, 3, 16])
def test_a_cut_on_whole_windows_decodes_alike(window: int, request) -> None:
    # 40 full tokens and a short one, the first 20 concentrated (the lowest scores): cut
    # in two halves, or in pieces of 1, 2, 3 windows and the rest, at multiples of
    # alignment = row * window, the pieces choose the tokens of their windows as the whole
    # does and decode alike. With window 0 the halves choose differently (half of the low
    # tokens each).
    seed = seed_for(request)
    x = activations(np.random.default_rng(seed), 40 * 64 + 30, 64)
    x[: 20 * 64 : 64] *= 1000.0
    c = TahCompressor(row=64, low_fraction=0.4, window=window)
    whole = c.encode(x)
    y = c.decode(whole, count=x.size, dtype=F32)
    halves = [c.alignment * (40 // window // 2)]
    uneven = [k * c.alignment for k in (1, 3, 6) if k * c.alignment < x.size]  # 1, 2, 3, rest
    for cuts in (halves, uneven):
        flags, got = [], []
        for piece in np.split(x, cuts):
            payload = c.encode(piece)
            flags.append(parse(c, payload, piece.size)["flags"])
            got.append(c.decode(payload, count=piece.size, dtype=F32))
        np.testing.assert_array_equal(np.concatenate(flags), parse(c, whole, x.size)["flags"])
        np.testing.assert_array_equal(np.concatenate(got).view(np.uint32), y.view(np.uint32))
    g = TahCompressor(row=64, low_fraction=0.4)
    got = np.concatenate(
        [g.decode(g.encode(p), count=p.size, dtype=F32) for p in np.split(x, halves)]
    )
    assert not np.array_equal(got, g.decode(g.encode(x), count=x.size, dtype=F32))


def test_config_and_errors() -> None:
    c = get_compressor("tah", row=1024)
    assert c.get_config() == {
        "id": "tah",
        "row": 1024,
        "tile": 64,
        "bits_high": 4,
        "bits_low": 3,
        "low_fraction": 0.2,
        "window": 0,
        "pivot": "auto",
        "pivot_ratio": 2.0,
    }
    assert c.alignment == 1024 and get_compressor("tah").row == 4096
    assert get_compressor("tah", row=1024, window=5).alignment == 5 * 1024
    assert 0 < c.rel_error_typical < c.rel_error_bound
    for bad in ({"row": 100}, {"row": 0}, {"tile": 256}, {"bits_high": 9}, {"bits_low": 5},
                {"low_fraction": 1.5}, {"pivot": "on"}, {"pivot_ratio": 0.5},
                {"row": 2**21}, {"window": -1}, {"window": 1025}):  # fmt: skip
        with pytest.raises(ValueError):
            TahCompressor(**bad)
    for bad in ({"row": "64"}, {"tile": 64.0}, {"pivot": True}, {"low_fraction": "0.2"},
                {"window": 2.0}):  # fmt: skip
        with pytest.raises(TypeError):
            TahCompressor(**bad)
