"""Dense (bf16 / fp16 / fp32) linear: the weight layout and the pure-torch reference.

The Triton template "dense" runs gemm.py's kernels (shared with fp8): a CUDA-core GEMV for one
row; the transposed TMA product ("tma-swap") and split-K tiles for small row buckets; tiled paths
for large ones (TMA descriptors where the row strides allow, stream-K for buckets 512-2048,
persistent from 4096; pointer loads otherwise). fp32 operands multiply at common.f32_precision's
precision: tf32x3 on NVIDIA GPUs (about fp32's accuracy, on the tensor cores), IEEE elsewhere.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from vsr.kernels import common, gemm, gemm_tiles, pdl
from vsr.kernels.template import Problem


@dataclass
class DenseWeight(common.MatrixWeight):
    """An nn.Linear weight as stored: W [N, K] (K contiguous), optional bias [N]."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None

    format = "dense"

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


# This template's paths whose tiles may be wide (BLOCK_N2: gemm.tma_gemm_kernel's second block).
WIDE_PATHS = ("tma",)


def launch(x: torch.Tensor, w: DenseWeight, tile: dict, out: torch.Tensor | None = None, glu: bool = False
           ) -> torch.Tensor:
    """y[M, N] = x[M, K] · Wᵀ + b with the given tile; y in x's dtype (written into `out` if given).
    `glu`: W's rows are gate and up rows interleaved (runtime/fuse.fuse's interleave), and the
    product's epilogue stores y[M, N / 2] = silu(gate) · up (common.store_tile)."""
    common.check_tile(tile, WIDE_PATHS)
    x = common.check_activation(x, w.K, w.weight.device, "dense")
    assert w.weight.dtype == x.dtype, f"dense kernel needs x and W of one dtype, got {x.dtype} and {w.weight.dtype}"
    assert w.weight.stride(1) == 1, "W must be K-contiguous"
    y = common.output(x, common.glu_width(w.N, glu), out)
    path = tile.get("path")
    wait = pdl.enabled(x.device)   # within pdl.programmatic_forward: a dependent of the kernel that made x
    if path in gemm.TMA_PATHS:
        gemm.launch_tma(x, w.weight, y, tile, bias=w.bias, owner=w, wait=wait, prefetch=gemm.PDL_PREFETCH_LINES,
                        glu=glu)
    elif path == "gemv":
        gemm.launch_gemv(x, w.weight, y, tile, bias=w.bias, wait=wait, glu=glu)
    else:
        gemm.launch_tiled(x, w.weight, y, tile, bias=w.bias, wait=wait, glu=glu)
    return y


def problem(w: DenseWeight, M: int, act_dtype: torch.dtype) -> Problem:
    """The Problem of a call; M is the row bucket (vsr.autotune.buckets.bucket_for)."""
    return Problem(N=w.N, K=w.K, bucket=M, act_dtype=act_dtype, params=w.params())


def _bytes(dt: torch.dtype) -> int:
    return torch.empty((), dtype=dt).element_size()


def default_tile(p: Problem) -> dict:
    b = _bytes(p.act_dtype)
    return gemm_tiles.default_gemm_tile(p.bucket, p.N, p.K, b, b)


def search_space(p: Problem) -> list[dict]:
    b = _bytes(p.act_dtype)
    space = gemm_tiles.gemm_space(p.bucket, p.N, p.K, b, b, default_tile(p))
    if p.bucket == 1:  # one row: the CUDA-core GEMV beside the split-K tiles
        space = space[:1] + gemm_tiles.gemv_tiles(p.K, b) + space[1:]
    return space


TEMPLATE = common.KernelTemplate(name="dense", module=sys.modules[__name__], search_space=search_space,
                    default_tile=default_tile, launch=launch, reference=reference_linear, problem=problem,
                    pick_group=gemm_tiles.pick_group)
