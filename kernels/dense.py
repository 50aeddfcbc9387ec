"""Dense (bf16 / fp16 / fp32) linear: the weight layout and the pure-torch reference.

The Triton template for this format joins this module.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


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
