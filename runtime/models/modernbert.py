"""ModernBertForSequenceClassification (the Vela-class encoder routers).

Numerics as transformers' modeling_modernbert:
- embeddings: token embedding, then LayerNorm (no bias unless norm_bias);
- pre-norm layers: attn_norm (none on layer 0: the embedding norm precedes it) -> Wqkv ([q | k |
  v] blocks of hidden each) -> RoPE (cos/sin made in fp32 and cast to the activation dtype, the
  rotation in fp32 and cast back; theta per layer type: "full_attention" global,
  "sliding_attention" local) -> bidirectional attention over the real keys, local layers only
  within |i - j| <= local_attention // 2 -> Wo; then mlp_norm -> Wi -> act(first half) * second
  half (GeGLU) -> Wo; each norm carries the residual add before it;
- final_norm, pooling ("cls": the first token; "mean": over the real tokens), the head
  (dense -> classifier_activation -> LayerNorm) and the classifier (fp32, with its bias).
layer_types is read as given; without it, transformers' derivation from
global_attn_every_n_layers (default 3: layers 0, 3, 6, ... global).
A layer runs four products (Wqkv and Wi are one Linear each in the package); the norms, RoPE,
attention and GeGLU are the operations of vsr.runtime.models.ops: Triton kernels on the GPU path,
their pure-torch references on the CPU. Activations are 2-D [B*S, hidden].
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vsr.runtime.errors import PackageError
from vsr.runtime.models.common import (Builder, activated_product, labels, normed_product, request_lengths,
                                       rope_cos_sin, rope_inv_freq)

# config.json's activation -> its name in models/common.activated_product (the MLP's gated form is
# this name + "_mul"); transformers' "gelu" is the exact (erf) GELU.
_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "silu": "silu", "relu": "relu"}
LAYER_TYPES = ("full_attention", "sliding_attention")
_DEFAULT_THETA = {"full_attention": 160_000.0, "sliding_attention": 10_000.0}
_LEGACY_THETA_KEYS = {"full_attention": "global_rope_theta", "sliding_attention": "local_rope_theta"}
_PROJ = ("attn.Wqkv", "attn.Wo", "mlp.Wi", "mlp.Wo")


def layer_types(config: dict) -> list[str]:
    n = int(config["num_hidden_layers"])
    types = config.get("layer_types")
    if types is None:
        every = int(config.get("global_attn_every_n_layers", 3))
        return ["full_attention" if i % every == 0 else "sliding_attention" for i in range(n)]
    if not isinstance(types, list) or len(types) < n:
        raise PackageError(f"config.json: layer_types must list at least num_hidden_layers={n} layer types")
    bad = sorted({t for t in types[:n] if t not in LAYER_TYPES})
    if bad:
        raise PackageError(f"config.json: layer type(s) {', '.join(map(repr, bad))} are not supported "
                           f"(ModernBERT layers are {' or '.join(LAYER_TYPES)})")
    return list(types[:n])


def rope_theta(config: dict, layer_type: str) -> float:
    """The RoPE theta of a layer type: rope_parameters[type] (transformers 5), else the 4.x keys
    global_rope_theta / local_rope_theta, else transformers' defaults (160000 / 10000)."""
    params = (config.get("rope_parameters") or {}).get(layer_type) or {}
    rtype = params.get("rope_type", "default")
    if rtype != "default":
        raise PackageError(f"config.json: rope_type {rtype!r} ({layer_type}) is not supported (only default RoPE)")
    theta = params.get("rope_theta", config.get(_LEGACY_THETA_KEYS[layer_type], _DEFAULT_THETA[layer_type]))
    return float(theta)


def linear_names(config: dict, loader=None) -> list[str]:
    n = int(config["num_hidden_layers"])
    return [f"model.layers.{i}.{p}" for i in range(n) for p in _PROJ] + ["head.dense"]


def products(config: dict, loader=None) -> list[tuple[str, tuple[str, ...]]]:
    """The products a forward runs: each Linear of the package alone (Wqkv is q|k|v and Wi is
    act|gate already)."""
    return [(n, (n,)) for n in linear_names(config, loader)]


class ModernBertRouter(torch.nn.Module):
    def __init__(self, config: dict, b: Builder):
        super().__init__()
        arch = (config.get("architectures") or [None])[0]
        if arch != "ModernBertForSequenceClassification":
            raise PackageError(f"config.json: architecture {arch!r} is not supported; ModernBERT packages must be "
                               "ModernBertForSequenceClassification (an encoder with its classifier head)")
        for key, default in (("hidden_activation", "gelu"), ("classifier_activation", "gelu")):
            if config.get(key, default) not in _ACTS:
                raise PackageError(f"config.json: {key} {config[key]!r} is not supported ({', '.join(_ACTS)})")
        self.act = _ACTS[config.get("hidden_activation", "gelu")] + "_mul"
        self.head_act = _ACTS[config.get("classifier_activation", "gelu")]
        self.pooling = config.get("classifier_pooling", "cls")
        if self.pooling not in ("cls", "mean"):
            raise PackageError(f"config.json: classifier_pooling {self.pooling!r} is not supported (cls or mean)")
        self.ops, self.exact = b.ops(), b.exact
        self.dtype = b.act_dtype
        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        if self.hidden % self.heads:
            raise PackageError(f"config.json: hidden_size {self.hidden} is not a multiple of num_attention_heads "
                               f"{self.heads}")
        self.head_dim = self.hidden // self.heads
        self.eps = float(config.get("norm_eps", 1e-5))
        self.local_attention = int(config.get("local_attention", 128))   # keys within |i - j| <= this // 2
        self.types = layer_types(config)
        self.labels = labels(config, "a ModernBERT classifier's head")

        self.embed = b.tensor("model.embeddings.tok_embeddings.weight")   # as stored; rows cast after lookup
        self.emb_norm = self._norm(b, "model.embeddings.norm")
        self.layers = torch.nn.ModuleList()
        self.norms = []
        for i in range(len(self.types)):
            L = f"model.layers.{i}."
            self.layers.append(torch.nn.ModuleDict({p.replace(".", "_"): b.linear(L + p) for p in _PROJ}))
            # Layer 0 has no attention norm (nn.Identity in transformers): the embedding norm precedes it.
            self.norms.append((self._norm(b, L + "attn_norm") if i else None, self._norm(b, L + "mlp_norm")))
        self.final_norm = self._norm(b, "model.final_norm")
        self.head_dense = b.linear("head.dense")
        self.head_norm = self._norm(b, "head.norm")
        self.cls_w = b.tensor("classifier.weight", torch.float32)
        self.cls_b = b.tensor("classifier.bias", torch.float32) if b.has("classifier.bias") else None
        if tuple(self.cls_w.shape) != (len(self.labels), self.hidden):
            raise PackageError(f"classifier.weight: shape {tuple(self.cls_w.shape)}, expected "
                               f"[{len(self.labels)}, {self.hidden}] (labels x hidden_size)")
        self.inv_freq = {t: rope_inv_freq(rope_theta(config, t), self.head_dim, b.device) for t in set(self.types)}

    def _norm(self, b: Builder, name: str):
        bias = b.tensor(name + ".bias", self.dtype) if b.has(name + ".bias") else None
        return b.tensor(name + ".weight", self.dtype), bias

    def _cos_sin(self, layer_type: str, S: int):
        """cos, sin [S, head_dim], made in fp32 and cast to the activation dtype (transformers')."""
        cos, sin = rope_cos_sin(S, self.inv_freq[layer_type])
        return cos.to(self.dtype), sin.to(self.dtype)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, lengths: torch.Tensor | None = None
               ) -> torch.Tensor:
        """Last hidden state [B, S, H] (after final_norm) in the activation dtype."""
        B, S = input_ids.shape
        T, H, nh, dh = B * S, self.hidden, self.heads, self.head_dim
        lengths = request_lengths(input_ids, attention_mask, lengths)
        o, X = self.ops, self.exact
        e = self.embed[input_ids.reshape(T)].to(self.dtype)
        rope = {t: self._cos_sin(t, S) for t in set(self.types)}
        d = res = None   # the residual stream is d + res, summed by the next norm
        for i, (t, m, (attn_norm, mlp_norm)) in enumerate(zip(self.types, self.layers, self.norms)):
            if i == 0:   # the embedding norm's output is the stream and Wqkv's input
                qkv, res, _ = normed_product(o, m["attn_Wqkv"], e, self.emb_norm[0], self.eps, bias=self.emb_norm[1],
                                             layer=True, exact=X)
            else:
                qkv, _, res = normed_product(o, m["attn_Wqkv"], d, attn_norm[0], self.eps, bias=attn_norm[1],
                                             residual=res, layer=True, exact=X, keep_output=False)
            q, k = o.rope(qkv[:, :H], qkv[:, H:2 * H], *rope[t], dh)
            v = qkv[:, 2 * H:].unflatten(0, (B, S)).unflatten(-1, (nh, dh))
            a = o.attention(q.view(B, S, nh, dh), k.view(B, S, nh, dh), v, lengths, causal=False,
                            window=self.local_attention if t == "sliding_attention" else None, scale=dh ** -0.5)
            d = m["attn_Wo"](a.reshape(T, H))
            wi, _, res = normed_product(o, m["mlp_Wi"], d, mlp_norm[0], self.eps, bias=mlp_norm[1], residual=res,
                                        layer=True, exact=X, keep_output=False)
            d = activated_product(o, m["mlp_Wo"], wi, self.act, X)
        w, bias = self.final_norm
        return o.layer_norm(d, w, bias, self.eps, residual=res, exact=X)[0].view(B, S, H)

    def pool(self, h: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The pooled state in the activation dtype, as transformers pools it."""
        if self.pooling == "cls":
            return h[:, 0]
        m = attention_mask.to(h.dtype)[..., None]
        return (h * m).sum(1) / m.sum(1)

    def logits(self, pooled: torch.Tensor) -> torch.Tensor:
        y = self.head_dense(pooled)
        if self.head_act in ("gelu", "gelu_tanh"):
            y = self.ops.gelu(y, "tanh" if self.head_act == "gelu_tanh" else "none")
        else:
            y = F.silu(y) if self.head_act == "silu" else torch.relu(y)
        e = self.ops.layer_norm(y, self.head_norm[0], self.head_norm[1], self.eps, exact=self.exact)[0]
        y = e.float() @ self.cls_w.t()
        return y if self.cls_b is None else y + self.cls_b

    def forward(self, input_ids, attention_mask, lengths=None) -> torch.Tensor:
        """Probabilities [B, L] (fp32)."""
        h = self.encode(input_ids, attention_mask, lengths)
        return torch.softmax(self.logits(self.pool(h, attention_mask)), dim=-1)
