"""The chunked gated delta rule (Gated DeltaNet's token mixer, prefill), as Triton kernels with
its pure-torch references (kept in vsr.kernels.deltanet_reference, which imports no Triton, and
re-exported here).

Per value head, with fp32 state S [K, V] starting at zero, for each token t:

    S_t = exp(g_t) * S_{t-1} + beta_t * k_t (v_t - (exp(g_t) S_{t-1})^T k_t)^T
    o_t = S_t^T q_t

q and k L2-normalised over K (rsqrt(sum(x^2) + 1e-6), fp32) when `l2norm`, q scaled by K^-0.5.
Grouped heads: value head h reads query/key head h // (Hv // Hk) (transformers' repeat_interleave).
(Yang et al., "Gated Delta Networks", https://arxiv.org/abs/2412.06464.)

Chunked form (chunk 64, as transformers' torch_chunk_gated_delta_rule): within a chunk,
gc = cumsum(g), N[i, j] = beta_i k_i.k_j exp(gc_i - gc_j) for j < i, T = (I + N)^-1 by forward
substitution (the UT transform), u = T (beta v), w = T (beta exp(gc) k); across chunks, in order:

    v' = u - w S;  o = (exp(gc) q) S + (q k^T * exp(gc_i - gc_j) [j <= i]) v'
    S  = exp(gc_last) S + (exp(gc_last - gc) k)^T v'

Kernels: `_ut_kernel` (one program per (chunk, batch x value head): T, u, w, gc into an fp32
workspace, chunks in parallel) and `_scan_kernel` (one program per (value block, batch x value
head): the chunks in order, the state in registers). No atomics; the chunking starts at
position 0 of each request and every program reads one request only, so a request's bytes do not
depend on the batch it shares or its padding. Right padding: with `lengths`, positions
t >= lengths[b] count as q = k = v = beta = g = 0 (they leave the state unchanged, and their
output rows are zeros).

The gates (deltanet_gates): beta = sigmoid(b) and g = -exp(A_log) * softplus(a + dt_bias) from the
fused in_proj_b | in_proj_a output, one program per token.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

# The references live in a module without Triton (the CPU path imports them); re-exported here.
from vsr.kernels.deltanet_reference import (CHUNK, L2_EPS, chunk_gated_delta_rule_reference,  # noqa: F401
                                            deltanet_gates_reference, recurrent_gated_delta_rule_reference)
from vsr.kernels.norm import LIBDEVICE
# The scan's chunks depend on each other through the state, so its loop runs unpipelined: Triton's
# default 3 stages buffer the loop's fp32 tiles in shared memory (263 KB at K = V = 128 in bf16,
# more than an H200's 227 KB; 106 KB with one stage).
SCAN_STAGES = 1



# ---------------------------------------------------------------------------------------------
# Triton


@triton.jit
def _load_qk(ptr, b, pos, head, sb, ss, sh, L, K, BT: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr):
    """[BT, BK] fp32 rows `pos` of head `head` (zeros past the length and past K), L2-normalised."""
    cols = tl.arange(0, BK)
    m = (pos < L)[:, None] & (cols < K)[None, :]
    x = tl.load(ptr + b.to(tl.int64) * sb + pos.to(tl.int64)[:, None] * ss + head * sh + cols[None, :],
                mask=m, other=0.0).to(tl.float32)
    if L2NORM:
        x = x * tl.rsqrt(tl.sum(x * x, axis=1) + 1e-6)[:, None]
    return x


@triton.jit
def _ut_kernel(k_ptr, v_ptr, g_ptr, beta_ptr, len_ptr, w_ptr, u_ptr, gc_ptr,
               S, Hv, GROUP, K, V, SP,
               skb, sks, skh, svb, svs, svh, sgb, sgs,
               BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr):
    """One chunk of one (request, value head): gc, T = (I + N)^-1, w = T (beta exp(gc) k) and
    u = T (beta v) into the fp32 workspaces [B*Hv, SP, *] (SP: S rounded up to BT)."""
    c = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // Hv
    h = bh % Hv
    L = tl.minimum(tl.load(len_ptr + b), S)
    r = tl.arange(0, BT)
    pos = c * BT + r
    real = pos < L
    k = _load_qk(k_ptr, b, pos, h // GROUP, skb, sks, skh, L, K, BT, BK, L2NORM)
    gb = b.to(tl.int64) * sgb + pos.to(tl.int64) * sgs + h
    g = tl.load(g_ptr + gb, mask=real, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + gb, mask=real, other=0.0).to(tl.float32)
    gc = tl.cumsum(g, axis=0)
    kb = k * beta[:, None]
    below = r[:, None] > r[None, :]
    diff = tl.where(below, gc[:, None] - gc[None, :], 0.0)
    n = tl.dot(kb, tl.trans(k), input_precision="ieee") * tl.where(below, tl.exp(diff), 0.0)
    # Forward substitution (transformers' form): t = -N, then row i += row_i . t[:i, :i], in order.
    t = -n
    for i in range(1, BT):
        row = tl.sum(tl.where(r[:, None] == i, t, 0.0), axis=0)             # [BT]: t[i, :]
        new = row + tl.sum(row[:, None] * t, axis=0)
        t = tl.where(r[:, None] == i, new[None, :], t)
    t = t + tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    ws = bh.to(tl.int64) * SP + pos.to(tl.int64)
    kcols = tl.arange(0, BK)
    w = tl.dot(t, kb * tl.exp(gc)[:, None], input_precision="ieee")
    tl.store(w_ptr + ws[:, None] * BK + kcols[None, :], w)
    tl.store(gc_ptr + ws, gc)
    for v0 in range(0, V, BV):
        vcols = v0 + tl.arange(0, BV)
        vm = real[:, None] & (vcols < V)[None, :]
        vv = tl.load(v_ptr + b.to(tl.int64) * svb + pos.to(tl.int64)[:, None] * svs + h * svh + vcols[None, :],
                     mask=vm, other=0.0).to(tl.float32)
        u = tl.dot(t, vv * beta[:, None], input_precision="ieee")
        tl.store(u_ptr + ws[:, None] * V + vcols[None, :], u, mask=(vcols < V)[None, :])


@triton.jit
def _scan_kernel(q_ptr, k_ptr, w_ptr, u_ptr, gc_ptr, len_ptr, o_ptr,
                 S, Hv, GROUP, K, V, SP, scale,
                 sqb, sqs, sqh, skb, sks, skh, sob, sos, soh,
                 BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr):
    """The chunks of one (request, value head) in order, for value columns [pid0 * BV, +BV): the
    state [BK, BV] in fp32 registers; o written in o's dtype (zeros past the length)."""
    vb = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // Hv
    h = bh % Hv
    L = tl.minimum(tl.load(len_ptr + b), S)
    r = tl.arange(0, BT)
    kcols = tl.arange(0, BK)
    vcols = vb * BV + tl.arange(0, BV)
    vmask = vcols < V
    causal = r[:, None] >= r[None, :]
    state = tl.zeros((BK, BV), dtype=tl.float32)
    for c in range(0, tl.cdiv(S, BT)):
        pos = c * BT + r
        q = _load_qk(q_ptr, b, pos, h // GROUP, sqb, sqs, sqh, L, K, BT, BK, L2NORM) * scale
        k = _load_qk(k_ptr, b, pos, h // GROUP, skb, sks, skh, L, K, BT, BK, L2NORM)
        ws = bh.to(tl.int64) * SP + pos.to(tl.int64)
        gc = tl.load(gc_ptr + ws)
        g_last = tl.load(gc_ptr + bh.to(tl.int64) * SP + c * BT + BT - 1)
        w = tl.load(w_ptr + ws[:, None] * BK + kcols[None, :])
        u = tl.load(u_ptr + ws[:, None] * V + vcols[None, :], mask=vmask[None, :], other=0.0)
        vn = u - tl.dot(w, state, input_precision="ieee")
        decay = tl.where(causal, tl.exp(tl.where(causal, gc[:, None] - gc[None, :], 0.0)), 0.0)
        attn = tl.dot(q, tl.trans(k), input_precision="ieee") * decay
        o = tl.dot(q * tl.exp(gc)[:, None], state, input_precision="ieee") + tl.dot(attn, vn, input_precision="ieee")
        om = (pos < S)[:, None] & vmask[None, :]
        tl.store(o_ptr + b.to(tl.int64) * sob + pos.to(tl.int64)[:, None] * sos + h * soh + vcols[None, :],
                 o.to(o_ptr.dtype.element_ty), mask=om)
        kg = k * tl.exp(g_last - gc)[:, None]
        state = state * tl.exp(g_last) + tl.dot(tl.trans(kg), vn, input_precision="ieee")


def _check(q, k, v, g, beta):
    B, S, Hk, K = k.shape
    if q.shape != k.shape or v.shape[:2] != (B, S) or g.shape != (B, S, v.shape[2]) or beta.shape != g.shape:
        raise ValueError(f"shapes: q {tuple(q.shape)} k {tuple(k.shape)} v {tuple(v.shape)} g {tuple(g.shape)} "
                         f"beta {tuple(beta.shape)}; expected q, k [B, S, Hk, K], v [B, S, Hv, V], g, beta [B, S, Hv]")
    if v.shape[2] % Hk:
        raise ValueError(f"value heads {v.shape[2]} are not a multiple of key heads {Hk}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name}: the head dimension must be contiguous (stride 1), got strides {x.stride()}")


def chunk_gated_delta_rule(q, k, v, g, beta, lengths=None, *, l2norm=True, block_v: int = 64, out=None):
    """The Triton form of chunk_gated_delta_rule_reference (same signature; q/k/v may be strided views,
    e.g. column slices of the conv output, with the head dimension contiguous). o [B, S, Hv, V] in
    q's dtype, contiguous (written into `out` when given)."""
    _check(q, k, v, g, beta)
    B, S, Hk, K = k.shape
    Hv, V = v.shape[2:]
    BK = triton.next_power_of_2(K)
    BV = min(block_v, triton.next_power_of_2(V))
    SP = triton.cdiv(S, CHUNK) * CHUNK
    dev = q.device
    if lengths is None:
        lengths = torch.full((B,), S, dtype=torch.int32, device=dev)
    lengths = lengths.to(device=dev, dtype=torch.int32)
    g = g.float().contiguous()
    beta = beta.contiguous()
    w = torch.empty(B * Hv, SP, BK, dtype=torch.float32, device=dev)
    u = torch.empty(B * Hv, SP, V, dtype=torch.float32, device=dev)
    gc = torch.empty(B * Hv, SP, dtype=torch.float32, device=dev)
    o = torch.empty(B, S, Hv, V, dtype=q.dtype, device=dev) if out is None else out
    if o.shape != (B, S, Hv, V) or not o.is_contiguous() or o.dtype != q.dtype:
        raise ValueError(f"out must be a contiguous [B, S, Hv, V] = {[B, S, Hv, V]} tensor of {q.dtype}")
    _ut_kernel[(SP // CHUNK, B * Hv)](
        k, v, g, beta, lengths, w, u, gc, S, Hv, Hv // Hk, K, V, SP,
        k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2), g.stride(0), g.stride(1),
        BT=CHUNK, BK=BK, BV=BV, L2NORM=l2norm, num_warps=4)
    _scan_kernel[(triton.cdiv(V, BV), B * Hv)](
        q, k, w, u, gc, lengths, o, S, Hv, Hv // Hk, K, V, SP, K ** -0.5,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        o.stride(0), o.stride(1), o.stride(2),
        BT=CHUNK, BK=BK, BV=BV, L2NORM=l2norm, num_warps=4, num_stages=SCAN_STAGES)
    return o


# ---------------------------------------------------------------------------------------------
# the gates


@triton.jit
def _gates_kernel(ba_ptr, na_ptr, dt_ptr, g_ptr, beta_ptr, H, stride_ba, BLOCK_H: tl.constexpr,
                  LIBDEVICE: tl.constexpr):
    """Row program_id(0): beta = sigmoid(b) (fp32, rounded to ba's dtype), g = neg_a · softplus(a +
    dt_bias) in fp32 (torch's softplus: x past 20 is x itself, else log1p(exp(x)))."""
    row = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)
    m = h < H
    b = tl.load(ba_ptr + row * stride_ba + h, mask=m, other=0.0).to(tl.float32)
    a = tl.load(ba_ptr + row * stride_ba + H + h, mask=m, other=0.0).to(tl.float32)
    x = a + tl.load(dt_ptr + h, mask=m, other=0.0)
    one = tl.full((BLOCK_H,), 1.0, tl.float32)
    if LIBDEVICE:
        sp = libdevice.log1p(libdevice.exp(x))
        eb = libdevice.exp(-b)
    else:   # log1p(e) as log(u) · e / (u - 1), u = 1 + e (exact where u rounds to 1: e itself)
        e = tl.exp(x)
        u = 1.0 + e
        sp = tl.where(u == 1.0, e, tl.log(u) * (e / tl.where(u == 1.0, 1.0, u - 1.0)))
        eb = tl.exp(-b)
    sp = tl.where(x > 20.0, x, sp)
    tl.store(beta_ptr + row * H + h, tl.div_rn(one, 1.0 + eb).to(beta_ptr.dtype.element_ty), mask=m)
    tl.store(g_ptr + row * H + h, tl.load(na_ptr + h, mask=m, other=0.0) * sp, mask=m)


def deltanet_gates(ba: torch.Tensor, neg_a: torch.Tensor, dt_bias: torch.Tensor):
    """The Triton form of deltanet_gates_reference: (g fp32 [T, H], beta [T, H] in ba's dtype), both
    contiguous, from ba [T, 2H] (b | a; a row-strided view allowed), neg_a and dt_bias fp32 [H]."""
    if ba.dim() != 2 or ba.shape[1] % 2 or ba.stride(1) != 1:
        raise ValueError(f"ba must be [T, 2H] with unit column stride, got {tuple(ba.shape)} {ba.stride()}")
    T, H = ba.shape[0], ba.shape[1] // 2
    if neg_a.shape != (H,) or dt_bias.shape != (H,) or neg_a.dtype != torch.float32 or dt_bias.dtype != torch.float32:
        raise ValueError(f"neg_a and dt_bias must be fp32 [{H}]")
    g = torch.empty(T, H, dtype=torch.float32, device=ba.device)
    beta = torch.empty(T, H, dtype=ba.dtype, device=ba.device)
    if T:
        _gates_kernel[(T,)](ba, neg_a.contiguous(), dt_bias.contiguous(), g, beta, H, ba.stride(0),
                            BLOCK_H=triton.next_power_of_2(H), LIBDEVICE=LIBDEVICE, num_warps=1)
    return g, beta
