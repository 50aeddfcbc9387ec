"""NVFP4 W4A4 (compressed-tensors nvfp4-pack-quantized): weight layout and pure-torch reference.

Weights: e2m1 nibbles, two per uint8 (low nibble = even k), one e4m3 block scale
per 16 columns and one fp32 global scale that DIVIDES. Activations: e2m1 with a
dynamic e4m3 scale per 16 columns of each row and the static input_global_scale.
Packages without input_global_scale (NVFP4A16) keep activations unquantized.
FORMATS.md §3, §7.

Two Triton templates:
- "nvfp4_emulated": a prologue kernel quantizes x per 16-column block exactly as
  quantize_activation does and writes the dequantized values e2m1·s_x, which are exact
  in fp16 (at most 6 significant bits, exponents 2^-10..2^12); the GEMM decodes the
  weight's nibbles and block scales into fp16 (exact too) and multiplies in fp16 with
  fp32 accumulation, then scales by 1/(gx·gw): the reference's fp32 math up to the order
  of the sum. Runs anywhere Triton runs; used only when emulation is asked for.
- "nvfp4_w4a4": tl.dot_scaled with e2m1 operands and e4m3 block scales of 16, for
  NVIDIA compute capability 10.x/12.x (FP4 tensor cores).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from vsr.kernels import common, gemm_tiles
from vsr.kernels.fp8 import e4m3_rne
from vsr.kernels.template import Problem

BLOCK = 16
FP4_MAX = 6.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# |x| thresholds between neighbouring codes, with the side a tie falls to:
# ties go to the even code (0.25->0, 0.75->2, 1.25->2, 1.75->4, 2.5->4, 3.5->6, 5->6).
_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """Nibble codes (any int dtype, 0..15) -> fp32 values; bit 3 is the sign."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    c = codes.to(torch.int64)
    mag = table[c & 7]
    return torch.where((c & 8) != 0, -mag, mag)


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """fp32 values (already clamped to ±6) -> nibble codes (uint8), round-to-nearest, ties to even code."""
    a = x.abs().float()
    code = torch.zeros_like(a, dtype=torch.uint8)
    for t, tie_up in _THRESHOLDS:
        code += (a >= t if tie_up else a > t).to(torch.uint8)
    return code | ((x < 0).to(torch.uint8) << 3)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] -> codes uint8 [N, K]: low nibble is the even column."""
    lo = packed & 0xF
    hi = packed >> 4
    return torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    c = codes.to(torch.uint8).reshape(*codes.shape[:-1], -1, 2)
    return c[..., 0] | (c[..., 1] << 4)


@dataclass
class Nvfp4Weight:
    """packed uint8 [N, K/2]; block_scale e4m3 [N, K/16]; global_scale fp32 scalar (divides);
    input_global_scale fp32 scalar or None (NVFP4A16: activations stay unquantized)."""

    packed: torch.Tensor
    block_scale: torch.Tensor
    global_scale: torch.Tensor
    input_global_scale: torch.Tensor | None = None
    bias: torch.Tensor | None = None

    format = "nvfp4"

    def __post_init__(self) -> None:
        N, half = self.packed.shape
        assert self.packed.dtype == torch.uint8, f"packed fp4 must be uint8, got {self.packed.dtype}"
        assert (2 * half) % BLOCK == 0, f"NVFP4 needs K % 16 == 0, got K={2 * half}"
        assert self.block_scale.dtype == torch.float8_e4m3fn, f"block scales must be e4m3, got {self.block_scale.dtype}"
        assert self.block_scale.shape == (N, 2 * half // BLOCK), (
            f"block_scale must be [N, K/16]=[{N}, {2 * half // BLOCK}], got {tuple(self.block_scale.shape)}")
        assert self.global_scale.numel() == 1, "weight_global_scale must hold one value"

    @property
    def N(self) -> int:
        return self.packed.shape[0]

    @property
    def K(self) -> int:
        return self.packed.shape[1] * 2

    @property
    def quantizes_activations(self) -> bool:
        return self.input_global_scale is not None

    def params(self) -> tuple[tuple[str, object], ...]:
        return (("act", "e2m1-block16-dynamic" if self.quantizes_activations else "none"), ("bits", 4), ("group", BLOCK))

    def to(self, device) -> "Nvfp4Weight":
        mv = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Nvfp4Weight(mv(self.packed), mv(self.block_scale), mv(self.global_scale),
                           mv(self.input_global_scale), mv(self.bias))

    def nbytes(self) -> int:
        ts = (self.packed, self.block_scale, self.global_scale, self.input_global_scale, self.bias)
        return sum(t.numel() * t.element_size() for t in ts if t is not None)


def dequantize(w: Nvfp4Weight) -> torch.Tensor:
    """W[n, k] = e2m1(c) · (fp8(block_scale[n, k//16]) / global_scale), fp32."""
    vals = e2m1_decode(unpack_fp4(w.packed))
    eff = w.block_scale.float() / w.global_scale.float().reshape(())
    return vals * eff.repeat_interleave(BLOCK, dim=1)


def quantize_activation(x: torch.Tensor, input_global_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row, per-16-column dynamic e2m1 quantization with a static global scale.

    Returns (codes uint8 [M, K], block scales e4m3 [M, K/16]). `amax/6` is taken in
    x's dtype, its product with the global scale in fp32, as the reference library does.
    """
    M, K = x.shape
    gx = input_global_scale.float().reshape(())
    xb = x.reshape(M, K // BLOCK, BLOCK)
    amax6 = xb.abs().amax(dim=-1) / FP4_MAX                      # activation dtype
    s = e4m3_rne(gx * amax6.float())
    s = torch.where(s.float() == 0, torch.full_like(s, 0.125), s)
    eff = s.float() / gx
    xq = (xb.float() / eff[..., None]).clamp(-FP4_MAX, FP4_MAX)
    return e2m1_encode(xq).reshape(M, K), s


def reference_linear(x: torch.Tensor, w: Nvfp4Weight) -> torch.Tensor:
    """y = (1/(gx·gw)) · Σ_k (e2m1(xq)·s_x)(e2m1(w)·s_w) + bias in fp32, returned in x's dtype.

    Without an input_global_scale (NVFP4A16): y = x·dequant(W)ᵀ + bias."""
    assert x.shape[-1] == w.K, f"x has {x.shape[-1]} columns, the weight expects K={w.K}"
    if not w.quantizes_activations:
        y = x.float() @ dequantize(w).t()
    else:
        codes, s = quantize_activation(x, w.input_global_scale)
        xs = e2m1_decode(codes) * s.float().repeat_interleave(BLOCK, dim=1)
        ws = e2m1_decode(unpack_fp4(w.packed)) * w.block_scale.float().repeat_interleave(BLOCK, dim=1)
        alpha = 1.0 / (w.input_global_scale.float().reshape(()) * w.global_scale.float().reshape(()))
        y = (xs @ ws.t()) * alpha
    if w.bias is not None:
        y = y + w.bias.float()
    return y.to(x.dtype)


# ---------------------------------------------------------------------------------------
# Triton templates "nvfp4_emulated" and "nvfp4_w4a4"


@triton.jit
def _e2m1_mag(c):
    """Magnitude code 0..7 -> fp32 value in {0, .5, 1, 1.5, 2, 3, 4, 6}."""
    e = c >> 1
    m = (c & 1).to(tl.float32)
    pw = tl.where(e == 1, 1.0, tl.where(e == 2, 2.0, 4.0))
    return tl.where(e == 0, 0.5 * m, pw * (1.0 + 0.5 * m))


@triton.jit
def _e2m1_code(xq):
    """fp32 in [-6, 6] -> magnitude code 0..7, nearest, ties to the even code (the reference's thresholds)."""
    a = tl.abs(xq)
    c = (a > 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32) + (a > 1.25).to(tl.int32) \
        + (a >= 1.75).to(tl.int32) + (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32) + (a > 5.0).to(tl.int32)
    return c


@triton.jit
def _act_quant_kernel(x_ptr, gx_ptr, val_ptr, code_ptr, sc_ptr, K, stride_xm,
                      PACKED: tl.constexpr, BLOCKS: tl.constexpr):
    """Per row, per 16 columns: s = e4m3(gx · (amax/6 in x's dtype)) (0 -> 0.125),
    xq = clamp(x / (s/gx), ±6) -> e2m1. PACKED=False writes e2m1·s in fp16 (the
    emulation's operand); PACKED=True writes packed codes and the e4m3 scales (dot_scaled's)."""
    row = tl.program_id(0).to(tl.int64)
    ob = tl.program_id(1) * BLOCKS + tl.arange(0, BLOCKS)
    j = tl.arange(0, 8)
    nb = K // 16
    bmask = ob[:, None] < nb
    col_e = ob[:, None] * 16 + 2 * j[None, :]           # even columns (low nibbles)
    xrow = x_ptr + row * stride_xm
    xe = tl.load(xrow + col_e, mask=bmask, other=0.0)
    xo = tl.load(xrow + col_e + 1, mask=bmask, other=0.0)
    xe32 = xe.to(tl.float32)
    xo32 = xo.to(tl.float32)
    # A block holding a NaN gets a NaN scale (code 0x7F), codes 0 and, in the emulation, NaN
    # values, as the reference: the amax keeps the NaN (common.abs_bits) and the clamps
    # propagate it, where a float max would drop it and leave a finite, wrong block.
    amax = tl.maximum(tl.max(common.abs_bits(xe), axis=1), tl.max(common.abs_bits(xo), axis=1)).to(tl.float32, bitcast=True)
    amax6 = tl.div_rn(amax, 6.0).to(x_ptr.dtype.element_ty).to(tl.float32)
    gx = tl.load(gx_ptr).to(tl.float32)
    sv = common.clamp_keep_nan(gx * amax6, 448.0)
    scode = common.e4m3_encode(sv).to(tl.int32)   # a NaN's code is 0x7F, which decodes as NaN
    s = common.e4m3_decode(scode)
    scode = tl.where(s == 0.0, 0x20, scode).to(tl.uint8)   # 0x20 is e4m3 0.125
    s = tl.where(s == 0.0, 0.125, s)
    eff = tl.div_rn(s, gx)
    qe = common.clamp_keep_nan(tl.div_rn(xe32, eff[:, None]), 6.0)
    qo = common.clamp_keep_nan(tl.div_rn(xo32, eff[:, None]), 6.0)
    ce = _e2m1_code(qe)
    co = _e2m1_code(qo)
    if PACKED:
        ce = ce | ((qe < 0).to(tl.int32) << 3)
        co = co | ((qo < 0).to(tl.int32) << 3)
        tl.store(code_ptr + row * (K // 2) + ob[:, None] * 8 + j[None, :], (ce | (co << 4)).to(tl.uint8), mask=bmask)
        tl.store(sc_ptr + row * nb + ob, scode, mask=ob < nb)
    else:
        ve = _e2m1_mag(ce) * s[:, None]
        vo = _e2m1_mag(co) * s[:, None]
        ve = tl.where(qe < 0, -ve, ve)
        vo = tl.where(qo < 0, -vo, vo)
        vrow = val_ptr + row * K
        tl.store(vrow + col_e, ve.to(tl.float16), mask=bmask)
        tl.store(vrow + col_e + 1, vo.to(tl.float16), mask=bmask)


def _quantize(x: torch.Tensor, gx: torch.Tensor, packed: bool):
    M, K = x.shape
    blocks = min(64, common.next_pow2(K // BLOCK))
    grid = (M, common.cdiv(K // BLOCK, blocks))
    if packed:
        codes = torch.empty((M, K // 2), dtype=torch.uint8, device=x.device)
        sc = torch.empty((M, K // BLOCK), dtype=torch.float8_e4m3fn, device=x.device)
        _act_quant_kernel[grid](x, gx, codes, codes, sc.view(torch.uint8), K, x.stride(0), PACKED=True, BLOCKS=blocks)
        return codes, sc
    vals = torch.empty((M, K), dtype=torch.float16, device=x.device)
    _act_quant_kernel[grid](x, gx, vals, vals, vals, K, x.stride(0), PACKED=False, BLOCKS=blocks)
    return vals


def quantize_activation_triton(x: torch.Tensor, input_global_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton twin of quantize_activation: (codes uint8 [M, K], scales e4m3 [M, K/16])."""
    codes, sc = _quantize(x, input_global_scale.reshape(1).float(), packed=True)
    return unpack_fp4(codes), sc


def dequantized_activation_triton(x: torch.Tensor, input_global_scale: torch.Tensor) -> torch.Tensor:
    """e2m1(codes) · s_x per element, fp16 (exact): the emulation GEMM's left operand."""
    return _quantize(x, input_global_scale.reshape(1).float(), packed=False)


@triton.jit
def _emulated_kernel(a_ptr, q_ptr, bs_ptr, gw_ptr, alpha_ptr, y_ptr, ws_ptr, bias_ptr, M, N, K, K2, K16, stride_am,
                     stride_ym, K_SPLIT, A16: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid_k, offs_m, offs_n, rm, rn = common.tile_setup(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    shifts = (tl.arange(0, 2) * 4)[None, :, None]
    if A16:
        inv_gw = tl.div_rn(1.0, tl.load(gw_ptr).to(tl.float32))
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        offs_p = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        offs_s = k0 // 16 + tl.arange(0, BLOCK_K // 16)
        a_ptrs = a_ptr + rm[:, None] * stride_am + offs_k[None, :]
        q_ptrs = q_ptr + rn[None, :] * K2 + offs_p[:, None]
        s_ptrs = bs_ptr + rn[None, :] * K16 + offs_s[:, None]
        if EVEN_K:
            a = tl.load(a_ptrs)
            byt = tl.load(q_ptrs)
            sc = tl.load(s_ptrs)
        else:
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_hi, other=0.0)
            byt = tl.load(q_ptrs, mask=offs_p[:, None] < k_hi // 2, other=0)
            sc = tl.load(s_ptrs, mask=offs_s[:, None] < k_hi // 16, other=0)
        c = (byt.to(tl.int32)[:, None, :] >> shifts) & 0xF            # [BK/2, 2, BN]
        c = tl.reshape(c, (BLOCK_K, BLOCK_N))                          # k = 2·byte + nibble
        v = _e2m1_mag(c & 7)
        v = tl.where((c & 8) != 0, -v, v)
        s = common.e4m3_decode(sc)                                     # [BK/16, BN]
        s = tl.reshape(tl.broadcast_to(s[:, None, :], (BLOCK_K // 16, 16, BLOCK_N)), (BLOCK_K, BLOCK_N))
        if A16:
            # NVFP4A16: W = e2m1 · (s / gw) in fp32, x unquantized; fp32 products, IEEE.
            b = v * (s * inv_gw)
            acc = tl.dot(a.to(tl.float32), b, acc, input_precision="ieee")
        else:
            b = (v * s).to(tl.float16)                                 # exact: ≤ 6 significant bits
            acc = tl.dot(a, b, acc)
    common.store_or_stash(acc, y_ptr, ws_ptr, ws_ptr, pid_k, offs_m, offs_n, M, N, stride_ym,
                          bias_ptr, bias_ptr, bias_ptr, alpha_ptr, SPLIT_K, HAS_BIAS, False, False, not A16, False)


def _check(x: torch.Tensor, w: Nvfp4Weight, tile: dict) -> torch.Tensor:
    """The launchers' checks; x returned with unit column stride."""
    common.check_tile(tile)
    assert w.packed.is_contiguous() and w.block_scale.is_contiguous(), "packed and block_scale must be contiguous"
    assert tile["BLOCK_K"] % 32 == 0, f"BLOCK_K={tile['BLOCK_K']} must be a multiple of 32"
    return common.check_activation(x, w.K, w.packed.device, "nvfp4")


def _alpha(w: Nvfp4Weight) -> torch.Tensor:
    # The reference's fp32 arithmetic, in torch, so the rounding is the same.
    return (1.0 / (w.input_global_scale.float().reshape(1) * w.global_scale.float().reshape(1))).contiguous()


def launch_emulated(x: torch.Tensor, w: Nvfp4Weight, tile: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    """The explicit NVFP4 emulation: reference numerics on any Triton device."""
    x = _check(x, w, tile)
    M, K = x.shape
    N = w.N
    y = common.output(x, N, out)
    a16 = not w.quantizes_activations
    a = x if a16 else dequantized_activation_triton(x, w.input_global_scale)
    alpha = w.global_scale.float().reshape(1) if a16 else _alpha(w)
    gw = w.global_scale.float().reshape(1)
    k_split, split = common.split_plan(K, tile)
    ws = common.workspace(split, y)
    bias = w.bias if w.bias is not None else y
    bm, bn, bk = tile["BLOCK_M"], tile["BLOCK_N"], tile["BLOCK_K"]
    grid = (common.cdiv(M, bm) * common.cdiv(N, bn), split)
    _emulated_kernel[grid](a, w.packed, w.block_scale.view(torch.uint8), gw, alpha, y, ws, bias, M, N, K, K // 2, K // 16,
                           a.stride(0), y.stride(0), k_split, A16=a16, HAS_BIAS=w.bias is not None,
                           EVEN_K=K % bk == 0, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                           SPLIT_K=split, GROUP_M=tile.get("GROUP_M", 8),
                           num_warps=tile["num_warps"], num_stages=tile["num_stages"])
    if split > 1:
        common.reduce_splits(ws, y, split, M, N, w.bias, None, None, None if a16 else alpha)
    return y


@triton.jit
def _w4a4_kernel(xc_ptr, xs_ptr, q_ptr, bs_ptr, alpha_ptr, y_ptr, ws_ptr, bias_ptr, M, N, K, K2, K16, stride_ym, K_SPLIT,
                 HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr):
    """FP4 tensor cores: tl.dot_scaled(e2m1 [BM, BK/2] packed along K, e4m3 scales [BM, BK/16];
    e2m1 [BK/2, BN] packed along K, e4m3 scales [BN, BK/16]). Needs K % BLOCK_K == 0 (the launcher
    checks) and K_SPLIT % BLOCK_K == 0. Not yet run on a Blackwell GPU (the only device measured
    is the sm_90 H200). Scales are float8e4nv tensors [rows, BLOCK_K/16]: Triton up to 3.6 deduces
    the NVFP4 group (16) from the e4m3 scale dtype, later releases from the scale shape
    (triton-lang/triton#9561); both read these operands as NVFP4."""
    pid_k, offs_m, offs_n, rm, rn = common.tile_setup(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_p = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        offs_s = k0 // 16 + tl.arange(0, BLOCK_K // 16)
        a = tl.load(xc_ptr + rm[:, None] * K2 + offs_p[None, :])
        a_s = tl.load(xs_ptr + rm[:, None] * K16 + offs_s[None, :])
        b = tl.load(q_ptr + rn[None, :] * K2 + offs_p[:, None])
        b_s = tl.load(bs_ptr + rn[:, None] * K16 + offs_s[None, :])
        acc = tl.dot_scaled(a, a_s, "e2m1", b, b_s, "e2m1", acc)
    common.store_or_stash(acc, y_ptr, ws_ptr, ws_ptr, pid_k, offs_m, offs_n, M, N, stride_ym,
                          bias_ptr, bias_ptr, bias_ptr, alpha_ptr, SPLIT_K, HAS_BIAS, False, False, True, False)


def fp4_tensor_cores(device: torch.device) -> bool:
    """FP4 tensor cores, which tl.dot_scaled on e2m1 needs: NVIDIA compute capability 10.x / 12.x."""
    f = common.device_features(torch.device(device))
    return f.nvidia and f.capability[0] in (10, 12)


def launch_w4a4(x: torch.Tensor, w: Nvfp4Weight, tile: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    """NVFP4 W4A4 on FP4 tensor cores (compute capability 10.x / 12.x)."""
    x = _check(x, w, tile)
    if not w.quantizes_activations:
        raise ValueError("nvfp4_w4a4 needs input_global_scale (W4A4); NVFP4A16 packages run nvfp4_emulated")
    if not fp4_tensor_cores(x.device):
        raise RuntimeError("nvfp4_w4a4 needs FP4 tensor cores (NVIDIA compute capability 10.x or 12.x)")
    M, K = x.shape
    N = w.N
    bk = tile["BLOCK_K"]
    k_split, split = common.split_plan(K, tile)
    assert K % bk == 0, f"nvfp4_w4a4 needs K={K} to be a multiple of BLOCK_K={bk}"
    y = common.output(x, N, out)
    codes, sc = _quantize(x.contiguous(), w.input_global_scale.reshape(1).float(), packed=True)
    alpha = _alpha(w)
    ws = common.workspace(split, y)
    bias = w.bias if w.bias is not None else y
    grid = (common.cdiv(M, tile["BLOCK_M"]) * common.cdiv(N, tile["BLOCK_N"]), split)
    _w4a4_kernel[grid](codes, sc, w.packed, w.block_scale, alpha, y, ws, bias, M, N, K, K // 2, K // 16, y.stride(0), k_split,
                       HAS_BIAS=w.bias is not None, BLOCK_M=tile["BLOCK_M"], BLOCK_N=tile["BLOCK_N"], BLOCK_K=bk,
                       SPLIT_K=split, GROUP_M=tile.get("GROUP_M", 8),
                       num_warps=tile["num_warps"], num_stages=tile["num_stages"])
    if split > 1:
        common.reduce_splits(ws, y, split, M, N, w.bias, None, None, alpha)
    return y


def problem(w: Nvfp4Weight, M: int, act_dtype: torch.dtype) -> Problem:
    """The Problem of a call; M is the row bucket (vsr.autotune.buckets.bucket_for)."""
    return Problem(N=w.N, K=w.K, bucket=M, act_dtype=act_dtype, params=w.params())


def _bks(K: int) -> tuple[int, ...]:
    return tuple(b for b in (64, 128, 256) if K % b == 0) or (32,)


def default_tile(p: Problem) -> dict:
    a16 = p.param("act") == "none"
    t = gemm_tiles.default_gemm_tile(p.bucket, p.N, p.K, 4 if a16 else 2, 0.5625, tma=False)
    bks = [b for b in _bks(p.K) if b <= t["BLOCK_K"]] or [32]
    t["BLOCK_K"] = max(bks)
    return t


def search_space(p: Problem) -> list[dict]:
    a16 = p.param("act") == "none"
    return gemm_tiles.gemm_space(p.bucket, p.N, p.K, 4 if a16 else 2, 0.5625, default_tile(p), bk_choices=_bks(p.K),
                             tma=False)


def default_tile_w4a4(p: Problem) -> dict:
    t = gemm_tiles.default_gemm_tile(p.bucket, p.N, p.K, 0.5625, 0.5625, tma=False)
    t["BLOCK_K"] = max(b for b in (64, 128, 256) if p.K % b == 0) if p.K % 64 == 0 else 32
    return t


def search_space_w4a4(p: Problem) -> list[dict]:
    return gemm_tiles.gemm_space(p.bucket, p.N, p.K, 0.5625, 0.5625, default_tile_w4a4(p),
                             bk_choices=tuple(b for b in (64, 128, 256) if p.K % b == 0), tma=False)


TEMPLATE_EMULATED = common.KernelTemplate(name="nvfp4_emulated", module=sys.modules[__name__],
                                          search_space=search_space,
                             default_tile=default_tile, launch=launch_emulated, reference=reference_linear,
                             problem=problem, pick_group=gemm_tiles.pick_group, deps=(sys.modules["vsr.kernels.fp8"],))
TEMPLATE_W4A4 = common.KernelTemplate(name="nvfp4_w4a4", module=sys.modules[__name__],
                                      search_space=search_space_w4a4,
                         default_tile=default_tile_w4a4, launch=launch_w4a4, reference=reference_linear,
                         problem=problem, pick_group=gemm_tiles.pick_group, deps=(sys.modules["vsr.kernels.fp8"],))
