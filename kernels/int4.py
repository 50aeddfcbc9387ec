"""int4 W4A16 (compressed-tensors pack-quantized, GPTQ symmetric / AWQ asymmetric): layout and reference.

Weights: signed int4 q in [-8, 7] stored as u = q + 8, eight per int32 along K,
least-significant nibble first; one scale per (n, group of G columns); AWQ adds
a zero point per (n, group) in the signed domain. Activations stay in bf16/fp16.
Legacy act-order files (g_idx) are turned at load into a column permutation of
the packed weight plus the same permutation of x, so groups are contiguous.
FORMATS.md §3, §5, §6.

Below the reference: the Triton template "int4_w4a16". One kernel family, a constexpr
switch for the zero point (GPTQ symmetric: zu = 8; AWQ: zu from zero_point). Nibbles are
unpacked in registers; each BLOCK_K tile lies inside one quantization group, so the
tile's product is taken on the integers (u - zu), exact in bf16/fp16, and the group
scale multiplies the fp32 partial product: the same sum as the reference's, in fp32.
"""
from __future__ import annotations

import functools
import re
import subprocess
import sys
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from vsr.kernels import common, gemm, int4_wgmma
from vsr.kernels.int4_tiles import default_tile, pick_group, search_space
from vsr.kernels.template import Problem


def unpack_int4(packed: torch.Tensor, length: int, dim: int = -1) -> torch.Tensor:
    """Unpack int32 words (8 nibbles each, LSB first) along `dim` into u in [0, 15] (int32), trimmed to `length`."""
    p = packed.movedim(dim, -1)
    shifts = torch.arange(0, 32, 4, device=p.device, dtype=torch.int32)
    u = (p.unsqueeze(-1) >> shifts) & 0xF  # arithmetic shift then mask: raw bits
    u = u.reshape(*p.shape[:-1], p.shape[-1] * 8)[..., :length]
    return u.movedim(-1, dim).contiguous()


def pack_int4(u: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Pack u in [0, 15] along `dim` into int32 words, LSB first, zero-padding the tail."""
    v = u.movedim(dim, -1).to(torch.int64)
    pad = (-v.shape[-1]) % 8
    if pad:
        v = torch.nn.functional.pad(v, (0, pad))
    v = v.reshape(*v.shape[:-1], -1, 8)
    shifts = torch.arange(0, 32, 4, device=v.device, dtype=torch.int64)
    words = (v << shifts).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.movedim(-1, dim).contiguous()


@dataclass
class Int4Weight:
    """packed int32 [N, ceil(K/8)] (u = q + 8); scale [N, ceil(K/G)] in the model dtype;
    zero_point int32 [N, ceil(K/G)] unpacked u-domain zero (zp + 8), or None when symmetric;
    act_perm int64 [K] or None (legacy g_idx: x is gathered by it, the weight is stored permuted)."""

    packed: torch.Tensor
    scale: torch.Tensor
    K: int
    group_size: int = 128
    zero_point: torch.Tensor | None = None
    act_perm: torch.Tensor | None = None
    bias: torch.Tensor | None = None

    format = "int4"

    def __post_init__(self) -> None:
        N = self.packed.shape[0]
        G = self.group_size
        assert self.packed.dtype == torch.int32, f"packed int4 must be int32, got {self.packed.dtype}"
        assert self.packed.shape == (N, -(-self.K // 8)), f"packed must be [N, ceil(K/8)], got {tuple(self.packed.shape)}"
        assert self.scale.shape == (N, -(-self.K // G)), f"scale must be [N, ceil(K/G)]=[{N}, {-(-self.K // G)}], got {tuple(self.scale.shape)}"
        if self.zero_point is not None:
            assert self.zero_point.shape == self.scale.shape, "zero_point must match scale's shape"

    @property
    def N(self) -> int:
        return self.packed.shape[0]

    @property
    def symmetric(self) -> bool:
        return self.zero_point is None

    def params(self) -> tuple[tuple[str, object], ...]:
        return (("bits", 4), ("group", self.group_size), ("symmetric", self.symmetric),
                ("act_order", self.act_perm is not None))

    def to(self, device) -> "Int4Weight":
        mv = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Int4Weight(mv(self.packed), mv(self.scale), self.K, self.group_size,
                          mv(self.zero_point), mv(self.act_perm), mv(self.bias))

    def nbytes(self) -> int:
        ts = (self.packed, self.scale, self.zero_point, self.bias)
        return sum(t.numel() * t.element_size() for t in ts if t is not None)


def dequantize(w: Int4Weight) -> torch.Tensor:
    """W (fp32, in the stored column order, i.e. permuted when act_perm is set):
    W[n, k] = (u - zu) · scale[n, k // G]  (zu = 8 when symmetric)."""
    u = unpack_int4(w.packed, w.K).float()
    g = torch.arange(w.K, device=u.device) // w.group_size
    zu = 8.0 if w.zero_point is None else w.zero_point.float()[:, g]
    return (u - zu) * w.scale.float()[:, g]


def dequantize_original_order(w: Int4Weight) -> torch.Tensor:
    """W in the checkpoint's column order (undoes act_perm)."""
    W = dequantize(w)
    if w.act_perm is None:
        return W
    out = torch.empty_like(W)
    out[:, w.act_perm] = W
    return out


def reference_linear(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """y = x·Wᵀ + b with W dequantized in fp32, accumulated in fp32, returned in x's dtype."""
    assert x.shape[-1] == w.K, f"x has {x.shape[-1]} columns, the weight expects K={w.K}"
    xp = x if w.act_perm is None else x[:, w.act_perm]
    y = xp.float() @ dequantize(w).t()
    if w.bias is not None:
        y = y + w.bias.float()
    return y.to(x.dtype)


# ---------------------------------------------------------------------------------------
# Triton template "int4_w4a16": its paths, chosen by the tile's "path".
#   "slices"  buckets 1..128 (the default with bf16/fp16 x and groups of 128k): each nibble
#             slice of the words its own MMA operand, x in slice order; _int4_slices_kernel.
#   "join"    buckets 16..256, a candidate: the slices conversion joined back into natural K
#             order, one tl.dot a step over x as stored; _int4_join_kernel (SCALE_W: scale on W).
#   "frag"    buckets 16 up, a candidate: join's SCALE_W product, its weight operand unpacked in
#             the MMA's register fragment (each lane its byte of the words), so the unpacked
#             operand never passes through shared memory; _int4_frag_kernel (the last kernel).
#   "gemv"    M = 1: no tensor cores; rows of packed words streamed (16-byte loads along K),
#             nibbles to floats through the mantissa of 2^23 (_nibble_field), zero point per word.
#   "swap"    buckets 2..128: the split-K product taken transposed (weights as the MMA's left
#             operand, the few rows of x its narrow side, unpacked by a reshape); _int4_swap_kernel.
#   "splitk" / "tiled": tl.dot on the unpacked integers (u - zu) with the group scale
#             applied to the fp32 partial product of each BLOCK_K tile.
#   Row strides of the packed words and scales (K8 = ceil(K/8), KG = ceil(K/G)) come in as
#   arguments: Triton specialises an int argument divisible by 16 and then issues 16-byte loads
#   of packed words; a ceil-division computed in the kernel has unknown divisibility (4-byte loads).
#   "dequant" / "dequant-tma" / "dequant-sk" large M: a Triton kernel writes a transient
#             W [N, K] in x's dtype for this call (freed after it; no dequantized copy is kept)
#             and the dense template's kernel multiplies (pointer loads, TMA descriptors, or
#             TMA descriptors walked stream-K).


@triton.jit
def _split_words(pid_k, KW_SPLIT, K8):
    """[kw_lo, kw_hi): the packed words split pid_k covers. The loops run in word units so the
    compiler knows the word offsets' alignment (k0 // 8 would lose it) and issues wide loads."""
    kw_lo = pid_k * KW_SPLIT
    return kw_lo, tl.minimum(kw_lo + KW_SPLIT, K8)


@triton.jit
def _tile_words(M, N, K8, KW_SPLIT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """common.tile_setup's (pid_k, offs_m, offs_n, rm, rn) and the split's words [kw_lo, kw_hi)."""
    pid_k, offs_m, offs_n, rm, rn = common.tile_setup(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    kw_lo, kw_hi = _split_words(pid_k, KW_SPLIT, K8)
    return pid_k, offs_m, offs_n, rm, rn, kw_lo, kw_hi


@triton.jit
def _int4_kernel(x_ptr, q_ptr, sc_ptr, zp_ptr, y_ptr, ws_ptr, cnt_ptr, bias_ptr, M, N, K, K8, KG, stride_xm, stride_ym, KW_SPLIT,
                 GROUP: tl.constexpr, HAS_ZP: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr, FIXUP: tl.constexpr, F32: tl.constexpr = "",
                 GLU: tl.constexpr = False):
    pid_k, offs_m, offs_n, rm, rn, kw_lo, kw_hi = _tile_words(M, N, K8, KW_SPLIT, BLOCK_M, BLOCK_N, GROUP_M)
    k_hi = tl.minimum((kw_lo + KW_SPLIT) * 8, K)
    shifts = (tl.arange(0, 8) * 4)[None, :, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kw0 in range(kw_lo, kw_hi, BLOCK_K // 8):
        k0 = kw0 * 8
        offs_k = k0 + tl.arange(0, BLOCK_K)
        offs_w = kw0 + tl.arange(0, BLOCK_K // 8)
        a_ptrs = x_ptr + rm[:, None] * stride_xm + offs_k[None, :]
        q_ptrs = q_ptr + rn[None, :] * K8 + offs_w[:, None]
        if EVEN_K:
            a = tl.load(a_ptrs)
            words = tl.load(q_ptrs)
        else:
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_hi, other=0.0)
            words = tl.load(q_ptrs, mask=offs_w[:, None] < K8, other=0)
        # [BK/8, BN] words -> [BK/8, 8, BN] nibbles -> [BK, BN] with k = 8·word + nibble.
        u = tl.reshape(words[:, None, :] >> shifts, (BLOCK_K, BLOCK_N))   # (_nibble_field masks)
        g = k0 // GROUP
        # u - zu through the mantissa of 2^23 (_nibble_field, which masks the nibble): no int-to-float convert.
        if HAS_ZP:
            zu = tl.load(zp_ptr + rn * KG + g)
            b = _nibble_field(u, 0xF, zu.to(tl.float32)[None, :]).to(x_ptr.dtype.element_ty)
        else:
            b = _nibble_field(u, 0xF, 8).to(x_ptr.dtype.element_ty)
        scale = tl.load(sc_ptr + rn * KG + g).to(tl.float32)
        part = gemm._dot(a, b, None, F32)   # fp32 activations (--dtype float32): common.f32_precision
        acc += part * scale[None, :]
    common.store_or_stash(acc, y_ptr, ws_ptr, cnt_ptr, pid_k, offs_m, offs_n, M, N, stride_ym,
                          bias_ptr, bias_ptr, bias_ptr, bias_ptr, SPLIT_K, HAS_BIAS, False, False, False, FIXUP, GLU)


@triton.jit
def _int4_swap_kernel(x_ptr, q_ptr, sc_ptr, zp_ptr, y_ptr, ws_ptr, cnt_ptr, bias_ptr, M, N, K, K8, KG, stride_xm, stride_ym,
                      KW_SPLIT, GROUP: tl.constexpr, HAS_ZP: tl.constexpr, HAS_BIAS: tl.constexpr,
                      EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr, FIXUP: tl.constexpr, F32: tl.constexpr = "",
                      GLU: tl.constexpr = False):
    """Path "swap" (few rows): acc[BN, BM] = W_tile · x_tileᵀ. The weights, unpacked in registers,
    are the MMA's left operand (which wgmma reads from registers) and the few rows of x its narrow
    side (8-64 columns) instead of padding the rows up to the MMA's 64. Otherwise as split-K."""
    pid_k, offs_m, offs_n, rm, rn, kw_lo, kw_hi = _tile_words(M, N, K8, KW_SPLIT, BLOCK_M, BLOCK_N, GROUP_M)
    k_hi = tl.minimum((kw_lo + KW_SPLIT) * 8, K)
    shifts = (tl.arange(0, 8) * 4)[None, None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kw0 in range(kw_lo, kw_hi, BLOCK_K // 8):
        k0 = kw0 * 8
        offs_k = k0 + tl.arange(0, BLOCK_K)
        offs_w = kw0 + tl.arange(0, BLOCK_K // 8)
        xt_ptrs = x_ptr + rm[None, :] * stride_xm + offs_k[:, None]           # xᵀ [BK, BM]
        q_ptrs = q_ptr + rn[:, None] * K8 + offs_w[None, :]                    # words [BN, BK/8]
        if EVEN_K:
            xt = tl.load(xt_ptrs)
            words = tl.load(q_ptrs)
        else:
            xt = tl.load(xt_ptrs, mask=offs_k[:, None] < k_hi, other=0.0)
            words = tl.load(q_ptrs, mask=offs_w[None, :] < K8, other=0)
        u = tl.reshape(words[:, :, None] >> shifts, (BLOCK_N, BLOCK_K))   # k = 8·word + nibble, unmasked
        g = k0 // GROUP
        if HAS_ZP:
            zu = tl.load(zp_ptr + rn * KG + g)
            wt = _nibble_field(u, 0xF, zu.to(tl.float32)[:, None]).to(x_ptr.dtype.element_ty)
        else:
            wt = _nibble_field(u, 0xF, 8).to(x_ptr.dtype.element_ty)
        scale = tl.load(sc_ptr + rn * KG + g).to(tl.float32)
        part = gemm._dot(wt, xt, None, F32)
        acc += part * scale[:, None]
    common.store_or_stash(tl.trans(acc), y_ptr, ws_ptr, cnt_ptr, pid_k, offs_m, offs_n, M, N, stride_ym,
                          bias_ptr, bias_ptr, bias_ptr, bias_ptr, SPLIT_K, HAS_BIAS, False, False, False, FIXUP, GLU)


@triton.jit
def _nibble_pair_bf16(w, zz):
    """(u_j - zu, u_{j+4} - zu) of each (pre-shifted) word as two bf16 tensors: one LOP3 puts
    nibbles 0 and 4 into the mantissas of the bf16x2 pair 128 + u, one packed subtraction of zz
    (128 + zu in both halves) takes the zero point off both, exactly (u, zu < 16). NVIDIA PTX,
    sm_90; _nibble_pair_fp32 is the portable twin."""
    return tl.inline_asm_elementwise(
        "{ .reg .b32 t; lop3.b32 t, $2, 0x000F000F, 0x43004300, 0xEA; sub.rn.bf16x2 t, t, $3; "
        "mov.b32 {$0, $1}, t; }", "=h,=h,r,r", [w, zz], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=1)


@triton.jit
def _nibble_pair_f16(w, zz):
    """_nibble_pair_bf16 for fp16 activations: the f16x2 pair 1024 + u, zz = 1024 + zu (a function
    per dtype: Triton unifies the types of every return, constexpr branches included)."""
    return tl.inline_asm_elementwise(
        "{ .reg .b32 t; lop3.b32 t, $2, 0x000F000F, 0x64006400, 0xEA; sub.rn.f16x2 t, t, $3; "
        "mov.b32 {$0, $1}, t; }", "=h,=h,r,r", [w, zz], dtype=(tl.float16, tl.float16), is_pure=True, pack=1)


@triton.jit
def _nibble_pair(words, zu, J: tl.constexpr, F16: tl.constexpr):
    """The PAIRS conversion, pair J (0..3): (u_J - zu, u_{J+4} - zu) of words [BN, W8] in fp16 (F16)
    or bf16, zu [BN] the rows' zero points. The eight nibbles of a word cost four LOP3s and four
    packed subtractions (the four calls of a step share zz and the bitcast)."""
    zz = ((0x64006400 if F16 else 0x43004300) + zu * 0x10001)[:, None] + tl.zeros_like(words)
    uw = words.to(tl.uint32, bitcast=True) >> (4 * J)
    if F16:
        lo, hi = _nibble_pair_f16(uw, zz)
    else:
        lo, hi = _nibble_pair_bf16(uw, zz)
    return lo, hi


@triton.jit
def _packed_step(q_ptr, sc_ptr, zp_ptr, rn, kw0, K8, KG, GROUP: tl.constexpr, HAS_ZP: tl.constexpr,
                 BLOCK_N: tl.constexpr, W8: tl.constexpr):
    """One K step: the weight rows' W8 packed words from word kw0 (0 past K8), their group's fp32
    scale and zero point (8 when symmetric)."""
    offs_w = kw0 + tl.arange(0, W8)
    words = tl.load(q_ptr + rn[:, None] * K8 + offs_w[None, :], mask=offs_w[None, :] < K8, other=0)
    g = (kw0 * 8) // GROUP
    scale = tl.load(sc_ptr + rn * KG + g).to(tl.float32)
    if HAS_ZP:
        zu = tl.load(zp_ptr + rn * KG + g)
    else:
        zu = tl.full((BLOCK_N,), 8, tl.int32)
    return words, scale, zu


@triton.jit
def _int4_slices_kernel(x_ptr, q_ptr, sc_ptr, zp_ptr, y_ptr, ws_ptr, cnt_ptr, bias_ptr, M, N, K, K8, KG, stride_xm,
                        stride_ym, KW_SPLIT, GROUP: tl.constexpr, HAS_ZP: tl.constexpr, HAS_BIAS: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                        GROUP_M: tl.constexpr, PAIRS: tl.constexpr, F16: tl.constexpr, F32: tl.constexpr,
                        FIXUP: tl.constexpr, X_SPLIT: tl.constexpr, X_ROW: tl.constexpr, GLU: tl.constexpr = False):
    """Path "slices" (few rows): acc[BN, BM] = Σ_j W_j · x_jᵀ per BLOCK_K step, W_j [BN, BK/8] the
    j-th nibble of each word (k = 8·word + j) as its own MMA operand in registers, x_j the matching
    columns of x. The launcher hands x over with each BLOCK_K block's columns in slice order
    (column j·BK/8 + w of a block holds x[8·w + j]), zero-padded to whole blocks, so every x_j is a
    contiguous load and the unpacked weights never round-trip through shared memory.
    The zero point (8 when symmetric) is subtracted exactly: PAIRS (NVIDIA PTX, bf16/fp16 x) two
    nibbles per instruction, else in fp32 through the mantissa of 2^23. The group scale multiplies
    each step's fp32 partial product (BLOCK_K divides the group). Words past K8 read as 0, and
    their x columns are the launcher's zero padding.
    X_SPLIT (tile field): x as stored instead of the slice-order copy (no second launch), each
    step's [BM, BK] block split into its eight slices in registers (_x_slices); with M <= BLOCK_M / 8
    rows (X_ROW) only those rows are loaded (_x_row_slices).
    With a zero point (AWQ) and the PTX pairs, slices 4-7 go to a second accumulator, added to the
    first before the scale: two chains of four MMAs a step instead of one of eight (up to 6%
    faster for AWQ; the symmetric and portable forms gain nothing and keep one chain)."""
    pid_k, offs_m, offs_n, rm, rn, kw_lo, kw_hi = _tile_words(M, N, K8, KW_SPLIT, BLOCK_M, BLOCK_N, GROUP_M)
    W8: tl.constexpr = BLOCK_K // 8
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kw0 in range(kw_lo, kw_hi, W8):
        words, scale, zu = _packed_step(q_ptr, sc_ptr, zp_ptr, rn, kw0, K8, KG, GROUP, HAS_ZP, BLOCK_N, W8)
        if X_ROW:
            xs = _x_row_slices(x_ptr, stride_xm, M, kw0 * 8, K, BLOCK_M, BLOCK_K)
        elif X_SPLIT:
            xs = _x_slices(x_ptr, rm, stride_xm, kw0 * 8, K, BLOCK_M, BLOCK_K)
        else:
            x_cols = x_ptr + rm[None, :] * stride_xm + (kw0 * 8 + tl.arange(0, W8))[:, None]   # slice 0: [W8, BM]
            xs = (tl.load(x_cols), tl.load(x_cols + W8), tl.load(x_cols + 2 * W8), tl.load(x_cols + 3 * W8),
                  tl.load(x_cols + 4 * W8), tl.load(x_cols + 5 * W8), tl.load(x_cols + 6 * W8),
                  tl.load(x_cols + 7 * W8))
        part = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        part2 = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)   # the second chain (HAS_ZP, PAIRS)
        if PAIRS:
            for j in tl.static_range(4):
                lo, hi = _nibble_pair(words, zu, j, F16)
                part = tl.dot(lo, xs[j], part)
                if HAS_ZP:
                    part2 = tl.dot(hi, xs[j + 4], part2)
                else:
                    part = tl.dot(hi, xs[j + 4], part)
        else:
            zf = zu.to(tl.float32)
            for j in tl.static_range(8):
                xj = xs[j]
                wj = _nibble_field(words >> (4 * j), 0xF, zf[:, None]).to(xj.dtype)
                part = gemm._dot(wj, xj, part, F32)
        if HAS_ZP and PAIRS:
            part += part2
        acc += part * scale[:, None]
    if X_ROW:   # row m's slice j is in column 8·m + j: row m's result is the sum of its eight, into column m
        acc = _x_row_results(acc, BLOCK_N, BLOCK_M)
    common.store_or_stash(tl.trans(acc), y_ptr, ws_ptr, cnt_ptr, pid_k, offs_m, offs_n, M, N, stride_ym,
                          bias_ptr, bias_ptr, bias_ptr, bias_ptr, SPLIT_K, HAS_BIAS, False, False, False, FIXUP, GLU)


@triton.jit
def _x_slices(x_ptr, rm, stride_xm, k0, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """The slices kernel's X_SPLIT: x[rm, k0:k0+BK] as stored (columns past K read as zero), split in
    registers into its eight slices, slice j the [BK/8, BM] operand of columns k0 + 8·w + j. tl.split
    halves the last axis, so the block viewed as [BM, BK/8, c, d, e] (k = 8·w + 4c + 2d + e) gives
    e, then d, then c: the pairs (j, j+4) of one (d, e) come out of the last split together."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    xt = tl.load(x_ptr + rm[:, None] * stride_xm + offs_k[None, :], mask=offs_k[None, :] < K, other=0.0)
    e0, e1 = tl.split(tl.reshape(xt, (BLOCK_M, BLOCK_K // 8, 2, 2, 2)))
    d0e0, d1e0 = tl.split(e0)
    d0e1, d1e1 = tl.split(e1)
    x0, x4 = tl.split(d0e0)
    x2, x6 = tl.split(d1e0)
    x1, x5 = tl.split(d0e1)
    x3, x7 = tl.split(d1e1)
    return (tl.trans(x0), tl.trans(x1), tl.trans(x2), tl.trans(x3), tl.trans(x4), tl.trans(x5), tl.trans(x6),
            tl.trans(x7))


@triton.jit
def _x_row_slices(x_ptr, stride_xm, M, k0, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """X_SPLIT's operands for x of M <= BLOCK_M / 8 rows (X_ROW): the rows' BK columns from k0
    loaded once as t[w, 8·m + j] = x[m, k0 + 8·w + j] (rows past M and columns past K read as
    zero), and slice j's operand t with every column but those of j zeroed. The step's eight
    products then leave row m's slice-j partial sum in column 8·m + j of the accumulator
    (_x_row_results adds them up), and neither a slice-order copy (2-4 us of an M = 1-2 call) nor
    the padded rows of x are loaded. (Broadcasting each slice to the BM columns instead costs a
    shared-memory store per element.)"""
    w = tl.arange(0, BLOCK_K // 8)[:, None]
    c = tl.arange(0, BLOCK_M)[None, :]
    j = c % 8
    k = k0 + 8 * w + j
    m = c // 8
    t = tl.load(x_ptr + m.to(tl.int64) * stride_xm + k, mask=(m < M) & (k < K), other=0.0)
    zero = tl.zeros_like(t)
    return (tl.where(j == 0, t, zero), tl.where(j == 1, t, zero), tl.where(j == 2, t, zero),
            tl.where(j == 3, t, zero), tl.where(j == 4, t, zero), tl.where(j == 5, t, zero),
            tl.where(j == 6, t, zero), tl.where(j == 7, t, zero))


@triton.jit
def _x_row_results(acc, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr):
    """X_ROW's accumulator [BN, BM] (row m's slice j in column 8·m + j) turned into the usual one:
    row m's result, the sum of its eight columns, in column m (columns past BM / 8 hold zeros,
    rows the store masks). Masked sums, not a product with a 0/1 matrix: an inf partial sum
    would turn every other column's result into NaN there."""
    c = tl.arange(0, BLOCK_M)[None, :]
    out = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for m in tl.static_range(BLOCK_M // 8):
        row = tl.sum(tl.where(c // 8 == m, acc, 0.0), axis=1)
        out = tl.where(c == m, row[:, None], out)
    return out


@triton.jit
def _nibble_pair_fp32(words, zu):
    """The portable twin of _nibble_pair_bf16/_f16 in fp32: (u_j - zu, u_{j+4} - zu) of each
    (pre-shifted) word through the mantissa of 2^23, exactly; zu broadcasts against the words
    (the join kernel passes [BLOCK_N, 1])."""
    zf = zu.to(tl.float32)
    return _nibble_field(words, 0xF, zf), _nibble_field(words >> 16, 0xF, zf)


@triton.jit
def _int4_join_kernel(x_ptr, q_ptr, sc_ptr, zp_ptr, y_ptr, ws_ptr, cnt_ptr, bias_ptr, M, N, K, K8, KG, stride_xm, stride_ym,
                      KW_SPLIT, GROUP: tl.constexpr, HAS_ZP: tl.constexpr, HAS_BIAS: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                      GROUP_M: tl.constexpr, PAIRS: tl.constexpr, F16: tl.constexpr, FIXUP: tl.constexpr,
                      SCALE_W: tl.constexpr = False, MMA_WAIT: tl.constexpr = False, GLU: tl.constexpr = False):
    """Path "join" (few rows): the slices path's pair conversion, with the four pairs of each word
    joined back into natural K order and ONE tl.dot of K = BLOCK_K per step over x as stored (no
    slice-order copy). tl.join puts its new axis last: joining pairs (0, 2) and (1, 3), then those
    two, flattens to nibble 4c + 2d + e, i.e. k = 8·word + nibble. On sm_90 the slices kernel waits
    for each of its eight wgmmas per step (operand A in registers) behind 16 barriers; this one
    waits once behind 2, though its joined operand passes through shared memory. Numerics as the
    slices path: exact integers (u - zu) in x's dtype, the group scale on each step's fp32 product.
    SCALE_W: the group scale multiplies the weight tile instead, in x's dtype, so W is (u - zu)·s
    rounded once to x's dtype (the transient dequantization's numerics) and the products chain in
    one fp32 accumulator: with no fp32 step product to scale, Triton keeps the wgmmas in flight
    across steps (sm_90 TTGIR, Triton 3.6 and 3.9: waits keep 7 of a step's 8 products pending, or
    1 of 2, instead of 0), except under MMA_WAIT (mma_wait), which retires them each step. Either
    way the joined operand passes through shared memory on sm_90: the unscaled form stores it there
    for the MMA's operand load (local_alloc, local_load), the scaled one reaches the MMA's register
    layout by a layout conversion that Triton lowers the same way (PTX, Triton 3.6 and 3.9: 8
    st.shared.v4 and 8 ldmatrix.x4 a thread a step in both, with 9-10 barriers a step in the
    scaled form against 3)."""
    pid_k, offs_m, offs_n, rm, rn, kw_lo, kw_hi = _tile_words(M, N, K8, KW_SPLIT, BLOCK_M, BLOCK_N, GROUP_M)
    W8: tl.constexpr = BLOCK_K // 8
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kw0 in range(kw_lo, kw_hi, W8):
        words, scale, zu = _packed_step(q_ptr, sc_ptr, zp_ptr, rn, kw0, K8, KG, GROUP, HAS_ZP, BLOCK_N, W8)
        offs_k = kw0 * 8 + tl.arange(0, BLOCK_K)
        xt = tl.load(x_ptr + rm[None, :] * stride_xm + offs_k[:, None], mask=offs_k[:, None] < K, other=0.0)
        if PAIRS:
            l0, h0 = _nibble_pair(words, zu, 0, F16)
            l1, h1 = _nibble_pair(words, zu, 1, F16)
            l2, h2 = _nibble_pair(words, zu, 2, F16)
            l3, h3 = _nibble_pair(words, zu, 3, F16)
        else:
            zc = zu[:, None]
            l0, h0 = _nibble_pair_fp32(words, zc)
            l1, h1 = _nibble_pair_fp32(words >> 4, zc)
            l2, h2 = _nibble_pair_fp32(words >> 8, zc)
            l3, h3 = _nibble_pair_fp32(words >> 12, zc)
        v = tl.join(tl.join(tl.join(l0, h0), tl.join(l2, h2)), tl.join(tl.join(l1, h1), tl.join(l3, h3)))
        w_t = tl.reshape(v, (BLOCK_N, BLOCK_K))                 # [BN, W8, c, d, e] -> k = 8·word + 4c + 2d + e
        if SCALE_W:   # (u - zu)·s in x's dtype, bit for bit as _int4_dequant_kernel makes it
            if sc_ptr.dtype.element_ty == x_ptr.dtype.element_ty:
                # s is exact in x's dtype and so is u - zu: their exact product (at most 11 x 11
                # bits) rounded once, in the packed half-precision multiply
                wq = w_t.to(xt.dtype) * scale[:, None].to(xt.dtype)
            else:   # a scale of another dtype (bf16 scales under fp16 x, fp32 scales) may not be
                # exact in x's: the fp32 product, then x's dtype (for fp32 scales two roundings,
                # as in the transient dequantization)
                wq = (w_t.to(tl.float32) * scale[:, None]).to(xt.dtype)
            acc = tl.dot(wq, xt, acc)
            if MMA_WAIT:
                acc = _retire(acc)
        else:
            acc += tl.dot(w_t.to(xt.dtype), xt) * scale[:, None]
    common.store_or_stash(tl.trans(acc), y_ptr, ws_ptr, cnt_ptr, pid_k, offs_m, offs_n, M, N, stride_ym,
                          bias_ptr, bias_ptr, bias_ptr, bias_ptr, SPLIT_K, HAS_BIAS, False, False, False, FIXUP, GLU)


@triton.jit
def _nibble_field(words, MASK: tl.constexpr, zu=0):
    """(words & MASK) | 0x4B000000 read as fp32 is 2^23 + field, the field lying in the mantissa:
    minus 2^23 it is the field, exactly, as a float. One LOP3 and one FADD per nibble instead of
    a shift, a mask and an int-to-float convert (a quarter-rate instruction on Hopper). `zu` (0 by
    default; 8 when symmetric, or an fp32 tensor that broadcasts against the words) is a zero point
    taken off in the same subtraction, of 2^23 + zu: field - zu, exactly (field, zu < 16)."""
    return ((words & MASK) | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + zu)


@triton.jit
def _int4_gemv_kernel(x_ptr, q_ptr, sc_ptr, zp_ptr, y_ptr, ws_ptr, bias_ptr, N, K8, KG, KW_SPLIT,
                      GROUP: tl.constexpr, HAS_ZP: tl.constexpr, HAS_BIAS: tl.constexpr,
                      BLOCK_N: tl.constexpr, W8: tl.constexpr, SPLIT_K: tl.constexpr, GLU: tl.constexpr = False):
    """One row of x: y[n] = Σ_words scale[n, g] · (Σ_j u_j·x_j - zu·Σ_j x_j), in fp32 on the CUDA
    cores. Nibble j of a word sits at bits 4j; nibbles 0-4 are read in place with their x divided
    by 16^j (a power of two: exact), nibbles 5-7 after one shift by 20. The zero point is taken
    once per word through Σ_j x_j. x past K reads as 0, so a partial word adds nothing beyond K."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = (offs_n % N).to(tl.int64)
    i = tl.arange(0, W8)
    G8: tl.constexpr = GROUP // 8
    kw_lo, kw_hi = _split_words(pid_k, KW_SPLIT, K8)
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
        u = _nibble_field(words, 0xF) * x0[None, :]
        u += _nibble_field(words, 0xF0) * (x1 * 0.0625)[None, :]
        u += _nibble_field(words, 0xF00) * (x2 * 0.00390625)[None, :]
        u += _nibble_field(words, 0xF000) * (x3 * 0.000244140625)[None, :]
        u += _nibble_field(words, 0xF0000) * (x4 * 0.0000152587890625)[None, :]
        u += _nibble_field(hi, 0xF) * x5[None, :]
        u += _nibble_field(hi, 0xF0) * (x6 * 0.0625)[None, :]
        u += _nibble_field(hi, 0xF00) * (x7 * 0.00390625)[None, :]
        g = offs_w // G8                                       # a word never straddles a group (G % 8 == 0)
        sc = tl.load(sc_ptr + rn[:, None] * KG + g[None, :], mask=wm[None, :], other=0.0).to(tl.float32)
        if HAS_ZP:
            zu = tl.load(zp_ptr + rn[:, None] * KG + g[None, :], mask=wm[None, :], other=0).to(tl.float32)
            acc += sc * (u - zu * sx[None, :])
        else:
            acc += sc * (u - 8.0 * sx[None, :])
    yv = tl.sum(acc, axis=1)
    if SPLIT_K == 1:
        if not GLU:
            if HAS_BIAS:
                yv += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
            tl.store(y_ptr + offs_n, yv.to(y_ptr.dtype.element_ty), mask=offs_n < N)
        else:
            common.store_tile(yv[None, :], tl.zeros((1,), dtype=tl.int32), offs_n, y_ptr, bias_ptr, bias_ptr,
                              bias_ptr, bias_ptr, 1, N, 0, HAS_BIAS, False, False, False, GLU)
    else:
        tl.store(ws_ptr + pid_k.to(tl.int64) * N + offs_n, yv, mask=offs_n < N)


@triton.jit
def _int4_dequant_kernel(q_ptr, sc_ptr, zp_ptr, w_ptr, N, K, K8, KG, GROUP: tl.constexpr, HAS_ZP: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """W[n, k] = (u - zu) · scale[n, k // G] in W's dtype, for one call's transient buffer. BLOCK_K
    divides the group, so a tile takes one scale (and zero point) per row, loaded once, not
    gathered per element; nibbles become floats through the mantissa of 2^23 (_nibble_field's
    trick), and each row of the tile is stored as contiguous, vectorised columns."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    W8: tl.constexpr = BLOCK_K // 8
    i = tl.arange(0, W8)
    nmask = offs_n < N
    rn = offs_n.to(tl.int64)
    words = tl.load(q_ptr + rn[:, None] * K8 + k0 // 8 + i[None, :],
                    mask=nmask[:, None] & (k0 // 8 + i[None, :] < K8), other=0)
    u = words[:, :, None] >> (tl.arange(0, 8) * 4)[None, None, :]              # [BN, BK/8, 8], masked below
    g = k0 // GROUP
    sc = tl.load(sc_ptr + rn * KG + g, mask=nmask, other=0.0).to(tl.float32)
    if HAS_ZP:
        zu = tl.load(zp_ptr + rn * KG + g, mask=nmask, other=0).to(tl.float32)
        wv = _nibble_field(u, 0xF, zu[:, None, None]) * sc[:, None, None]
    else:
        wv = _nibble_field(u, 0xF, 8) * sc[:, None, None]
    wv = tl.reshape(wv, (BLOCK_N, BLOCK_K))                                    # k = 8·word + nibble
    offs_k = k0 + tl.arange(0, BLOCK_K)
    tl.store(w_ptr + rn[:, None] * K + offs_k[None, :], wv.to(w_ptr.dtype.element_ty),
             mask=nmask[:, None] & (offs_k[None, :] < K))


# This template's paths whose tiles may be wide (BLOCK_N2): the transient dense product's.
WIDE_PATHS = ("dequant-tma",)


def launch(x: torch.Tensor, w: Int4Weight, tile: dict, out: torch.Tensor | None = None, glu: bool = False
           ) -> torch.Tensor:
    """y = x[:, act_perm] · dequant(W)ᵀ + b in x's dtype (bf16/fp16 activations: W4A16; fp32 for an
    explicit float32 run, multiplied at common.f32_precision's precision). `glu`: W's rows are gate
    and up rows interleaved, and y [M, N / 2] = silu(gate) · up (dense.launch's)."""
    common.check_tile(tile, WIDE_PATHS)
    x = common.check_activation(x, w.K, w.packed.device, "int4 W4A16")
    assert w.packed.is_contiguous() and w.scale.is_contiguous(), "packed and scale must be contiguous"
    assert w.zero_point is None or (w.zero_point.dtype == torch.int32 and w.zero_point.is_contiguous()), \
        "zero_point must be contiguous int32 (unpacked u-domain)"
    path = tile.get("path", "splitk")
    bk = tile["BLOCK_K"]
    if path in ("splitk", "tiled", "swap", "slices", "join", "frag"):
        assert w.group_size % bk == 0, f"BLOCK_K={bk} must divide the group size {w.group_size}"
    assert w.group_size % 8 == 0, f"int4 group size {w.group_size} must be a multiple of 8"
    assert bk % 8 == 0, "BLOCK_K must be a multiple of 8 (one packed word)"
    if w.act_perm is not None:
        # Legacy act-order: the weight was permuted once at load; x follows per call.
        x = x.index_select(1, w.act_perm)
    M, K = x.shape
    N = w.N
    y = common.output(x, common.glu_width(N, glu), out)
    if M == 0 or tile.get("TAIL_TILES"):   # no rows: nothing to run (the GEMV takes one); a tail: two launches
        return _launch_tail(x, w, tile, y, glu) if M else y
    dtile = dense_tile(tile)
    if dtile is not None:
        from vsr.kernels import dense
        wt = dequantize_transient(w, x.dtype)
        return dense.launch(x, dense.DenseWeight(wt, w.bias), dtile, out=y, glu=glu)
    zp, bias = (w.zero_point if w.zero_point is not None else w.packed), (w.bias if w.bias is not None else y)
    k_split, split = common.split_plan(K, tile)
    ws = common.workspace(split, y, N)
    bm, bn = tile["BLOCK_M"], tile["BLOCK_N"]
    dev = common.device_features(x.device)
    pairs = path in ("slices", "join") and dev.nvidia and ptx_pairs(x.dtype, dev.capability)
    fixup = common.split_fixup(tile, split)
    if fixup and (path == "gemv" or path == "wgmma" and not tile.get("RS")):   # they leave partials to reduce_splits
        raise ValueError(f"the int4 {path} path has no in-kernel fixup (FIXUP) but in its RS form: {tile}")
    cnt = common.fixup_counters(fixup, y.device, common.cdiv(M, bm) * common.cdiv(N, bn) * tile.get("PARTS", 1), ws)
    if path == "gemv":
        assert M == 1 and bk & (bk - 1) == 0, f"the gemv path takes one row in power-of-two word steps: {M=} {bk=}"
        # The GEMV steps in whole words: x beyond K (a partial last word) must read as zero.
        if K % 8:
            x = torch.nn.functional.pad(x, (0, 8 - K % 8))
        _int4_gemv_kernel[(common.cdiv(N, bn), split)](
            x, w.packed, w.scale, zp, y, ws, bias, N, w.packed.stride(0), w.scale.stride(0), k_split // 8,
            GROUP=w.group_size, HAS_ZP=w.zero_point is not None, HAS_BIAS=w.bias is not None,
            BLOCK_N=bn, W8=bk // 8, SPLIT_K=split, GLU=glu, num_warps=tile["num_warps"],
            num_stages=tile["num_stages"])
    elif path == "slices":
        assert bk >= 128, f"the slices path needs BLOCK_K >= 128 (16 words: an MMA's depth), got {bk}"
        # (16: an MMA's narrow side, and X_ROW's room for two rows' eight slices)
        assert bm >= 16, f"the slices path needs BLOCK_M >= 16, got {bm}"
        x_split = bool(tile.get("X_SPLIT", 0))
        xs = x if x_split else slice_order(x, bk)
        _int4_slices_kernel[(common.cdiv(M, bm) * common.cdiv(N, bn), split)](
            xs, w.packed, w.scale, zp, y, ws, cnt, bias, M, N, K, w.packed.stride(0), w.scale.stride(0), xs.stride(0),
            y.stride(0), k_split // 8, GROUP=w.group_size, HAS_ZP=w.zero_point is not None,
            HAS_BIAS=w.bias is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split,
            GROUP_M=tile.get("GROUP_M", 8), PAIRS=pairs, F16=x.dtype == torch.float16, F32=common.f32_precision(x),
            FIXUP=fixup, X_SPLIT=x_split, X_ROW=x_split and 8 * M <= bm, GLU=glu,
            num_warps=tile["num_warps"], num_stages=tile["num_stages"])
    elif path == "join":
        assert bk >= 16 and x.dtype != torch.float32, "the join path takes bf16/fp16 x and BLOCK_K >= 16"
        # The kernel masks x only at K, not at its split's end: split_plan makes each split whole BLOCK_K steps.
        _int4_join_kernel[(common.cdiv(M, bm) * common.cdiv(N, bn), split)](
            x, w.packed, w.scale, zp, y, ws, cnt, bias, M, N, K, w.packed.stride(0), w.scale.stride(0), x.stride(0),
            y.stride(0), k_split // 8, GROUP=w.group_size, HAS_ZP=w.zero_point is not None,
            HAS_BIAS=w.bias is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split,
            GROUP_M=tile.get("GROUP_M", 8), PAIRS=pairs, F16=x.dtype == torch.float16, FIXUP=fixup,
            SCALE_W=bool(tile.get("SCALE_W", 0)), MMA_WAIT=bool(tile.get("SCALE_W", 0)) and mma_wait(dev),
            GLU=glu, num_warps=tile["num_warps"], num_stages=tile["num_stages"])
    elif path == "frag":
        assert bk >= 16 and bk & (bk - 1) == 0 and x.dtype != torch.float32, \
            "the frag path takes bf16/fp16 x and a power-of-two BLOCK_K >= 16"
        _int4_frag_kernel[(common.cdiv(M, bm) * common.cdiv(N, bn), split)](
            x, w.packed, w.scale, zp, y, ws, cnt, bias, M, N, K, w.packed.stride(0), w.scale.stride(0), x.stride(0),
            y.stride(0), k_split // 8, GROUP=w.group_size, HAS_ZP=w.zero_point is not None,
            HAS_BIAS=w.bias is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split,
            GROUP_M=tile.get("GROUP_M", 8), PAIRS=frag_pairs(x.dtype, w.scale.dtype, dev), F16=x.dtype == torch.float16,
            FIXUP=fixup, MMA_WAIT=mma_wait(dev), GLU=glu, num_warps=tile["num_warps"],
            num_stages=tile["num_stages"])
    elif path == "wgmma":
        _launch_wgmma(x, w, tile, y, ws, zp, bias, k_split, split, glu, dev, cnt if fixup else None)
    else:
        kernel = _int4_swap_kernel if path == "swap" else _int4_kernel
        kernel[(common.cdiv(M, bm) * common.cdiv(N, bn), split)](
            x, w.packed, w.scale, zp, y, ws, cnt, bias, M, N, K, w.packed.stride(0), w.scale.stride(0),
            x.stride(0), y.stride(0), k_split // 8,
            GROUP=w.group_size, HAS_ZP=w.zero_point is not None, HAS_BIAS=w.bias is not None,
            EVEN_K=K % bk == 0, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
            SPLIT_K=split, GROUP_M=tile.get("GROUP_M", 8), F32=common.f32_precision(x), FIXUP=fixup,
            GLU=glu, num_warps=tile["num_warps"], num_stages=tile["num_stages"])
    if split > 1 and not fixup:
        common.reduce_splits(ws, y, split, M, N, w.bias, None, None, None, glu)
    return y


def ptx_pairs(dtype: torch.dtype, capability: tuple[int, int]) -> bool:
    """Whether the slices and join kernels convert nibbles by PTX pairs (_nibble_pair_*) for x of `dtype` on
    an NVIDIA device of `capability`: f16x2 subtraction exists on every supported GPU, bf16x2
    only from sm_90 (ptxas refuses sub.bf16x2 below), so bf16 on Ampere/Ada takes the portable
    twin; fp32 x always does."""
    return dtype == torch.float16 or (dtype == torch.bfloat16 and tuple(capability) >= (9, 0))


_TRITON = tuple(int(p) for p in triton.__version__.split(".")[:2])
# The first ptxas release whose SASS of Triton 3.9's frag and SCALE_W join kernels writes no
# register of a pending wgmma (86 of 86 kernels of the space; 12.9 and 13.0 write them in 62).
_PTXAS_KEEPS_OPERANDS = (13, 4)


@functools.cache
def ptxas_release(arch: int) -> tuple[int, int] | None:
    """(major, minor) of the ptxas Triton assembles sm_`arch` with (its own, or the one that
    TRITON_PTXAS_PATH / TRITON_PTXAS_BLACKWELL_PATH names); None where it cannot be asked."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas_version
        m = re.search(r"release (\d+)\.(\d+)", get_ptxas_version(arch))
    except (ImportError, OSError, subprocess.SubprocessError):
        return None
    return (int(m.group(1)), int(m.group(2))) if m else None


def mma_wait(dev: common.DeviceFeatures) -> bool:
    """Whether the frag and SCALE_W join kernels retire each step's wgmmas before the next step
    (MMA_WAIT): on Hopper, unless Triton >= 3.9 assembles with ptxas >= 13.4. Their weight operand
    is a wgmma register operand, which Triton keeps in flight across loop steps
    (triton-lang/triton#9433). Only that pair's SASS never writes registers a pending wgmma still
    reads (kernels/wgmma_hazard.py finds such writes): Triton 3.7 and 3.8's with their own ptxas
    have them, 3.6's with each ptxas tried (13.4: 28 of the space's 86 kernels), and 3.9's through
    an older ptxas, which TRITON_PTXAS_BLACKWELL_PATH selects (12.9, 13.0: 62 of 86). Reading the
    accumulator each step makes Triton wait for the step's wgmmas there."""
    if not (dev.nvidia and dev.capability is not None and dev.capability[0] == 9):
        return False
    release = ptxas_release(10 * dev.capability[0] + dev.capability[1])
    return not (_TRITON >= (3, 9) and release is not None and release >= _PTXAS_KEEPS_OPERANDS)


def frag_pairs(dtype: torch.dtype, scale_dtype: torch.dtype, dev: common.DeviceFeatures) -> bool:
    """Whether the frag kernel converts by PTX pairs (_frag_pair_*): as ptx_pairs, for scales of x's
    own dtype (packed multiplies need both operands in it; other scales take the fp32 twin)."""
    return dev.nvidia and scale_dtype == dtype and ptx_pairs(dtype, dev.capability)


def slice_order(x: torch.Tensor, bk: int) -> torch.Tensor:
    """x [M, K] as the slices path reads it: zero-padded to whole BLOCK_K blocks, and in each block
    column j·BK/8 + w holding x[8·w + j] (one small copy of x per call; the weights stay as stored)."""
    M, K = x.shape
    if K % bk:
        x = torch.nn.functional.pad(x, (0, bk - K % bk))
    return x.reshape(M, x.shape[1] // bk, bk // 8, 8).transpose(2, 3).reshape(M, x.shape[1])


def dequantize_transient(w: Int4Weight, dtype: torch.dtype) -> torch.Tensor:
    """W [N, K] in `dtype` through _int4_dequant_kernel: the large-M paths' buffer for one call."""
    N, K = w.N, w.K
    wt = torch.empty((N, K), dtype=dtype, device=w.packed.device)
    dbk = dequant_block_k(w.group_size)
    _int4_dequant_kernel[(common.cdiv(N, 32), common.cdiv(K, dbk))](
        w.packed, w.scale, w.zero_point if w.zero_point is not None else w.packed, wt, N, K, w.packed.stride(0),
        w.scale.stride(0), GROUP=w.group_size, HAS_ZP=w.zero_point is not None, BLOCK_N=32, BLOCK_K=dbk,
        num_warps=4)
    return wt


def _dense_module():
    from vsr.kernels import dense
    return dense


# The large-M paths: a transient dense copy (dequantize_transient) multiplied by the dense
# template's path of this name. Launch-time choices live here, in the hashed module; the tile
# spaces (int4_tiles.py) only choose among them.
DENSE_PATH = {"dequant": "tiled", "dequant-tma": "tma", "dequant-sk": "tma-sk"}


def dense_tile(tile: dict) -> dict | None:
    """The dense template's tile that a large-M path ("dequant", "dequant-tma", "dequant-sk")
    multiplies its transient dense copy with (the same tile on "tiled", "tma" or "tma-sk"); None
    for the paths that unpack in the kernel."""
    path = DENSE_PATH.get(tile.get("path"))
    return None if path is None else dict(tile, path=path)


def glu_in_epilogue(tile: dict) -> bool:
    """The TEMPLATE's glu_in_epilogue: SwiGLU in the product on the large-M paths' tiles (the dense TMA product
    of the interleaved copy) and the wgmma path's RS tiles without FIXUP (a gate row and its up row in one
    thread's registers, int4_wgmma._store_glu; split ones by the reduction); frag and join split one
    accumulator's columns into pairs, which took 1.17x, 1.25x and 1.16x the plain product and the activation
    kernel at 64, 128 and 256 rows on an H100 (ab-nvidia-h100-2026-12-06.json, "swiglu_in_product")."""
    return dense_tile(tile) is not None or bool(tile.get("RS")) and not tile.get("FIXUP")


def dequant_block_k(group: int) -> int:
    """The dequantization kernel's K step: the largest power of two up to 256 that divides the group."""
    return next(b for b in (256, 128, 64, 32, 16, 8) if group % b == 0)


def problem(w: Int4Weight, M: int, act_dtype: torch.dtype) -> Problem:
    """The Problem of a call; M is the row bucket (vsr.autotune.buckets.bucket_for)."""
    return Problem(N=w.N, K=w.K, bucket=M, act_dtype=act_dtype, params=w.params())


# Path "frag". Kernels are added below the others: a Triton cache key counts the line its function
# starts on, and a shipped tile may be re-keyed to a new source hash only while the kernel it was
# timed as keeps its key (docs/cache.md).


@triton.jit
def _frag_pair_bf16(t, zz, ss):
    """(u_lo - zu)·s and (u_hi - zu)·s, each rounded once to bf16, of t holding u_lo in bits 0-3 and
    u_hi in bits 16-19: _nibble_pair_bf16's LOP3 and exact subtraction, then one packed multiply by
    ss (the row's bf16 scale in both halves), which rounds the exact product once, as
    _int4_dequant_kernel's fp32 product and cast do. NVIDIA PTX, sm_90: common.INT4_PAIR_PTX_BF16,
    whose text int4_wgmma's unpackers run too."""
    return tl.inline_asm_elementwise(common.INT4_PAIR_PTX_BF16, "=h,=h,r,r,r", [t, zz, ss],
                                     dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=1)


@triton.jit
def _frag_pair_f16(t, zz, ss):
    """_frag_pair_bf16 for fp16 activations and scales (1024 + u in the f16x2 mantissas):
    common.INT4_PAIR_PTX_F16."""
    return tl.inline_asm_elementwise(common.INT4_PAIR_PTX_F16, "=h,=h,r,r,r", [t, zz, ss],
                                     dtype=(tl.float16, tl.float16), is_pure=True, pack=1)


@triton.jit
def _frag_group(sc_ptr, zp_ptr, rn, g, KG, HAS_ZP: tl.constexpr, BLOCK_N: tl.constexpr):
    """Group g's scale and u-domain zero point (8 when symmetric) of rows rn. The zero point (0..15)
    is the low half of its little-endian int32, read as 16 bits like the scale."""
    s = tl.load(sc_ptr + rn * KG + g)
    if HAS_ZP:
        zu = tl.load(zp_ptr.to(tl.pointer_type(tl.int16)) + 2 * (rn * KG + g)).to(tl.int32)
    else:
        zu = tl.full((BLOCK_N,), 8, tl.int32)
    return s, zu


@triton.jit
def _int4_frag_kernel(x_ptr, q_ptr, sc_ptr, zp_ptr, y_ptr, ws_ptr, cnt_ptr, bias_ptr, M, N, K, K8, KG, stride_xm,
                      stride_ym, KW_SPLIT, GROUP: tl.constexpr, HAS_ZP: tl.constexpr, HAS_BIAS: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                      GROUP_M: tl.constexpr, PAIRS: tl.constexpr, F16: tl.constexpr, FIXUP: tl.constexpr,
                      MMA_WAIT: tl.constexpr = False, GLU: tl.constexpr = False):
    """Path "frag" (from 16 rows): acc[BN, BM] += W_q · x_tileᵀ, one tl.dot of K = BLOCK_K a step, the
    weight tile W_q = (u - zu)·s rounded once to x's dtype (the join path's SCALE_W numerics) built
    where the MMA reads it. The operand is indexed [n, c, h, l, e] with k = 16c + 8h + 2l + e: the
    word 2c + h of row n holds k's nibble in byte l, nibble e. A warpgroup's register operand for
    K = 16 gives each thread the pairs k = 2l + e (l its lane mod 4) of two rows and both h, so with
    l on the lanes, (n, c, h) in registers and e joined in last, the nibbles each thread unpacks
    are the ones its MMA fragment holds: on sm_90 the packed words go through shared memory as
    loaded (the pipeline's asynchronous copy) and every thread reads the words of its rows, taking
    byte l; the unpacked operand never passes through shared memory (the join path stores and
    reloads it each step). PAIRS (NVIDIA PTX, scales in x's dtype): byte l spread to bits 0-3 and
    16-19 by one multiply, then _frag_pair_*; else the fp32 twin through the mantissa of 2^23.
    MMA_WAIT (mma_wait): each step's wgmmas retired before the next step unpacks into registers.
    Words past K8 read as 0 and x past K as 0, as in the join path."""
    pid_k, offs_m, offs_n, rm, rn, kw_lo, kw_hi = _tile_words(M, N, K8, KW_SPLIT, BLOCK_M, BLOCK_N, GROUP_M)
    C16: tl.constexpr = BLOCK_K // 16
    W8: tl.constexpr = BLOCK_K // 8
    lane_shift = (8 * tl.arange(0, 4))[None, None, None, :].to(tl.uint32)                    # [1, 1, 1, L]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    # The group's scale and zero point (2-byte loads, which the pipeline leaves to the loop) are
    # loaded a step ahead, so their latency hides behind a step's work rather than stall the MMAs.
    s, zu = _frag_group(sc_ptr, zp_ptr, rn, (kw_lo * 8) // GROUP, KG, HAS_ZP, BLOCK_N)
    for kw0 in range(kw_lo, kw_hi, W8):
        s_next, zu_next = _frag_group(sc_ptr, zp_ptr, rn, tl.minimum(((kw0 + W8) * 8) // GROUP, KG - 1), KG, HAS_ZP,
                                      BLOCK_N)
        offs_w = kw0 + tl.arange(0, W8)
        words = tl.load(q_ptr + rn[:, None] * K8 + offs_w[None, :], mask=offs_w[None, :] < K8, other=0)
        words = tl.reshape(words, (BLOCK_N, C16, 2))                                            # [BN, C, H]
        b = (words.to(tl.uint32, bitcast=True)[:, :, :, None] >> lane_shift) & 0xFF           # [BN, C, H, L]
        offs_k = kw0 * 8 + tl.arange(0, BLOCK_K)
        xt = tl.load(x_ptr + rm[None, :] * stride_xm + offs_k[:, None], mask=offs_k[:, None] < K, other=0.0)
        if PAIRS:
            t = (b * 0x1001).to(tl.int32, bitcast=True)          # byte l's nibbles at bits 0-3 and 16-19
            zz = ((0x64006400 if F16 else 0x43004300) + zu * 0x10001)[:, None, None, None]
            sb = s.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
            ss = (sb * 0x10001)[:, None, None, None]
            if F16:
                lo, hi = _frag_pair_f16(t, zz, ss)
            else:
                lo, hi = _frag_pair_bf16(t, zz, ss)
        else:   # the exact u - zu in fp32, times the fp32 scale, then x's dtype (the dequantization's roundings)
            zf = zu.to(tl.float32)[:, None, None, None]
            sf = s.to(tl.float32)[:, None, None, None]
            bi = b.to(tl.int32, bitcast=True)
            lo = (_nibble_field(bi, 0xF, zf) * sf).to(xt.dtype)
            hi = (_nibble_field(bi >> 4, 0xF, zf) * sf).to(xt.dtype)
        w_q = tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_K))
        acc = tl.dot(w_q, xt, acc)
        if MMA_WAIT:
            acc = _retire(acc)
        s, zu = s_next, zu_next
    common.store_or_stash(tl.trans(acc), y_ptr, ws_ptr, cnt_ptr, pid_k, offs_m, offs_n, M, N, stride_ym,
                          bias_ptr, bias_ptr, bias_ptr, bias_ptr, SPLIT_K, HAS_BIAS, False, False, False, FIXUP, GLU)


@triton.jit
def _retire(acc):
    """acc unchanged, read by an instruction: Triton retires the wgmmas that produce it here
    (a wait for none in flight) instead of keeping them in flight into the next step (mma_wait)."""
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [acc], dtype=tl.float32, is_pure=True, pack=1)


def _launch_wgmma(x, w: Int4Weight, tile: dict, y, ws, zp, bias, k_split: int, split: int, glu: bool,
                  dev: common.DeviceFeatures, cnt: torch.Tensor | None = None) -> None:
    """Path "wgmma" (int4_wgmma.py, Gluon): Hopper only; x in half precision, x's and the packed
    words' rows whole 16-byte TMA rows (K % 32 == 0; a misaligned view of x is copied once),
    BLOCK_K 64 or 128 dividing the group; SwiGLU (glu) on RS tiles without FIXUP, in the kernel with one
    split, else by launch's reduction of the partials."""
    if not (dev.nvidia and dev.capability == (9, 0)):
        raise ValueError(f"the int4 wgmma path runs on NVIDIA Hopper (sm_90) only, not on {dev.capability}: {tile}")
    if glu and (not tile.get("RS") or cnt is not None):
        raise ValueError(f"the int4 wgmma path takes SwiGLU on its RS tiles without FIXUP: {tile}")
    bk = tile["BLOCK_K"]
    assert bk in (64, 128) and w.group_size % bk == 0 and x.dtype in (torch.bfloat16, torch.float16), \
        f"the wgmma path takes bf16/fp16 x and BLOCK_K 64 or 128 dividing the group: {tile}"
    if not gemm.tma_aligned(w.K, x.element_size(), 0.5):
        raise ValueError(f"the int4 wgmma path copies x and the packed words by TMA (16-byte rows), which "
                         f"K={w.K} does not allow: {tile}")
    int4_wgmma.launch(gemm.tma_rows(x), w, zp, bias, y, ws, tile, k_split, split, cnt, glu and split == 1)


def _weight_rows(w: Int4Weight, lo: int, hi: int) -> Int4Weight:
    """Rows lo..hi of w (views of its contiguous tensors), x's columns already in w's order; kept on
    w, so that what a launch keeps on a weight (its TMA descriptors, the RS form's scale words) is
    made once, not on every call of a tile with a tail (anew where w's tensors were replaced)."""
    tensors = tuple(None if t is None else t.data_ptr() for t in (w.packed, w.scale, w.zero_point, w.bias))
    kept = w.__dict__.setdefault("_row_parts", {})
    if kept.get((lo, hi), (None,))[0] != tensors:   # (a part of replaced tensors is not kept)
        part = lambda t: None if t is None else t[lo:hi]  # noqa: E731
        kept[(lo, hi)] = (tensors, Int4Weight(part(w.packed), part(w.scale), w.K, w.group_size, part(w.zero_point),
                                              None, part(w.bias)))
    return kept[(lo, hi)][1]


def _launch_tail(x: torch.Tensor, w: Int4Weight, tile: dict, y: torch.Tensor, glu: bool) -> torch.Tensor:
    """A tile with TAIL_TILES = t > 0: its last t blocks of BLOCK_N weight rows launched apart, K split
    TAIL_SPLIT ways, after the others as the tile itself. A grid whose last wave of programs is
    nearly empty runs that wave on a few multiprocessors; split over K, those rows' programs
    spread over all of them. x is in w's column order (launch gathers it first). With glu each launch
    takes the SwiGLU of its own rows (whole gate and up pairs: BLOCK_N is even) into its half of y's columns."""
    nd = (common.cdiv(w.N, tile["BLOCK_N"]) - tile["TAIL_TILES"]) * tile["BLOCK_N"]
    if dense_tile(tile) is not None or not 0 < nd < w.N or tile.get("TAIL_SPLIT", 0) < 1 or nd % 2:
        raise ValueError(f"TAIL_TILES takes an unpacking path's tile, fewer blocks than N={w.N}'s and a TAIL_SPLIT: "
                         f"{tile}")
    head = {k: v for k, v in tile.items() if k not in ("TAIL_TILES", "TAIL_SPLIT")}
    cut = nd // 2 if glu else nd
    launch(x, _weight_rows(w, 0, nd), head, out=y[:, :cut], glu=glu)
    launch(x, _weight_rows(w, nd, w.N), dict(head, SPLIT_K=tile["TAIL_SPLIT"]), out=y[:, cut:], glu=glu)
    return y


TEMPLATE = common.KernelTemplate(name="int4_w4a16", module=sys.modules[__name__], search_space=search_space,
                    default_tile=default_tile, launch=launch, reference=reference_linear, problem=problem,
                    pick_group=pick_group, glu_in_epilogue=glu_in_epilogue, deps=(_dense_module(), int4_wgmma))
