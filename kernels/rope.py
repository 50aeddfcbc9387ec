"""Rotary position embedding (rotate-half form), optionally after a per-head RMSNorm (Qwen3's q_norm
and k_norm), as one Triton kernel for q and k together, with pure-torch references of the same
signature.

For each head x (D columns) of each row, with R = rotary_dim (even, <= D), h = R / 2:
    x = RMSNorm(x) · w                                   (qk_norm_rope; rope skips it)
    out[:h]  = x[:h] · cos[:h] - x[h:R] · sin[:h]
    out[h:R] = x[h:R] · cos[h:R] + x[:h] · sin[h:R]
    out[R:]  = x[R:]                                     (partial rotary: the rest passes through)
as transformers' apply_rotary_pos_emb, q · cos + rotate_half(q) · sin on the first R columns.

cos and sin are [P, R] (fp32, or the activation dtype): row t of q and k takes row positions[t]
when `positions` is given, else row t % P (P = T: one row per token; P = S: right-padded
requests of S tokens each, T = B · S).

Rounding: exact=True follows transformers: the norm as Qwen3RMSNorm (norm.py), cos and sin rounded
to q's dtype (its rotary embedding casts them), each product and the sum rounded to q's dtype.
exact=False keeps the normalised head, the products and the sum in fp32 with fp32 cos and sin and
rounds once. The exact kernel compiles without FP fusion: it would otherwise contract a rounded
product and the sum after it into one bf16 FMA, dropping the product's rounding. Every head is
computed on its own: results never depend on the batch.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from vsr.kernels import pdl

# Heads per program: about 1024 elements of a row's q or k.
_HEAD_ELEMS = 1024


@triton.jit
def _rope_kernel(q_ptr, k_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos_ptr, qo_ptr, ko_ptr,
                 HQ, HKV, P, stride_q, stride_k, stride_c, eps, INV_D,
                 D: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
                 BLOCK_PASS: tl.constexpr, HB: tl.constexpr, NORM: tl.constexpr, ZERO_CENTERED: tl.constexpr,
                 EXACT: tl.constexpr, HAS_POS: tl.constexpr,
                 WAIT: tl.constexpr, RELEASE: tl.constexpr):
    """Row program_id(0); heads [j · HB, (j + 1) · HB) of q for j = program_id(1) < cdiv(HQ, HB),
    else of k."""
    pdl.begin(WAIT, RELEASE)
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    nqb = tl.cdiv(HQ, HB)
    if j < nqb:
        x_ptr = q_ptr + row * stride_q
        o_ptr = qo_ptr + row * HQ * D
        w_ptr = qw_ptr
        h0 = j * HB
        H = HQ
    else:
        x_ptr = k_ptr + row * stride_k
        o_ptr = ko_ptr + row * HKV * D
        w_ptr = kw_ptr
        h0 = (j - nqb) * HB
        H = HKV
    dtype = q_ptr.dtype.element_ty
    heads = h0 + tl.arange(0, BLOCK_H)
    mh = heads < H
    c1d = tl.arange(0, BLOCK_HALF)
    mc = c1d < HALF
    m1 = mh[:, None] & mc[None, :]
    base = heads[:, None] * D
    x1 = tl.load(x_ptr + base + c1d[None, :], mask=m1, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + base + HALF + c1d[None, :], mask=m1, other=0.0).to(tl.float32)
    if BLOCK_PASS > 0:
        p1d = 2 * HALF + tl.arange(0, BLOCK_PASS)
        mp1 = p1d < D
        mp = mh[:, None] & mp1[None, :]
        xp = tl.load(x_ptr + base + p1d[None, :], mask=mp, other=0.0).to(tl.float32)
    if NORM:
        ss = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)
        if BLOCK_PASS > 0:
            ss += tl.sum(xp * xp, axis=1)
        rstd = tl.math.rsqrt(ss * INV_D + eps)[:, None]
        x1 = _normed(x1 * rstd, w_ptr, c1d, mc, dtype, ZERO_CENTERED, EXACT)
        x2 = _normed(x2 * rstd, w_ptr, HALF + c1d, mc, dtype, ZERO_CENTERED, EXACT)
        if BLOCK_PASS > 0:
            xp = _normed(xp * rstd, w_ptr, p1d, mp1, dtype, ZERO_CENTERED, EXACT)
    if HAS_POS:
        pos = tl.load(pos_ptr + row).to(tl.int64)
    else:
        pos = row % P
    crow = cos_ptr + pos * stride_c
    srow = sin_ptr + pos * stride_c
    c1 = _trig(crow, c1d, mc, dtype, EXACT)
    c2 = _trig(crow, HALF + c1d, mc, dtype, EXACT)
    s1 = _trig(srow, c1d, mc, dtype, EXACT)
    s2 = _trig(srow, HALF + c1d, mc, dtype, EXACT)
    if EXACT:
        o1 = (_rd(x1 * c1, dtype) + _rd(-x2 * s1, dtype)).to(dtype)
        o2 = (_rd(x2 * c2, dtype) + _rd(x1 * s2, dtype)).to(dtype)
    else:
        o1 = (x1 * c1 - x2 * s1).to(dtype)
        o2 = (x2 * c2 + x1 * s2).to(dtype)
    tl.store(o_ptr + base + c1d[None, :], o1, mask=m1)
    tl.store(o_ptr + base + HALF + c1d[None, :], o2, mask=m1)
    if BLOCK_PASS > 0:
        tl.store(o_ptr + base + p1d[None, :], xp.to(dtype), mask=mp)


@triton.jit
def _rd(v, dtype: tl.constexpr):
    """v rounded to dtype, back in fp32."""
    return v.to(dtype).to(tl.float32)


@triton.jit
def _trig(ptr, offs, mask, dtype: tl.constexpr, EXACT: tl.constexpr):
    """A cos or sin half-row [1, BLOCK_HALF] in fp32, rounded to dtype first when EXACT."""
    v = tl.load(ptr + offs, mask=mask, other=0.0)[None, :]
    if EXACT:
        return v.to(dtype).to(tl.float32)
    return v.to(tl.float32)


@triton.jit
def _normed(n, w_ptr, offs, mask, dtype: tl.constexpr, ZERO_CENTERED: tl.constexpr, EXACT: tl.constexpr):
    """The normalised fp32 columns n [BLOCK_H, cols] times the weight, rounded as norm.rms_norm."""
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)[None, :]
    if ZERO_CENTERED:
        y = n * (1.0 + w)
    elif EXACT:
        y = w * _rd(n, dtype)
    else:
        y = n * w
    if EXACT:
        y = _rd(y, dtype)
    return y


@functools.cache
def _plan(D: int, R: int, HQ: int, HKV: int) -> tuple[int, int, int, int, int, int]:
    """(BLOCK_H, BLOCK_HALF, BLOCK_PASS, heads per program, programs per row, warps)."""
    half, rest = R // 2, D - R
    bh = triton.next_power_of_2(half)
    bp = triton.next_power_of_2(rest) if rest else 0
    hb = max(1, min(triton.next_power_of_2(max(HQ, HKV)), _HEAD_ELEMS // triton.next_power_of_2(D)))
    return hb, bh, bp, hb, triton.cdiv(HQ, hb) + triton.cdiv(HKV, hb), 4


def check_tables(cos: torch.Tensor, sin: torch.Tensor, D: int, R: int) -> None:
    """RoPE over R of a head's D columns takes cos and sin [P, R] alike, unit column stride."""
    assert R % 2 == 0 and 0 < R <= D, f"rotary_dim must be even, in (0, {D}], got {R}"
    assert cos.dim() == 2 and cos.shape == sin.shape and cos.shape[1] == R and cos.stride(1) == 1 \
        and sin.stride() == cos.stride(), f"cos and sin must be [P, {R}] alike, unit column stride"


def _launch(q, k, q_weight, k_weight, cos, sin, eps, head_dim, rotary_dim, positions, zero_centered, exact, norm):
    D = head_dim
    R = D if rotary_dim is None else rotary_dim
    assert q.dim() == 2 and k.dim() == 2 and q.stride(1) == 1 and k.stride(1) == 1, \
        "q and k must be [T, H * D] with unit column stride"
    assert q.dtype == k.dtype and q.shape[0] == k.shape[0], "q and k must share their dtype and rows"
    assert q.shape[1] % D == 0 and k.shape[1] % D == 0, f"q and k columns must be whole heads of {D}"
    check_tables(cos, sin, D, R)
    T = q.shape[0]
    HQ, HKV = q.shape[1] // D, k.shape[1] // D
    qo = torch.empty((T, HQ * D), dtype=q.dtype, device=q.device)
    ko = torch.empty((T, HKV * D), dtype=k.dtype, device=k.device)
    if T:
        bh, bhalf, bp, hb, progs, warps = _plan(D, R, HQ, HKV)
        _rope_kernel[(T, progs)](
            q, k, q if q_weight is None else q_weight, k if k_weight is None else k_weight, cos, sin,
            cos if positions is None else positions, qo, ko, HQ, HKV, cos.shape[0], q.stride(0), k.stride(0),
            cos.stride(0), eps, 1.0 / D, D=D, HALF=R // 2, BLOCK_H=bh, BLOCK_HALF=bhalf, BLOCK_PASS=bp, HB=hb,
            NORM=norm, ZERO_CENTERED=zero_centered, EXACT=exact, HAS_POS=positions is not None, num_warps=warps,
            enable_fp_fusion=not exact, **pdl.options(q.device))
    return qo, ko


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                 cos: torch.Tensor, sin: torch.Tensor, eps: float, *, rotary_dim: int | None = None,
                 zero_centered: bool = False, exact: bool = True, positions: torch.Tensor | None = None):
    """(q_out, k_out) contiguous [T, H · D]: per-head RMSNorm with q_weight / k_weight [D], then RoPE."""
    D = q_weight.shape[0]
    assert k_weight.shape == (D,) and q_weight.is_contiguous() and k_weight.is_contiguous()
    return _launch(q, k, q_weight, k_weight, cos, sin, eps, D, rotary_dim, positions, zero_centered, exact, True)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int, *,
         rotary_dim: int | None = None, exact: bool = True, positions: torch.Tensor | None = None):
    """(q_out, k_out) contiguous [T, H · D]: RoPE alone (ModernBERT)."""
    return _launch(q, k, None, None, cos, sin, 0.0, head_dim, rotary_dim, positions, False, exact, False)


def _rows(cos, T, positions):
    return cos[positions.long()] if positions is not None else cos[torch.arange(T, device=cos.device) % cos.shape[0]]


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _rope_reference(x, D, cos, sin, R, exact, dtype):
    """RoPE of x [T, H * D]: exact in x's dtype with cos and sin cast to it (transformers), else in fp32."""
    T = x.shape[0]
    x = x.reshape(T, -1, D)
    c, s = cos[:, None, :], sin[:, None, :]
    if exact:
        c, s = c.to(x.dtype), s.to(x.dtype)
    else:
        x, c, s = x.float(), c.float(), s.float()
    xr, xp = x[..., :R], x[..., R:]
    o = xr * c + _rotate_half(xr) * s
    return torch.cat((o, xp), dim=-1).to(dtype).reshape(T, -1)


def _head_norm_reference(x, w, eps, D, zero_centered, exact):
    """Per-head RMSNorm of x [T, H * D]: exact as Qwen3RMSNorm (Qwen3.5's when zero_centered), else fp32."""
    T = x.shape[0]
    xf = x.reshape(T, -1, D).float()
    n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if zero_centered:
        y = n * (1.0 + w.float())
        return (y.to(x.dtype) if exact else y).reshape(T, -1)
    return (w * n.to(x.dtype) if exact else n * w.float()).reshape(T, -1)


def qk_norm_rope_reference(q, k, q_weight, k_weight, cos, sin, eps, *, rotary_dim=None, zero_centered=False,
                           exact=True, positions=None):
    """transformers' Qwen3Attention: q_norm / k_norm, then apply_rotary_pos_emb."""
    D = q_weight.shape[0]
    R = D if rotary_dim is None else rotary_dim
    c, s = _rows(cos, q.shape[0], positions), _rows(sin, q.shape[0], positions)
    return tuple(_rope_reference(_head_norm_reference(x, w, eps, D, zero_centered, exact), D, c, s, R, exact,
                                 x.dtype) for x, w in ((q, q_weight), (k, k_weight)))


def rope_reference(q, k, cos, sin, head_dim, *, rotary_dim=None, exact=True, positions=None):
    R = head_dim if rotary_dim is None else rotary_dim
    c, s = _rows(cos, q.shape[0], positions), _rows(sin, q.shape[0], positions)
    return tuple(_rope_reference(x, head_dim, c, s, R, exact, x.dtype) for x in (q, k))
