"""What the template tests (tests/test_kernels_{dense,fp8,int4,nvfp4,launch}.py) share: every Triton
template against its pure-torch reference, on small shapes.

Without a GPU these run under the Triton interpreter (tests/conftest.py), whose bf16
tl.dot is wrong: activations here are fp16 and fp32. Shapes: N odd (37), K a multiple
of the int4 group and of 16, row counts in buckets 1, 8 and 64 (split-K paths) plus an
explicit tiled tile. Outputs are pre-filled with NaN so an unwritten element fails.
"""
from __future__ import annotations

import pytest
import torch

from vsr.autotune.tuner import FP8_OPERAND_TOLERANCE, TOLERANCES
from vsr.kernels import fp8, int4, nvfp4

DEV = "cuda" if torch.cuda.is_available() else "cpu"
N, K = 37, 256
# (rtol, atol as a fraction of max|ref|) per output dtype: the kernels differ from the
# references only in the order of fp32 sums (and, for fp8, not at all in the quantization).
# The tuner's own bounds: a tile that passes here passes the tuner's reference check.
TOL = TOLERANCES
ROWS = (1, 5, 40)          # buckets 1, 8, 64
TILED = {"path": "tiled", "BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": 1, "GROUP_M": 2,
         "num_warps": 4, "num_stages": 2}


def gen(seed):
    return torch.Generator().manual_seed(seed)


# Hopper's fp8 tensor cores accumulate in reduced precision inside a tl.dot (as _scaled_mm
# with use_fast_accum does): on a GPU, fp8 products meet fp16-level tolerances, not fp32's.
FP8_GPU_TOL = FP8_OPERAND_TOLERANCE


def assert_close(y, ref, tol=None):
    assert y.shape == ref.shape and y.dtype == ref.dtype
    assert not torch.isnan(y).any(), "kernel left unwritten (NaN-poisoned) outputs"
    rtol, atol = tol or TOL[ref.dtype]
    scale = ref.float().abs().max().item()
    assert scale > 0
    err = (y.float() - ref.float()).abs()
    bound = atol * scale + rtol * ref.float().abs()
    assert (err <= bound).all(), f"max error {err.max().item():.3g} (max |ref| {scale:.3g})"


def run(template_launch, x, w, tile):
    out = torch.full((x.shape[0], w.N), float("nan"), dtype=x.dtype, device=x.device)
    y = template_launch(x, w, tile, out=out)
    assert y.data_ptr() == out.data_ptr()
    return y


TMA = dict(TILED, path="tma")
SWAP = dict(TMA, path="tma-swap", BLOCK_M=16, BLOCK_N=32, BLOCK_K=64)
SLICES = dict(TILED, path="slices", BLOCK_M=16, BLOCK_N=32, BLOCK_K=128)


# The interpreter rounds fp32 -> bf16 casts toward zero (Triton 3.9: 200.86 -> 200, not 201), so
# bf16 bit-exactness is checked where the kernels really run, on the GPU.
BF16_ON_GPU = pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    DEV != "cuda", reason="the Triton interpreter truncates fp32 -> bf16 casts; checked on the GPU"))


def fp8_weight(g, dtype, bias):
    return fp8.Fp8Weight(fp8.e4m3_rne(torch.randn(N, K, generator=g) * 40),
                         (torch.rand(N, generator=g) * 0.01 + 1e-3).to(dtype),
                         torch.randn(N, generator=g).to(dtype) if bias else None).to(DEV)


def int4_weight(g, G, symmetric, act_order, bias, dtype=torch.float16, Kx=K):
    """A random int4 weight [N, Kx] with groups of G (the last one partial when G does not divide Kx)."""
    KG = -(-Kx // G)
    u = torch.randint(0, 16, (N, Kx), generator=g, dtype=torch.int32)
    scale = (torch.rand(N, KG, generator=g) * 0.05 + 1e-3).to(dtype)
    zp = None if symmetric else torch.randint(0, 16, (N, KG), generator=g, dtype=torch.int32)
    perm = torch.randperm(Kx, generator=g) if act_order else None
    b = torch.randn(N, generator=g).to(dtype) if bias else None
    return int4.Int4Weight(int4.pack_int4(u), scale, Kx, G, zp, perm, b).to(DEV)


def nvfp4_weight(g, w4a4, bias, dtype):
    W = torch.randn(N, K, generator=g)
    gw = torch.tensor(448.0 * 6.0 / W.abs().max().item())
    codes, bs = nvfp4.quantize_activation(W, gw)  # the same per-16 rounding makes a valid weight
    return nvfp4.Nvfp4Weight(nvfp4.pack_fp4(codes), bs, gw, torch.tensor(37.5) if w4a4 else None,
                             torch.randn(N, generator=g).to(dtype) if bias else None).to(DEV)


class KernelSpy:
    """Stands in for a @triton.jit kernel: each launch, kernel[grid](*args, **kw), is appended to
    `calls` as (name, grid, kw), and not run, or run by `real` when given."""

    def __init__(self, calls: list, name: str = "", real=None):
        self.calls, self.name, self.real = calls, name, real

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.calls.append((self.name, grid, kw))
            if self.real is not None:
                return self.real[grid](*args, **kw)
        return launch
