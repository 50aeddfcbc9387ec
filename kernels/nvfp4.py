"""NVFP4 W4A4 (compressed-tensors nvfp4-pack-quantized): weight layout and pure-torch reference.

Weights: e2m1 nibbles, two per uint8 (low nibble = even k), one e4m3 block scale
per 16 columns and one fp32 global scale that DIVIDES. Activations: e2m1 with a
dynamic e4m3 scale per 16 columns of each row and the static input_global_scale.
Packages without input_global_scale (NVFP4A16) keep activations unquantized.
FORMATS.md §3, §7. The Triton templates (tl.dot_scaled on Blackwell; the
explicit dequantizing emulation elsewhere) join this module.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .fp8 import e4m3_rne

BLOCK = 16
FP4_MAX = 6.0
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# |x| thresholds between neighbouring codes, with the side a tie falls to:
# ties go to the even code (0.25->0, 0.75->2, 1.25->2, 1.75->4, 2.5->4, 3.5->6, 5->6).
_THRESHOLDS = ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False))


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """Nibble codes (any int dtype, 0..15) -> fp32 values; bit 3 is the sign."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    c = codes.to(torch.int64)
    mag = table[c & 7]
    return torch.where((c & 8) != 0, -mag, mag)


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """fp32 values (already clamped to ±6) -> nibble codes (uint8), round-to-nearest, ties to even code."""
    a = x.abs().float()
    code = torch.zeros_like(a, dtype=torch.uint8)
    for t, tie_up in _THRESHOLDS:
        code += (a >= t if tie_up else a > t).to(torch.uint8)
    return code | ((x < 0).to(torch.uint8) << 3)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K/2] -> codes uint8 [N, K]: low nibble is the even column."""
    lo = packed & 0xF
    hi = packed >> 4
    return torch.stack((lo, hi), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    c = codes.to(torch.uint8).reshape(*codes.shape[:-1], -1, 2)
    return c[..., 0] | (c[..., 1] << 4)


@dataclass
class Nvfp4Weight:
    """packed uint8 [N, K/2]; block_scale e4m3 [N, K/16]; global_scale fp32 scalar (divides);
    input_global_scale fp32 scalar or None (NVFP4A16: activations stay unquantized)."""

    packed: torch.Tensor
    block_scale: torch.Tensor
    global_scale: torch.Tensor
    input_global_scale: torch.Tensor | None = None
    bias: torch.Tensor | None = None

    format = "nvfp4"

    def __post_init__(self) -> None:
        N, half = self.packed.shape
        assert self.packed.dtype == torch.uint8, f"packed fp4 must be uint8, got {self.packed.dtype}"
        assert (2 * half) % BLOCK == 0, f"NVFP4 needs K % 16 == 0, got K={2 * half}"
        assert self.block_scale.dtype == torch.float8_e4m3fn, f"block scales must be e4m3, got {self.block_scale.dtype}"
        assert self.block_scale.shape == (N, 2 * half // BLOCK), (
            f"block_scale must be [N, K/16]=[{N}, {2 * half // BLOCK}], got {tuple(self.block_scale.shape)}")
        assert self.global_scale.numel() == 1, "weight_global_scale must hold one value"

    @property
    def N(self) -> int:
        return self.packed.shape[0]

    @property
    def K(self) -> int:
        return self.packed.shape[1] * 2

    @property
    def quantizes_activations(self) -> bool:
        return self.input_global_scale is not None

    def params(self) -> tuple[tuple[str, object], ...]:
        return (("act", "e2m1-block16-dynamic" if self.quantizes_activations else "none"), ("bits", 4), ("group", BLOCK))

    def to(self, device) -> "Nvfp4Weight":
        mv = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Nvfp4Weight(mv(self.packed), mv(self.block_scale), mv(self.global_scale),
                           mv(self.input_global_scale), mv(self.bias))

    def nbytes(self) -> int:
        ts = (self.packed, self.block_scale, self.global_scale, self.input_global_scale, self.bias)
        return sum(t.numel() * t.element_size() for t in ts if t is not None)


def dequantize(w: Nvfp4Weight) -> torch.Tensor:
    """W[n, k] = e2m1(c) · (fp8(block_scale[n, k//16]) / global_scale), fp32."""
    vals = e2m1_decode(unpack_fp4(w.packed))
    eff = w.block_scale.float() / w.global_scale.float().reshape(())
    return vals * eff.repeat_interleave(BLOCK, dim=1)


def quantize_activation(x: torch.Tensor, input_global_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row, per-16-column dynamic e2m1 quantization with a static global scale.

    Returns (codes uint8 [M, K], block scales e4m3 [M, K/16]). `amax/6` is taken in
    x's dtype, its product with the global scale in fp32, as the reference library does.
    """
    M, K = x.shape
    gx = input_global_scale.float().reshape(())
    xb = x.reshape(M, K // BLOCK, BLOCK)
    amax6 = xb.abs().amax(dim=-1) / FP4_MAX                      # activation dtype
    s = e4m3_rne(gx * amax6.float())
    s = torch.where(s.float() == 0, torch.full_like(s, 0.125), s)
    eff = s.float() / gx
    xq = (xb.float() / eff[..., None]).clamp(-FP4_MAX, FP4_MAX)
    return e2m1_encode(xq).reshape(M, K), s


def reference_linear(x: torch.Tensor, w: Nvfp4Weight) -> torch.Tensor:
    """y = (1/(gx·gw)) · Σ_k (e2m1(xq)·s_x)(e2m1(w)·s_w) + bias in fp32, returned in x's dtype.

    Without an input_global_scale (NVFP4A16): y = x·dequant(W)ᵀ + bias."""
    assert x.shape[-1] == w.K, f"x has {x.shape[-1]} columns, the weight expects K={w.K}"
    if not w.quantizes_activations:
        y = x.float() @ dequantize(w).t()
    else:
        codes, s = quantize_activation(x, w.input_global_scale)
        xs = e2m1_decode(codes) * s.float().repeat_interleave(BLOCK, dim=1)
        ws = e2m1_decode(unpack_fp4(w.packed)) * w.block_scale.float().repeat_interleave(BLOCK, dim=1)
        alpha = 1.0 / (w.input_global_scale.float().reshape(()) * w.global_scale.float().reshape(()))
        y = (xs @ ws.t()) * alpha
    if w.bias is not None:
        y = y + w.bias.float()
    return y.to(x.dtype)
