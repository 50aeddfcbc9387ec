"""The reference numerics on the CPU with each weight dequantized once, at load.

Every format's `reference_linear` (vsr.kernels.<format>) rebuilds its weight at full precision on
every call: int4 unpacks nibbles and applies group scales, NVFP4 decodes e2m1 codes and block
scales, FP8 and bf16 weights are upcast to fp32. `prepare_reference(weight)` computes those
weight-side tensors once, with the same torch operations, and `PreparedReference(x)` then runs the
rest of the reference: the same product (`x.float() @ W.t()` on a tensor equal to the reference's
in values and layout) and the same activation-side work per call (FP8 W8A8 and NVFP4 W4A4 still
quantize each call's activations), so the output bytes are the reference's
(tests/test_dequantized.py checks them against `reference_linear` for every format).

The cost is memory: the layer holds an fp32 [N, K] copy beside its stored weight.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from vsr.kernels import fp8, int4, nvfp4


def _float_bias(w: Any) -> torch.Tensor | None:
    return None if w.bias is None else w.bias.float()


class PreparedReference:
    """y = reference_linear(x, weight) from precomputed weight-side tensors."""

    def __init__(self, weight: Any, run: Callable[[torch.Tensor], torch.Tensor], dense: torch.Tensor):
        self.format = weight.format
        self.dense = dense          # the fp32 [N, K] tensor the product reads (its memory)
        self._run = run

    def nbytes(self) -> int:
        return self.dense.numel() * self.dense.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x)


def _product(w, W: torch.Tensor, perm: torch.Tensor | None = None) -> PreparedReference:
    """x (columns gathered by perm, act-order int4) times a precomputed fp32 W, plus the bias."""
    b = _float_bias(w)

    def run(x):
        xp = x if perm is None else x[:, perm]
        y = xp.float() @ W.t()
        if b is not None:
            y = y + b
        return y.to(x.dtype)
    return PreparedReference(w, run, W)


def _dense(w) -> PreparedReference:
    return _product(w, w.weight.float())


def _int4(w: int4.Int4Weight) -> PreparedReference:
    return _product(w, int4.dequantize(w), w.act_perm)


# Every e4m3 code's value and every e2m1 code's (sign in bit 3, -0.0 at code 8), in fp32: a
# gather from these gives the bytes of torch's float8 -> float conversion and of
# nvfp4.e2m1_decode in about 40% and 15% of their time (2,048 x 384 codes, 2 CPU cores).
E4M3_VALUES = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fp8.FP8_DTYPE).float()
E2M1_VALUES = torch.cat([torch.tensor(nvfp4.E2M1_VALUES), -torch.tensor(nvfp4.E2M1_VALUES)]).float()


def _lookup(table: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    return torch.index_select(table, 0, codes.reshape(-1).to(torch.int32)).view(codes.shape)


def fp8_activation(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8.quantize_activation's bytes as (the codes' fp32 values, the scales [M, 1] in x's
    dtype): the quotient clamped in place, its codes read through E4M3_VALUES."""
    s = x.abs().amax(dim=-1, keepdim=True) / fp8.FP8_MAX
    s = torch.where(s == 0, torch.full_like(s, fp8.dtype_eps(x.dtype)), s)
    codes = torch.div(x, s).clamp_(-fp8.FP8_MAX, fp8.FP8_MAX).to(fp8.FP8_DTYPE)
    return _lookup(E4M3_VALUES, codes.view(torch.uint8)), s


def nvfp4_activation(x: torch.Tensor, input_global_scale: torch.Tensor) -> torch.Tensor:
    """e2m1_decode(codes) · s_x of nvfp4.quantize_activation(x) as fp32 [M, K]: the codes read
    through E2M1_VALUES, each block's scale broadcast over its 16 columns."""
    codes, s = nvfp4.quantize_activation(x, input_global_scale)
    M, K = codes.shape
    v = _lookup(E2M1_VALUES, codes).view(M, K // nvfp4.BLOCK, nvfp4.BLOCK)
    return v.mul_(s.float()[..., None]).view(M, K)


def _fp8(w: fp8.Fp8Weight) -> PreparedReference:
    W, scale, b = w.weight.float(), w.weight_scale.float()[None, :], _float_bias(w)

    def run(x):
        xq, s = fp8_activation(x)                    # per call: the activations' codes and scales
        y = (xq @ W.t()).mul_(s.float()).mul_(scale)
        if b is not None:
            y.add_(b)
        return y.to(x.dtype)
    return PreparedReference(w, run, W)


def _nvfp4(w: nvfp4.Nvfp4Weight) -> PreparedReference:
    b = _float_bias(w)
    if not w.quantizes_activations:   # NVFP4A16
        W = nvfp4.dequantize(w)

        def run(x):
            y = x.float() @ W.t()
            if b is not None:
                y = y + b
            return y.to(x.dtype)
        return PreparedReference(w, run, W)
    W = nvfp4.e2m1_decode(nvfp4.unpack_fp4(w.packed)) * w.block_scale.float().repeat_interleave(nvfp4.BLOCK, dim=1)
    alpha = 1.0 / (w.input_global_scale.float().reshape(()) * w.global_scale.float().reshape(()))
    igs = w.input_global_scale

    def run(x):
        xs = nvfp4_activation(x, igs)                  # per call: the activations' codes and scales
        y = (xs @ W.t()).mul_(alpha)
        if b is not None:
            y.add_(b)
        return y.to(x.dtype)
    return PreparedReference(w, run, W)


_PREPARE = {"dense": _dense, "int4": _int4, "fp8": _fp8, "nvfp4": _nvfp4}


def prepare_reference(weight: Any) -> PreparedReference | None:
    """The weight's reference with its weight side computed now, or None where there is nothing to
    precompute (an fp32 dense weight without a bias conversion: the reference reads it as stored)
    or no preparation is known for the format (the format's own reference then runs per call)."""
    if weight.format == "dense" and weight.weight.dtype == torch.float32 and (
            weight.bias is None or weight.bias.dtype == torch.float32):
        return None
    prepare = _PREPARE.get(weight.format)
    return None if prepare is None else prepare(weight)
