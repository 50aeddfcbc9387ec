"""The non-product operations of a forward, as two interchangeable sets of one signature each.

`REFERENCE` is pure torch with transformers' roundings: the CPU path's numerics (and the emulated
mode's), imported with no Triton (the Gated DeltaNet's references come from
vsr.kernels.deltanet_reference, which imports none). `triton_ops()` is the Triton kernels of
vsr.kernels.norm, rope, activation, attention, head and delta_rule, imported on first use
(the CPU path never imports them). Both take and give the same tensors (the signatures of those
modules' wrappers and their `*_reference` twins):

- rms_norm(x, weight, eps, *, residual=None, zero_centered=False, exact=True) -> (y, s)
- layer_norm(x, weight, bias, eps, *, residual=None, exact=True) -> (y, s)      bias may be None
- gated_rms_norm(x, z, weight, eps, *, exact=True) -> y
                                              per head of D = len(weight): norm(x) · w · silu(z)
- qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps, *, rotary_dim=None, zero_centered=False,
  exact=True) -> (q, k)                       q [T, Hq*D], k [T, Hkv*D]; out contiguous
- rope(q, k, cos, sin, head_dim) -> (q, k)    RoPE alone, in fp32 with cos/sin as given, one
                                              rounding (ModernBERT's apply_rotary_pos_emb)
- silu_mul(gate_up) -> y                      [T, 2I] (gate first) -> [T, I]
- gelu(x, approximate="none") -> y
- gelu_mul(x, approximate="none") -> y        [T, 2I] -> gelu(first half) · second half (GeGLU)
- attention(q, k, v, lengths, *, causal, window=None, scale=None, gate=None) -> o
                                              q [B, S, Hq, D], k/v [B, S, Hkv, D] -> [B, S, Hq, D];
                                              window: |i - j| <= window // 2; gate: o · sigmoid(gate)
- deltanet_mixer(x, conv_w, ba, neg_a, dt_bias, heads, lengths) -> o
                                              Gated DeltaNet's token mixer: x [B, S, 2 Hk K + Hv V]
                                              (q | k | v before the causal conv1d + SiLU, conv_w
                                              [C, W]), ba [B, S, 2 Hv] (b | a: beta = sigmoid(b),
                                              g = neg_a · softplus(a + dt_bias)), heads (Hk, K, Hv, V)
                                              -> the chunked gated delta rule's o [B, S, Hv, V]
- last_token_score(h, lengths, weight) -> logits (fp32 [B, L]) from row lengths[b] - 1 of [B*S, H]

s is x + residual (the next residual; None when no residual is given). A quantized package at
--dtype auto runs the kernels with exact=False (the approximate set, engine.kernel_set); the
reference set always computes exactly.
"""
from __future__ import annotations

from types import SimpleNamespace

import functools

import torch
import torch.nn.functional as F

from vsr.kernels import deltanet_reference as _gdn


def rms_norm(x, weight, eps, *, residual=None, zero_centered=False, exact=True):
    """transformers' Qwen3RMSNorm of x (+ residual, added in x's dtype): normalise in fp32, cast
    back to x's dtype, then times the weight ((1 + weight) in fp32 when zero_centered)."""
    s = x if residual is None else x + residual
    sf = s.float()
    n = (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps))
    if zero_centered:
        y = (n * (1.0 + weight.float())).to(s.dtype)
    else:
        y = weight * n.to(s.dtype)
    return y, (None if residual is None else s)


def layer_norm(x, weight, bias, eps, *, residual=None, exact=True):
    """LayerNorm of x (+ residual), post-LN as BERT: y = LN(x + residual)."""
    s = x if residual is None else x + residual
    return F.layer_norm(s, (s.shape[-1],), weight, bias, eps), (None if residual is None else s)


def gated_rms_norm(x, z, weight, eps, *, exact=True):
    """transformers' Qwen3_5RMSNormGated over each head of D = len(weight) columns of x [T, H*D]:
    normalise in fp32, cast to x's dtype, times the weight (in x's dtype), times silu(z) in fp32,
    cast. z [T, H*D] (a row-strided view allowed: made contiguous first, as transformers' own
    in_proj_z output is, since torch's CPU kernels may round a strided view's tail differently)."""
    T, D = x.shape[0], weight.shape[0]
    xf = x.reshape(T, -1, D).float()
    y = weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (y * F.silu(z.contiguous().reshape(T, -1, D).float())).to(x.dtype).reshape(T, -1)


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _rope_heads(x, cos, sin, rotary_dim):
    """Rotate-half RoPE over x [T, H, D]'s first rotary_dim dims, cos/sin cast to x's dtype first
    (transformers' rotary embedding returns them in the activation dtype)."""
    c, s = cos.to(x.dtype)[:, None, :], sin.to(x.dtype)[:, None, :]
    if rotary_dim == x.shape[-1]:
        return x * c + _rotate_half(x) * s
    r, p = x[..., :rotary_dim], x[..., rotary_dim:]
    return torch.cat((r * c + _rotate_half(r) * s, p), dim=-1)


def _rows(t, T):
    """cos/sin of each of T rows: given per row, or per position (S rows) repeated per request."""
    return t if t.shape[0] == T else t.repeat(T // t.shape[0], 1)


def qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps, *, rotary_dim=None, zero_centered=False, exact=True):
    """Per-head RMSNorm (Qwen3's q_norm/k_norm) then RoPE, for q [T, Hq*D] and k [T, Hkv*D]."""
    D = q_weight.shape[-1]
    T = q.shape[0]
    rd = D if rotary_dim is None else rotary_dim
    c, s = _rows(cos, T), _rows(sin, T)
    out = []
    for t, w in ((q, q_weight), (k, k_weight)):
        h = rms_norm(t.reshape(T, -1, D), w, eps, zero_centered=zero_centered)[0]
        out.append(_rope_heads(h, c, s, rd).reshape(T, -1))
    return out[0], out[1]


def rope(q, k, cos, sin, head_dim):
    """ModernBERT's apply_rotary_pos_emb on q [T, Hq*D] and k [T, Hkv*D]: in fp32 with cos and sin
    as given (ModernBERT's rotary embedding casts them to the activation dtype), cast back."""
    T = q.shape[0]
    c, s = _rows(cos, T)[:, None, :], _rows(sin, T)[:, None, :]
    out = []
    for t in (q, k):
        x = t.reshape(T, -1, head_dim).float()
        out.append((x * c + _rotate_half(x) * s).to(t.dtype).reshape(T, -1))
    return out[0], out[1]


def silu_mul(gate_up):
    """silu(gate) * up over [T, 2I] (gate columns first), in its dtype."""
    i = gate_up.shape[-1] // 2
    return F.silu(gate_up[:, :i]) * gate_up[:, i:]


def gelu(x, approximate="none"):
    return F.gelu(x, approximate=approximate)


def gelu_mul(x, approximate="none"):
    """ModernBertMLP's GeGLU: gelu(first half) * second half of [T, 2I], in its dtype."""
    i = x.shape[-1] // 2
    return F.gelu(x[:, :i], approximate=approximate) * x[:, i:]


def attention(q, k, v, lengths, *, causal, window=None, scale=None, gate=None):
    """torch's scaled_dot_product_attention with an explicit mask: keys at positions >= length
    masked; causal (decoder) or bidirectional (encoder); with a window, only keys within
    |i - j| <= window // 2 (ModernBERT's local attention: transformers' sliding_window =
    local_attention // 2, distance <= sliding_window); query rows past a request's length see
    its real keys (finite, never read; zeros where the window leaves them none). GQA by repeating
    K and V per query head group. With gate: the output times sigmoid(gate) (Qwen3.5; the gate
    made contiguous first, as transformers reshapes it)."""
    B, S, Hq, D = q.shape
    Hkv = k.shape[2]
    i = torch.arange(S, device=q.device)
    keys = i[None, :] < lengths.to(q.device)[:, None]   # [B, S]
    allow = keys[:, None, None, :]
    if causal:
        allow = allow & (i[None, :] <= i[:, None])[None, None]
    if window is not None:
        allow = allow & ((i[:, None] - i[None, :]).abs() <= window // 2)[None, None]
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if Hkv != Hq:
        kt = kt.repeat_interleave(Hq // Hkv, dim=1)
        vt = vt.repeat_interleave(Hq // Hkv, dim=1)
    a = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=allow, scale=D ** -0.5 if scale is None else scale)
    a = a.transpose(1, 2)
    return a if gate is None else a * torch.sigmoid(gate.contiguous())


deltanet_mixer = _gdn.deltanet_mixer_reference


def last_token_score(h, lengths, weight):
    """The score head (fp32) on row lengths[b] - 1 of each request of h [B*S, H]."""
    B = lengths.shape[0]
    hb = h.reshape(B, -1, h.shape[-1])
    last = hb[torch.arange(B, device=h.device), lengths.to(h.device) - 1]
    return last.float() @ weight.t()


NAMES = ("rms_norm", "layer_norm", "gated_rms_norm", "qk_norm_rope", "rope", "silu_mul", "gelu", "gelu_mul",
         "attention", "deltanet_mixer", "last_token_score")
REFERENCE = SimpleNamespace(**{n: globals()[n] for n in NAMES})


def triton_ops() -> SimpleNamespace:
    """The Triton kernels' wrappers under the same names (imported here, on the GPU path only).
    rope is kernels.rope.rope's one-rounding form (exact=False), ModernBERT's numerics."""
    from vsr.kernels import activation, attention as attn, delta_rule, head, norm, rope as rp

    return SimpleNamespace(rms_norm=norm.rms_norm, layer_norm=norm.layer_norm, gated_rms_norm=norm.gated_rms_norm,
                           qk_norm_rope=rp.qk_norm_rope, rope=functools.partial(rp.rope, exact=False),
                           silu_mul=activation.silu_mul, gelu=activation.gelu, gelu_mul=activation.gelu_mul,
                           attention=attn.attention, deltanet_mixer=delta_rule.deltanet_mixer,
                           last_token_score=head.last_token_score)


def kernel_twins() -> SimpleNamespace:
    """The kernels' own `*_reference` twins under the same names (for tests: they must give the
    bytes of REFERENCE)."""
    from vsr.kernels import activation, attention as attn, head, norm, rope as rp

    return SimpleNamespace(rms_norm=norm.rms_norm_reference, layer_norm=norm.layer_norm_reference,
                           gated_rms_norm=norm.gated_rms_norm_reference, qk_norm_rope=rp.qk_norm_rope_reference,
                           rope=functools.partial(rp.rope_reference, exact=False),
                           silu_mul=activation.silu_mul_reference, gelu=activation.gelu_reference,
                           gelu_mul=activation.gelu_mul_reference, attention=attn.attention_reference,
                           deltanet_mixer=_gdn.deltanet_mixer_reference,
                           last_token_score=head.last_token_score_reference)
