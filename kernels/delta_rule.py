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

Kernels: `_ut_kernel` (two programs per (chunk, batch x value head), chunks in parallel: one
solves T by a blocked triangular solve and writes w and u, the other the chunk's
state-independent terms exp(gc) q, the decayed keys and the masked q k^T; into workspaces:
WORKSPACE_DTYPE) and `_scan_kernel` (one program per (value block,
batch x value head): the chunks in order, the state in registers, four products a chunk). No
atomics; the chunking starts at position 0 of each request and every program reads one request
only, so a request's bytes do not depend on the batch it shares or its padding. Right padding: with `lengths`, positions
t >= lengths[b] count as q = k = v = beta = g = 0 (they leave the state unchanged, and their
output rows are zeros).

The gates: beta = sigmoid(b) and g = -exp(A_log) * softplus(a + dt_bias) from the fused
in_proj_b | in_proj_a output (deltanet_gates, one program per token). deltanet_mixer, the model's
call, runs the conv kernel, the gates kernel and the rule in turn.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from vsr.kernels import common, conv1d, gemm, pdl

# The references live in a module without Triton (the CPU path imports them); re-exported here.
from vsr.kernels.deltanet_reference import (CHUNK, L2_EPS, chunk_gated_delta_rule_reference,  # noqa: F401
                                            deltanet_gates_reference, deltanet_mixer_reference,
                                            recurrent_gated_delta_rule_reference, split_mixed)
from vsr.kernels.common import LIBDEVICE, exp_f32, sigmoid_f32
# The scan's loop prefetches the next chunk's workspace tiles (two stages) where its programs are
# one a multiprocessor at most (scan_stages), else it runs unpipelined (one): with the 16-bit
# workspaces two stages fit a Hopper's 227 KB of shared memory at K = V = 128. Timed on an H100 at
# Qwen3.5's 27B-class heads (96 programs a request), two stages took 0.90-0.91x the time of one at
# one request of 512-2,048 tokens and 0.98x at 256, but 1.11x at two of 512 and 16 of 128 and 1.02x
# at four of 1,024 (benchmarks/results/ab-nvidia-h100-2026-12-06.json, "delta_rule_fp16_workspaces").
# The stages schedule the same loads and products: the bytes are the same either way.
SCAN_STAGES = 1
TWO_STAGE_SHARED_MEMORY = 227 * 1024
# Every product runs on the tensor cores: TF32 operands (10-bit mantissa, fp32 accumulation) for
# 16-bit inputs, whose output rounds to 8 or 11 bits anyway; three TF32 products per product
# (tf32x3, about fp32's accuracy) for fp32 inputs. IEEE fp32 products are FMA loops whose [64, 128]
# fp32 operands spill many KB of registers a thread at K = V = 128.
PRECISION = {torch.float32: "tf32x3", torch.bfloat16: "tf32", torch.float16: "tf32"}
# The fastest of the forms tried at Qwen3.5's 27B-class heads (16 key, 48 value heads of 128, bf16)
# on the H200: 64 value columns a scan program, 4 warps on the scan.
SCAN_BLOCK_V = 64
# The dtype of the workspaces that only ever enter the scan as TF32 operands (w, qg, kt, attn) by the
# input dtype: fp16 for 16-bit inputs holds the same 10-bit mantissa a TF32 operand keeps in half
# the bytes (values below fp16's 6e-5 lose bits, at most 3e-8 each); fp32 for fp32 inputs (tf32x3).
# u stays fp32: v' = u - w S can cancel, and it is added, not multiplied, in the scan.
WORKSPACE_DTYPE = {torch.float32: torch.float32, torch.bfloat16: torch.float16, torch.float16: torch.float16}
# The per-chunk kernel: two programs a chunk (T, w and u | q's terms, kt and attn), 4 warps each.
# One program a chunk on 8 warps holds 255 registers a thread and spills: one program a
# multiprocessor, each waiting on its own chain. Split, neither part spills (Triton 3.6, sm_90) and
# two programs fit a multiprocessor. On an H100 at Qwen3.5's 27B-class heads the kernel takes
# 0.83x the time of one program on 8 warps at 1x128 and 0.68-0.71x at 1x1024, 16x128 and 4x1024,
# with the same bytes (benchmarks/results/ab-nvidia-h100-2026-12-06.json, "delta_rule_ut_parts").
UT_WARPS = 4
UT_PARTS = 2
SCAN_WARPS = 4


def scan_stages(programs: int, device: torch.device, workspace_dtype: torch.dtype) -> int:
    """The scan's pipeline stages: two over 16-bit workspaces where its `programs` fit one to a
    multiprocessor of a GPU with TWO_STAGE_SHARED_MEMORY a program, else SCAN_STAGES."""
    if device.type != "cuda" or workspace_dtype == torch.float32:
        return SCAN_STAGES
    smem = common.device_features(device).shared_memory or 0
    return 2 if programs <= gemm.multiprocessors(device) and smem >= TWO_STAGE_SHARED_MEMORY else SCAN_STAGES

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
def _merge_blocks(a, d, BT: tl.constexpr, S_IN: tl.constexpr, S_OUT: tl.constexpr, PREC: tl.constexpr):
    """(I + a)^-1 on the [S_OUT, S_OUT] diagonal blocks of a strictly lower a [BT, BT], from d, its
    inverse on the [S_IN, S_IN] diagonal blocks: within a block, I + a = (I + a_in)(I + d L) with L
    a's part below the S_IN blocks, and N = d L is nilpotent at block level, so (I + a)^-1 =
    (I - N + N^2 - ... (S_OUT / S_IN terms, Horner's form)) d. Every block at once in [BT, BT]."""
    r = tl.arange(0, BT)
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    lower = (r[:, None] // S_OUT == r[None, :] // S_OUT) & (r[:, None] // S_IN > r[None, :] // S_IN)
    n = tl.dot(d, tl.where(lower, a, 0.0), input_precision=PREC)
    p = eye - n
    for _ in range(2, S_OUT // S_IN):
        p = eye - tl.dot(n, p, input_precision=PREC)
    return tl.dot(p, d, input_precision=PREC)


@triton.jit
def _bmm4(x, y):
    """[NB, 4, 4] x [NB, 4, 4] -> [NB, 4, 4], block by block, in fp32 FMAs."""
    return tl.sum(x[:, :, :, None] * y[:, None, :, :], axis=2)


@triton.jit
def _unit_lower_inverse(a, BT: tl.constexpr, PREC: tl.constexpr):
    """(I + a)^-1 of a strictly lower [BT, BT] (BT = 64), without a serial loop: its [4, 4] diagonal
    blocks as I - a + a^2 - a^3 (exact: a 4 x 4 strictly lower block cubed is the last nonzero
    power), merged into [16, 16] blocks and then the whole (_merge_blocks)."""
    NB: tl.constexpr = BT // 4
    bi = tl.arange(0, NB)[:, None, None, None]
    ci = tl.arange(0, NB)[None, None, :, None]
    a4 = tl.sum(tl.where(bi == ci, tl.reshape(a, (NB, 4, NB, 4)), 0.0), axis=2)     # [NB, 4, 4]
    i3 = tl.arange(0, 4)
    eye4 = tl.where(i3[None, :, None] == i3[None, None, :], 1.0, 0.0)
    p = eye4 - a4
    p = eye4 - _bmm4(a4, p)
    p = eye4 - _bmm4(a4, p)
    d = tl.reshape(tl.where(bi == ci, p[:, :, None, :], 0.0), (BT, BT))
    d = _merge_blocks(a, d, BT, 4, 16, PREC)
    return _merge_blocks(a, d, BT, 16, BT, PREC)


@triton.jit
def _ut_solved(k, v_ptr, w_ptr, u_ptr, beta, gc, decay, b, h, r, pos, real, ws, svb, svs, svh, V,
               BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    """T = (I + N)^-1 of one chunk (N = beta_i k_i.k_j exp(gc_i - gc_j) below the diagonal), then
    w = T (beta exp(gc) k) and u = T (beta v) (BV value columns at a time) into their workspace
    rows ws."""
    kb = k * beta[:, None]
    n = tl.dot(kb, tl.trans(k), input_precision=PREC) * tl.where(r[:, None] > r[None, :], decay, 0.0)
    t = _unit_lower_inverse(n, BT, PREC)
    kcols = tl.arange(0, BK)
    w = tl.dot(t, kb * tl.exp(gc)[:, None], input_precision=PREC)
    tl.store(w_ptr + ws[:, None] * BK + kcols[None, :], w.to(w_ptr.dtype.element_ty))
    for v0 in range(0, V, BV):
        vcols = v0 + tl.arange(0, BV)
        vm = real[:, None] & (vcols < V)[None, :]
        vv = tl.load(v_ptr + b.to(tl.int64) * svb + pos.to(tl.int64)[:, None] * svs + h * svh + vcols[None, :],
                     mask=vm, other=0.0).to(tl.float32)
        u = tl.dot(t, vv * beta[:, None], input_precision=PREC)
        tl.store(u_ptr + ws[:, None] * V + vcols[None, :], u, mask=(vcols < V)[None, :])


@triton.jit
def _ut_query(q_ptr, qg_ptr, kt_ptr, attn_ptr, gl_ptr, k, gc, g_last, decay, b, h, GROUP, r, pos, ws, chunk,
              L, K, scale, sqb, sqs, sqh, BT: tl.constexpr, BK: tl.constexpr, L2NORM: tl.constexpr,
              PREC: tl.constexpr):
    """The chunk's terms that do not need T: qg = exp(gc) q, kt = (exp(gc_last - gc) k)^T,
    attn = q k^T exp(gc_i - gc_j) [j <= i] and gl = gc_last."""
    q = _load_qk(q_ptr, b, pos, h // GROUP, sqb, sqs, sqh, L, K, BT, BK, L2NORM) * scale
    kcols = tl.arange(0, BK)
    wdt = qg_ptr.dtype.element_ty
    tl.store(qg_ptr + ws[:, None] * BK + kcols[None, :], (q * tl.exp(gc)[:, None]).to(wdt))
    tl.store(kt_ptr + chunk * BK * BT + kcols[None, :] * BT + r[:, None], (k * tl.exp(g_last - gc)[:, None]).to(wdt))
    tl.store(attn_ptr + ws[:, None] * BT + r[None, :], (tl.dot(q, tl.trans(k), input_precision=PREC) * decay).to(wdt))
    tl.store(gl_ptr + chunk, g_last)


@triton.jit
def _ut_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, len_ptr, w_ptr, u_ptr, qg_ptr, kt_ptr, attn_ptr, gl_ptr,
               S, Hv, GROUP, K, V, SP, scale,
               sqb, sqs, sqh, skb, sks, skh, svb, svs, svh, sgb, sgs,
               BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, PREC: tl.constexpr,
               PARTS: tl.constexpr, WAIT: tl.constexpr, RELEASE: tl.constexpr):
    """Everything of one chunk of one (request, value head) that does not depend on the state, into
    workspaces (rows bh * SP + position; SP is S rounded up to BT; u and gl in fp32, the rest in
    WORKSPACE_DTYPE[input dtype]): T = (I + N)^-1,
    w = T (beta exp(gc) k) [SP, BK], u = T (beta v) [SP, V], qg = exp(gc) q [SP, BK],
    kt = (exp(gc_last - gc) k)^T [SP / BT, BK, BT], attn = q k^T exp(gc_i - gc_j) [j <= i] [SP, BT],
    gl = gc_last [SP / BT]. PARTS programs a chunk (program_id(2), UT_PARTS): 1 does it all; 2 gives
    T, w and u to one and qg, kt, attn and gl to the other, the same operations either way."""
    pdl.begin(WAIT, RELEASE)
    c = tl.program_id(0)
    bh = tl.program_id(1)
    part = tl.program_id(2)
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
    g_last = tl.sum(tl.where(r == BT - 1, gc, 0.0), axis=0)
    causal = r[:, None] >= r[None, :]
    decay = tl.where(causal, tl.exp(tl.where(causal, gc[:, None] - gc[None, :], 0.0)), 0.0)
    ws = bh.to(tl.int64) * SP + pos.to(tl.int64)
    chunk = bh.to(tl.int64) * (SP // BT) + c
    if PARTS == 1:
        _ut_solved(k, v_ptr, w_ptr, u_ptr, beta, gc, decay, b, h, r, pos, real, ws, svb, svs, svh, V, BT, BK, BV, PREC)
        _ut_query(q_ptr, qg_ptr, kt_ptr, attn_ptr, gl_ptr, k, gc, g_last, decay, b, h, GROUP, r, pos, ws, chunk,
                  L, K, scale, sqb, sqs, sqh, BT, BK, L2NORM, PREC)
    else:
        if part == 1:
            _ut_query(q_ptr, qg_ptr, kt_ptr, attn_ptr, gl_ptr, k, gc, g_last, decay, b, h, GROUP, r, pos, ws, chunk,
                      L, K, scale, sqb, sqs, sqh, BT, BK, L2NORM, PREC)
        else:
            _ut_solved(k, v_ptr, w_ptr, u_ptr, beta, gc, decay, b, h, r, pos, real, ws, svb, svs, svh, V,
                       BT, BK, BV, PREC)


@triton.jit
def _scan_kernel(w_ptr, u_ptr, qg_ptr, kt_ptr, attn_ptr, gl_ptr, o_ptr, S, V, SP, sob, sos, soh, Hv,
                 BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
                 WAIT: tl.constexpr, RELEASE: tl.constexpr):
    """The chunks of one (request, value head) in order, for value columns [pid0 * BV, +BV), from
    _ut_kernel's workspaces: the state [BK, BV] in fp32 registers, v' = u - w S,
    o = qg S + attn v' (written in o's dtype), S = exp(gl) S + kt v'."""
    pdl.begin(WAIT, RELEASE)
    vb = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // Hv
    h = bh % Hv
    r = tl.arange(0, BT)
    kcols = tl.arange(0, BK)
    vcols = vb * BV + tl.arange(0, BV)
    vmask = vcols < V
    state = tl.zeros((BK, BV), dtype=tl.float32)
    for c in range(0, tl.cdiv(S, BT)):
        pos = c * BT + r
        ws = bh.to(tl.int64) * SP + pos.to(tl.int64)
        chunk = bh.to(tl.int64) * (SP // BT) + c
        w = tl.load(w_ptr + ws[:, None] * BK + kcols[None, :]).to(tl.float32)
        u = tl.load(u_ptr + ws[:, None] * V + vcols[None, :], mask=vmask[None, :], other=0.0)
        vn = u - tl.dot(w, state, input_precision=PREC)
        qg = tl.load(qg_ptr + ws[:, None] * BK + kcols[None, :]).to(tl.float32)
        attn = tl.load(attn_ptr + ws[:, None] * BT + r[None, :]).to(tl.float32)
        o = tl.dot(qg, state, input_precision=PREC) + tl.dot(attn, vn, input_precision=PREC)
        om = (pos < S)[:, None] & vmask[None, :]
        tl.store(o_ptr + b.to(tl.int64) * sob + pos.to(tl.int64)[:, None] * sos + h * soh + vcols[None, :],
                 o.to(o_ptr.dtype.element_ty), mask=om)
        kt = tl.load(kt_ptr + chunk * BK * BT + kcols[:, None] * BT + r[None, :]).to(tl.float32)
        state = state * tl.exp(tl.load(gl_ptr + chunk)) + tl.dot(kt, vn, input_precision=PREC)


def _check_heads(q, k, v):
    """q, k [B, S, Hk, K] and v [B, S, Hv, V], Hv a multiple of Hk, each head dimension contiguous."""
    B, S, Hk, K = k.shape
    if q.shape != k.shape or v.dim() != 4 or v.shape[:2] != (B, S):
        raise ValueError(f"shapes: q {tuple(q.shape)} k {tuple(k.shape)} v {tuple(v.shape)}; expected q, k "
                         f"[B, S, Hk, K], v [B, S, Hv, V]")
    if v.shape[2] % Hk:
        raise ValueError(f"value heads {v.shape[2]} are not a multiple of key heads {Hk}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name}: the head dimension must be contiguous (stride 1), got strides {x.stride()}")


def _check_gate_params(neg_a, dt_bias, H):
    if neg_a.shape != (H,) or dt_bias.shape != (H,) or neg_a.dtype != torch.float32 or dt_bias.dtype != torch.float32:
        raise ValueError(f"neg_a and dt_bias must be fp32 [{H}]")


def chunk_gated_delta_rule(q, k, v, g, beta, lengths=None, *, l2norm=True, block_v: int | None = None, out=None):
    """The Triton form of chunk_gated_delta_rule_reference (same signature; q/k/v may be strided views,
    e.g. column slices of the conv output, with the head dimension contiguous). o [B, S, Hv, V] in
    q's dtype, contiguous (written into `out` when given). Products in PRECISION[q.dtype];
    `block_v`: the scan's value columns a program (default SCAN_BLOCK_V)."""
    _check_heads(q, k, v)
    if g.shape != (*k.shape[:2], v.shape[2]) or beta.shape != g.shape:
        raise ValueError(f"shapes: g {tuple(g.shape)} beta {tuple(beta.shape)}; expected [B, S, Hv] = "
                         f"{[*k.shape[:2], v.shape[2]]}")
    return _rule(q, k, v, g.float().contiguous(), beta.contiguous(), lengths, l2norm, block_v, out)


def deltanet_mixer(x, conv_w, ba, neg_a, dt_bias, heads, lengths=None, *, block_v: int | None = None, out=None):
    """The Triton form of deltanet_mixer_reference: Gated DeltaNet's token mixer from in_proj's
    outputs, conv1d.causal_conv1d_silu, deltanet_gates and the rule in turn. x [B, S, C] (C = 2 Hk K + Hv V:
    q | k | v before the convolution; a row-strided view allowed), conv_w [C, W], ba [B, S, 2 Hv]
    (b | a; row-strided allowed), neg_a and dt_bias fp32 [Hv], heads (Hk, K, Hv, V)."""
    Hk, K, Hv, V = heads
    B, S, C = x.shape
    if C != 2 * Hk * K + Hv * V:
        raise ValueError(f"x must be [B, S, 2 Hk K + Hv V] = [B, S, {2 * Hk * K + Hv * V}], got {tuple(x.shape)}")
    if ba.shape != (B, S, 2 * Hv) or ba.stride(2) != 1:
        raise ValueError(f"ba must be [B, S, 2 Hv] = {[B, S, 2 * Hv]} with unit column stride, got {tuple(ba.shape)}")
    _check_gate_params(neg_a, dt_bias, Hv)
    _check_heads(*split_mixed(x, heads))   # the conv output's q, k and v are these views' shapes
    q, k, v = split_mixed(conv1d.causal_conv1d_silu(x, conv_w), heads)
    g, beta = deltanet_gates(ba.reshape(B * S, 2 * Hv), neg_a, dt_bias)
    return _rule(q, k, v, g.view(B, S, Hv), beta.view(B, S, Hv), lengths, True, block_v, out)


def _rule(q, k, v, g, beta, lengths, l2norm, block_v, out):
    """Both kernels: g fp32 [B, S, Hv] and beta, contiguous."""
    B, S, Hk, K = k.shape
    Hv, V = v.shape[2:]
    BK = triton.next_power_of_2(K)
    BV = min(block_v or SCAN_BLOCK_V, triton.next_power_of_2(V))
    prec = PRECISION[q.dtype]
    SP = triton.cdiv(S, CHUNK) * CHUNK
    dev = q.device
    if lengths is None:
        lengths = torch.full((B,), S, dtype=torch.int32, device=dev)
    lengths = lengths.to(device=dev, dtype=torch.int32)
    f32 = dict(dtype=torch.float32, device=dev)
    wsp = dict(dtype=WORKSPACE_DTYPE[q.dtype], device=dev)
    w, qg = torch.empty(B * Hv, SP, BK, **wsp), torch.empty(B * Hv, SP, BK, **wsp)
    u, attn = torch.empty(B * Hv, SP, V, **f32), torch.empty(B * Hv, SP, CHUNK, **wsp)
    kt, gl = torch.empty(B * Hv, SP // CHUNK, BK, CHUNK, **wsp), torch.empty(B * Hv, SP // CHUNK, **f32)
    o = torch.empty(B, S, Hv, V, dtype=q.dtype, device=dev) if out is None else out
    if o.shape != (B, S, Hv, V) or not o.is_contiguous() or o.dtype != q.dtype:
        raise ValueError(f"out must be a contiguous [B, S, Hv, V] = {[B, S, Hv, V]} tensor of {q.dtype}")
    parts = UT_PARTS
    if parts not in (1, 2):   # the kernel splits a chunk's work in two at most
        raise ValueError(f"UT_PARTS must be 1 or 2, got {parts}")
    _ut_kernel[(SP // CHUNK, B * Hv, parts)](
        q, k, v, g, beta, lengths, w, u, qg, kt, attn, gl, S, Hv, Hv // Hk, K, V, SP, K ** -0.5,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), g.stride(0), g.stride(1),
        BT=CHUNK, BK=BK, BV=BV, L2NORM=l2norm, PREC=prec, PARTS=parts, num_warps=UT_WARPS, **pdl.options(q.device))
    grid = (triton.cdiv(V, BV), B * Hv)
    stages = scan_stages(grid[0] * grid[1], dev, wsp["dtype"])
    _scan_kernel[grid](
        w, u, qg, kt, attn, gl, o, S, V, SP, o.stride(0), o.stride(1), o.stride(2), Hv,
        BT=CHUNK, BK=BK, BV=BV, PREC=prec, num_warps=SCAN_WARPS, num_stages=stages,
        **pdl.options(w.device))
    return o


# ---------------------------------------------------------------------------------------------
# the gates


@triton.jit
def _gates_kernel(ba_ptr, na_ptr, dt_ptr, g_ptr, beta_ptr, H, stride_ba, BLOCK_H: tl.constexpr,
                  LIBDEVICE: tl.constexpr, WAIT: tl.constexpr, RELEASE: tl.constexpr):
    """Row program_id(0): beta = sigmoid(b) (fp32, rounded to ba's dtype), g = neg_a · softplus(a +
    dt_bias) in fp32 (torch's softplus: x past 20 is x itself, else log1p(exp(x)))."""
    pdl.begin(WAIT, RELEASE)
    row = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)
    m = h < H
    b = tl.load(ba_ptr + row * stride_ba + h, mask=m, other=0.0).to(tl.float32)
    a = tl.load(ba_ptr + row * stride_ba + H + h, mask=m, other=0.0).to(tl.float32)
    x = a + tl.load(dt_ptr + h, mask=m, other=0.0)
    e = exp_f32(x, LIBDEVICE)
    if LIBDEVICE:
        sp = libdevice.log1p(e)
    else:   # log1p(e) as log(u) · e / (u - 1), u = 1 + e (exact where u rounds to 1: e itself)
        u = 1.0 + e
        sp = tl.where(u == 1.0, e, tl.log(u) * (e / tl.where(u == 1.0, 1.0, u - 1.0)))
    sp = tl.where(x > 20.0, x, sp)
    tl.store(beta_ptr + row * H + h, sigmoid_f32(b, LIBDEVICE).to(beta_ptr.dtype.element_ty), mask=m)
    tl.store(g_ptr + row * H + h, tl.load(na_ptr + h, mask=m, other=0.0) * sp, mask=m)


def deltanet_gates(ba: torch.Tensor, neg_a: torch.Tensor, dt_bias: torch.Tensor):
    """The Triton form of deltanet_gates_reference: (g fp32 [T, H], beta [T, H] in ba's dtype), both
    contiguous, from ba [T, 2H] (b | a; a row-strided view allowed), neg_a and dt_bias fp32 [H]."""
    if ba.dim() != 2 or ba.shape[1] % 2 or ba.stride(1) != 1:
        raise ValueError(f"ba must be [T, 2H] with unit column stride, got {tuple(ba.shape)} {ba.stride()}")
    T, H = ba.shape[0], ba.shape[1] // 2
    _check_gate_params(neg_a, dt_bias, H)
    g = torch.empty(T, H, dtype=torch.float32, device=ba.device)
    beta = torch.empty(T, H, dtype=ba.dtype, device=ba.device)
    if T:
        _gates_kernel[(T,)](ba, neg_a.contiguous(), dt_bias.contiguous(), g, beta, H, ba.stride(0),
                            BLOCK_H=triton.next_power_of_2(H), LIBDEVICE=LIBDEVICE, num_warps=1,
                            **pdl.options(ba.device))
    return g, beta
