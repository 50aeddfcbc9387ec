"""FP8 W8A8 (compressed-tensors FP8_DYNAMIC): weight layout and pure-torch reference.

Weights: e4m3 [N, K] with one scale per output channel. Activations: e4m3 with
one dynamic scale per row (token), computed as each call runs. FORMATS.md §4.
Below the reference: the Triton template "fp8_w8a8": a prologue kernel quantizes each
row of x exactly as quantize_activation does (same roundings: the division in x's
dtype, then e4m3 round-to-nearest-even), then an fp8 product with fp32 accumulation
applies row scale × channel scale and the bias in its epilogue: a CUDA-core GEMV for one
row, else common.py's tensor-core kernels (shared with the dense template).
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from vsr.kernels import common
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
class Fp8Weight:
    """weight e4m3 [N, K]; weight_scale [N] in the model dtype (multiplier); bias [N]."""

    weight: torch.Tensor
    weight_scale: torch.Tensor
    bias: torch.Tensor | None = None

    format = "fp8"

    def __post_init__(self) -> None:
        assert self.weight.dtype == FP8_DTYPE, f"fp8 weight must be float8_e4m3fn, got {self.weight.dtype}"
        assert self.weight_scale.shape == (self.weight.shape[0],), (
            f"weight_scale must be [N]={self.weight.shape[0]}, got {tuple(self.weight_scale.shape)}")

    @property
    def N(self) -> int:
        return self.weight.shape[0]

    @property
    def K(self) -> int:
        return self.weight.shape[1]

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
    """Per-row dynamic e4m3 quantization in the activation dtype, as the reference library does.

    Returns (xq e4m3 [M, K], scale [M, 1] in x's dtype).
    """
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
def _row_amax(xrow, K, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, CHUNKED: tl.constexpr):
    """(amax of |x| over the row's K columns, block A, block B): the row read once into two
    power-of-two register blocks, columns [0, BLOCK_A) and [BLOCK_A, BLOCK_A + BLOCK_B) (K = 17408
    is 16384 + 1024: no lane padded, where one block would pad to 32768); CHUNKED (rows too long
    for registers): one pass over BLOCK_A-column chunks, and the blocks returned are empty."""
    offs_a = tl.arange(0, BLOCK_A)
    if CHUNKED:
        amax_k = tl.zeros((BLOCK_A,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_A):
            v = tl.load(xrow + k0 + offs_a, mask=k0 + offs_a < K, other=0.0)
            amax_k = tl.maximum(amax_k, tl.abs(v.to(tl.float32)))
        return tl.max(amax_k, axis=0), amax_k, amax_k
    va = tl.load(xrow + offs_a, mask=offs_a < K, other=0.0)
    amax = tl.max(tl.abs(va.to(tl.float32)), axis=0)
    vb = va
    if BLOCK_B > 0:
        offs_b = BLOCK_A + tl.arange(0, BLOCK_B)
        vb = tl.load(xrow + offs_b, mask=offs_b < K, other=0.0)
        amax = tl.maximum(amax, tl.max(tl.abs(vb.to(tl.float32)), axis=0))
    return amax, va, vb


@triton.jit
def _row_scale(amax, EPS, X_DTYPE: tl.constexpr, RECIPROCAL: tl.constexpr):
    """s = amax/448 rounded to x's dtype (division IEEE round-to-nearest, div_rn, as torch's), EPS
    for an all-zero row; on CUDA, torch divides a tensor by a Python number as a product with its
    fp32 reciprocal (one bit apart at times, seen on the H200), and RECIPROCAL does the same, so
    the scales equal the reference's bits on each device."""
    if RECIPROCAL:
        s = (amax * 0.0022321429569274187).to(X_DTYPE).to(tl.float32)  # fp32(1/448), exact
    else:
        s = tl.div_rn(amax, 448.0).to(X_DTYPE).to(tl.float32)
    return tl.where(s == 0.0, EPS, s)


@triton.jit
def _e4m3_codes(v, s, HW_CVT: tl.constexpr):
    """e4m3_rne(v / s) as e4m3 codes (uint8), the quotient rounded to v's dtype first, as the
    reference does."""
    q = tl.div_rn(v.to(tl.float32), s).to(v.dtype).to(tl.float32)
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)
    if HW_CVT:  # sm_89+: the hardware convert rounds to nearest even, as torch's cast does
        return q.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    return common.e4m3_encode(q)   # the interpreter's cast rounds wrongly: the integer encoder gives torch's bits


@triton.jit
def _act_quant_kernel(x_ptr, xq_ptr, s_ptr, K, stride_xm, EPS, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr,
                      CHUNKED: tl.constexpr, RECIPROCAL: tl.constexpr, HW_CVT: tl.constexpr,
                      RELEASE: tl.constexpr):
    """One program per row: s (_row_scale of the row's amax), then xq = e4m3_rne(x / s) as codes
    (xq_ptr is uint8). CHUNKED: the second pass reads the row again, from L2.
    RELEASE: let the product, launched as this grid's programmatic dependent, start now; it
    waits for this grid's end before it reads xq (common.wait_for_producer)."""
    if RELEASE:
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    xrow = x_ptr + row * stride_xm
    amax, va, vb = _row_amax(xrow, K, BLOCK_A, BLOCK_B, CHUNKED)
    s = _row_scale(amax, EPS, x_ptr.dtype.element_ty, RECIPROCAL)
    tl.store(s_ptr + row, s.to(s_ptr.dtype.element_ty))
    offs_a = tl.arange(0, BLOCK_A)
    if CHUNKED:
        for k0 in range(0, K, BLOCK_A):
            v = tl.load(xrow + k0 + offs_a, mask=k0 + offs_a < K, other=0.0)
            tl.store(xq_ptr + row * K + k0 + offs_a, _e4m3_codes(v, s, HW_CVT), mask=k0 + offs_a < K)
    else:
        tl.store(xq_ptr + row * K + offs_a, _e4m3_codes(va, s, HW_CVT), mask=offs_a < K)
        if BLOCK_B > 0:
            offs_b = BLOCK_A + tl.arange(0, BLOCK_B)
            tl.store(xq_ptr + row * K + offs_b, _e4m3_codes(vb, s, HW_CVT), mask=offs_b < K)


@triton.jit
def _one_row_kernel(x_ptr, x_desc, w_desc, w_ptr, stride_wn, y_ptr, bias_ptr, cs_ptr, N, K, EPS,
                    HAS_BIAS: tl.constexpr, RECIPROCAL: tl.constexpr, HW_CVT: tl.constexpr,
                    BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, CHUNKED: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr, LINE_COLS: tl.constexpr):
    """One row ("tma-swap-q"): the quantization inside the transposed TMA product, no prologue
    kernel. Each program asks the L2 for the head of its weight rows, takes the row's scale
    (the row read once into registers, as the prologue reads it), then per step quantizes the
    row's BLOCK_K columns (fetched by TMA, zero past K) and places them in row 0 of the MMA's
    16-wide side, the other 15 rows zero codes: acc[BN, 16] = W_tile · xq_tileᵀ, row scale ·
    channel scale + bias in the epilogue. Only one row is ever divided, not the 16 of the tile
    (run 9's fused kernel quantized every tile row of every program and lost)."""
    off_n = tl.program_id(0) * BLOCK_N
    if PREFETCH > 0:
        common.prefetch_weight_rows(w_ptr, stride_wn, off_n, 0, N, K, BLOCK_N, PREFETCH, LINE_COLS)
    amax, va, vb = _row_amax(x_ptr, K, BLOCK_A, BLOCK_B, CHUNKED)
    s = _row_scale(amax, EPS, x_ptr.dtype.element_ty, RECIPROCAL)
    first = tl.arange(0, 16)[:, None] == 0
    acc = tl.zeros((BLOCK_N, 16), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        codes = _e4m3_codes(x_desc.load([0, k0]), s, HW_CVT)                     # [1, BK]
        xt = tl.where(first, codes, 0).to(tl.float8e4nv, bitcast=True)           # [16, BK]
        acc = tl.dot(w_desc.load([off_n, k0]), xt.T, acc)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    yv = tl.sum(tl.where(first.T, acc, 0.0), axis=1)[None, :] * s   # row 0: the row scale first, as the reference
    zero = tl.zeros((1,), dtype=tl.int32)
    yv = common.epilogue(yv, zero, offs_n, 1, N, bias_ptr, bias_ptr, cs_ptr, bias_ptr, HAS_BIAS, False, True, False)
    tl.store(y_ptr + offs_n[None, :], yv.to(y_ptr.dtype.element_ty), mask=offs_n[None, :] < N)


def _hardware_e4m3(dev: torch.device) -> bool:
    """NVIDIA sm_89+ converts fp32 -> e4m3 in hardware (round to nearest even, as torch's cast)."""
    return common.nvidia(dev) and common.capability(dev) >= (8, 9)


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
    thread, at most 16 warps: H200 run 15, 8-16 warps beat 4 at every M but K = 5120 at M = 4096,
    where 16 lost 20%); CHUNKED 2048-column passes
    beyond PROLOGUE_REGISTER_K. (Any plan gives the same bits: the amax is exact and every
    element is rounded on its own.)"""
    if K > PROLOGUE_REGISTER_K:
        return ProloguePlan(2048, 0, True, warps or 4)
    a = 1 << (K.bit_length() - 1)
    b = common.next_pow2(K - a) if K > a else 0
    return ProloguePlan(a, b, False, warps or max(1, min(16, a // 512)))


def quantize_activation_triton(x: torch.Tensor, plan: ProloguePlan | None = None,
                               release: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton twin of quantize_activation: (xq e4m3 [M, K], scale [M] in x's dtype).
    `release` (where common.pdl_supported): the next launch may be a programmatic dependent."""
    M, K = x.shape
    xq = torch.empty((M, K), dtype=FP8_DTYPE, device=x.device)
    s = torch.empty((M,), dtype=x.dtype, device=x.device)
    p = plan or prologue_plan(K)
    _act_quant_kernel[(M,)](x, xq.view(torch.uint8), s, K, x.stride(0), dtype_eps(x.dtype),
                            BLOCK_A=p.block_a, BLOCK_B=p.block_b, CHUNKED=p.chunked, RECIPROCAL=x.is_cuda,
                            HW_CVT=_hardware_e4m3(x.device), RELEASE=release, num_warps=p.warps)
    return xq, s


def launch(x: torch.Tensor, w: Fp8Weight, tile: dict, out: torch.Tensor | None = None, *,
           plan: ProloguePlan | None = None, pdl: bool | None = None, prefetch: int | None = None) -> torch.Tensor:
    """y = fp8_gemm(quant(x), W) · s_x · s_w + b in x's dtype: the activation prologue, then the
    product on the tile's path (path ONE_ROW_PATH: both in one kernel). `plan`, `pdl` and
    `prefetch` (the prologue plan, programmatic dependent launch, prefetched lines per weight
    row) override the defaults below; the variant studies time them."""
    common.check_tile(tile)
    x = common.check_activation(x, w.K, common.ACT_DTYPES, w.weight.device, "fp8")
    assert w.weight.dtype == FP8_DTYPE and w.weight.stride(1) == 1, "W must be K-contiguous float8_e4m3fn"
    y = common.output(x, w.N, out)
    if x.shape[0] == 0:
        return y
    if tile.get("path") == ONE_ROW_PATH:
        launch_one_row(x, w, y, tile, plan=plan, prefetch=prefetch)
        return y
    if pdl is None:
        pdl = x.shape[0] <= PDL_MAX_ROWS and common.pdl_supported(x.device)
    xq, xs = quantize_activation_triton(x, plan=plan, release=pdl)
    if prefetch is None:
        prefetch = PDL_PREFETCH_LINES
    launch_product(xq, xs, w, y, tile, wait=pdl, prefetch=prefetch if pdl else 0)
    return y


ONE_ROW_PATH = "tma-swap-q"


def launch_one_row(x: torch.Tensor, w: Fp8Weight, y: torch.Tensor, tile: dict, plan: ProloguePlan | None = None,
                   prefetch: int | None = None) -> None:
    """y[1, N] through _one_row_kernel (path ONE_ROW_PATH): x [1, K] with K·bytes % 16 == 0 (TMA);
    `prefetch`: 128-byte lines of each weight row asked of the L2 first (PDL_PREFETCH_LINES on
    NVIDIA GPUs; the interpreter has no inline PTX)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    M, K = x.shape
    if M != 1:
        raise ValueError(f"tile {tile} quantizes one row in the product; x has {M} rows")
    if not common.tma_aligned(K, x.element_size(), 1):
        raise ValueError(f"tile {tile} uses TMA, which needs K·bytes % 16 == 0; K={K} does not allow it")
    if x.stride(1) != 1 or x.data_ptr() % 16:
        x = x.clone(memory_format=torch.contiguous_format)
    bn, bk = tile["BLOCK_N"], tile["BLOCK_K"]
    p = plan or prologue_plan(K)
    if prefetch is None:
        prefetch = PDL_PREFETCH_LINES if common.nvidia(x.device) else 0
    _one_row_kernel[(common.cdiv(w.N, bn),)](
        x, TensorDescriptor.from_tensor(x, [1, bk]), common.weight_descriptor(w, w.weight, [bn, bk]), w.weight,
        w.weight.stride(0), y, y if w.bias is None else w.bias, w.weight_scale, w.N, K, dtype_eps(x.dtype),
        HAS_BIAS=w.bias is not None, RECIPROCAL=x.is_cuda, HW_CVT=_hardware_e4m3(x.device), BLOCK_A=p.block_a,
        BLOCK_B=p.block_b, CHUNKED=p.chunked, BLOCK_N=bn, BLOCK_K=bk, PREFETCH=prefetch, LINE_COLS=128,
        num_warps=tile["num_warps"], num_stages=tile["num_stages"])


# Few rows on Hopper and newer: the product is launched as the prologue's programmatic dependent,
# asks the L2 for the head of its weight rows, then waits for the prologue in the kernel. H200
# run 15 (variants.py --study fp8-prologue): PDL alone saved 0.2-1.1 us at M = 1-64 on every
# shape, 4 prefetched 128-byte lines per row another 0.4-1.0 us (16-32 lines lost on qkv and
# gate_up); at M = 256 PDL cost up to 8.8 us (down 61 -> 69 us), at 4096 up to 39 us (down and
# gate_up 35-39 us, qkv and o within 3.3 us), so it stops at 64 rows.
PDL_MAX_ROWS = 64
PDL_PREFETCH_LINES = 4


def launch_product(xq: torch.Tensor, xs: torch.Tensor, w: Fp8Weight, y: torch.Tensor, tile: dict,
                   wait: bool = False, prefetch: int = 0) -> None:
    """y = (xq · Wᵀ) · s_x · s_w + b: the product after the activation prologue, on the tile's
    path; `wait`, `prefetch`: launched as the prologue's programmatic dependent (common.launch_tma)."""
    path = tile.get("path")
    if path in common.TMA_PATHS:
        common.launch_tma(xq, w.weight, y, tile, bias=w.bias, rs=xs, cs=w.weight_scale, owner=w, wait=wait,
                          prefetch=prefetch)
    elif path == "gemv":
        common.launch_gemv(xq, w.weight, y, tile, bias=w.bias, rs=xs, cs=w.weight_scale, wait=wait)
    else:
        common.launch_tiled(xq, w.weight, y, tile, bias=w.bias, rs=xs, cs=w.weight_scale, wait=wait)


def problem(w: Fp8Weight, M: int, act_dtype: torch.dtype) -> Problem:
    """The Problem of a call; M is the row BUCKET (the caller rounds with vsr.autotune.buckets.bucket_for)."""
    return Problem(N=w.N, K=w.K, bucket=M, act_dtype=act_dtype, params=w.params())


def default_tile(p: Problem) -> dict:
    t = common.default_gemm_tile(p.bucket, p.N, p.K, 1, 1)
    if p.bucket == 1 and t["path"] != "tma-swap":
        # H200 (run 5): 8 rows x 512 columns per step, 3 stages, beat the split-K tile on every
        # shape. (Run 10: the transposed TMA product beat it on 3 of 4 where the strides allow.)
        return common.gemv_tiles(p.K, 1)[0]
    if p.bucket <= 16 and t["path"] == "splitk":  # fp8 rows are half as wide: a longer K step keeps the same bytes in flight
        t["BLOCK_K"] = 256
        t["SPLIT_K"] = common._split_for(p.bucket, p.N, p.K, 16, 64, 256, 16, waves=8)
    return t


def search_space(p: Problem) -> list[dict]:
    d = default_tile(p)
    space = common.gemm_space(p.bucket, p.N, p.K, 1, 1, d, bk_choices=(64, 128, 256))
    if p.bucket == 1:
        gemv = [t for t in common.gemv_tiles(p.K, 1) if t != d]
        space = space[:1] + gemv[:1] + space[1:12] + gemv[1:] + space[12:36]
    return space


TEMPLATE = common.KernelTemplate(name="fp8_w8a8", module=sys.modules[__name__], search_space=search_space,
                    default_tile=default_tile, launch=launch, reference=reference_linear, problem=problem)
