"""The Gated DeltaNet's pure-torch references, importable without Triton (the CPU path's numerics):
the depthwise causal conv1d with SiLU (the Triton form in vsr.kernels.conv1d) and the gated delta
rule, chunked and token by token (the Triton form and the definitions in vsr.kernels.delta_rule).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64
L2_EPS = 1e-6


def causal_conv1d_silu_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """transformers' causal_conv1d_fn(x^T, w, activation="silu")^T: [B, S, C] in x's dtype."""
    S, W = x.shape[1], w.shape[-1]
    y = F.conv1d(x.transpose(1, 2).to(w.dtype), w.unsqueeze(1), padding=W - 1, groups=w.shape[0])[..., :S]
    return F.silu(y).to(x.dtype).transpose(1, 2).contiguous()


def _prepare(q, k, v, g, beta, lengths, l2norm):
    """fp32 [B, Hv, S, *] copies, heads repeated, padding zeroed, q/k normalised, q scaled."""
    B, S, Hk, K = k.shape
    Hv = v.shape[2]
    if Hv % Hk:
        raise ValueError(f"value heads {Hv} are not a multiple of key heads {Hk}")
    q, k = (x.repeat_interleave(Hv // Hk, dim=2) if Hv != Hk else x for x in (q, k))
    q, k, v, g, beta = (x.transpose(1, 2).float().contiguous() for x in (q, k, v, g, beta))
    if lengths is not None:
        keep = (torch.arange(S, device=q.device)[None] < lengths.to(q.device)[:, None]).float()  # [B, S]
        q, k, v = (x * keep[:, None, :, None] for x in (q, k, v))
        g, beta = g * keep[:, None], beta * keep[:, None]
    if l2norm:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + L2_EPS)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + L2_EPS)
    return q * K ** -0.5, k, v, g, beta


def chunk_gated_delta_rule_reference(q, k, v, g, beta, lengths=None, *, l2norm=True, chunk=CHUNK):
    """o [B, S, Hv, V] in q's dtype. q, k [B, S, Hk, K]; v [B, S, Hv, V]; g (log decay, <= 0) and beta
    [B, S, Hv]; lengths int [B] or None. The chunked form of transformers' torch_chunk_gated_delta_rule,
    with the triangular solve written as its forward substitution."""
    B, S = q.shape[:2]
    dtype = q.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta, lengths, l2norm)
    pad = (-S) % chunk
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    n = (S + pad) // chunk
    q, k, v = (x.reshape(B, x.shape[1], n, chunk, x.shape[-1]) for x in (q, k, v))
    g, beta = g.reshape(B, -1, n, chunk), beta.reshape(B, -1, n, chunk)
    gc = g.cumsum(-1)
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = (gc[..., :, None] - gc[..., None, :]).masked_fill(~lower, float("-inf")).exp()
    kb = k * beta[..., None]
    t = -((kb @ k.transpose(-1, -2)) * decay).tril(-1)
    for i in range(1, chunk):
        row = t[..., i, :i].clone()
        t[..., i, :i] = row + (row[..., None] * t[..., :i, :i]).sum(-2)
    t = t + torch.eye(chunk, device=q.device)
    u = t @ (v * beta[..., None])
    w = t @ (kb * gc.exp()[..., None])
    attn = (q @ k.transpose(-1, -2)) * decay
    qg = q * gc.exp()[..., None]
    kg = k * (gc[..., -1:] - gc).exp()[..., None]
    state = q.new_zeros(B, q.shape[1], q.shape[-1], v.shape[-1])
    out = torch.empty_like(v)
    for c in range(n):
        vn = u[:, :, c] - w[:, :, c] @ state
        out[:, :, c] = qg[:, :, c] @ state + attn[:, :, c] @ vn
        state = state * gc[:, :, c, -1, None, None].exp() + kg[:, :, c].transpose(-1, -2) @ vn
    out = out.reshape(B, out.shape[1], -1, out.shape[-1])[:, :, :S]
    return out.transpose(1, 2).to(dtype).contiguous()


def recurrent_gated_delta_rule_reference(q, k, v, g, beta, lengths=None, *, l2norm=True):
    """The token-by-token form (the definition): o [B, S, Hv, V] in fp32."""
    q, k, v, g, beta = _prepare(q, k, v, g, beta, lengths, l2norm)
    B, H, S, K = q.shape
    state = q.new_zeros(B, H, K, v.shape[-1])
    out = torch.empty_like(v)
    for t in range(S):
        state = state * g[:, :, t, None, None].exp()
        delta = (v[:, :, t] - (state * k[:, :, t, :, None]).sum(-2)) * beta[:, :, t, None]
        state = state + k[:, :, t, :, None] * delta[:, :, None, :]
        out[:, :, t] = (state * q[:, :, t, :, None]).sum(-2)
    return out.transpose(1, 2).contiguous()


def deltanet_gates_reference(ba: torch.Tensor, neg_a: torch.Tensor, dt_bias: torch.Tensor):
    """(g, beta) of Gated DeltaNet from the fused in_proj_b | in_proj_a output ba [T, 2H] (b columns
    first), as transformers' Qwen3_5GatedDeltaNet: beta = sigmoid(b) in ba's dtype; g =
    -exp(A_log) * softplus(a.float() + dt_bias) in fp32, neg_a = -exp(A_log) (fp32 [H]). Both [T, H].
    b is made contiguous first, as transformers' own in_proj_b output is (torch's CPU sigmoid may
    round a strided view's tail differently)."""
    H = ba.shape[-1] // 2
    beta = ba[:, :H].contiguous().sigmoid()
    g = neg_a * F.softplus(ba[:, H:].float() + dt_bias)
    return g, beta


def deltanet_mixer_reference(x, conv_w, ba, neg_a, dt_bias, heads, lengths=None):
    """Gated DeltaNet's token mixer from in_proj's outputs, as transformers' Qwen3_5GatedDeltaNet runs
    it: the causal conv1d + SiLU of x [B, S, 2 Hk K + Hv V] (q | k | v) with conv_w [C, W], the gates
    of ba [B, S, 2 Hv] (b | a), then the chunked gated delta rule (q and k L2-normalised);
    heads (Hk, K, Hv, V). o [B, S, Hv, V] in x's dtype."""
    B, S = x.shape[:2]
    q, k, v = split_mixed(causal_conv1d_silu_reference(x, conv_w), heads)
    g, beta = deltanet_gates_reference(ba.reshape(B * S, -1), neg_a, dt_bias)
    return chunk_gated_delta_rule_reference(q, k, v, g.view(B, S, -1), beta.view(B, S, -1), lengths)


def split_mixed(mixed: torch.Tensor, heads) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [B, S, Hk, K], k [B, S, Hk, K], v [B, S, Hv, V]: views of the conv output's columns
    [B, S, 2 Hk K + Hv V] (q | k | v), heads (Hk, K, Hv, V)."""
    Hk, K, Hv, V = heads
    kd = Hk * K
    return (mixed[..., :kd].unflatten(-1, (Hk, K)), mixed[..., kd:2 * kd].unflatten(-1, (Hk, K)),
            mixed[..., 2 * kd:].unflatten(-1, (Hv, V)))
