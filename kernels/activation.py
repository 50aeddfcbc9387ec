"""The MLP activations as Triton kernels, with pure-torch references of the same signature:

    silu_mul(gate_up)  = silu(gate) · up     gate_up [T, 2I]: gate columns first, then up (SwiGLU);
                                             interleaved=True: gate j in column 2j, up j in 2j + 1
                                             (the output of a gate|up weight fused for SwiGLU in
                                             the product, runtime/fuse.fuse's interleave)
    gelu(x)            = x · Φ(x)            approximate='none' (erf) or 'tanh'
    gelu_mul(x)        = gelu(x[:, :I]) · x[:, I:]                    (GeGLU, ModernBERT's MLP)

with Φ(x) = (1 + erf(x/√2)) / 2, tanh form 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 x³))).

Rounding (transformers' modules, torch's ops): the activation in fp32 rounded to the input dtype,
then the product with the other half rounded again (exact=True). exact=False rounds once, after the
fp32 product. The Triton forms evaluate exp, erf and tanh with libdevice's functions (those torch's
CUDA kernels call) and divide with IEEE division, so on the GPU they follow the references'
arithmetic; under the interpreter they use Triton's own, within an fp32 ulp or two.

quant_fp8=True also returns (xq, xs), the output quantized per row exactly as fp8's prologue does
(norm.quantize_row_fp8); keep_output=False then leaves the output itself unwritten (None in its
place), for a caller that reads only the codes. With quant_fp8 one program holds a whole row
(norm.row_blocks: 17408 = 16384 + 1024 columns); without it, each program covers
ELEMENTWISE_BLOCK columns of one row. Every element is computed on its own: the results never
depend on the batch.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from vsr.kernels import common, fp8, norm, pdl

ELEMENTWISE_BLOCK = 2048
# libdevice's exp, erf and tanh on a GPU; Triton's own under the interpreter (common.LIBDEVICE).
LIBDEVICE = common.LIBDEVICE


@triton.jit
def _act(x, MODE: tl.constexpr, TANH: tl.constexpr, LIBDEVICE: tl.constexpr):
    """silu (MODE 0) or gelu (MODE 1, TANH for the tanh form) of fp32 x, in fp32."""
    if MODE == 0:
        return common.silu_f32(x, LIBDEVICE)
    if TANH:
        z = 0.7978845608028654 * (x + 0.044715 * (x * x * x))   # torch's order: x³ first
        if LIBDEVICE:
            t = libdevice.tanh(z)
        else:
            e = tl.exp(-2.0 * tl.abs(z))
            t = tl.div_rn(1.0 - e, 1.0 + e)
            t = tl.where(z < 0, -t, t)
        return 0.5 * x * (1.0 + t)
    if LIBDEVICE:
        f = libdevice.erf(x * 0.7071067811865476)
    else:
        f = tl.math.erf(x * 0.7071067811865476)
    return x * 0.5 * (1.0 + f)


@triton.jit
def _block(x_ptr, stride_x, row, start, offs, mask, I, BLOCK: tl.constexpr, GATED: tl.constexpr, MODE: tl.constexpr,
           TANH: tl.constexpr, EXACT: tl.constexpr, LIBDEVICE: tl.constexpr, INTERLEAVED: tl.constexpr):
    """The output columns offs = start + [0, BLOCK) of one row."""
    if INTERLEAVED:   # (gated) the pairs' 2 · BLOCK adjacent columns in one load, split in registers
        c = 2 * start + tl.arange(0, 2 * BLOCK)
        pairs = tl.load(x_ptr + row * stride_x + c, mask=c < 2 * I, other=0.0)
        a, u = tl.split(tl.reshape(pairs, (BLOCK, 2)))
    else:
        a = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    y = _act(a.to(tl.float32), MODE, TANH, LIBDEVICE)
    if GATED:
        if not INTERLEAVED:
            u = tl.load(x_ptr + row * stride_x + I + offs, mask=mask, other=0.0)
        u = u.to(tl.float32)
        if EXACT:
            y = y.to(a.dtype).to(tl.float32)
        y = y * u
    return y.to(a.dtype)


@triton.jit
def _activation_kernel(x_ptr, y_ptr, q_ptr, qs_ptr, I, stride_x, EPS_Q, BLOCK_A: tl.constexpr,
                       BLOCK_B: tl.constexpr, GATED: tl.constexpr, MODE: tl.constexpr, TANH: tl.constexpr,
                       EXACT: tl.constexpr, QUANT: tl.constexpr, STORE_Y: tl.constexpr, LIBDEVICE: tl.constexpr,
                       INTERLEAVED: tl.constexpr, RECIPROCAL: tl.constexpr, HW_CVT: tl.constexpr, BF16_RCP: tl.constexpr,
                       WAIT: tl.constexpr, RELEASE: tl.constexpr):
    """Row program_id(0), columns from program_id(1) · BLOCK_A (QUANT: the whole row, one program)."""
    pdl.begin(WAIT, RELEASE)
    row = tl.program_id(0).to(tl.int64)
    offs_a = tl.program_id(1) * BLOCK_A + tl.arange(0, BLOCK_A)
    ma = offs_a < I
    ya = _block(x_ptr, stride_x, row, tl.program_id(1) * BLOCK_A, offs_a, ma, I, BLOCK_A, GATED, MODE, TANH, EXACT,
                LIBDEVICE, INTERLEAVED)
    if STORE_Y:
        tl.store(y_ptr + row * I + offs_a, ya, mask=ma)
    if BLOCK_B > 0:
        offs_b = BLOCK_A + tl.arange(0, BLOCK_B)
        mb = offs_b < I
        yb = _block(x_ptr, stride_x, row, BLOCK_A, offs_b, mb, I, BLOCK_B, GATED, MODE, TANH, EXACT, LIBDEVICE,
                    INTERLEAVED)
        if STORE_Y:
            tl.store(y_ptr + row * I + offs_b, yb, mask=mb)
    else:
        offs_b = offs_a
        yb = ya
    if QUANT:
        norm.quantize_row_fp8(ya, yb, offs_a, offs_b, I, row, q_ptr, qs_ptr, EPS_Q, BLOCK_B, RECIPROCAL,
                              HW_CVT, BF16_RCP)


@functools.cache
def _plan(I: int, quant: bool) -> tuple[int, int, int, int]:
    """(BLOCK_A, BLOCK_B, warps, column programs) for an output row of I columns."""
    if quant:
        a, b, warps = norm.row_blocks(I)
        return a, b, warps, 1
    block = min(ELEMENTWISE_BLOCK, triton.next_power_of_2(I))
    return block, 0, max(1, min(8, block // 256)), triton.cdiv(I, block)


def _launch(x, gated, mode, tanh, exact, quant_fp8, keep_output=True, interleaved=False):
    assert x.dim() == 2 and x.stride(1) == 1, "the input must be [T, C] with unit column stride"
    norm.check_keep_output(keep_output, quant_fp8)
    T, C = x.shape
    if gated:
        assert C % 2 == 0, f"a gated activation needs an even number of columns, got {C}"
    I = C // 2 if gated else C
    y = torch.empty((T, I), dtype=x.dtype, device=x.device) if keep_output else None
    xq = xs = None
    if quant_fp8:
        xq = torch.empty((T, I), dtype=fp8.FP8_DTYPE, device=x.device)
        xs = torch.empty((T,), dtype=x.dtype, device=x.device)
    if T:
        a, b, warps, cols = _plan(I, quant_fp8)
        rcp, hw, bf16_rcp, eps_q = norm._quant_flags(x.device, x.dtype)
        yp = y if keep_output else x   # (not written without STORE_Y)
        _activation_kernel[(T, cols)](
            x, yp, (xq if hw else xq.view(torch.uint8)) if quant_fp8 else yp, xs if quant_fp8 else yp, I, x.stride(0),
            eps_q, BLOCK_A=a, BLOCK_B=b, GATED=gated, MODE=mode, TANH=tanh, EXACT=exact, QUANT=quant_fp8,
            STORE_Y=keep_output, INTERLEAVED=interleaved,
            LIBDEVICE=LIBDEVICE, RECIPROCAL=rcp, HW_CVT=hw, BF16_RCP=bf16_rcp, num_warps=warps, **pdl.options(x.device))
    return (y, xq, xs) if quant_fp8 else y


def _tanh(approximate: str) -> bool:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return approximate == "tanh"


def silu_mul(gate_up: torch.Tensor, *, exact: bool = True, quant_fp8: bool = False, keep_output: bool = True,
             interleaved: bool = False):
    """silu(gate) · up of [T, 2I] (gate first; interleaved: gate and up columns alternate) -> [T, I];
    with quant_fp8 (y, xq, xs)."""
    return _launch(gate_up, True, 0, False, exact, quant_fp8, keep_output, interleaved)


def gelu(x: torch.Tensor, approximate: str = "none", *, quant_fp8: bool = False, keep_output: bool = True):
    """gelu(x) [T, N] -> [T, N] (one rounding, as torch's); with quant_fp8 (y, xq, xs)."""
    return _launch(x, False, 1, _tanh(approximate), True, quant_fp8, keep_output)


def gelu_mul(x: torch.Tensor, approximate: str = "none", *, exact: bool = True, quant_fp8: bool = False,
             keep_output: bool = True):
    """gelu(first half) · second half of [T, 2I] -> [T, I] (GeGLU); with quant_fp8 (y, xq, xs)."""
    return _launch(x, True, 1, _tanh(approximate), exact, quant_fp8, keep_output)


def _with_codes(y, quant_fp8, keep_output):
    """The references' return: y, or with quant_fp8 (y or None, xq, xs)."""
    out = norm.reference_out(y, (), quant_fp8, keep_output)
    return out if quant_fp8 else y


def _gated_reference(x, act, exact, quant_fp8, keep_output, interleaved=False):
    a, u = (x[..., 0::2], x[..., 1::2]) if interleaved else x.chunk(2, dim=-1)
    y = act(a) * u if exact else (act(a.float()) * u.float()).to(x.dtype)
    return _with_codes(y, quant_fp8, keep_output)


def silu_mul_reference(gate_up, *, exact=True, quant_fp8=False, keep_output=True, interleaved=False):
    """transformers' Qwen3MLP activation: F.silu(gate) * up."""
    return _gated_reference(gate_up, torch.nn.functional.silu, exact, quant_fp8, keep_output, interleaved)


def gelu_reference(x, approximate="none", *, quant_fp8=False, keep_output=True):
    return _with_codes(torch.nn.functional.gelu(x, approximate=approximate), quant_fp8, keep_output)


def gelu_mul_reference(x, approximate="none", *, exact=True, quant_fp8=False, keep_output=True):
    """ModernBertMLP's activation: act(input) * gate of Wi's output chunked in two."""
    return _gated_reference(x, lambda a: torch.nn.functional.gelu(a, approximate=approximate), exact, quant_fp8,
                            keep_output)
