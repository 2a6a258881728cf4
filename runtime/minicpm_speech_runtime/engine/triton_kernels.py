"""Triton kernels for the DiT block's memory-bound parts (imported only where Triton exists).

Each kernel is one pass over its rows: the residual update and the next layer norm, the q/k head
norms with q written in the head-major layout attention reads, the key-masked softmax, and the
conv tail (layer norm then Mish). fp32 throughout, the same operations as the torch ops they
replace (:mod:`.kernels`), so parity with the reference holds; only summation order differs.
``TRITON_INTERPRET=1`` runs them on CPU tensors (the tests do).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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
    x = tl.load(X + row * C + cols, mask=m, other=0.0)
    if HAS_RES:
        g = tl.load(G + cols, mask=m, other=0.0)
        y = tl.load(Y + row * C + cols, mask=m, other=0.0)
        x = x + g * y
        tl.store(XO + row * C + cols, x, mask=m)
    w = tl.load(W + cols, mask=m, other=0.0)
    b = tl.load(B + cols, mask=m, other=0.0)
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
def _qk_heads(
    QKV,
    QW,
    QB,
    KW,
    KB,
    Q,
    K,
    frames,
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
    q = tl.load(src, mask=m, other=0.0)
    k = tl.load(src + HEADS * D, mask=m, other=0.0)
    dm = ds < D
    qw = tl.load(QW + ds, mask=dm, other=0.0)
    qb = tl.load(QB + ds, mask=dm, other=0.0)
    kw = tl.load(KW + ds, mask=dm, other=0.0)
    kb = tl.load(KB + ds, mask=dm, other=0.0)
    q = _row_norm(q, m, D, eps) * qw + qb
    k = _row_norm(k, m, D, eps) * kw + kb
    tl.store(Q + ((r * HEADS + hs) * frames + f) * D + ds, q, mask=m)  # [R, H, F, D]
    tl.store(K + n * (HEADS * D) + hs * D + ds, k, mask=m)  # [R, F, H, D]


def qk_heads(
    qkv: torch.Tensor,
    heads: int,
    head_dim: int,
    q_norm: tuple[torch.Tensor, torch.Tensor],
    k_norm: tuple[torch.Tensor, torch.Tensor],
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r, f, _ = qkv.shape
    qkv = qkv.contiguous()
    q = torch.empty(r, heads, f, head_dim, device=qkv.device, dtype=qkv.dtype)
    k = torch.empty(r, f, heads, head_dim, device=qkv.device, dtype=qkv.dtype)
    bh, bd = triton.next_power_of_2(heads), triton.next_power_of_2(head_dim)
    _qk_heads[(r * f,)](qkv, *q_norm, *k_norm, q, k, f, eps, heads, head_dim, bh, bd)
    v = qkv.view(r, f, 3, heads, head_dim)[:, :, 2]
    return q, k, v


@triton.jit
def _masked_softmax(S, BIAS, rows_per_bias, T: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < T
    s = tl.load(S + row * T + cols, mask=m, other=float("-inf"))
    s = s + tl.load(BIAS + (row // rows_per_bias) * T + cols, mask=m, other=0.0)
    e = tl.exp(s - tl.max(s, axis=0))
    tl.store(S + row * T + cols, e / tl.sum(e, axis=0), mask=m)


def masked_softmax_(scores: torch.Tensor, key_bias: torch.Tensor) -> torch.Tensor:
    """In place; scores [R, H, F, T] contiguous, key_bias [R, 1, 1, T]."""
    r, h, f, t = scores.shape
    assert scores.is_contiguous()
    bias = key_bias.reshape(r, t).contiguous()
    _masked_softmax[(r * h * f,)](scores, bias, h * f, t, triton.next_power_of_2(t))
    return scores


@triton.jit
def _norm_mish(X, W, B, H, eps, C: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < C
    x = tl.load(X + row * C + cols, mask=m, other=0.0)
    w = tl.load(W + cols, mask=m, other=0.0)
    b = tl.load(B + cols, mask=m, other=0.0)
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
