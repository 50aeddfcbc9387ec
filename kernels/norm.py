"""RMSNorm and LayerNorm with the residual add fused, and optionally FP8 per-token quantization of
the output, as Triton kernels with pure-torch references of the same signature.

    s = x + residual (rounded to x's dtype, as transformers adds) or s = x
    RMSNorm   y = w · s / sqrt(mean(s²) + eps)             (zero_centered: (1 + w) · ...)
    LayerNorm y = w · (s - mean(s)) / sqrt(var(s) + eps) + b   (biased variance)
    gated_rms_norm  y = w · x / sqrt(mean(x²) + eps) · silu(z)  per head of D = len(w) columns
                    (Qwen3.5's Gated DeltaNet output norm, Qwen3_5RMSNormGated; no residual)

Rounding (the references are transformers' modules):
- rms_norm exact: Qwen3RMSNorm: s in fp32, n = s · rsqrt(mean(s²) + eps), n rounded to x's dtype,
  then w · n rounded again. zero_centered (Qwen3.5's RMSNorm): fp32 n · (1 + fp32 w), rounded once.
- layer_norm: torch's layer_norm: statistics and w · (s - mean) · rstd + b in fp32, rounded once.
- gated_rms_norm exact: Qwen3_5RMSNormGated: n in fp32 rounded to x's dtype, w · n rounded (w in
  x's dtype), times silu(z) in fp32 (z's SiLU in fp32), rounded once more. exact=False: all in fp32,
  one rounding. SiLU with libdevice's exp and IEEE division, as torch's CUDA kernel computes it.
- exact=False (the approximate set): the residual sum stays in fp32 for the statistics (s is still
  returned rounded) and rms_norm multiplies by w in fp32 before its one rounding.
The Triton forms differ from the references only by the order of their fp32 sums.

quant_fp8=True also returns (xq, xs): y quantized per row to e4m3 as vsr.kernels.fp8's prologue
does (the same bits as fp8.quantize_activation(y)), xq [T, N] e4m3 and xs [T] in x's dtype,
the layout fp8.launch_product takes. keep_output=False then leaves y unwritten (None in its place),
for a caller that reads only the codes and the sum.

One program per row, the row held in registers (two power-of-two blocks, row_blocks): every row's
result is independent of the others in the batch; no atomics.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from vsr.kernels import common, fp8, pdl
from vsr.kernels.common import LIBDEVICE, silu_f32

# fp32(1/448): torch on CUDA divides a tensor by a Python number as a product with its reciprocal.
_RCP_448 = 0.0022321429569274187
# Elements of a gated norm program: heads of D columns, about this many in all.
_GATED_ELEMS = 1024


@functools.cache
def row_blocks(N: int) -> tuple[int, int, int]:
    """(BLOCK_A, BLOCK_B, warps) covering a row of N columns in registers: the largest power of two
    <= N plus the rest rounded up to a power of two (5120 = 4096 + 1024, 17408 = 16384 + 1024, no
    lane padded), one warp per 512 columns of the first block, 1 to 16."""
    a = 1 << (N.bit_length() - 1)
    b = common.next_pow2(N - a) if N > a else 0
    return a, b, max(1, min(16, a // 512))


@functools.cache
def _quant_flags(device: torch.device, dtype: torch.dtype) -> tuple[bool, bool, bool, float]:
    """(RECIPROCAL, HW_CVT, BF16_RCP, eps of an all-zero row) as fp8.quantize_activation_triton sets them."""
    hw = common.device_features(device).hardware_e4m3
    return device.type == "cuda", hw, dtype == torch.bfloat16, fp8.dtype_eps(dtype)


@triton.jit
def quantize_row_fp8(ya, yb, offs_a, offs_b, N, row, q_ptr, qs_ptr, EPS_Q, BLOCK_B: tl.constexpr,
                     RECIPROCAL: tl.constexpr, HW_CVT: tl.constexpr, BF16_RCP: tl.constexpr):
    """Per-row e4m3 codes and scale of a row held as blocks ya (+ yb) in the activation dtype, with
    fp8._act_quant_kernel's roundings: s = amax / 448 rounded to the dtype (eps for an all-zero
    row, NaN for a row holding a NaN), codes e4m3_rne(y / s) (fp8._quantize_chunk)."""
    ma = offs_a < N
    amax_bits = tl.max(tl.where(ma, common.abs_bits(ya), 0), axis=0)
    if BLOCK_B > 0:
        mb = offs_b < N
        amax_bits = tl.maximum(amax_bits, tl.max(tl.where(mb, common.abs_bits(yb), 0), axis=0))
    amax = amax_bits.to(tl.float32, bitcast=True)
    if RECIPROCAL:
        s = (amax * 0.0022321429569274187).to(ya.dtype).to(tl.float32)
    else:
        s = tl.div_rn(amax, 448.0).to(ya.dtype).to(tl.float32)
    s = tl.where(s == 0.0, EPS_Q, s)
    tl.store(qs_ptr + row, s.to(qs_ptr.dtype.element_ty))
    r = tl.where(s >= 2.350988701644575e-38, tl.div_rn(s * 0.0 + 1.0, s), 0.0)
    fp8._quantize_chunk(ya, s, r, q_ptr + row * N + offs_a, ma, HW_CVT, BF16_RCP)
    if BLOCK_B > 0:
        fp8._quantize_chunk(yb, s, r, q_ptr + row * N + offs_b, mb, HW_CVT, BF16_RCP)


@triton.jit
def _load_sum(x_ptr, r_ptr, stride_x, stride_r, row, offs, mask, HAS_RES: tl.constexpr,
              EXACT: tl.constexpr):
    """One block: (s in fp32, rounded to x's dtype first when EXACT; s in x's dtype)."""
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(r_ptr + row * stride_r + offs, mask=mask, other=0.0)
        sf = x.to(tl.float32) + r.to(tl.float32)
        s = sf.to(x.dtype)
        if EXACT:
            sf = s.to(tl.float32)
        return sf, s
    return x.to(tl.float32), x


@triton.jit
def _norm_kernel(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, s_ptr, q_ptr, qs_ptr, N, INV_N, stride_x, stride_r, eps, EPS_Q,
                 BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, LAYER: tl.constexpr, HAS_RES: tl.constexpr,
                 HAS_BIAS: tl.constexpr, ZERO_CENTERED: tl.constexpr, EXACT: tl.constexpr, QUANT: tl.constexpr,
                 STORE_Y: tl.constexpr,
                 RECIPROCAL: tl.constexpr, HW_CVT: tl.constexpr, BF16_RCP: tl.constexpr,
                 WAIT: tl.constexpr, RELEASE: tl.constexpr):
    """One row: s (stored when HAS_RES), y = norm(s) (RMSNorm, or LayerNorm when LAYER; stored when
    STORE_Y), codes."""
    pdl.begin(WAIT, RELEASE)
    row = tl.program_id(0).to(tl.int64)
    offs_a = tl.arange(0, BLOCK_A)
    ma = offs_a < N
    sa, ra = _load_sum(x_ptr, r_ptr, stride_x, stride_r, row, offs_a, ma, HAS_RES, EXACT)
    if HAS_RES:
        tl.store(s_ptr + row * N + offs_a, ra, mask=ma)
    if BLOCK_B > 0:
        offs_b = BLOCK_A + tl.arange(0, BLOCK_B)
        mb = offs_b < N
        sb, rb = _load_sum(x_ptr, r_ptr, stride_x, stride_r, row, offs_b, mb, HAS_RES, EXACT)
        if HAS_RES:
            tl.store(s_ptr + row * N + offs_b, rb, mask=mb)
    else:
        offs_b = offs_a
        sb = sa
    if LAYER:
        tot = tl.sum(sa, axis=0)
        if BLOCK_B > 0:
            tot += tl.sum(sb, axis=0)
        mean = tot * INV_N
        sa = tl.where(ma, sa - mean, 0.0)
        ss = tl.sum(sa * sa, axis=0)
        if BLOCK_B > 0:
            sb = tl.where(mb, sb - mean, 0.0)
            ss += tl.sum(sb * sb, axis=0)
    else:
        ss = tl.sum(sa * sa, axis=0)
        if BLOCK_B > 0:
            ss += tl.sum(sb * sb, axis=0)
    rstd = tl.math.rsqrt(ss * INV_N + eps)   # torch's mean: the sum times fp32(1/N)
    ya = _scale(sa * rstd, w_ptr, b_ptr, offs_a, ma, x_ptr.dtype.element_ty, LAYER, HAS_BIAS, ZERO_CENTERED, EXACT)
    if STORE_Y:
        tl.store(y_ptr + row * N + offs_a, ya, mask=ma)
    if BLOCK_B > 0:
        yb = _scale(sb * rstd, w_ptr, b_ptr, offs_b, mb, x_ptr.dtype.element_ty, LAYER, HAS_BIAS, ZERO_CENTERED,
                    EXACT)
        if STORE_Y:
            tl.store(y_ptr + row * N + offs_b, yb, mask=mb)
    else:
        yb = ya
    if QUANT:
        quantize_row_fp8(ya, yb, offs_a, offs_b, N, row, q_ptr, qs_ptr, EPS_Q, BLOCK_B, RECIPROCAL, HW_CVT, BF16_RCP)


@triton.jit
def _scale(n, w_ptr, b_ptr, offs, mask, dtype: tl.constexpr, LAYER: tl.constexpr, HAS_BIAS: tl.constexpr,
           ZERO_CENTERED: tl.constexpr, EXACT: tl.constexpr):
    """The normalised fp32 block n times the weight (plus the bias), in the output dtype."""
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if LAYER:
        y = n * w
        if HAS_BIAS:
            y += tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        return y.to(dtype)
    if ZERO_CENTERED:
        return (n * (1.0 + w)).to(dtype)
    if EXACT:
        return (w * n.to(dtype).to(tl.float32)).to(dtype)
    return (n * w).to(dtype)


def _launch(x, residual, weight, bias, eps, layer, zero_centered, exact, quant_fp8, keep_output=True):
    assert x.dim() == 2 and x.stride(1) == 1, "x must be [T, N] with unit column stride"
    check_keep_output(keep_output, quant_fp8)
    T, N = x.shape
    assert weight.shape == (N,) and weight.is_contiguous(), f"weight must be contiguous [{N}]"
    y = torch.empty((T, N), dtype=x.dtype, device=x.device) if keep_output else None
    s = None
    if residual is not None:
        assert residual.shape == (T, N) and residual.stride(1) == 1, "residual must be [T, N], unit column stride"
        s = torch.empty((T, N), dtype=x.dtype, device=x.device)
    xq = xs = None
    if quant_fp8:
        xq = torch.empty((T, N), dtype=fp8.FP8_DTYPE, device=x.device)
        xs = torch.empty((T,), dtype=x.dtype, device=x.device)
    if T:
        a, b, warps = row_blocks(N)
        rcp, hw, bf16_rcp, eps_q = _quant_flags(x.device, x.dtype)
        yp = y if keep_output else x   # (not written without STORE_Y)
        _norm_kernel[(T,)](
            x, x if residual is None else residual, weight, weight if bias is None else bias, yp,
            yp if s is None else s, (xq if hw else xq.view(torch.uint8)) if quant_fp8 else yp,
            xs if quant_fp8 else yp, N, 1.0 / N, x.stride(0), 0 if residual is None else residual.stride(0), eps, eps_q,
            BLOCK_A=a, BLOCK_B=b, LAYER=layer, HAS_RES=residual is not None, HAS_BIAS=bias is not None,
            ZERO_CENTERED=zero_centered, EXACT=exact, QUANT=quant_fp8, STORE_Y=keep_output, RECIPROCAL=rcp, HW_CVT=hw,
            BF16_RCP=bf16_rcp, num_warps=warps, **pdl.options(x.device))
    return (y, s, xq, xs) if quant_fp8 else (y, s)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, residual: torch.Tensor | None = None,
             zero_centered: bool = False, exact: bool = True, quant_fp8: bool = False, keep_output: bool = True):
    """(y, s) = RMSNorm(x + residual) and the sum (None without a residual); with quant_fp8
    (y, s, xq, xs), y None (not written) with keep_output=False. x and residual [T, N] (row-strided
    views allowed); weight [N] in x's dtype."""
    return _launch(x, residual, weight, None, eps, False, zero_centered, exact, quant_fp8, keep_output)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, *,
               residual: torch.Tensor | None = None, exact: bool = True, quant_fp8: bool = False,
               keep_output: bool = True):
    """(y, s) = LayerNorm(x + residual) and the sum (None without a residual); with quant_fp8
    (y, s, xq, xs), y None (not written) with keep_output=False. bias may be None (ModernBERT)."""
    return _launch(x, residual, weight, bias, eps, True, False, exact, quant_fp8, keep_output)


@triton.jit
def _gated_norm_kernel(x_ptr, z_ptr, w_ptr, y_ptr, H, stride_x, stride_z, eps, INV_D, D: tl.constexpr,
                       BLOCK_D: tl.constexpr, HB: tl.constexpr, EXACT: tl.constexpr, LIBDEVICE: tl.constexpr,
                       WAIT: tl.constexpr, RELEASE: tl.constexpr):
    """Row program_id(0), heads [program_id(1) · HB, +HB) of D columns each."""
    pdl.begin(WAIT, RELEASE)
    row = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * HB + tl.arange(0, HB)
    cols = tl.arange(0, BLOCK_D)
    mc = cols < D
    m = (heads < H)[:, None] & mc[None, :]
    offs = heads[:, None] * D + cols[None, :]
    x = tl.load(x_ptr + row * stride_x + offs, mask=m, other=0.0)
    xf = x.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(xf * xf, axis=1) * INV_D + eps)
    n = xf * rstd[:, None]
    w = tl.load(w_ptr + cols, mask=mc, other=0.0).to(tl.float32)[None, :]
    g = silu_f32(tl.load(z_ptr + row * stride_z + offs, mask=m, other=0.0).to(tl.float32), LIBDEVICE)
    if EXACT:
        y = (w * n.to(x.dtype).to(tl.float32)).to(x.dtype).to(tl.float32) * g
    else:
        y = n * w * g
    tl.store(y_ptr + row * (H * D) + offs, y.to(x.dtype), mask=m)


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float, *, exact: bool = True):
    """y [T, H · D] contiguous in x's dtype: RMSNorm of each head of D = len(weight) columns of x
    [T, H · D], times weight (in x's dtype), times silu(z) (z [T, H · D]; row-strided views allowed)."""
    assert x.dim() == 2 and z.shape == x.shape and x.stride(1) == 1 and z.stride(1) == 1, \
        "x and z must be [T, H * D] alike, unit column stride"
    D = weight.shape[0]
    assert weight.shape == (D,) and weight.is_contiguous() and x.shape[1] % D == 0, \
        f"weight must be contiguous [D] with D dividing x's {x.shape[1]} columns"
    T, H = x.shape[0], x.shape[1] // D
    y = torch.empty((T, H * D), dtype=x.dtype, device=x.device)
    if T and H:
        bd = triton.next_power_of_2(D)
        hb = max(1, min(triton.next_power_of_2(H), _GATED_ELEMS // bd))
        _gated_norm_kernel[(T, triton.cdiv(H, hb))](
            x, z, weight, y, H, x.stride(0), z.stride(0), eps, 1.0 / D, D=D, BLOCK_D=bd, HB=hb, EXACT=exact,
            LIBDEVICE=LIBDEVICE, num_warps=4, **pdl.options(x.device))
    return y


def check_keep_output(keep_output: bool, quant_fp8: bool) -> None:
    """keep_output=False (the output left unwritten) only where codes are returned instead."""
    if not (keep_output or quant_fp8):
        raise ValueError("keep_output=False is for quant_fp8=True: without codes there is nothing to return")


def _quant_reference(y):
    xq, xs = fp8.quantize_activation(y)
    return xq, xs.reshape(-1)


def reference_out(y, rest: tuple, quant_fp8: bool, keep_output: bool) -> tuple:
    """A reference's return as its kernel's: (y, *rest), with quant_fp8 (y or None, *rest, xq, xs)."""
    check_keep_output(keep_output, quant_fp8)
    return (y if keep_output else None, *rest) + _quant_reference(y) if quant_fp8 else (y, *rest)


def rms_norm_reference(x, weight, eps, *, residual=None, zero_centered=False, exact=True, quant_fp8=False,
                       keep_output=True):
    """transformers' Qwen3RMSNorm (zero_centered: Qwen3.5's) on x + residual, as rms_norm."""
    s = x if residual is None else x + residual
    sf = s.float() if exact or residual is None else x.float() + residual.float()
    n = sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps)
    if zero_centered:
        y = (n * (1.0 + weight.float())).to(x.dtype)
    elif exact:
        y = (weight * n.to(x.dtype)).to(x.dtype)
    else:
        y = (n * weight.float()).to(x.dtype)
    return reference_out(y, (None if residual is None else s,), quant_fp8, keep_output)


def layer_norm_reference(x, weight, bias, eps, *, residual=None, exact=True, quant_fp8=False, keep_output=True):
    """torch's layer_norm (BERT's LayerNorm) on x + residual, as layer_norm."""
    s = x if residual is None else x + residual
    if exact or residual is None:
        y = torch.nn.functional.layer_norm(s, (s.shape[-1],), weight, bias, eps)
    else:
        sf = x.float() + residual.float()
        y = torch.nn.functional.layer_norm(sf, (s.shape[-1],), weight.float(),
                                           None if bias is None else bias.float(), eps).to(x.dtype)
    return reference_out(y, (None if residual is None else s,), quant_fp8, keep_output)


def gated_rms_norm_reference(x, z, weight, eps, *, exact=True):
    """transformers' Qwen3_5RMSNormGated over each head of D = len(weight) columns, as gated_rms_norm."""
    T, D = x.shape[0], weight.shape[0]
    xf = x.reshape(T, -1, D).float()
    n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    g = torch.nn.functional.silu(z.contiguous().reshape(T, -1, D).float())
    y = (weight * n.to(x.dtype)) * g if exact else n * weight.float() * g
    return y.to(x.dtype).reshape(T, -1)
