"""The reference numerics on the CPU with each weight dequantized once, at load.

Every format's `reference_linear` (vsr.kernels.<format>) rebuilds its weight at full precision on
every call: int4 unpacks nibbles and applies group scales, NVFP4 decodes e2m1 codes and block
scales, FP8 and bf16 weights are upcast to fp32. `prepare_reference(weight)` computes those
weight-side tensors once, with the same torch operations, and `PreparedReference(x)` then runs the
rest of the reference: the same product (`x.float() @ W.t()` on a tensor equal to the reference's
in values and layout) and the same activation-side work per call (FP8 W8A8 and NVFP4 W4A4 still
quantize each call's activations, runtime/act_quant.py), so the output bytes are the reference's
(tests/test_dequantized.py checks them against `reference_linear` for every format).

The cost is memory: the layer holds an fp32 [N, K] copy beside its stored weight.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from vsr.kernels import fp8, int4, nvfp4
from vsr.runtime.act_quant import Nvfp4Activation, Workspace, fp8_activation

# The activations' scratch memory, per thread, shared by every layer: each layer's products read
# its activation before the next layer quantizes (act_quant.Workspace).
WORKSPACE = Workspace()


def _float_bias(w: Any) -> torch.Tensor | None:
    return None if w.bias is None else w.bias.float()


class PreparedReference:
    """y = reference_linear(x, weight) from precomputed weight-side tensors: y = product(a, x) with
    a = activation(x), the per-call activation quantization (None: a is x). `activation_key`
    names what the activation step computes (None where there is none): references with equal
    keys give the same `a` for one x, so parts over one input may share it (stack_nvfp4_parts)."""

    def __init__(self, weight: Any, product: Callable[[Any, torch.Tensor], torch.Tensor], dense: torch.Tensor,
                 activation: Callable[[torch.Tensor], Any] | None = None, activation_key: Any = None):
        self.format = weight.format
        self.dense = dense          # the fp32 [N, K] tensor the product reads (its memory)
        self.activation = activation
        self.activation_key = activation_key if activation is not None else None
        self.product = product

    def nbytes(self) -> int:
        return self.dense.numel() * self.dense.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.product(x if self.activation is None else self.activation(x), x)


def _product(w, W: torch.Tensor, perm: torch.Tensor | None = None) -> PreparedReference:
    """x (columns gathered by perm, act-order int4) times a precomputed fp32 W, plus the bias."""
    b = _float_bias(w)

    def run(_, x):
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


def _fp8(w: fp8.Fp8Weight) -> PreparedReference:
    W, scale, b = w.weight.float(), w.weight_scale.float()[None, :], _float_bias(w)

    def run(a, x):
        xq, s = a                                    # per call: the activations' codes and scales
        y = (xq @ W.t()).mul_(s.float()).mul_(scale)
        if b is not None:
            y.add_(b)
        return y.to(x.dtype)
    return PreparedReference(w, run, W, lambda x: fp8_activation(x, WORKSPACE), "fp8")


def _nvfp4(w: nvfp4.Nvfp4Weight) -> PreparedReference:
    b = _float_bias(w)
    if not w.quantizes_activations:   # NVFP4A16
        W = nvfp4.dequantize(w)

        def run_a16(_, x):
            y = x.float() @ W.t()
            if b is not None:
                y = y + b
            return y.to(x.dtype)
        return PreparedReference(w, run_a16, W)
    W = nvfp4.e2m1_decode(nvfp4.unpack_fp4(w.packed)) * w.block_scale.float().repeat_interleave(nvfp4.BLOCK, dim=1)
    activation = Nvfp4Activation(w.input_global_scale, WORKSPACE)
    return PreparedReference(w, _nvfp4_w4a4_product(W, _nvfp4_alpha(w), b), W, activation, activation.key)


def _nvfp4_alpha(w: nvfp4.Nvfp4Weight) -> torch.Tensor:
    return 1.0 / (w.input_global_scale.float().reshape(()) * w.global_scale.float().reshape(()))


def _nvfp4_w4a4_product(W: torch.Tensor, alpha: torch.Tensor, b: torch.Tensor | None):
    """xs @ W.t() times alpha (a scalar, or one per output column), plus b."""
    def run(xs, x):
        y = (xs @ W.t()).mul_(alpha)                   # xs: e2m1(codes) · s_x of this call's activations
        if b is not None:
            y.add_(b)
        return y.to(x.dtype)
    return run


def stack_nvfp4_parts(parts: list[PreparedReference], weights: list) -> tuple[PreparedReference, list[PreparedReference]] | None:
    """One product for NVFP4 W4A4 parts over one input that cannot share a weight (their weight
    global scales differ, runtime/fuse.py) but share the activation (one input global scale): the
    parts' fp32 weights stacked along N, each output column times its own part's alpha (the
    product of a row-stacked weight is the same sum per column, and each column is multiplied by
    the same fp32 alpha as its part's product; tests check the bytes). Returns (the stacked
    reference, the parts' references over views of the stacked weight, so the weights are held
    once), or None where the parts are not such."""
    if len(parts) < 2 or any(p is None or p.format != "nvfp4" for p in parts):
        return None
    if any(not w.quantizes_activations for w in weights) or len({p.activation_key for p in parts}) != 1:
        return None
    W = torch.cat([p.dense for p in parts])
    alphas = [_nvfp4_alpha(w) for w in weights]
    biases = [_float_bias(w) for w in weights]
    # -0.0 for a part without a bias: -0.0 + y is y for every y, a -0.0 output included.
    bias = None if all(b is None for b in biases) else torch.cat(
        [b if b is not None else torch.full((w.N,), -0.0) for b, w in zip(biases, weights)])
    alpha = torch.cat([a.expand(w.N) for a, w in zip(alphas, weights)])
    stacked = PreparedReference(weights[0], _nvfp4_w4a4_product(W, alpha, bias), W, parts[0].activation,
                                parts[0].activation_key)
    views, row = [], 0
    for p, w, a, b in zip(parts, weights, alphas, biases):
        Wp = W[row:row + w.N]
        views.append(PreparedReference(w, _nvfp4_w4a4_product(Wp, a, b), Wp, p.activation, p.activation_key))
        row += w.N
    return stacked, views


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
