"""Depthwise causal conv1d with SiLU (Gated DeltaNet's short convolution), Triton kernel and reference
(the reference kept in vsr.kernels.deltanet_reference, which imports no Triton, and re-exported here).

    y[b, s, c] = silu( sum_{j<W} x[b, s - (W-1) + j, c] * w[c, j] )     (x = 0 before position 0)

x [B, S, C] (a row-strided view allowed, e.g. a column slice of a product output), w [C, W]
(nn.Conv1d's [C, 1, W] squeezed). Rounding as transformers' causal_conv1d_fn: the convolution's
sum in fp32, rounded to w's dtype, SiLU of that, rounded to x's dtype. Each output is one fixed
sum of W products in order: the bytes do not depend on the batch or on the padding after a
request (right padding: a real position reads only earlier positions).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from vsr.kernels import pdl

# The reference lives in a module without Triton (the CPU path imports it); re-exported here.
from vsr.kernels.deltanet_reference import causal_conv1d_silu_reference  # noqa: F401


@triton.jit
def _conv_kernel(x_ptr, w_ptr, y_ptr, S, C, sxb, sxs, syb, sys_, W: tl.constexpr,
                 BS: tl.constexpr, BC: tl.constexpr,
                 WAIT: tl.constexpr, RELEASE: tl.constexpr):
    pdl.begin(WAIT, RELEASE)
    ps = tl.program_id(0)
    pc = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    s = ps * BS + tl.arange(0, BS)
    c = pc * BC + tl.arange(0, BC)
    cm = c < C
    acc = tl.zeros((BS, BC), dtype=tl.float32)
    for j in tl.static_range(W):
        src = s - (W - 1) + j
        m = ((src >= 0) & (src < S))[:, None] & cm[None, :]
        xv = tl.load(x_ptr + b * sxb + src.to(tl.int64)[:, None] * sxs + c[None, :], mask=m, other=0.0)
        wv = tl.load(w_ptr + c * W + j, mask=cm, other=0.0)
        acc += xv.to(tl.float32) * wv.to(tl.float32)[None, :]
    acc = acc.to(w_ptr.dtype.element_ty).to(tl.float32)
    y = (acc / (1.0 + tl.exp(-acc))).to(w_ptr.dtype.element_ty)
    om = (s < S)[:, None] & cm[None, :]
    tl.store(y_ptr + b * syb + s.to(tl.int64)[:, None] * sys_ + c[None, :], y.to(y_ptr.dtype.element_ty), mask=om)


def causal_conv1d_silu(x: torch.Tensor, w: torch.Tensor, *, block_s: int = 32, block_c: int = 128,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """The Triton form of causal_conv1d_silu_reference: [B, S, C] contiguous, in x's dtype (into `out`
    when given)."""
    if x.dim() != 3 or w.dim() != 2 or w.shape[0] != x.shape[2]:
        raise ValueError(f"x must be [B, S, C] and w [C, W], got {tuple(x.shape)} and {tuple(w.shape)}")
    if x.stride(2) != 1:
        raise ValueError(f"x: the channel dimension must be contiguous, got strides {x.stride()}")
    B, S, C = x.shape
    w = w.contiguous()
    y = torch.empty(B, S, C, dtype=x.dtype, device=x.device) if out is None else out
    if y.shape != (B, S, C) or not y.is_contiguous() or y.dtype != x.dtype:
        raise ValueError(f"out must be a contiguous [B, S, C] = {[B, S, C]} tensor of {x.dtype}")
    grid = (triton.cdiv(S, block_s), triton.cdiv(C, block_c), B)
    _conv_kernel[grid](x, w, y, S, C, x.stride(0), x.stride(1), y.stride(0), y.stride(1), W=w.shape[1],
                       BS=block_s, BC=block_c, num_warps=4, **pdl.options(x.device))
    return y
