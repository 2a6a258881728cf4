"""Triton kernels for the engine's memory-bound steps (imported only where Triton exists).

Each kernel is one pass: the residual update and the next layer norm; the q/k head norms, q
written in the head-major layout attention reads, k and v straight into the caches; attention
over each row's key range with an online softmax, so the scores never reach memory; the causal
conv's taps with its next cache; the conv tail (layer norm, Mish); HiFT's Snake. fp32
throughout, the operations of the torch ops they replace (:mod:`.kernels`), so parity with the
reference holds up to summation order. ``TRITON_INTERPRET=1`` runs them on CPU tensors (the
tests do).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

# libdevice's sin is accurate over the whole range, as torch's is (``tl.sin`` may lower to an
# approximate instruction); the interpreter has no libdevice and uses NumPy's
_LIBDEVICE = os.environ.get("TRITON_INTERPRET") != "1"


@triton.jit
def _row_norm(x, mask, n: tl.constexpr, eps):
    """Each row of the 2-D ``x`` to zero mean, unit variance (biased, as layer_norm)."""
    mean = tl.sum(x, axis=1, keep_dims=True) / n
    d = tl.where(mask, x - mean, 0.0)
    var = tl.sum(d * d, axis=1, keep_dims=True) / n
    return d / tl.sqrt(var + eps)


@triton.jit
def _residual_norm(
    X, G, Y, W, B, XO, H, eps, C: tl.constexpr, BLOCK: tl.constexpr, HAS_RES: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < C
    # every kernel computes in fp32 whatever it reads: bf16 weights and activations too
    x = tl.load(X + row * C + cols, mask=m, other=0.0).to(tl.float32)
    if HAS_RES:
        g = tl.load(G + cols, mask=m, other=0.0).to(tl.float32)
        y = tl.load(Y + row * C + cols, mask=m, other=0.0).to(tl.float32)
        x = x + g * y
        tl.store(XO + row * C + cols, x, mask=m)
    w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=m, other=0.0).to(tl.float32)
    h = _row_norm(x[None, :], m[None, :], C, eps)
    tl.store(H + row * C + cols[None, :], h * w[None, :] + b[None, :], mask=m[None, :])


def residual_norm(
    x: torch.Tensor,
    gate: torch.Tensor | None,
    y: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    c = x.shape[-1]
    x2 = x.contiguous()
    h = torch.empty_like(x2)
    if y is None:
        xo = x2
        _residual_norm[(x2.numel() // c,)](
            x2, weight, x2, weight, bias, x2, h, eps, c, triton.next_power_of_2(c), False
        )
    else:
        xo = torch.empty_like(x2)
        _residual_norm[(x2.numel() // c,)](
            x2, gate, y.contiguous(), weight, bias, xo, h, eps, c, triton.next_power_of_2(c), True
        )
    return xo, h


@triton.jit
def _qkv_into_cache(
    QKV,
    QW,
    QB,
    KW,
    KB,
    Q,
    KC,
    VC,
    TABLE,
    WP,
    frames,
    positions,
    sc_p,
    sc_h,
    eps,
    HEADS: tl.constexpr,
    D: tl.constexpr,
    BH: tl.constexpr,
    BD: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64)  # row of [R * F]
    r, f = n // frames, n % frames
    hs = tl.arange(0, BH)[:, None]
    ds = tl.arange(0, BD)[None, :]
    m = (hs < HEADS) & (ds < D)
    src = QKV + n * (3 * HEADS * D) + hs * D + ds
    q = tl.load(src, mask=m, other=0.0).to(tl.float32)
    k = tl.load(src + HEADS * D, mask=m, other=0.0).to(tl.float32)
    v = tl.load(src + 2 * HEADS * D, mask=m, other=0.0)
    dm = ds < D
    qw = tl.load(QW + ds, mask=dm, other=0.0).to(tl.float32)
    qb = tl.load(QB + ds, mask=dm, other=0.0).to(tl.float32)
    kw = tl.load(KW + ds, mask=dm, other=0.0).to(tl.float32)
    kb = tl.load(KB + ds, mask=dm, other=0.0).to(tl.float32)
    q = _row_norm(q, m, D, eps) * qw + qb
    k = _row_norm(k, m, D, eps) * kw + kb
    tl.store(Q + ((r * HEADS + hs) * frames + f) * D + ds, q, mask=m)  # [R, H, F, D]
    frame = tl.load(TABLE + r * positions + tl.load(WP + n))  # the pool frame of that position
    dst = frame * sc_p + hs * sc_h + ds  # the pool's [P, H, D]
    tl.store(KC + dst, k, mask=m)
    tl.store(VC + dst, v, mask=m)


def qkv_into_cache(
    qkv: torch.Tensor,
    heads: int,
    head_dim: int,
    q_norm: tuple[torch.Tensor, torch.Tensor],
    k_norm: tuple[torch.Tensor, torch.Tensor],
    eps: float,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table: torch.Tensor,
    write_pos: torch.Tensor,
) -> torch.Tensor:
    """q [R, H, F, D]; k and v written into the pools [P, H, D] at the frames ``table`` [R, T]
    maps each row's ``write_pos`` [R, F] to."""
    r, f, _ = qkv.shape
    qkv, write_pos, table = qkv.contiguous(), write_pos.contiguous(), table.contiguous()
    assert k_pool.stride() == v_pool.stride() and k_pool.stride(2) == 1
    q = torch.empty(r, heads, f, head_dim, device=qkv.device, dtype=qkv.dtype)
    bh, bd = triton.next_power_of_2(heads), triton.next_power_of_2(head_dim)
    sp, sh, _ = k_pool.stride()
    _qkv_into_cache[(r * f,)](
        qkv, *q_norm, *k_norm, q, k_pool, v_pool, table, write_pos, f, table.shape[1], sp, sh,
        eps, heads, head_dim, bh, bd,
    )  # fmt: skip
    return q


@triton.jit
def _attention(
    Q,
    KC,
    VC,
    TABLE,
    BIAS,
    RANGE,
    OUT,
    frames,
    keys,
    sc_p,
    sc_h,
    HEADS: tl.constexpr,
    D: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    PRECISION: tl.constexpr,
    PER_QUERY: tl.constexpr,
):
    """One (row, head, block of frames): online softmax over the row's key range, or with
    ``PER_QUERY`` over each frame's own range (the block scans the union of its frames')."""
    rh = tl.program_id(1).to(tl.int64)
    r, h = rh // HEADS, rh % HEADS
    fs = tl.program_id(0) * BM + tl.arange(0, BM)
    ds = tl.arange(0, D)
    fm = fs < frames
    q = tl.load(Q + (rh * frames + fs[:, None]) * D + ds[None, :], mask=fm[:, None], other=0.0)
    q = q.to(tl.float32)
    if PER_QUERY:
        at = RANGE + 2 * (r * frames + fs)
        q_lo = tl.load(at, mask=fm, other=2**62)
        q_hi = tl.load(at + 1, mask=fm, other=0)
        lo = tl.min(q_lo, axis=0)
        hi = tl.max(q_hi, axis=0)
    else:
        lo = tl.load(RANGE + 2 * r)
        hi = tl.load(RANGE + 2 * r + 1)
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    for start in range(lo - lo % BN, hi, BN):
        ts = start + tl.arange(0, BN)
        tm = ts < keys
        frame = tl.load(TABLE + r * keys + ts, mask=tm, other=0)  # each key's pool frame
        kv = frame[:, None] * sc_p + h * sc_h + ds[None, :]
        k = tl.load(KC + kv, mask=tm[:, None], other=0.0).to(tl.float32)  # bf16 caches too
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        s += tl.load(BIAS + r * keys + ts, mask=tm, other=float("-inf"))[None, :]
        if PER_QUERY:
            mine = (ts[None, :] >= q_lo[:, None]) & (ts[None, :] < q_hi[:, None])
            s = tl.where(mine, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no valid key seen yet
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        v = tl.load(VC + kv, mask=tm[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    out = OUT + ((r * frames + fs[:, None]) * HEADS + h) * D + ds[None, :]  # [R, F, H, D]
    tl.store(out, acc / l_i[:, None], mask=fm[:, None])


Tiles = tuple[int, int, int, int]  # frames per block, keys per block, warps, pipeline stages


def attention_tiles(frames: int, per_query: bool) -> Tiles:
    """The attention kernel's tiles for ``frames`` queries per row."""
    if per_query and frames > 64:
        # packed prompts of a few hundred frames each: 128 x 32 tiles took 0.145 ms a call
        # where 64 x 64 took 0.191 (H200, 8 prompts of ~460 frames; runtime/bench-results/
        # attention-tiles-h200-af15d4b.json, from ``bench.attention_tiles``)
        return 128, 32, 4, 3
    return (64 if frames > 32 else (32 if frames > 16 else 16)), 64, 4, 3


def attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table: torch.Tensor,
    key_bias: torch.Tensor,
    key_range: torch.Tensor,
    tiles: Tiles | None = None,
) -> torch.Tensor:
    """softmax(q k^T + bias) v over each row's keys ``[lo, hi)`` -> [R, F, H * D].

    Row r's key at position t is frame ``table[r, t]`` of the pools [P, H, D].
    ``key_range`` [R, 2]: keys outside it must be masked in ``key_bias`` (they are skipped);
    or [R, F, 2], a range per frame (keys outside a frame's range are masked here).
    Matmuls in TF32 exactly when torch's are (``allow_tf32``), as the torch path.
    ``tiles`` overrides :func:`attention_tiles` (to compare them).
    """
    r, h, f, d = q.shape
    t = table.shape[1]
    assert q.is_contiguous() and k_pool.stride() == v_pool.stride() and k_pool.stride(2) == 1
    out = torch.empty(r, f, h * d, device=q.device, dtype=q.dtype)
    bias = key_bias.reshape(r, t).contiguous()
    precision = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"
    per_query = key_range.dim() == 3
    bm, bn, warps, stages = tiles or attention_tiles(f, per_query)
    sp, sh, _ = k_pool.stride()
    _attention[(triton.cdiv(f, bm), r * h)](
        q, k_pool, v_pool, table.contiguous(), bias, key_range.contiguous(), out, f, t, sp, sh,
        h, d, bm, bn, precision, per_query, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out


@triton.jit
def _norm_mish(X, W, B, H, eps, C: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < C
    x = tl.load(X + row * C + cols, mask=m, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=m, other=0.0).to(tl.float32)
    y = _row_norm(x[None, :], m[None, :], C, eps) * w[None, :] + b[None, :]
    # Mish: y * tanh(softplus(y)); softplus >= 0, so tanh = 1 - 2 / (exp(2 sp) + 1) is stable
    sp = tl.where(y > 20.0, y, tl.log(1.0 + tl.exp(tl.minimum(y, 20.0))))
    t = 1.0 - 2.0 / (tl.exp(2.0 * sp) + 1.0)
    tl.store(H + row * C + cols[None, :], y * t, mask=m[None, :])


def norm_mish(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    c = x.shape[-1]
    x = x.contiguous()
    out = torch.empty_like(x)
    _norm_mish[(x.numel() // c,)](x, weight, bias, out, eps, c, triton.next_power_of_2(c))
    return out


@triton.jit
def _conv_taps(
    X,
    CACHE,
    LAST,
    TAPS,
    NEW,
    frames,
    s_cr,
    s_ct,
    C: tl.constexpr,
    BC: tl.constexpr,
):
    """Row (r, f) of the taps [R, F, 3C]: frames f, f+1, f+2 of [cache (2 frames) | x], channel-
    major and tap-minor; program (r, 0) also copies the frames that become the row's cache."""
    n = tl.program_id(0).to(tl.int64)
    r, f = n // frames, n % frames
    cs = tl.arange(0, BC)[:, None]
    js = tl.arange(0, 4)[None, :]
    for c0 in range(0, C, BC):
        c = c0 + cs
        t = f + js  # time in [cache | x]
        m = (c < C) & (js < 3)
        from_cache = tl.load(CACHE + r * s_cr + t * s_ct + c, mask=m & (t < 2), other=0.0)
        from_cache = from_cache.to(tl.float32)  # bf16 caches too
        from_x = tl.load(X + (r * frames + t - 2) * C + c, mask=m & (t >= 2), other=0.0)
        tl.store(TAPS + n * (3 * C) + c * 3 + js, tl.where(t < 2, from_cache, from_x), mask=m)
    if f == 0:
        last = tl.load(LAST + r)
        cv = tl.arange(0, BC)
        for c0 in range(0, C, BC):
            c = c0 + cv
            for i in range(2):
                t = last + i
                a = tl.load(CACHE + r * s_cr + t * s_ct + c, mask=(c < C) & (t < 2), other=0.0)
                a = a.to(tl.float32)
                b = tl.load(X + (r * frames + t - 2) * C + c, mask=(c < C) & (t >= 2), other=0.0)
                tl.store(NEW + (r * 2 + i) * C + c, tl.where(t < 2, a, b), mask=c < C)


def conv_taps(
    x: torch.Tensor, cache: torch.Tensor, last_idx: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, F, C], cache [R, 2, C] (a strided view), last_idx [R] -> taps [R, F, 3C] and the
    two frames before each row's end, [R, 2, C]: what the conv cache becomes."""
    r, f, c = x.shape
    x = x.contiguous()
    assert cache.stride(2) == 1
    taps = torch.empty(r, f, 3 * c, device=x.device, dtype=x.dtype)
    new = torch.empty(r, 2, c, device=x.device, dtype=x.dtype)
    bc = min(triton.next_power_of_2(c), 256)
    _conv_taps[(r * f,)](x, cache, last_idx, taps, new, f, cache.stride(0), cache.stride(1), c, bc)
    return taps, new


@triton.jit
def _conv_taps_packed(X, FIRST, TAPS, frames, C: tl.constexpr, BC: tl.constexpr):
    """Row (r, f) of the taps [R, F, 3C]: frames f - 2, f - 1, f of x, zero before the frame's
    segment starts (a fresh stream's conv cache)."""
    n = tl.program_id(0).to(tl.int64)
    r, f = n // frames, n % frames
    first = tl.load(FIRST + n)
    cs = tl.arange(0, BC)[:, None]
    js = tl.arange(0, 4)[None, :]
    t = f + js - 2  # frame of x each tap reads
    for c0 in range(0, C, BC):
        c = c0 + cs
        m = (c < C) & (js < 3)
        v = tl.load(X + (r * frames + t) * C + c, mask=m & (t >= first), other=0.0)
        tl.store(TAPS + n * (3 * C) + c * 3 + js, v, mask=m)


def conv_taps_packed(x: torch.Tensor, seg_first: torch.Tensor) -> torch.Tensor:
    """x [R, F, C], seg_first [R, F] (the first frame of each frame's segment) -> taps
    [R, F, 3C] of a kernel-3 causal conv that starts from zeros at every segment."""
    r, f, c = x.shape
    x = x.contiguous()
    taps = torch.empty(r, f, 3 * c, device=x.device, dtype=x.dtype)
    bc = min(triton.next_power_of_2(c), 256)
    _conv_taps_packed[(r * f,)](x, seg_first.contiguous(), taps, f, c, bc)
    return taps


@triton.jit
def _snake(X, ALPHA, OUT, n, channels, frames, LIBDEVICE: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(X + i, mask=m, other=0.0)
    a = tl.load(ALPHA + (i // frames) % channels, mask=m, other=1.0)
    s = libdevice.sin(x * a) if LIBDEVICE else tl.sin(x * a)
    tl.store(OUT + i, x + (1.0 / (a + 1e-9)) * (s * s), mask=m)


def snake(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """BigVGAN's Snake, ``x + sin(alpha x)^2 / (alpha + 1e-9)``, on [B, C, T] in one pass."""
    x = x.contiguous()
    out = torch.empty_like(x)
    _, c, t = x.shape
    n = x.numel()
    _snake[(triton.cdiv(n, 1024),)](x, alpha.contiguous(), out, n, c, t, _LIBDEVICE, 1024)
    return out
