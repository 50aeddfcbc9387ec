"""ModernBertForSequenceClassification in plain torch (the Vela-class encoder routers).

Numerics as transformers' modeling_modernbert:
- embeddings: token embedding, then LayerNorm (no bias unless norm_bias);
- pre-norm layers: attn_norm (none on layer 0) -> Wqkv ([q | k | v] blocks of hidden each) ->
  RoPE (cos/sin made in fp32 and cast to the activation dtype, the rotation in fp32 and cast back;
  theta per layer type: "full_attention" global, "sliding_attention" local) -> bidirectional
  attention over the real keys, local layers only within |i - j| <= local_attention // 2 -> Wo;
  then mlp_norm -> Wi -> act(first half) * second half (GeGLU) -> Wo;
- final_norm, pooling ("cls": the first token; "mean": over the real tokens), the head
  (dense -> classifier_activation -> LayerNorm) and the classifier (fp32, with its bias).
layer_types is read as given; without it, transformers' derivation from
global_attn_every_n_layers (default 3: layers 0, 3, 6, ... global).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vsr.runtime.errors import PackageError
from vsr.runtime.models.common import Builder

_ACTS = {
    "gelu": lambda x: F.gelu(x),   # transformers' "gelu" is the exact (erf) GELU
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu": F.relu,
}
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


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' ModernBERT rotation: in fp32 with the (already cast) cos/sin, cast back
    (shared: rope.rope(...) without a norm)."""
    xf = x.float()
    return (xf * cos + _rotate_half(xf) * sin).to(x.dtype)


def _encoder_attention(q, k, v, attention_mask, window: int | None):
    """Bidirectional attention over the real keys, within |i - j| <= window when given
    (shared: attention.attention(q, k, v, lengths, causal=False, window=local_attention))."""
    S = q.shape[2]
    allow = attention_mask.bool()[:, None, None, :]
    if window is not None:
        i = torch.arange(S, device=q.device)
        allow = allow & ((i[:, None] - i[None, :]).abs() <= window)[None, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allow, scale=q.shape[-1] ** -0.5)


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
        self.act = _ACTS[config.get("hidden_activation", "gelu")]
        self.head_act = _ACTS[config.get("classifier_activation", "gelu")]
        self.pooling = config.get("classifier_pooling", "cls")
        if self.pooling not in ("cls", "mean"):
            raise PackageError(f"config.json: classifier_pooling {self.pooling!r} is not supported (cls or mean)")
        self.dtype = b.act_dtype
        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        if self.hidden % self.heads:
            raise PackageError(f"config.json: hidden_size {self.hidden} is not a multiple of num_attention_heads "
                               f"{self.heads}")
        self.head_dim = self.hidden // self.heads
        self.eps = float(config.get("norm_eps", 1e-5))
        self.window = int(config.get("local_attention", 128)) // 2
        self.types = layer_types(config)
        id2label = config.get("id2label")
        if not id2label:
            raise PackageError("config.json: a ModernBERT classifier needs id2label (its classifier's labels)")
        self.labels = [id2label[str(i)] if str(i) in id2label else id2label[i] for i in range(len(id2label))]

        self.embed = b.tensor("model.embeddings.tok_embeddings.weight")   # as stored; rows cast after lookup
        self.emb_norm = self._norm(b, "model.embeddings.norm")
        self.layers = torch.nn.ModuleList()
        self.norms = []
        for i in range(len(self.types)):
            L = f"model.layers.{i}."
            self.layers.append(torch.nn.ModuleDict({p.replace(".", "_"): b.linear(L + p) for p in _PROJ}))
            # Layer 0 has no attention norm (nn.Identity in transformers): the embedding norm precedes it.
            attn_norm = self._norm(b, L + "attn_norm") if b.has(L + "attn_norm.weight") else None
            self.norms.append((attn_norm, self._norm(b, L + "mlp_norm")))
        self.final_norm = self._norm(b, "model.final_norm")
        self.head_dense = b.linear("head.dense")
        self.head_norm = self._norm(b, "head.norm")
        self.cls_w = b.tensor("classifier.weight", torch.float32)
        self.cls_b = b.tensor("classifier.bias", torch.float32) if b.has("classifier.bias") else None
        if tuple(self.cls_w.shape) != (len(self.labels), self.hidden):
            raise PackageError(f"classifier.weight: shape {tuple(self.cls_w.shape)}, expected "
                               f"[{len(self.labels)}, {self.hidden}] (labels x hidden_size)")
        self.inv_freq = {t: 1.0 / (rope_theta(config, t) ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32,
                                                                           device=b.device) / self.head_dim))
                         for t in set(self.types)}

    def _norm(self, b: Builder, name: str):
        bias = b.tensor(name + ".bias", self.dtype) if b.has(name + ".bias") else None
        return b.tensor(name + ".weight", self.dtype), bias

    def _ln(self, x, wb):
        return F.layer_norm(x, (self.hidden,), wb[0], wb[1], self.eps)

    def _cos_sin(self, layer_type: str, S: int, device):
        f = torch.outer(torch.arange(S, device=device, dtype=torch.float32), self.inv_freq[layer_type])
        emb = torch.cat((f, f), dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Last hidden state [B, S, H] (after final_norm) in the activation dtype."""
        B, S = input_ids.shape
        x = self._ln(self.embed[input_ids].to(self.dtype), self.emb_norm)
        rope = {t: self._cos_sin(t, S, x.device) for t in set(self.types)}
        nh, dh = self.heads, self.head_dim
        for t, m, (attn_norm, mlp_norm) in zip(self.types, self.layers, self.norms):
            h = x if attn_norm is None else self._ln(x, attn_norm)
            qkv = m["attn_Wqkv"](h).view(B, S, 3, nh, dh)
            q, k, v = (qkv[:, :, j].transpose(1, 2) for j in range(3))
            cos, sin = rope[t]
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            a = _encoder_attention(q, k, v, attention_mask, self.window if t == "sliding_attention" else None)
            x = x + m["attn_Wo"](a.transpose(1, 2).reshape(B, S, self.hidden))
            up, gate = m["mlp_Wi"](self._ln(x, mlp_norm)).chunk(2, dim=-1)
            x = x + m["mlp_Wo"](self.act(up) * gate)
        return self._ln(x, self.final_norm)

    def pool(self, h: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The pooled state in the activation dtype, as transformers pools it."""
        if self.pooling == "cls":
            return h[:, 0]
        m = attention_mask.to(h.dtype)[..., None]
        return (h * m).sum(1) / m.sum(1)

    def logits(self, pooled: torch.Tensor) -> torch.Tensor:
        e = self._ln(self.head_act(self.head_dense(pooled)), self.head_norm)
        y = e.float() @ self.cls_w.t()
        return y if self.cls_b is None else y + self.cls_b

    def forward(self, input_ids, attention_mask, lengths=None) -> torch.Tensor:
        """Probabilities [B, L] (fp32)."""
        return torch.softmax(self.logits(self.pool(self.encode(input_ids, attention_mask), attention_mask)), dim=-1)
