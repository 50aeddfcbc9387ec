"""Qwen3ForSequenceClassification in plain torch: the architecture of the Decision-class routers.

RMSNorm (computed in fp32, as transformers), per-head RMSNorm on q and k before
RoPE, grouped-query attention, SwiGLU MLP, a causal mask combined with the
padding mask, and the score head applied to the last real token of each
right-padded request. The score head is a plain dense weight (quantized packages
list "score" in their ignore list) and runs in fp32. With tie_word_embeddings
there is no lm_head tensor; a classifier never needs one, so nothing is read for it.

A layer runs four products: q|k|v and gate|up fused at load (runtime/fuse.py), o and down. The
rest of the forward (norms with the residual add, q/k norm with RoPE, attention, SwiGLU, the
last-token score head) are the operations of vsr.runtime.models.ops: Triton kernels on the
GPU path, their pure-torch reference on the CPU. Activations are 2-D [B*S, hidden].
"""
from __future__ import annotations

import torch

from vsr.runtime.errors import PackageError
from vsr.runtime.models import ops
from vsr.runtime.models.common import (Builder, DecoderRouter, labels, mlp_down, normed_product,
                                       request_lengths, rope_cos_sin, rope_inv_freq, rope_theta)

_PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
         "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
# The four products of a layer: (label, the package's Linear layers it runs, in output order).
_PRODUCTS = (("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
             ("self_attn.o_proj", ("self_attn.o_proj",)),
             ("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj")),
             ("mlp.down_proj", ("mlp.down_proj",)))


def linear_names(config: dict, loader=None) -> list[str]:
    return [f"model.layers.{i}.{p}" for i in range(int(config["num_hidden_layers"])) for p in _PROJ]


def products(config: dict, loader=None) -> list[tuple[str, tuple[str, ...]]]:
    """The products a forward runs: (label, Linear layers fused into it)."""
    return [(f"model.layers.{i}.{label}", tuple(f"model.layers.{i}.{p}" for p in parts))
            for i in range(int(config["num_hidden_layers"])) for label, parts in _PRODUCTS]


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Qwen3RMSNorm: normalise in fp32, cast back, then scale."""
    return ops.REFERENCE.rms_norm(x, w, eps)[0]


class Qwen3Router(DecoderRouter):
    def __init__(self, config: dict, b: Builder):
        super().__init__()
        if config.get("use_sliding_window"):
            raise PackageError("config.json: use_sliding_window is not supported")
        if config.get("hidden_act", "silu") != "silu":
            raise PackageError(f"config.json: hidden_act {config['hidden_act']!r} is not supported (only silu)")
        self.dtype = b.act_dtype
        self.hidden = int(config["hidden_size"])
        self.attention_heads(config)
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        self.theta = rope_theta(config)
        self.labels = labels(config, "a Qwen3 router's score head")

        # Norm weights in the activation dtype, as transformers multiplies them.
        self.ops, self.exact = b.ops(), b.exact
        self.embed = b.tensor("model.embed_tokens.weight")  # as stored; rows cast after the lookup
        self.layers = torch.nn.ModuleList()
        self.norms = []
        for i, (label, parts) in enumerate(products(config)):
            if i % len(_PRODUCTS) == 0:
                self.layers.append(torch.nn.ModuleDict())
            name = label.rsplit(".", 1)[1]
            act = "silu_mul" if name == "gate_up_proj" else None
            self.layers[-1][name] = b.projection(label, list(parts), act) if len(parts) > 1 else b.linear(parts[0])
        for i in range(len(self.layers)):
            P = f"model.layers.{i}."
            self.norms.append({n: b.tensor(P + n + ".weight", self.dtype) for n in
                               ("input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm")})
        self.final_norm = b.tensor("model.norm.weight", self.dtype)
        self.load_score(b)
        self.inv_freq = rope_inv_freq(self.theta, self.head_dim, b.device)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, lengths: torch.Tensor | None = None
               ) -> torch.Tensor:
        """The final-normed hidden state [B, S, H] (rows past a request's length are finite padding)."""
        B, S = input_ids.shape
        lengths = request_lengths(input_ids, attention_mask, lengths)
        o, X = self.ops, self.exact
        T = B * S
        x = self.embed[input_ids.reshape(T)].to(self.dtype)
        cos, sin = rope_cos_sin(S, self.inv_freq, self.dtype if X else None)   # [S, head_dim]: row t % S
        nh, nkv, dh = self.heads, self.kv_heads, self.head_dim
        d, res = x, None   # the residual stream is d + res, summed by the next norm (res None: d alone)
        for m, n in zip(self.layers, self.norms):
            qkv, _, res = normed_product(o, m["qkv_proj"], d, n["input_layernorm"], self.eps, residual=res, exact=X,
                                         keep_output=False)
            q, k, v = qkv.split(m["qkv_proj"].sizes, dim=1)
            q, k = o.qk_norm_rope(q, k, n["self_attn.q_norm"], n["self_attn.k_norm"], cos, sin, self.eps, exact=X)
            a = o.attention(q.view(B, S, nh, dh), k.view(B, S, nkv, dh), v.view(B, S, nkv, dh), lengths,
                            causal=True, scale=dh ** -0.5)
            d = m["o_proj"](a.reshape(T, nh * dh))
            gu, _, res = normed_product(o, m["gate_up_proj"], d, n["post_attention_layernorm"], self.eps,
                                        residual=res, exact=X, keep_output=False)
            d = mlp_down(o, m["gate_up_proj"], m["down_proj"], gu, "silu_mul", X)
        h = o.rms_norm(d, self.final_norm, self.eps, residual=res, exact=X)[0]
        return h.view(B, S, self.hidden)
