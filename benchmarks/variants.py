"""Variant study: candidate kernel designs timed beside the shipped templates and cuBLAS, in one run.

    python benchmarks/variants.py [--quick] [--out FILE]

Each variant isolates one cost the issue-4 notes name (benchmarks/NOTES.md, run 5):
  int4 GEMV (M=1)   "magic": nibbles become floats by OR-ing them into the mantissa of 2^23
                    (one LOP3 + one FADD per nibble) instead of an int->float convert, and the
                    zero point is taken once per word (U - zu·Σx), not per nibble.
  int4 split-K      CONV 0 = (u - zu).to(bf16) (shipped); 1 = fp32 magic then cast;
  (M=16)            2 = bf16 magic (0x4300|u = 128+u exactly) fed to the dot, corrected by
                    the rank-1 term (128+zu)·Σ_k x per row: no per-element subtract.
  dense / fp8       TMA tensor descriptors (host-built) instead of pointer loads, tiled and
  (M >= 64)         persistent.
Every variant's output is checked against the format's pure-torch reference before its time counts.
Writes JSON (every figure) and prints a table last. The kernels that win move into kernels/.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common_bench import SHAPES, check, code_commit, copies_for, eager_ms, graph_ms, make_weight  # noqa: E402

from vsr.autotune.buckets import bucket_for  # noqa: E402
from vsr.kernels import common, registry  # noqa: E402
from vsr.kernels import fp8 as fp8mod  # noqa: E402
from vsr.kernels import int4 as int4mod  # noqa: E402

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None


@triton.jit
def _magic(words, MASK: tl.constexpr):
    """(words & MASK) | 0x4B000000 read as fp32 is 2^23 + field (the field sits in the mantissa):
    minus 2^23 gives the field exactly, as a float, with no int->float convert."""
    return ((words & MASK) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def int4_gemv_magic(x_ptr, q_ptr, sc_ptr, zp_ptr, y_ptr, ws_ptr, N, K8, KG, KW_SPLIT,
                    GROUP: tl.constexpr, HAS_ZP: tl.constexpr, BLOCK_N: tl.constexpr, W8: tl.constexpr,
                    SPLIT_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = (offs_n % N).to(tl.int64)
    i = tl.arange(0, W8)
    G8: tl.constexpr = GROUP // 8
    kw_lo = pid_k * KW_SPLIT
    kw_hi = tl.minimum(kw_lo + KW_SPLIT, K8)
    acc = tl.zeros((BLOCK_N, W8), dtype=tl.float32)
    for kw0 in range(kw_lo, kw_hi, W8):
        offs_w = kw0 + i
        wm = offs_w < kw_hi
        words = tl.load(q_ptr + rn[:, None] * K8 + offs_w[None, :], mask=wm[None, :], other=0)
        xp = x_ptr + offs_w * 8
        x0 = tl.load(xp + 0, mask=wm, other=0.0).to(tl.float32)
        x1 = tl.load(xp + 1, mask=wm, other=0.0).to(tl.float32)
        x2 = tl.load(xp + 2, mask=wm, other=0.0).to(tl.float32)
        x3 = tl.load(xp + 3, mask=wm, other=0.0).to(tl.float32)
        x4 = tl.load(xp + 4, mask=wm, other=0.0).to(tl.float32)
        x5 = tl.load(xp + 5, mask=wm, other=0.0).to(tl.float32)
        x6 = tl.load(xp + 6, mask=wm, other=0.0).to(tl.float32)
        x7 = tl.load(xp + 7, mask=wm, other=0.0).to(tl.float32)
        sx = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))
        hi = words >> 20
        u = _magic(words, 0xF) * x0[None, :]
        u += _magic(words, 0xF0) * (x1 * 0.0625)[None, :]
        u += _magic(words, 0xF00) * (x2 * 0.00390625)[None, :]
        u += _magic(words, 0xF000) * (x3 * 0.000244140625)[None, :]
        u += _magic(words, 0xF0000) * (x4 * 0.0000152587890625)[None, :]
        u += _magic(hi, 0xF) * x5[None, :]
        u += _magic(hi, 0xF0) * (x6 * 0.0625)[None, :]
        u += _magic(hi, 0xF00) * (x7 * 0.00390625)[None, :]
        g = offs_w // G8
        sc = tl.load(sc_ptr + rn[:, None] * KG + g[None, :], mask=wm[None, :], other=0.0).to(tl.float32)
        if HAS_ZP:
            zu = tl.load(zp_ptr + rn[:, None] * KG + g[None, :], mask=wm[None, :], other=0).to(tl.float32)
            acc += sc * (u - zu * sx[None, :])
        else:
            acc += sc * (u - 8.0 * sx[None, :])
    y = tl.sum(acc, axis=1)
    if SPLIT_K == 1:
        tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=offs_n < N)
    else:
        tl.store(ws_ptr + pid_k.to(tl.int64) * N + offs_n, y, mask=offs_n < N)


@triton.jit
def _split8(x2, W8: tl.constexpr):
    """[W8, 8] -> its 8 columns, each [W8] (three rounds of tl.split on in-register pairs)."""
    a, b = tl.split(tl.reshape(x2, (W8, 4, 2)))          # a = cols 0,2,4,6 ; b = 1,3,5,7
    a0, a1 = tl.split(tl.reshape(a, (W8, 2, 2)))         # a0 = 0,4 ; a1 = 2,6
    b0, b1 = tl.split(tl.reshape(b, (W8, 2, 2)))         # b0 = 1,5 ; b1 = 3,7
    x0, x4 = tl.split(a0)
    x2_, x6 = tl.split(a1)
    x1, x5 = tl.split(b0)
    x3, x7 = tl.split(b1)
    return x0, x1, x2_, x3, x4, x5, x6, x7


@triton.jit
def int4_gemv_xsplit(x_ptr, q_ptr, sc_ptr, zp_ptr, y_ptr, ws_ptr, N, K8, KG, KW_SPLIT,
                     GROUP: tl.constexpr, HAS_ZP: tl.constexpr, BLOCK_N: tl.constexpr, W8: tl.constexpr,
                     SPLIT_K: tl.constexpr):
    """int4_gemv_magic with x read once per step as one contiguous [W8, 8] tile (16-byte loads)
    and split into its 8 nibble columns in registers, instead of 8 strided scalar loads."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = (offs_n % N).to(tl.int64)
    i = tl.arange(0, W8)
    G8: tl.constexpr = GROUP // 8
    kw_lo = pid_k * KW_SPLIT
    kw_hi = tl.minimum(kw_lo + KW_SPLIT, K8)
    acc = tl.zeros((BLOCK_N, W8), dtype=tl.float32)
    for kw0 in range(kw_lo, kw_hi, W8):
        offs_w = kw0 + i
        wm = offs_w < kw_hi
        words = tl.load(q_ptr + rn[:, None] * K8 + offs_w[None, :], mask=wm[None, :], other=0)
        x2 = tl.load(x_ptr + offs_w[:, None] * 8 + tl.arange(0, 8)[None, :], mask=wm[:, None], other=0.0)
        x0, x1, x2_, x3, x4, x5, x6, x7 = _split8(x2.to(tl.float32), W8)
        sx = ((x0 + x1) + (x2_ + x3)) + ((x4 + x5) + (x6 + x7))
        hi = words >> 20
        u = _magic(words, 0xF) * x0[None, :]
        u += _magic(words, 0xF0) * (x1 * 0.0625)[None, :]
        u += _magic(words, 0xF00) * (x2_ * 0.00390625)[None, :]
        u += _magic(words, 0xF000) * (x3 * 0.000244140625)[None, :]
        u += _magic(words, 0xF0000) * (x4 * 0.0000152587890625)[None, :]
        u += _magic(hi, 0xF) * x5[None, :]
        u += _magic(hi, 0xF0) * (x6 * 0.0625)[None, :]
        u += _magic(hi, 0xF00) * (x7 * 0.00390625)[None, :]
        g = offs_w // G8
        sc = tl.load(sc_ptr + rn[:, None] * KG + g[None, :], mask=wm[None, :], other=0.0).to(tl.float32)
        if HAS_ZP:
            zu = tl.load(zp_ptr + rn[:, None] * KG + g[None, :], mask=wm[None, :], other=0).to(tl.float32)
            acc += sc * (u - zu * sx[None, :])
        else:
            acc += sc * (u - 8.0 * sx[None, :])
    y = tl.sum(acc, axis=1)
    if SPLIT_K == 1:
        tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=offs_n < N)
    else:
        tl.store(ws_ptr + pid_k.to(tl.int64) * N + offs_n, y, mask=offs_n < N)


@triton.jit
def fp8_gemv(xq_ptr, w_ptr, y_ptr, xs_ptr, wsc_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One row, CUDA cores: y[n] = s_x · s_w[n] · Σ_k xq[k]·w[n, k], fp8 operands decoded to fp32."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = (offs_n % N).to(tl.int64)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        wv = tl.load(w_ptr + rn[:, None] * K + offs_k[None, :]).to(tl.float32)
        xv = tl.load(xq_ptr + offs_k).to(tl.float32)
        acc += wv * xv[None, :]
    y = tl.sum(acc, axis=1) * tl.load(xs_ptr).to(tl.float32) * tl.load(wsc_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs_n, y.to(y_ptr.dtype.element_ty), mask=offs_n < N)


def launch_fp8_gemv(x, w, bn, bk, warps, stages):
    xq, xs = fp8mod.quantize_activation_triton(x)
    N, K = w.weight.shape
    y = torch.empty((1, N), dtype=x.dtype, device=x.device)
    fp8_gemv[(triton.cdiv(N, bn),)](xq, w.weight, y, xs, w.weight_scale, N, K, BLOCK_N=bn, BLOCK_K=bk,
                                    num_warps=warps, num_stages=stages)
    return y


def launch_gemv_xsplit(x, w, bn, w8, split, warps, stages):
    N, K8 = w.packed.shape
    y = torch.empty((1, N), dtype=x.dtype, device=x.device)
    kw_split = triton.cdiv(triton.cdiv(K8, split), w8) * w8
    split = triton.cdiv(K8, kw_split)
    ws = torch.empty((split, 1, N), dtype=torch.float32, device=x.device) if split > 1 else y
    zp = w.zero_point if w.zero_point is not None else w.packed
    int4_gemv_xsplit[(triton.cdiv(N, bn), split)](
        x, w.packed, w.scale, zp, y, ws, N, K8, w.scale.stride(0), kw_split, GROUP=w.group_size,
        HAS_ZP=w.zero_point is not None, BLOCK_N=bn, W8=w8, SPLIT_K=split, num_warps=warps, num_stages=stages)
    if split > 1:
        common.reduce_splits(ws, y, split, 1, N, None, None, None, None)
    return y


def launch_gemv_magic(x, w, bn, w8, split, warps, stages):
    N, K8 = w.packed.shape
    y = torch.empty((1, N), dtype=x.dtype, device=x.device)
    kw_split = triton.cdiv(triton.cdiv(K8, split), w8) * w8
    split = triton.cdiv(K8, kw_split)
    ws = torch.empty((split, 1, N), dtype=torch.float32, device=x.device) if split > 1 else y
    zp = w.zero_point if w.zero_point is not None else w.packed
    int4_gemv_magic[(triton.cdiv(N, bn), split)](
        x, w.packed, w.scale, zp, y, ws, N, K8, w.scale.stride(0), kw_split, GROUP=w.group_size,
        HAS_ZP=w.zero_point is not None, BLOCK_N=bn, W8=w8, SPLIT_K=split, num_warps=warps, num_stages=stages)
    if split > 1:
        common.reduce_splits(ws, y, split, 1, N, None, None, None, None)
    return y


@triton.jit
def int4_splitk_conv(x_ptr, q_ptr, sc_ptr, zp_ptr, y_ptr, ws_ptr, M, N, K, K8, KG, stride_xm, stride_ym, KW_SPLIT,
                     GROUP: tl.constexpr, HAS_ZP: tl.constexpr, CONV: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = common.swizzle(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = (offs_m % M).to(tl.int64)
    rn = (offs_n % N).to(tl.int64)
    kw_lo = pid_k * KW_SPLIT
    kw_hi = tl.minimum(kw_lo + KW_SPLIT, K8)
    shifts = (tl.arange(0, 8) * 4)[None, :, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kw0 in range(kw_lo, kw_hi, BLOCK_K // 8):
        k0 = kw0 * 8
        offs_k = k0 + tl.arange(0, BLOCK_K)
        offs_w = kw0 + tl.arange(0, BLOCK_K // 8)
        a = tl.load(x_ptr + rm[:, None] * stride_xm + offs_k[None, :])
        words = tl.load(q_ptr + rn[None, :] * K8 + offs_w[:, None])
        g = k0 // GROUP
        scale = tl.load(sc_ptr + rn * KG + g).to(tl.float32)
        if HAS_ZP:
            zu = tl.load(zp_ptr + rn * KG + g)
        else:
            zu = tl.full((BLOCK_N,), 8, tl.int32)
        if CONV == 0:
            u = (words[:, None, :] >> shifts) & 0xF
            u = tl.reshape(u, (BLOCK_K, BLOCK_N))
            b = (u - zu[None, :]).to(x_ptr.dtype.element_ty)
            acc += tl.dot(a, b) * scale[None, :]
        elif CONV == 1:
            u = ((words[:, None, :] >> shifts) & 0xF) | 0x4B000000
            u = tl.reshape(u, (BLOCK_K, BLOCK_N))
            f = u.to(tl.float32, bitcast=True) - (8388608.0 + zu.to(tl.float32))[None, :]
            acc += tl.dot(a, f.to(x_ptr.dtype.element_ty)) * scale[None, :]
        else:
            # 0x4300 | u is bf16 128 + u; 0x6400 | u is fp16 1024 + u: exact, no subtract per element.
            if x_ptr.dtype.element_ty == tl.bfloat16:
                MAG: tl.constexpr = 0x4300
                BIAS: tl.constexpr = 128.0
            else:
                MAG: tl.constexpr = 0x6400
                BIAS: tl.constexpr = 1024.0
            u = ((words[:, None, :] >> shifts) & 0xF) | MAG
            u = tl.reshape(u, (BLOCK_K, BLOCK_N)).to(tl.int16).to(x_ptr.dtype.element_ty, bitcast=True)
            part = tl.dot(a, u)
            xsum = tl.sum(a.to(tl.float32), axis=1)
            acc += (part - xsum[:, None] * (BIAS + zu.to(tl.float32))[None, :]) * scale[None, :]
    common.store_or_stash(acc, y_ptr, ws_ptr, pid_k, offs_m, offs_n, M, N, stride_ym,
                          y_ptr, y_ptr, y_ptr, y_ptr, SPLIT_K, False, False, False, False)


def launch_splitk_conv(x, w, conv, bm, bn, bk, split, warps, stages):
    M, K = x.shape
    N, K8 = w.packed.shape
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    k_split, split = common.split_plan(K, {"BLOCK_K": bk, "SPLIT_K": split})
    ws = torch.empty((split, M, N), dtype=torch.float32, device=x.device) if split > 1 else y
    zp = w.zero_point if w.zero_point is not None else w.packed
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn), split)
    int4_splitk_conv[grid](x, w.packed, w.scale, zp, y, ws, M, N, K, K8, w.scale.stride(0), x.stride(0), y.stride(0),
                           k_split // 8, GROUP=w.group_size, HAS_ZP=w.zero_point is not None, CONV=conv,
                           BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, GROUP_M=8,
                           num_warps=warps, num_stages=stages)
    if split > 1:
        common.reduce_splits(ws, y, split, M, N, None, None, None, None)
    return y


@triton.jit
def gemm_tma(a_desc, b_desc, y_ptr, rs_ptr, cs_ptr, M, N, K, stride_ym,
             HAS_SCALES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, PERSISTENT: tl.constexpr, FLATTEN: tl.constexpr):
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    if PERSISTENT:
        start = tl.program_id(0)
        step = NUM_SMS
        n_tiles = grid_m * grid_n
    else:
        start = tl.program_id(0)
        step = 1
        n_tiles = start + 1
    for t in tl.range(start, n_tiles, step, flatten=FLATTEN):
        pid_m, pid_n = common.swizzle(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            b = b_desc.load([pid_n * BLOCK_N, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = common.epilogue(acc, offs_m, offs_n, M, N, y_ptr, rs_ptr, cs_ptr, y_ptr,
                              False, HAS_SCALES, HAS_SCALES, False)
        mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
        tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :],
                 acc.to(y_ptr.dtype.element_ty), mask=mask)


def launch_tma(x, wt, bm, bn, bk, warps, stages, persistent=False, flatten=False, xs=None, wsc=None,
               out_dtype=None):
    M, K = x.shape
    N = wt.shape[0]
    y = torch.empty((M, N), dtype=out_dtype or x.dtype, device=x.device)
    a_desc = TensorDescriptor.from_tensor(x, [bm, bk])
    b_desc = TensorDescriptor.from_tensor(wt, [bn, bk])
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    grid = (min(sms, tiles),) if persistent else (tiles,)
    gemm_tma[grid](a_desc, b_desc, y, xs if xs is not None else y, wsc if wsc is not None else y, M, N, K,
                   y.stride(0), HAS_SCALES=xs is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8,
                   NUM_SMS=sms, PERSISTENT=persistent, FLATTEN=flatten, num_warps=warps, num_stages=stages)
    return y


def launch_fp8_tma(x, w, tile):
    xq, xs = fp8mod.quantize_activation_triton(x)
    return launch_tma(xq, w.weight, *tile, xs=xs, wsc=w.weight_scale, out_dtype=x.dtype)


# ---------------------------------------------------------------------------------------

GEMV_TILES = [(bn, w8, s, wp, 2) for bn, w8, wp in ((8, 64, 4), (16, 64, 4), (16, 128, 8), (32, 64, 8), (8, 128, 4),
                                                     (4, 128, 4), (16, 32, 4), (32, 32, 4))
              for s in (1, 2, 4)]
SPLITK_TILES = [(conv, 16, bn, bk, s, 4, 4) for conv in (0, 1, 2) for bn, bk in ((64, 128), (128, 128), (32, 128))
                for s in (2, 4, 8)]
TMA_TILES = {
    64: [(64, 64, 128, 4, 4), (64, 64, 128, 4, 6), (64, 128, 64, 4, 4), (64, 128, 128, 4, 4), (64, 128, 64, 8, 5),
         (64, 256, 64, 8, 4), (64, 32, 128, 4, 6)],
    256: [(64, 128, 64, 4, 4), (64, 256, 64, 8, 4), (128, 128, 64, 8, 4), (128, 128, 128, 8, 3), (128, 256, 64, 8, 3),
          (64, 128, 128, 4, 4)],
    1024: [(128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (256, 128, 64, 8, 3), (128, 128, 128, 8, 3)],
    4096: [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (256, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 256, 128, 8, 3)],
}
FP8_TMA_TILES = {m: [(bm, bn, 2 * bk, wp, st) for bm, bn, bk, wp, st in ts] for m, ts in TMA_TILES.items()}


def timed(fns, M):
    return graph_ms(fns) if M <= 16 else eager_ms(fns[0])


def study(shapes, large_shapes, ms_small, ms_large, quick, log):
    dev = torch.device("cuda")
    rows = []
    for sh in shapes:
        if sh not in large_shapes:
            ms_large_here = []
        else:
            ms_large_here = ms_large
        N, K = SHAPES[sh]
        # cuBLAS bf16 baseline
        wd = make_weight("bf16", N, K, dev)
        wds = [wd] + [make_weight("bf16", N, K, dev, seed=i) for i in range(1, copies_for(wd.nbytes()))]
        base = {}
        for M in ms_small + ms_large_here:
            x = torch.randn(M, K, device=dev).to(torch.bfloat16)
            base[M] = timed([lambda w=w: x @ w.weight.t() for w in wds], M)
            rows.append(dict(kind="cublas", shape=sh, M=M, ms=base[M], ratio=1.0, ok=True))
        # int4 variants at small M
        for fmt in ("int4-gptq", "int4-awq"):
            w0 = make_weight(fmt, N, K, dev)
            wis = [w0] + [make_weight(fmt, N, K, dev, seed=i) for i in range(1, copies_for(w0.nbytes()))]
            t = registry.template_for(w0, torch.bfloat16)
            for M in ms_small:
                x = torch.randn(M, K, device=dev).to(torch.bfloat16)
                ref = t.reference(x, w0)
                cands = [("shipped-default", None, lambda w, tile=t.default_tile(t.problem(w0, bucket_for(M), x.dtype)):
                          t.launch(x, w, tile))]
                if M == 1:
                    cands += [(f"shipped-gemv{i}", g, lambda w, g=g: t.launch(x, w, g))
                              for i, g in enumerate(int4mod._gemv_tiles(t.problem(w0, 1, x.dtype))[:6])]
                    cands += [(f"gemv-magic{c}", c, lambda w, c=c: launch_gemv_magic(x, w, *c))
                              for c in (GEMV_TILES[::3] if quick else GEMV_TILES)]
                cands += [(f"splitk-conv{c}", c, lambda w, c=c: launch_splitk_conv(x, w, *c))
                          for c in (SPLITK_TILES[::4] if quick else SPLITK_TILES)
                          if fmt == "int4-gptq" or c[0] != 1]
                for name, cfg, fn in cands:
                    rows.append(run_one(fmt, sh, M, name, cfg, fn, wis, ref, base[M], log))
        # dense + fp8 TMA at large M
        w8 = make_weight("fp8", N, K, dev)
        for M in ms_large_here:
            x = torch.randn(M, K, device=dev).to(torch.bfloat16)
            ref = registry.TEMPLATES["dense"].reference(x, wd)
            td = registry.TEMPLATES["dense"]
            rows.append(run_one("bf16", sh, M, "shipped-default", None,
                                lambda w, tile=td.default_tile(td.problem(wd, M, x.dtype)): td.launch(x, w, tile),
                                [wd], ref, base[M], log))
            for c in TMA_TILES[M]:
                for pers in (False, True):
                    rows.append(run_one("bf16", sh, M, f"tma{'-persistent' if pers else ''}{c}", c,
                                        lambda w, c=c, p=pers: launch_tma(x, w.weight, *c, persistent=p),
                                        [wd], ref, base[M], log))
            ref8 = fp8mod.reference_linear(x, w8)
            tf = registry.TEMPLATES["fp8_w8a8"]
            rows.append(run_one("fp8", sh, M, "shipped-default", None,
                                lambda w, tile=tf.default_tile(tf.problem(w8, M, x.dtype)): tf.launch(x, w, tile),
                                [w8], ref8, base[M], log))
            for c in FP8_TMA_TILES[M]:
                if (c[0] * c[2] + c[1] * c[2]) * c[4] > common.SMEM_LIMIT:
                    continue
                for pers in (False, True):
                    rows.append(run_one("fp8", sh, M, f"tma{'-persistent' if pers else ''}{c}", c,
                                        lambda w, c=c, p=pers: launch_fp8_tma(x, w, (*c, p)),
                                        [w8], ref8, base[M], log))
            rows.append(run_one("fp8", sh, M, "quant-only", None,
                                lambda w: fp8mod.quantize_activation_triton(x), [w8], None, base[M], log))
    return rows


GEMV2_TILES = [(bn, w8, 1, wp, st) for bn, w8, wp in ((8, 128, 4), (4, 128, 4), (8, 256, 4), (8, 128, 8), (16, 128, 4),
                                                      (4, 256, 4), (8, 64, 4), (16, 64, 4), (4, 64, 2), (8, 128, 2))
               for st in (2,)]
FP8_GEMV_TILES = [(bn, bk, wp, st) for bn, bk, wp in ((8, 512, 4), (8, 1024, 4), (16, 512, 4), (4, 1024, 4), (16, 256, 4),
                                                       (8, 512, 8)) for st in (1, 3)]


def study2(shapes, log):
    """Round 2 (M=1): the GEMV with x split in registers, wider GEMV sweeps, an fp8 CUDA-core GEMV."""
    dev = torch.device("cuda")
    rows = []
    for sh in shapes:
        N, K = SHAPES[sh]
        wd = make_weight("bf16", N, K, dev)
        wds = [wd] + [make_weight("bf16", N, K, dev, seed=i) for i in range(1, copies_for(wd.nbytes()))]
        x = torch.randn(1, K, device=dev).to(torch.bfloat16)
        base = timed([lambda w=w: x @ w.weight.t() for w in wds], 1)
        rows.append(dict(kind="cublas", shape=sh, M=1, ms=base, ratio=1.0, ok=True))
        for fmt in ("int4-gptq", "int4-awq"):
            w0 = make_weight(fmt, N, K, dev)
            wis = [w0] + [make_weight(fmt, N, K, dev, seed=i) for i in range(1, copies_for(w0.nbytes()))]
            t = registry.template_for(w0, torch.bfloat16)
            ref = t.reference(x, w0)
            d = t.default_tile(t.problem(w0, 1, x.dtype))
            cands = [("shipped-default", d, lambda w: t.launch(x, w, d))]
            cands += [(f"gemv-magic{c}", c, lambda w, c=c: launch_gemv_magic(x, w, *c)) for c in GEMV2_TILES]
            cands += [(f"gemv-xsplit{c}", c, lambda w, c=c: launch_gemv_xsplit(x, w, *c)) for c in GEMV2_TILES]
            for name, cfg, fn in cands:
                rows.append(run_one(fmt, sh, 1, name, cfg, fn, wis, ref, base, log))
        w8 = make_weight("fp8", N, K, dev)
        w8s = [w8] + [make_weight("fp8", N, K, dev, seed=i) for i in range(1, copies_for(w8.nbytes()))]
        tf = registry.TEMPLATES["fp8_w8a8"]
        ref8 = fp8mod.reference_linear(x, w8)
        d8 = tf.default_tile(tf.problem(w8, 1, x.dtype))
        rows.append(run_one("fp8", sh, 1, "shipped-default", d8, lambda w: tf.launch(x, w, d8), w8s, ref8, base, log))
        for c in FP8_GEMV_TILES:
            rows.append(run_one("fp8", sh, 1, f"fp8-gemv{c}", c, lambda w, c=c: launch_fp8_gemv(x, w, *c), w8s, ref8,
                                base, log))
        rows.append(run_one("fp8", sh, 1, "quant-only", None, lambda w: fp8mod.quantize_activation_triton(x), w8s,
                            None, base, log))
    return rows


def run_one(fmt, sh, M, name, cfg, fn, ws, ref, base_ms, log):
    row = dict(kind=fmt, shape=sh, M=M, variant=name, cfg=cfg)
    try:
        y = fn(ws[0])
        if ref is not None:
            row["ok"], row["rel_err"] = check(y, ref)
        else:
            row["ok"] = True
        row["ms"] = timed([lambda w=w: fn(w) for w in ws], M)
        row["ratio"] = base_ms / row["ms"]
    except Exception as e:  # a variant that does not compile is a finding, not a crash
        row["ok"] = False
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    log(row)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--large-shapes", default="qkv,down")
    ap.add_argument("--small", default="1,16")
    ap.add_argument("--large", default="64,256,1024,4096")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--round", type=int, default=1, help="1: the first study; 2: the M=1 follow-up")
    ap.add_argument("--out", default=os.environ.get("OUT", ".") + "/variants.json")
    a = ap.parse_args()
    t0 = time.time()
    out = Path(a.out)

    def log(r):
        print(json.dumps(r, default=str), flush=True)

    rows = study2(a.shapes.split(","), log) if a.round == 2 else study(a.shapes.split(","), a.large_shapes.split(","), [int(m) for m in a.small.split(",") if m],
                 [int(m) for m in a.large.split(",") if m], a.quick, log)
    out.write_text(json.dumps({"benchmark": "variants", "commit": code_commit(), "device": torch.cuda.get_device_name(),
                               "triton": triton.__version__, "torch": torch.__version__, "rows": rows,
                               "seconds": time.time() - t0}, indent=1, default=str))
    best = {}
    for r in rows:
        if r.get("ok") and "ratio" in r and r.get("variant") != "quant-only":
            k = (r["kind"], r["shape"], r["M"], (r.get("variant") or "").split("(")[0])
            if k not in best or r["ratio"] > best[k]["ratio"]:
                best[k] = r
    print("\nbest ratio to cuBLAS bf16 per (format, shape, M, variant family):")
    for k in sorted(best):
        r = best[k]
        print(f"{k[0]:10s} {k[1]:8s} M={k[2]:5d} {k[3]:22s} {r['ratio']:.2f}x  {r['ms']*1e3:8.1f} us  {r.get('cfg')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
