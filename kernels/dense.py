"""Dense (bf16 / fp16 / fp32) linear: the weight layout and the pure-torch reference.

Below the reference: the Triton template "dense" (split-K path for small row buckets,
tiled paths for large ones: TMA descriptors where the row strides allow, pointer loads
otherwise; fp32 operands multiply in IEEE precision, never tf32).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from vsr.kernels import common
from vsr.kernels.template import Problem


@dataclass
class DenseWeight:
    """An nn.Linear weight as stored: W [N, K] (K contiguous), optional bias [N]."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None

    format = "dense"

    @property
    def N(self) -> int:
        return self.weight.shape[0]

    @property
    def K(self) -> int:
        return self.weight.shape[1]

    def params(self) -> tuple[tuple[str, object], ...]:
        return (("wdtype", str(self.weight.dtype).removeprefix("torch.")),)

    def to(self, device) -> "DenseWeight":
        return DenseWeight(self.weight.to(device), None if self.bias is None else self.bias.to(device))

    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size() + (0 if self.bias is None else self.bias.numel() * self.bias.element_size())


def dequantize(w: DenseWeight) -> torch.Tensor:
    return w.weight.float()


def reference_linear(x: torch.Tensor, w: DenseWeight) -> torch.Tensor:
    """y = x·Wᵀ + b, accumulated in fp32 (IEEE, never tf32), returned in x's dtype."""
    assert x.shape[-1] == w.K, f"x has {x.shape[-1]} columns, the weight expects K={w.K}"
    y = x.float() @ w.weight.float().t()
    if w.bias is not None:
        y = y + w.bias.float()
    return y.to(x.dtype)


# ---------------------------------------------------------------------------------------
# Triton template "dense"


@triton.jit
def _dense_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, bias_ptr, M, N, K, stride_xm, stride_wn, stride_ym, K_SPLIT,
                  HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, EVEN_K: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = common.swizzle(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Rows/columns past the edge read a valid row (modulo) instead of masking: their
    # results are never stored, and the loads stay unmasked and vectorised.
    rm = (offs_m % M).to(tl.int64)
    rn = (offs_n % N).to(tl.int64)
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        a_ptrs = x_ptr + rm[:, None] * stride_xm + offs_k[None, :]
        b_ptrs = w_ptr + rn[None, :] * stride_wn + offs_k[:, None]
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_hi, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_hi, other=0.0)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    common.store_or_stash(acc, y_ptr, ws_ptr, pid_k, offs_m, offs_n, M, N, stride_ym,
                          bias_ptr, bias_ptr, bias_ptr, bias_ptr, SPLIT_K, HAS_BIAS, False, False, False)


_ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def launch(x: torch.Tensor, w: DenseWeight, tile: dict, out: torch.Tensor | None = None) -> torch.Tensor:
    """y[M, N] = x[M, K] · Wᵀ + b with the given tile; y in x's dtype (written into `out` if given)."""
    common.check_tile(tile)
    assert x.dim() == 2 and x.shape[1] == w.K, f"x must be [M, K={w.K}], got {tuple(x.shape)}"
    assert x.dtype in _ACT_DTYPES, f"dense kernel takes bf16/fp16/fp32 activations, got {x.dtype}"
    assert w.weight.dtype == x.dtype, f"dense kernel needs x and W of one dtype, got {x.dtype} and {w.weight.dtype}"
    assert w.weight.stride(1) == 1, "W must be K-contiguous"
    assert x.device == w.weight.device, f"x on {x.device}, W on {w.weight.device}"
    if x.stride(1) != 1:
        x = x.contiguous()
    M, K = x.shape
    N = w.N
    y = out if out is not None else torch.empty((M, N), dtype=x.dtype, device=x.device)
    assert y.shape == (M, N) and y.dtype == x.dtype and y.stride(1) == 1, "out must be [M, N] in x's dtype"
    if tile.get("path") == "tma":
        common.launch_tma(x, w.weight, y, tile, bias=w.bias)
        return y
    k_split, split = common.split_plan(K, tile)
    ws = torch.empty((split, M, N), dtype=torch.float32, device=x.device) if split > 1 else y
    bias = w.bias if w.bias is not None else y
    bm, bn = tile["BLOCK_M"], tile["BLOCK_N"]
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn), split)
    _dense_kernel[grid](x, w.weight, y, ws, bias, M, N, K, x.stride(0), w.weight.stride(0), y.stride(0), k_split,
                        HAS_BIAS=w.bias is not None, IEEE=x.dtype == torch.float32,
                        EVEN_K=(K % tile["BLOCK_K"] == 0 and k_split % tile["BLOCK_K"] == 0),
                        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=tile["BLOCK_K"], SPLIT_K=split,
                        GROUP_M=tile.get("GROUP_M", 8), num_warps=tile["num_warps"], num_stages=tile["num_stages"])
    if split > 1:
        common.reduce_splits(ws, y, split, M, N, w.bias, None, None, None)
    return y


def problem(w: DenseWeight, M: int, act_dtype: torch.dtype) -> Problem:
    """The Problem of a call; M is the row BUCKET (the caller rounds with vsr.autotune.buckets.bucket_for)."""
    return Problem(N=w.N, K=w.K, bucket=M, act_dtype=act_dtype, params=w.params())


def _bytes(dt: torch.dtype) -> int:
    return torch.empty((), dtype=dt).element_size()


def default_tile(p: Problem) -> dict:
    b = _bytes(p.act_dtype)
    return common.default_gemm_tile(p.bucket, p.N, p.K, b, b)


def search_space(p: Problem) -> list[dict]:
    b = _bytes(p.act_dtype)
    return common.gemm_space(p.bucket, p.N, p.K, b, b, default_tile(p))


TEMPLATE = common.KernelTemplate(name="dense", module=sys.modules[__name__], search_space=search_space,
                    default_tile=default_tile, launch=launch, reference=reference_linear, problem=problem)
