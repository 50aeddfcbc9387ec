"""Qwen3ForSequenceClassification in plain torch: the architecture of the Decision-class routers.

RMSNorm (computed in fp32, as transformers), per-head RMSNorm on q and k before
RoPE, grouped-query attention, SwiGLU MLP, a causal mask combined with the
padding mask, and the score head applied to the last real token of each
right-padded request. The score head is a plain dense weight (quantized packages
list "score" in their ignore list) and runs in fp32. With tie_word_embeddings
there is no lm_head tensor; a classifier never needs one, so nothing is read for it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vsr.runtime.errors import PackageError
from vsr.runtime.models.common import Builder

_PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
         "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def linear_names(config: dict, loader=None) -> list[str]:
    return [f"model.layers.{i}.{p}" for i in range(int(config["num_hidden_layers"])) for p in _PROJ]


def rope_theta(config: dict) -> float:
    """rope_theta from transformers 4.x ("rope_theta") or 5.x ("rope_parameters") configs."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rtype = params.get("rope_type", params.get("type", "default"))
    if rtype != "default":
        raise PackageError(f"config.json: rope_type {rtype!r} is not supported (only default RoPE)")
    theta = config.get("rope_theta", params.get("rope_theta"))
    if theta is None:
        raise PackageError("config.json: no rope_theta (neither top-level nor in rope_parameters)")
    return float(theta)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Qwen3RMSNorm: normalise in fp32, cast back, then scale."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Qwen3Router(torch.nn.Module):
    def __init__(self, config: dict, b: Builder):
        super().__init__()
        if config.get("use_sliding_window"):
            raise PackageError("config.json: use_sliding_window is not supported")
        if config.get("hidden_act", "silu") != "silu":
            raise PackageError(f"config.json: hidden_act {config['hidden_act']!r} is not supported (only silu)")
        self.dtype = b.act_dtype
        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.kv_heads = int(config.get("num_key_value_heads") or self.heads)
        self.head_dim = int(config.get("head_dim") or self.hidden // self.heads)
        if self.heads % self.kv_heads:
            raise PackageError(f"config.json: num_attention_heads {self.heads} is not a multiple of "
                               f"num_key_value_heads {self.kv_heads}")
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        self.theta = rope_theta(config)
        id2label = config.get("id2label")
        if not id2label:
            raise PackageError("config.json: a Qwen3 router needs id2label (its score head's labels)")
        self.labels = [id2label[str(i)] if str(i) in id2label else id2label[i] for i in range(len(id2label))]

        # Norm weights in the activation dtype, as transformers multiplies them.
        self.embed = b.tensor("model.embed_tokens.weight")  # as stored; rows cast after the lookup
        self.layers = torch.nn.ModuleList()
        self.norms = []
        for i in range(int(config["num_hidden_layers"])):
            P = f"model.layers.{i}."
            self.layers.append(torch.nn.ModuleDict({p.split(".")[1]: b.linear(P + p) for p in _PROJ}))
            self.norms.append({n: b.tensor(P + n + ".weight", self.dtype) for n in
                               ("input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm")})
        self.final_norm = b.tensor("model.norm.weight", self.dtype)
        self.score = b.tensor("score.weight", torch.float32)
        if tuple(self.score.shape) != (len(self.labels), self.hidden):
            raise PackageError(f"score.weight: shape {tuple(self.score.shape)}, expected "
                               f"[{len(self.labels)}, {self.hidden}] (labels x hidden_size)")
        self.inv_freq = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32,
                                                            device=b.device) / self.head_dim))

    def _rope(self, S: int, device):
        # In fp32, then cast, as transformers' rotary embedding.
        t = torch.arange(S, device=device, dtype=torch.float32)
        f = torch.outer(t, self.inv_freq)
        emb = torch.cat((f, f), dim=-1)
        return emb.cos().to(self.dtype)[None, None], emb.sin().to(self.dtype)[None, None]

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        B, S = input_ids.shape
        x = self.embed[input_ids].to(self.dtype)
        cos, sin = self._rope(S, x.device)
        causal = torch.ones(S, S, dtype=torch.bool, device=x.device).tril()
        # Right padding: real queries only ever see real keys through the causal mask; pad
        # queries still see the real prefix, so no row is all-masked (no NaN).
        allow = causal[None, None] & attention_mask.bool()[:, None, None, :]
        nh, nkv, dh = self.heads, self.kv_heads, self.head_dim
        for m, n in zip(self.layers, self.norms):
            h = rms_norm(x, n["input_layernorm"], self.eps)
            q = rms_norm(m["q_proj"](h).view(B, S, nh, dh), n["self_attn.q_norm"], self.eps).transpose(1, 2)
            k = rms_norm(m["k_proj"](h).view(B, S, nkv, dh), n["self_attn.k_norm"], self.eps).transpose(1, 2)
            v = m["v_proj"](h).view(B, S, nkv, dh).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            if nkv != nh:
                k = k.repeat_interleave(nh // nkv, dim=1)
                v = v.repeat_interleave(nh // nkv, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=allow, scale=dh ** -0.5)
            x = x + m["o_proj"](a.transpose(1, 2).reshape(B, S, nh * dh))
            h = rms_norm(x, n["post_attention_layernorm"], self.eps)
            x = x + m["down_proj"](F.silu(m["gate_proj"](h)) * m["up_proj"](h))
        return rms_norm(x, self.final_norm, self.eps)

    def forward(self, input_ids, attention_mask, lengths) -> torch.Tensor:
        """Probabilities [B, L] (fp32) from the score head on each request's last real token."""
        h = self.encode(input_ids, attention_mask)
        last = h[torch.arange(h.shape[0], device=h.device), lengths.to(h.device) - 1]
        return torch.softmax(self.logits(last), dim=-1)

    def logits(self, last_hidden: torch.Tensor) -> torch.Tensor:
        return last_hidden.float() @ self.score.t()
