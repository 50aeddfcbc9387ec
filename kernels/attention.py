"""Prefill attention as a Triton flash-attention kernel, with a pure-torch reference of the same
signature. https://arxiv.org/abs/2205.14135 (FlashAttention), online softmax in fp32.

    o[b, i, h] = Σ_j softmax_j(scale · q[b, i, h] · k[b, j, g(h)]) · v[b, j, g(h)]

over the keys j allowed for query i: j < lengths[b] (right padding), and j <= i when causal
(decoders), |i - j| <= window // 2 when a window is given (ModernBERT's local attention).
g(h) = h // (Hq / Hkv): grouped-query heads read their key/value head in place.
Query rows i >= lengths[b] are written as zeros (they carry no token; the reference does the same).
With `gate` ([B, S, Hq, D], Qwen3.5's gated attention), the output is o · sigmoid(gate) as
transformers computes it: o rounded to q's dtype, sigmoid(gate) in fp32 rounded to it (libdevice's
exp, IEEE division, as torch's CUDA sigmoid), their product rounded once more.

q [B, S, Hq, D], k and v [B, S, Hkv, D] and gate may be strided views (the head columns of a
fused qkv output), with unit stride along D; head dims 32, 64, 128, 256. The output is contiguous
[B, S, Hq, D] in q's dtype. Each program owns BLOCK_M queries of one (request, head) and walks
its key blocks in a fixed order, one after another: no split over keys, no atomics, so the bytes
depend only on that request's own q, k, v and length, never on the rest of the batch. The tiles
are fixed per head dim and sequence length (_config), chosen without timing at run time.

Numerics: q · kᵀ accumulated in fp32, the softmax in fp32 (exp2 of logits scaled by
scale · log2 e), probabilities rounded to v's dtype for the P · V product (fp32 accumulation), the
output divided by the fp32 row sum once at the end and rounded to q's dtype. fp32 inputs multiply at
common.f32_precision's precision (tf32x3 on NVIDIA GPUs: about fp32's accuracy; IEEE elsewhere).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from vsr.kernels import common, pdl
from vsr.kernels.common import LIBDEVICE, sigmoid_f32

HEAD_DIMS = (32, 64, 128, 256)
# From this sequence length the unmasked key blocks run in a loop of their own (SKIP_MASK). A loop
# starts its loads afresh, so a program with few key blocks waits for two loops' first loads where
# one masked loop would have prefetched the next block: in the H200 records of the 27B-class
# forward, 16 requests of 128 tokens spend 15% longer in attention with the two loops, one request
# of 1024 tokens 12% less; timed alone on an H100 at Qwen3's heads, two loops lose at 128 and 256
# tokens and win from 512.
SKIP_MASK_FROM = 257
# From this sequence length the programs launch heads first (_attention_kernel's HEADS_FIRST): timed
# alone on an H100 at Qwen3's heads, 5-13% less time at 4-8 requests of 256 tokens, 12% at one of
# 1,024, 10% at 2,048, 3% more at 16 of 128 (benchmarks/results/attention-nvidia-h100-2026-12-06.json);
# the 27B-class forward at one request of 1,024 tokens 1.8% less (ab-nvidia-h100-2026-12-06.json).
HEADS_FIRST_FROM = 256
# From this sequence length the programs take 128 queries at head size 128 (8 warps), below it 64
# (4 warps). Timed alone on an H100 at Qwen3's heads (causal, bf16, 64 keys a step, 3 stages), 64
# queries took 0.92x the time of 128 at one request of 512 tokens, 0.90x at two, 0.95x at 1,024,
# 0.98x at 2,048 and 1.02x at 4,096 (benchmarks/results/ab-nvidia-h100-2026-12-06.json,
# "attention_block_m").
BLOCK_M_128_FROM = 4096


@triton.jit
def _key_blocks(q, k_base, v_base, acc, l_i, m_i, n_lo, n_hi, offs_m, offs_d, length, qk_scale, HALF_W, sks, svs,
                BLOCK_N: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
                F32: tl.constexpr):
    """The online softmax over key blocks [n_lo, n_hi) in order: (acc, l_i, m_i) updated. MASK: keys
    past the length, after the query (CAUSAL) or outside the window give -inf logits; without it
    every key of every block is allowed (and in bounds)."""
    offs_nb = tl.arange(0, BLOCK_N)
    for start_n in range(n_lo, n_hi, BLOCK_N):
        offs_n = start_n + offs_nb
        k_ptrs = k_base + offs_n[:, None].to(tl.int64) * sks + offs_d[None, :]
        v_ptrs = v_base + offs_n[:, None].to(tl.int64) * svs + offs_d[None, :]
        if MASK:
            k = tl.load(k_ptrs, mask=offs_n[:, None] < length, other=0.0)
        else:
            k = tl.load(k_ptrs)
        if F32 != "":
            qk = tl.dot(q, tl.trans(k), input_precision=F32)
        else:
            qk = tl.dot(q, tl.trans(k))
        if MASK:
            allowed = offs_n[None, :] < length
            if CAUSAL:
                allowed &= offs_n[None, :] <= offs_m[:, None]
            if WINDOW:
                d = offs_m[:, None] - offs_n[None, :]
                allowed &= (d <= HALF_W) & (d >= -HALF_W)
            qk = tl.where(allowed, qk * qk_scale, float("-inf"))
        else:
            qk = qk * qk_scale
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)   # a row with no key allowed yet
        p = tl.math.exp2(qk - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if MASK:
            v = tl.load(v_ptrs, mask=offs_n[:, None] < length, other=0.0)
        else:
            v = tl.load(v_ptrs)
        if F32 != "":
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=F32)
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, len_ptr, g_ptr, S, HQ, GROUP, qk_scale, HALF_W,
                      sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sgb, sgs, sgh,
                      D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                      WINDOW: tl.constexpr, F32: tl.constexpr, GATE: tl.constexpr, LIBDEVICE: tl.constexpr,
                      SKIP_MASK: tl.constexpr, HEADS_FIRST: tl.constexpr, WAIT: tl.constexpr,
                      RELEASE: tl.constexpr):
    pdl.begin(WAIT, RELEASE)
    # The grid is (query blocks, requests x heads), or with HEADS_FIRST (requests x heads, query
    # blocks): the programs launched together are then one query block of every head (in key/value
    # head groups, sharing their keys in L2), and causal, the longest blocks of all heads first.
    if HEADS_FIRST:
        qb = tl.program_id(1)
        n_qb = tl.num_programs(1)
        bh = tl.program_id(0)
    else:
        qb = tl.program_id(0)
        n_qb = tl.num_programs(0)
        bh = tl.program_id(1)
    if CAUSAL:   # the longest query blocks (the most keys) first: the last wave's programs are short
        qb = n_qb - 1 - qb
    start_m = qb * BLOCK_M
    b = (bh // HQ).to(tl.int64)
    h = bh % HQ
    g = (h // GROUP).to(tl.int64)
    h = h.to(tl.int64)
    length = tl.load(len_ptr + b)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    o_rows = o_ptr + ((b * S + offs_m.to(tl.int64)) * HQ + h) * D
    o_ptrs = o_rows[:, None] + offs_d[None, :]
    if start_m >= length:   # a block of padding queries only
        tl.store(o_ptrs, tl.zeros((BLOCK_M, D), dtype=o_ptr.dtype.element_ty), mask=offs_m[:, None] < S)
        return
    q = tl.load(q_ptr + b * sqb + h * sqh + offs_m[:, None].to(tl.int64) * sqs + offs_d[None, :],
                mask=offs_m[:, None] < length, other=0.0)
    k_base = k_ptr + b * skb + g * skh
    v_base = v_ptr + b * svb + g * svh
    lo = 0
    hi = length
    if CAUSAL:
        hi = tl.minimum(hi, start_m + BLOCK_M)
    if WINDOW:
        lo = tl.maximum(start_m - HALF_W, 0) // BLOCK_N * BLOCK_N
        hi = tl.minimum(hi, start_m + BLOCK_M + HALF_W)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    # With SKIP_MASK, the key blocks whose every key is allowed to every query of the block (below the
    # padding and, causal, at or before the block's first query) skip the mask, which only ever
    # replaces logits by -inf; the rest take it. Two loops in the one fixed block order, not a branch
    # in one loop. Without it, one masked loop.
    mid = lo
    if SKIP_MASK and not WINDOW:
        whole = length
        if CAUSAL:
            whole = tl.minimum(whole, start_m + 1)
        mid = whole // BLOCK_N * BLOCK_N
        acc, l_i, m_i = _key_blocks(q, k_base, v_base, acc, l_i, m_i, lo, mid, offs_m, offs_d, length, qk_scale,
                                    HALF_W, sks, svs, BLOCK_N, False, CAUSAL, WINDOW, F32)
    acc, l_i, m_i = _key_blocks(q, k_base, v_base, acc, l_i, m_i, mid, hi, offs_m, offs_d, length, qk_scale, HALF_W,
                                sks, svs, BLOCK_N, True, CAUSAL, WINDOW, F32)
    valid = offs_m < length
    o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    o = tl.where(valid[:, None], o, 0.0)
    if GATE:
        gate = tl.load(g_ptr + b * sgb + h * sgh + offs_m[:, None].to(tl.int64) * sgs + offs_d[None, :],
                       mask=valid[:, None], other=0.0).to(tl.float32)
        sig = sigmoid_f32(gate, LIBDEVICE)
        o = o.to(o_ptr.dtype.element_ty).to(tl.float32) * sig.to(o_ptr.dtype.element_ty).to(tl.float32)
    tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty), mask=offs_m[:, None] < S)


@functools.cache
def _config(D: int, S: int, f32: str = "") -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, warps, stages), fixed per head dim: BLOCK_N 64 keys a step (32 below
    SKIP_MASK_FROM at D = 128); BLOCK_M 128 queries for long sequences at D < 128 and beyond
    BLOCK_M_128_FROM tokens at D = 128, else 64 (more programs for short prompts, and the registers
    of a 64 x 256 accumulator at D = 256). fp32 inputs
    multiplied as tf32x3 (`f32`) stage their TF32 parts in shared memory too: from D = 128 they take
    fewer stages and keys a step to fit the H200's 227 KB (196,608 bytes at D = 128 and 256,
    compiled for sm_90)."""
    if D not in HEAD_DIMS:
        raise ValueError(f"attention supports head dims {HEAD_DIMS}, got {D}")
    if f32 == "tf32x3" and D >= 128:
        return (64, 64, 4, 2) if D == 128 else (64, 32, 8, 1)
    block_m = 128 if (S > 256 and D < 128) or (S >= BLOCK_M_128_FROM and D == 128) else 64
    warps = 8 if (D >= 128 and block_m == 128) or D == 256 else 4
    stages = 2 if D == 256 else 3
    # At head size 128 the one masked loop below SKIP_MASK_FROM walks 32 keys a step: 8% less time
    # at 16 requests of 128 tokens (Qwen3's 64/8 heads, 44.0 against 47.8 us on an H100), 2-5% at
    # 4-8 of 256, 0.3 us more at one request of 128 (5.4 against 5.1; benchmarks/bench_attention.py).
    block_n = 32 if (D == 128 and S < SKIP_MASK_FROM) else 64
    return block_m, block_n, warps, stages


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, *, causal: bool,
              window: int | None = None, scale: float | None = None, gate: torch.Tensor | None = None
              ) -> torch.Tensor:
    """o [B, S, Hq, D] in q's dtype (times sigmoid(gate) when given); lengths int32 [B] on q's device
    (rows >= length: zeros)."""
    B, S, HQ, D = q.shape
    HKV = k.shape[2]
    assert k.shape == (B, S, HKV, D) and v.shape == k.shape, "k and v must be [B, S, Hkv, D] as q's"
    assert HQ % HKV == 0, f"query heads {HQ} are not a multiple of key/value heads {HKV}"
    assert q.stride(3) == 1 and k.stride(3) == 1 and v.stride(3) == 1, "q, k, v need unit stride along D"
    assert q.dtype == k.dtype == v.dtype, "q, k, v must share a dtype"
    assert lengths.shape == (B,) and lengths.dtype == torch.int32, "lengths must be int32 [B]"
    if gate is not None:
        assert gate.shape == q.shape and gate.dtype == q.dtype and gate.stride(3) == 1, \
            "gate must be [B, S, Hq, D] in q's dtype, unit stride along D"
    f32 = common.f32_precision(q)
    block_m, block_n, warps, stages = _config(D, S, f32)
    o = torch.empty((B, S, HQ, D), dtype=q.dtype, device=q.device)
    if B == 0 or S == 0:
        return o
    sc = D ** -0.5 if scale is None else scale
    heads_first = S >= HEADS_FIRST_FROM
    grid = (B * HQ, triton.cdiv(S, block_m)) if heads_first else (triton.cdiv(S, block_m), B * HQ)
    g = q if gate is None else gate
    _attention_kernel[grid](
        q, k, v, o, lengths, g, S, HQ, HQ // HKV, sc * 1.4426950408889634, 0 if window is None else window // 2,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), g.stride(0), g.stride(1), g.stride(2),
        D=D, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal, WINDOW=window is not None,
        F32=f32, GATE=gate is not None, LIBDEVICE=LIBDEVICE, SKIP_MASK=S >= SKIP_MASK_FROM,
        HEADS_FIRST=heads_first, num_warps=warps, num_stages=stages, **pdl.options(q.device))
    return o


def attention_mask(lengths: torch.Tensor, S: int, causal: bool, window: int | None) -> torch.Tensor:
    """The boolean mask [B, 1, S, S] of the keys each query may attend to (True: allowed)."""
    i = torch.arange(S, device=lengths.device)
    allow = (i[None, :] < lengths.long()[:, None])[:, None, None, :]
    if causal:
        allow = allow & (i[None, :] <= i[:, None])
    if window is not None:
        allow = allow & ((i[:, None] - i[None, :]).abs() <= window // 2)
    return allow


def attention_reference(q, k, v, lengths, *, causal, window=None, scale=None, gate=None):
    """torch's scaled_dot_product_attention in fp32 with the explicit mask (attention_mask), key and
    value heads repeated for grouped-query attention; rows >= length zeroed; times sigmoid(gate) in
    q's dtype when given (Qwen3.5's attn_output * torch.sigmoid(gate))."""
    B, S, HQ, D = q.shape
    rep = HQ // k.shape[2]
    qf = q.float().transpose(1, 2)
    kf = k.float().repeat_interleave(rep, dim=2).transpose(1, 2)
    vf = v.float().repeat_interleave(rep, dim=2).transpose(1, 2)
    o = torch.nn.functional.scaled_dot_product_attention(
        qf, kf, vf, attn_mask=attention_mask(lengths, S, causal, window), scale=D ** -0.5 if scale is None else scale)
    valid = torch.arange(S, device=q.device)[None, :] < lengths.long()[:, None]
    o = torch.where(valid[:, :, None, None], o.transpose(1, 2), 0.0).to(q.dtype)
    return o if gate is None else o * torch.sigmoid(gate.contiguous())
