"""int4 W4A16 (compressed-tensors pack-quantized, GPTQ symmetric / AWQ asymmetric): layout and reference.

Weights: signed int4 q in [-8, 7] stored as u = q + 8, eight per int32 along K,
least-significant nibble first; one scale per (n, group of G columns); AWQ adds
a zero point per (n, group) in the signed domain. Activations stay in bf16/fp16.
Legacy act-order files (g_idx) are turned at load into a column permutation of
the packed weight plus the same permutation of x, so groups are contiguous.
FORMATS.md §3, §5, §6. The Triton template for this format joins this module.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def unpack_int4(packed: torch.Tensor, length: int, dim: int = -1) -> torch.Tensor:
    """Unpack int32 words (8 nibbles each, LSB first) along `dim` into u in [0, 15] (int32), trimmed to `length`."""
    p = packed.movedim(dim, -1)
    shifts = torch.arange(0, 32, 4, device=p.device, dtype=torch.int32)
    u = (p.unsqueeze(-1) >> shifts) & 0xF  # arithmetic shift then mask: raw bits
    u = u.reshape(*p.shape[:-1], p.shape[-1] * 8)[..., :length]
    return u.movedim(-1, dim).contiguous()


def pack_int4(u: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Pack u in [0, 15] along `dim` into int32 words, LSB first, zero-padding the tail."""
    v = u.movedim(dim, -1).to(torch.int64)
    pad = (-v.shape[-1]) % 8
    if pad:
        v = torch.nn.functional.pad(v, (0, pad))
    v = v.reshape(*v.shape[:-1], -1, 8)
    shifts = torch.arange(0, 32, 4, device=v.device, dtype=torch.int64)
    words = (v << shifts).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.movedim(-1, dim).contiguous()


@dataclass
class Int4Weight:
    """packed int32 [N, ceil(K/8)] (u = q + 8); scale [N, ceil(K/G)] in the model dtype;
    zero_point int32 [N, ceil(K/G)] unpacked u-domain zero (zp + 8), or None when symmetric;
    act_perm int64 [K] or None (legacy g_idx: x is gathered by it, the weight is stored permuted)."""

    packed: torch.Tensor
    scale: torch.Tensor
    K: int
    group_size: int = 128
    zero_point: torch.Tensor | None = None
    act_perm: torch.Tensor | None = None
    bias: torch.Tensor | None = None

    format = "int4"

    def __post_init__(self) -> None:
        N = self.packed.shape[0]
        G = self.group_size
        assert self.packed.dtype == torch.int32, f"packed int4 must be int32, got {self.packed.dtype}"
        assert self.packed.shape == (N, -(-self.K // 8)), f"packed must be [N, ceil(K/8)], got {tuple(self.packed.shape)}"
        assert self.scale.shape == (N, -(-self.K // G)), f"scale must be [N, ceil(K/G)]=[{N}, {-(-self.K // G)}], got {tuple(self.scale.shape)}"
        if self.zero_point is not None:
            assert self.zero_point.shape == self.scale.shape, "zero_point must match scale's shape"

    @property
    def N(self) -> int:
        return self.packed.shape[0]

    @property
    def symmetric(self) -> bool:
        return self.zero_point is None

    def params(self) -> tuple[tuple[str, object], ...]:
        return (("bits", 4), ("group", self.group_size), ("symmetric", self.symmetric),
                ("act_order", self.act_perm is not None))

    def to(self, device) -> "Int4Weight":
        mv = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Int4Weight(mv(self.packed), mv(self.scale), self.K, self.group_size,
                          mv(self.zero_point), mv(self.act_perm), mv(self.bias))

    def nbytes(self) -> int:
        ts = (self.packed, self.scale, self.zero_point, self.bias)
        return sum(t.numel() * t.element_size() for t in ts if t is not None)


def dequantize(w: Int4Weight) -> torch.Tensor:
    """W (fp32, in the stored column order, i.e. permuted when act_perm is set):
    W[n, k] = (u - zu) · scale[n, k // G]  (zu = 8 when symmetric)."""
    u = unpack_int4(w.packed, w.K).float()
    g = torch.arange(w.K, device=u.device) // w.group_size
    zu = 8.0 if w.zero_point is None else w.zero_point.float()[:, g]
    return (u - zu) * w.scale.float()[:, g]


def dequantize_original_order(w: Int4Weight) -> torch.Tensor:
    """W in the checkpoint's column order (undoes act_perm)."""
    W = dequantize(w)
    if w.act_perm is None:
        return W
    out = torch.empty_like(W)
    out[:, w.act_perm] = W
    return out


def reference_linear(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """y = x·Wᵀ + b with W dequantized in fp32, accumulated in fp32, returned in x's dtype."""
    assert x.shape[-1] == w.K, f"x has {x.shape[-1]} columns, the weight expects K={w.K}"
    xp = x if w.act_perm is None else x[:, w.act_perm]
    y = xp.float() @ dequantize(w).t()
    if w.bias is not None:
        y = y + w.bias.float()
    return y.to(x.dtype)
