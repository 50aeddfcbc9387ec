"""FP8 W8A8 (compressed-tensors FP8_DYNAMIC): weight layout and pure-torch reference.

Weights: e4m3 [N, K] with one scale per output channel. Activations: e4m3 with
one dynamic scale per row (token), computed as each call runs. FORMATS.md §4.
The Triton template for this format joins this module.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

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
