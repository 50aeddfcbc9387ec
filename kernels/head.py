"""The score head on each request's last token, gathered in the kernel, with a pure-torch
reference of the same signature:

    logits[b, l] = Σ_k h[b · S + lengths[b] - 1, k] · weight[l, k] (+ bias[l])   in fp32

h is the final hidden state [B · S, hidden] (right-padded requests of S rows each) or [B, S,
hidden]; weight [L, hidden] (fp32, as the runtime keeps the score head). One program per request
and block of labels; its sum runs over BLOCK_K-column chunks in a fixed order, each lane's partial
sums added last by tl.sum: the same bytes on every call, whatever else is in the batch.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from vsr.kernels import pdl


@triton.jit
def _score_kernel(h_ptr, len_ptr, w_ptr, b_ptr, o_ptr, S, K, L, stride_h, stride_w,
                  BLOCK_L: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr,
                  WAIT: tl.constexpr, RELEASE: tl.constexpr):
    pdl.begin(WAIT, RELEASE)
    b = tl.program_id(0).to(tl.int64)
    offs_l = tl.program_id(1) * BLOCK_L + tl.arange(0, BLOCK_L)
    ml = offs_l < L
    row = b * S + tl.load(len_ptr + b).to(tl.int64) - 1
    acc = tl.zeros((BLOCK_L, BLOCK_K), dtype=tl.float32)
    offs_k = tl.arange(0, BLOCK_K)
    for k0 in range(0, K, BLOCK_K):
        mk = k0 + offs_k < K
        x = tl.load(h_ptr + row * stride_h + k0 + offs_k, mask=mk, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs_l[:, None].to(tl.int64) * stride_w + k0 + offs_k[None, :],
                    mask=ml[:, None] & mk[None, :], other=0.0).to(tl.float32)
        acc += w * x[None, :]
    y = tl.sum(acc, axis=1)
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_l, mask=ml, other=0.0).to(tl.float32)
    tl.store(o_ptr + b * L + offs_l, y, mask=ml)


@functools.cache
def _plan(L: int) -> tuple[int, int]:
    """(BLOCK_L, BLOCK_K): up to 16 labels a program, 8192 fp32 lanes of partial sums."""
    bl = min(16, triton.next_power_of_2(L))
    return bl, 8192 // bl


def _rows(h, lengths):
    B = lengths.shape[0]
    if h.dim() == 3:
        h = h.reshape(-1, h.shape[-1])
    assert h.shape[0] % max(B, 1) == 0, f"h has {h.shape[0]} rows, not a whole number of {B} requests"
    return h, (h.shape[0] // B if B else 0)


def last_token_score(h: torch.Tensor, lengths: torch.Tensor, weight: torch.Tensor,
                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 logits [B, L] of row lengths[b] - 1 of each request (lengths int32 [B], each >= 1)."""
    h, S = _rows(h, lengths)
    assert h.stride(-1) == 1 and weight.stride(-1) == 1, "h and weight need unit column stride"
    assert lengths.dtype == torch.int32, "lengths must be int32"
    B, (L, K) = lengths.shape[0], weight.shape
    assert h.shape[1] == K, f"h has {h.shape[1]} columns, the score head {K}"
    o = torch.empty((B, L), dtype=torch.float32, device=h.device)
    if B:
        bl, bk = _plan(L)
        _score_kernel[(B, triton.cdiv(L, bl))](h, lengths, weight, weight if bias is None else bias, o, S, K, L,
                                               h.stride(0), weight.stride(0), BLOCK_L=bl, BLOCK_K=bk,
                                               HAS_BIAS=bias is not None, num_warps=4, **pdl.options(h.device))
    return o


def last_token_score_reference(h, lengths, weight, bias=None):
    """The runtime's Qwen3 head: h[b, lengths[b] - 1].float() @ weight.T (+ bias)."""
    h, S = _rows(h, lengths)
    rows = torch.arange(lengths.shape[0], device=h.device) * S + lengths.long() - 1
    y = h[rows].float() @ weight.float().t()
    return y if bias is None else y + bias.float()
