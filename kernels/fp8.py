"""FP8 W8A8 (compressed-tensors FP8_DYNAMIC): weight layout and pure-torch reference.

Weights: e4m3 [N, K] with one scale per output channel. Activations: e4m3 with one dynamic scale
per row (token), computed as each call runs. FORMATS.md §4.
The Triton template "fp8_w8a8": a prologue kernel quantizes each row of x exactly as
quantize_activation does (the division in x's dtype, then e4m3 round-to-nearest-even), then an
fp8 product with fp32 accumulation applies row scale × channel scale and the bias in its
epilogue: a CUDA-core GEMV for one row, else gemm.py's tensor-core kernels.
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from vsr.kernels import common, gemm, gemm_tiles
from vsr.kernels.template import Problem

FP8_MAX = 448.0
FP8_DTYPE = torch.float8_e4m3fn


def dtype_eps(dtype: torch.dtype) -> float:
    """The replacement for an all-zero row's scale: bf16 2^-7, fp16 2^-10, fp32 2^-23."""
    return torch.finfo(dtype).eps


def e4m3_rne(x: torch.Tensor) -> torch.Tensor:
    """Round to e4m3 nearest-even after clamping to ±448 (torch turns overflow into NaN)."""
    return x.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


@dataclass
class Fp8Weight(common.MatrixWeight):
    """weight e4m3 [N, K]; weight_scale [N] in the model dtype (multiplier); bias [N]."""

    weight: torch.Tensor
    weight_scale: torch.Tensor
    bias: torch.Tensor | None = None

    format = "fp8"

    def __post_init__(self) -> None:
        assert self.weight.dtype == FP8_DTYPE, f"fp8 weight must be float8_e4m3fn, got {self.weight.dtype}"
        assert self.weight_scale.shape == (self.weight.shape[0],), (
            f"weight_scale must be [N]={self.weight.shape[0]}, got {tuple(self.weight_scale.shape)}")

    def params(self) -> tuple[tuple[str, object], ...]:
        return (("act", "e4m3-per-token-dynamic"), ("bits", 8), ("wscale", "per-channel"))

    def to(self, device) -> "Fp8Weight":
        return Fp8Weight(self.weight.to(device), self.weight_scale.to(device),
                         None if self.bias is None else self.bias.to(device))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.weight, self.weight_scale, self.bias) if t is not None)


def dequantize(w: Fp8Weight) -> torch.Tensor:
    """W[n, k] = fp8(weight[n, k]) · weight_scale[n], in fp32."""
    return w.weight.float() * w.weight_scale.float()[:, None]


def quantize_activation(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row dynamic e4m3 quantization in the activation dtype, as compressed-tensors does:
    (xq e4m3 [M, K], scale [M, 1] in x's dtype)."""
    s = x.abs().amax(dim=-1, keepdim=True) / FP8_MAX
    s = torch.where(s == 0, torch.full_like(s, dtype_eps(x.dtype)), s)
    return e4m3_rne(x / s), s


def reference_linear(x: torch.Tensor, w: Fp8Weight) -> torch.Tensor:
    """y = (Σ_k xq·wq) · s_t · weight_scale[n] + bias, accumulated in fp32, in x's dtype."""
    assert x.shape[-1] == w.K, f"x has {x.shape[-1]} columns, the weight expects K={w.K}"
    xq, s = quantize_activation(x)
    acc = xq.float() @ w.weight.float().t()
    y = acc * s.float() * w.weight_scale.float()[None, :]
    if w.bias is not None:
        y = y + w.bias.float()
    return y.to(x.dtype)


# ---------------------------------------------------------------------------------------
# Triton template "fp8_w8a8"


@triton.jit
def _quantize_chunk(v, s, r, xq_ptrs, mask, HW_CVT: tl.constexpr, BF16_RCP: tl.constexpr):
    """Store e4m3_rne(v / s) with the quotient rounded to v's dtype first, as the reference does.
    BF16_RCP (bf16 v): where r > 0 (r = fp32(1/s), s >= 2^-125, so 1/s is finite), the quotient
    is fp32(v · r), one product instead of an IEEE division, and rounded to bf16 it is the
    reference's number. Why: v and s carry 8-bit significands, so v/s is never a bf16 rounding
    midpoint (a midpoint has 9 significant bits: m_v/m_s = odd/2^8 in the binade [1, 2), or
    odd/2^9 in [1/2, 1), would need 2^8 to divide m_s) and lies more than 2^-17 (relative) from
    every one (2^-16.86 at the closest pair, m_v = 233, m_s = 241), while fp32(v · r) and
    torch's fp32(v / s) are both within 2^-23 of v/s: they round to the same bf16 value
    (tests/test_kernels_fp8.py checks every bf16 significand pair). fp16 divides: with 11-bit
    significands the margin is no larger than the error."""
    if BF16_RCP:
        if r > 0.0:
            q = v.to(tl.float32) * r
        else:
            q = tl.div_rn(v.to(tl.float32), s)
    else:
        q = tl.div_rn(v.to(tl.float32), s)
    # Clamped as torch.clamp does: a NaN stays NaN (a NaN row, or inf / inf in an inf row).
    q = q.to(v.dtype).to(tl.float32)
    q = common.clamp_keep_nan(q, 448.0)
    if HW_CVT:  # sm_89+: the hardware convert rounds to nearest even, as torch's cast does, NaN to NaN
        tl.store(xq_ptrs, q.to(tl.float8e4nv), mask=mask)
    else:       # the interpreter's cast rounds wrongly: the integer encoder gives torch's bits (NaN 0x7F)
        tl.store(xq_ptrs, common.e4m3_encode(q), mask=mask)


@triton.jit
def _act_quant_kernel(x_ptr, xq_ptr, s_ptr, K, stride_xm, EPS, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr,
                      CHUNKED: tl.constexpr, RECIPROCAL: tl.constexpr, HW_CVT: tl.constexpr,
                      RELEASE: tl.constexpr, BF16_RCP: tl.constexpr):
    """One program per row (divisions are IEEE round-to-nearest, div_rn, as torch's):
    s = amax/448 (rounded to x's dtype, eps for an all-zero row, NaN for a row holding a NaN, so
    that, as in the reference, the whole row's output is NaN rather than a NaN clamped to 448);
    on CUDA, torch divides a tensor by a Python number as a product with its fp32 reciprocal (at
    times one bit apart), and RECIPROCAL does the same, so the scales equal the reference's bits on
    each device; xq = e4m3_rne(x / s) (_quantize_chunk).
    The row is read once and kept in registers as two power-of-two blocks, columns [0, BLOCK_A)
    and [BLOCK_A, BLOCK_A + BLOCK_B) (K = 17408 is 16384 + 1024, where one block would pad to
    32768). CHUNKED (rows too long for registers): two passes over BLOCK_A-column chunks.
    RELEASE: let the product, launched as this grid's programmatic dependent, start now; it
    waits for this grid's end before it reads xq (common.wait_for_producer)."""
    if RELEASE:
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    xrow = x_ptr + row * stride_xm
    offs_a = tl.arange(0, BLOCK_A)
    if CHUNKED:
        amax_k = tl.zeros((BLOCK_A,), dtype=tl.int32)
        for k0 in range(0, K, BLOCK_A):
            v = tl.load(xrow + k0 + offs_a, mask=k0 + offs_a < K, other=0.0)
            amax_k = tl.maximum(amax_k, common.abs_bits(v))
        amax_bits = tl.max(amax_k, axis=0)
    else:
        va = tl.load(xrow + offs_a, mask=offs_a < K, other=0.0)
        amax_bits = tl.max(common.abs_bits(va), axis=0)
        if BLOCK_B > 0:
            offs_b = BLOCK_A + tl.arange(0, BLOCK_B)
            vb = tl.load(xrow + offs_b, mask=offs_b < K, other=0.0)
            amax_bits = tl.maximum(amax_bits, tl.max(common.abs_bits(vb), axis=0))
    amax = amax_bits.to(tl.float32, bitcast=True)
    if RECIPROCAL:
        s = (amax * 0.0022321429569274187).to(x_ptr.dtype.element_ty).to(tl.float32)  # fp32(1/448), exact
    else:
        s = tl.div_rn(amax, 448.0).to(x_ptr.dtype.element_ty).to(tl.float32)
    s = tl.where(s == 0.0, EPS, s)
    tl.store(s_ptr + row, s.to(s_ptr.dtype.element_ty))
    # 1/s where s >= 2^-125 (a normal number, one binade clear of the subnormals, whose reciprocal,
    # <= 2^125, is finite and normal), else 0: divide instead (the tests cover both branches).
    r = tl.where(s >= 2.350988701644575e-38, tl.div_rn(s * 0.0 + 1.0, s), 0.0)
    if CHUNKED:
        for k0 in range(0, K, BLOCK_A):
            v = tl.load(xrow + k0 + offs_a, mask=k0 + offs_a < K, other=0.0)
            _quantize_chunk(v, s, r, xq_ptr + row * K + k0 + offs_a, k0 + offs_a < K, HW_CVT, BF16_RCP)
    else:
        _quantize_chunk(va, s, r, xq_ptr + row * K + offs_a, offs_a < K, HW_CVT, BF16_RCP)
        if BLOCK_B > 0:
            _quantize_chunk(vb, s, r, xq_ptr + row * K + offs_b, offs_b < K, HW_CVT, BF16_RCP)


# Rows longer than this go through the prologue in two chunked passes instead of in registers.
PROLOGUE_REGISTER_K = 32768


@dataclass(frozen=True)
class ProloguePlan:
    """How _act_quant_kernel covers a row: BLOCK_A (+ BLOCK_B) columns in registers, or CHUNKED
    passes of BLOCK_A columns; with `warps` warps per row."""

    block_a: int
    block_b: int
    chunked: bool
    warps: int


@functools.cache
def prologue_plan(K: int, warps: int | None = None) -> ProloguePlan:
    """The row in registers as the largest power of two <= K plus the rest rounded up to a power
    of two (K = 5120: 4096 + 1024), one warp per 512 columns of the first block (16 columns a
    thread, at most 16 warps) unless `warps` says otherwise; CHUNKED 2048-column passes beyond
    PROLOGUE_REGISTER_K. Any plan gives the same bits: the amax is exact and every element is
    rounded on its own."""
    if K > PROLOGUE_REGISTER_K:
        return ProloguePlan(2048, 0, True, warps or 4)
    a = 1 << (K.bit_length() - 1)
    b = common.next_pow2(K - a) if K > a else 0
    return ProloguePlan(a, b, False, warps or max(1, min(16, a // 512)))


def quantize_activation_triton(x: torch.Tensor, plan: ProloguePlan | None = None,
                               release: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton twin of quantize_activation: (xq e4m3 [M, K], scale [M] in x's dtype), covering each
    row by `plan` (default prologue_plan(K)). `release` (where common.pdl_supported): the next launch
    may be a programmatic dependent."""
    M, K = x.shape
    xq = torch.empty((M, K), dtype=FP8_DTYPE, device=x.device)
    s = torch.empty((M,), dtype=x.dtype, device=x.device)
    p = plan or prologue_plan(K)
    if not p.chunked and p.block_a + p.block_b < K:
        raise ValueError(f"prologue plan {p} covers {p.block_a + p.block_b} of the row's {K} columns")
    hw = common.device_features(x.device).hardware_e4m3
    _act_quant_kernel[(M,)](x, xq if hw else xq.view(torch.uint8), s, K, x.stride(0), dtype_eps(x.dtype),
                            BLOCK_A=p.block_a, BLOCK_B=p.block_b, CHUNKED=p.chunked, RECIPROCAL=x.is_cuda,
                            HW_CVT=hw, RELEASE=release, BF16_RCP=x.dtype == torch.bfloat16, num_warps=p.warps)
    return xq, s


# This template's paths whose tiles may be wide (BLOCK_N2: gemm.tma_gemm_kernel's second block).
WIDE_PATHS = ("tma",)


def launch(x: torch.Tensor, w: Fp8Weight, tile: dict, out: torch.Tensor | None = None, glu: bool = False
           ) -> torch.Tensor:
    """y = fp8_gemm(quant(x), W) · s_x · s_w + b in x's dtype. The prologue's warps and PDL come from
    the tile (tile_prologue); PDL applies only where the device has it. `glu`: W's rows are gate and
    up rows interleaved, y [M, N / 2] = silu(gate) · up (dense.launch)."""
    common.check_tile(tile, WIDE_PATHS)
    x = common.check_activation(x, w.K, w.weight.device, "fp8")
    assert w.weight.dtype == FP8_DTYPE and w.weight.stride(1) == 1, "W must be K-contiguous float8_e4m3fn"
    y = common.output(x, common.glu_width(w.N, glu), out)
    if x.shape[0] == 0:
        return y
    plan, pdl = tile_prologue(tile, w.K)
    pdl = pdl and common.device_features(x.device).pdl
    xq, xs = quantize_activation_triton(x, plan=plan, release=pdl)
    # (launch_tma prefetches only with wait)
    launch_product(xq, xs, w, y, tile, wait=pdl, prefetch=gemm.PDL_PREFETCH_LINES, glu=glu)
    return y


# The prologue's knobs in fp8's tile: PRO_WARPS, the prologue's warps per row (0: the plan's own,
# prologue_plan(K)); PDL (0/1), the product launched as the prologue's programmatic dependent
# (applied only where the device has it). default_tile and search_space set them from the row
# bucket (prologue_defaults), so the cache's tiles carry them; a tile without them runs plain
# (tile_prologue).
# From this row bucket the prologue takes 4 warps a row by default: at M = 4096 it is 4-18% faster
# than the plan's 8-16 on every 27B-class shape.
PROLOGUE_LARGE_BUCKET = 4096
PROLOGUE_LARGE_WARPS = 4
# Few rows on Hopper and newer: the product is launched as the prologue's programmatic dependent,
# asks the L2 for the head of its weight rows, then waits for the prologue in the kernel. On the
# H200 PDL saves 0.2-1.1 us at M = 1-64 on every 27B-class shape and the prefetch another
# 0.4-1.0 us; at M = 256 PDL costs 3-9 us on o and down, so by default it stops at bucket 64.
PDL_MAX_BUCKET = 64
# Where search_space tries the default tile with other prologue warps, and with PDL flipped.
PRO_WARPS_FROM = 1024
PDL_FLIP_BUCKETS = range(128, 257)


def prologue_defaults(bucket: int) -> dict:
    """The prologue knobs (PRO_WARPS, PDL) of a row bucket's default tile; device-independent (PDL
    is applied only where the device has it)."""
    return {"PRO_WARPS": PROLOGUE_LARGE_WARPS if bucket >= PROLOGUE_LARGE_BUCKET else 0,
            "PDL": int(bucket <= PDL_MAX_BUCKET)}


def tile_prologue(tile: dict, K: int) -> tuple[ProloguePlan, bool]:
    """(the prologue plan, whether the product asks to be its programmatic dependent) for rows of
    K columns on `tile`: its PRO_WARPS and PDL. A tile without them runs the plan's own warps, no
    PDL. (The kernels know no row buckets: the tile brings the bucket's choice.)"""
    return prologue_plan(K, tile.get("PRO_WARPS", 0) or None), bool(tile.get("PDL", 0))


def launch_product(xq: torch.Tensor, xs: torch.Tensor, w: Fp8Weight, y: torch.Tensor, tile: dict,
                   wait: bool = False, prefetch: int = 0, glu: bool = False) -> None:
    """y = (xq · Wᵀ) · s_x · s_w + b: the product after the activation prologue, on the tile's
    path; `wait`, `prefetch`: launched as the prologue's programmatic dependent (gemm.launch_tma);
    `glu`: SwiGLU of interleaved gate and up rows in the epilogue, after the scales (launch)."""
    path = tile.get("path")
    if path in gemm.TMA_PATHS:
        gemm.launch_tma(xq, w.weight, y, tile, bias=w.bias, rs=xs, cs=w.weight_scale, owner=w, wait=wait,
                        prefetch=prefetch, glu=glu)
    elif path == "gemv":
        gemm.launch_gemv(xq, w.weight, y, tile, bias=w.bias, rs=xs, cs=w.weight_scale, wait=wait, glu=glu)
    else:
        gemm.launch_tiled(xq, w.weight, y, tile, bias=w.bias, rs=xs, cs=w.weight_scale, wait=wait, glu=glu)


def problem(w: Fp8Weight, M: int, act_dtype: torch.dtype) -> Problem:
    """The Problem of a call; M is the row bucket (vsr.autotune.buckets.bucket_for)."""
    return Problem(N=w.N, K=w.K, bucket=M, act_dtype=act_dtype, params=w.params())


def default_tile(p: Problem) -> dict:
    """The product's default tile (_default_product_tile) with the bucket's prologue knobs."""
    return dict(_default_product_tile(p), **prologue_defaults(p.bucket))


def _default_product_tile(p: Problem) -> dict:
    t = gemm_tiles.default_gemm_tile(p.bucket, p.N, p.K, 1, 1)
    if p.bucket == 1 and t["path"] != "tma-swap":
        # The GEMV (8 rows x 512 columns per step, 3 stages) beats the split-K tile on every
        # 27B-class shape; where the strides allow, the transposed TMA product is the default.
        return gemm_tiles.gemv_tiles(p.K, 1)[0]
    if p.bucket <= 16 and t["path"] == "splitk":  # fp8 rows are half as wide: a longer K step keeps the same bytes in flight
        t["BLOCK_K"] = 256
        t["SPLIT_K"] = gemm_tiles._split_for(p.bucket, p.N, p.K, 16, 64, 256, 16, waves=8)
    if p.act_dtype == torch.float32:
        t = _fit_fp32_epilogue(t)
    return t


def _fp32_epilogue_fits(t: dict) -> bool:
    """Whether a tile's TMA pipeline and its fp32 output tile fit the shared memory together. fp32
    activations give an fp32 output, which the TMA kernels' epilogue stages whole in shared memory
    beside the pipeline: the bucket 1024-2048 default, 128 x 256 x 128 at 4 stages, asks 327,712
    bytes on sm_90 (Triton 3.6 and 3.9; benchmarks/sm90_fit.py), where the H200 gives a block
    232,448. The model, pipeline (smem_bytes) + BLOCK_M x width x 4, is within 32 bytes of what
    Triton allocates for these tiles."""
    return (t["path"] not in gemm.TMA_PATHS or gemm_tiles.smem_bytes(t, 1, 1)
            + t["BLOCK_M"] * (t["BLOCK_N"] + t.get("BLOCK_N2", 0)) * 4 <= gemm_tiles.SMEM_LIMIT)


def _fit_fp32_epilogue(t: dict) -> dict:
    """The tile with its K step halved until it fits beside its fp32 output (_fp32_epilogue_fits)."""
    while not _fp32_epilogue_fits(t) and t["BLOCK_K"] > 32:
        t = dict(t, BLOCK_K=t["BLOCK_K"] // 2)   # (not below 32: an fp8 tl.dot needs K >= 32 on sm_90)
    return t


def search_space(p: Problem) -> list[dict]:
    """The product tiles (gemm_tiles.gemm_space; the GEMV at one row), each with the bucket's prologue
    knobs, default first (with fp32 activations only those that fit beside their fp32 output); then
    the default with other prologue knobs (_prologue_variants). Those come last: the tuner's short
    sweeps spread each path's share of picks from its first tile to its last, so the last variant
    is timed by any sweep giving the default's path two or more picks."""
    base = _default_product_tile(p)
    space = gemm_tiles.gemm_space(p.bucket, p.N, p.K, 1, 1, base, bk_choices=(64, 128, 256))
    if p.act_dtype == torch.float32:   # gemm_space's shared-memory bound leaves the fp32 output out
        space = space[:1] + [t for t in space[1:] if _fp32_epilogue_fits(t)]
    if p.bucket == 1:
        gemv = [t for t in gemm_tiles.gemv_tiles(p.K, 1) if t != base]
        space = space[:1] + gemv[:1] + space[1:12] + gemv[1:] + space[12:36]
    knobs = prologue_defaults(p.bucket)
    return [dict(t, **knobs) for t in space] + _prologue_variants(p, dict(base, **knobs))


def _prologue_variants(p: Problem, d: dict) -> list[dict]:
    """The default tile d with other prologue knobs: from bucket PRO_WARPS_FROM other warps per row
    (the plan's own, 8, then 4, each number of warps once), and for PDL_FLIP_BUCKETS PDL flipped."""
    out = []
    if p.bucket >= PRO_WARPS_FROM:
        by_warps: dict[int, int] = {}
        for w in (0, 8, 4):   # an explicit number replaces 0 where the plan's own is the same
            by_warps[prologue_plan(p.K, w or None).warps] = w
        by_warps.pop(prologue_plan(p.K, d["PRO_WARPS"] or None).warps, None)
        out += [dict(d, PRO_WARPS=w) for w in by_warps.values()]
    if p.bucket in PDL_FLIP_BUCKETS:
        out.append(dict(d, PDL=1 - d["PDL"]))
    return out


TEMPLATE = common.KernelTemplate(name="fp8_w8a8", module=sys.modules[__name__], search_space=search_space,
                    default_tile=default_tile, launch=launch, reference=reference_linear, problem=problem,
                    pick_group=gemm_tiles.pick_group)
