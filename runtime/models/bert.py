"""A BERT encoder (the all-MiniLM-L6-v2 shape) in plain torch, with the package's head.

Heads (config.json, contract 12):
- "vsr_classifier": {"pooling": "mean", "normalize": true} plus "id2label": mean
  pooling over real tokens, L2 normalisation, then classifier.weight/.bias in fp32
  and a softmax -> probabilities over labels.
- no vsr_classifier: the mean-pooled, L2-normalised sentence embedding
  (what sentence-transformers answers for all-MiniLM-L6-v2).
Tensor names are BertModel's ("embeddings.…", "encoder.layer.i.…"); a "bert." prefix
(BertForSequenceClassification checkpoints) is accepted too.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from vsr.runtime.errors import PackageError
from vsr.runtime.models.common import Builder, activated_product, labels, normed_product

# config.json's hidden_act -> the activation op (models/common.activated_product): "gelu" is the
# exact (erf) GELU, as transformers' "gelu".
_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}


def _prefix(builder_or_loader) -> str:
    return "bert." if builder_or_loader.has("bert.embeddings.word_embeddings.weight") else ""


def linear_names(config: dict, loader) -> list[str]:
    p = _prefix(loader)
    names = []
    for i in range(int(config["num_hidden_layers"])):
        L = f"{p}encoder.layer.{i}."
        names += [L + "attention.self.query", L + "attention.self.key", L + "attention.self.value",
                  L + "attention.output.dense", L + "intermediate.dense", L + "output.dense"]
    return names


def products(config: dict, loader) -> list[tuple[str, tuple[str, ...]]]:
    """The four products of a layer: q|k|v fused (label "...attention.self.qkv"), o, up, down."""
    out = []
    for i in range(int(config["num_hidden_layers"])):
        L = f"{_prefix(loader)}encoder.layer.{i}."
        out += [(L + "attention.self.qkv", tuple(L + "attention.self." + p for p in ("query", "key", "value"))),
                (L + "attention.output.dense", (L + "attention.output.dense",)),
                (L + "intermediate.dense", (L + "intermediate.dense",)),
                (L + "output.dense", (L + "output.dense",))]
    return out


class BertRouter(torch.nn.Module):
    def __init__(self, config: dict, b: Builder):
        super().__init__()
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise PackageError(f"config.json: position_embedding_type {config['position_embedding_type']!r} "
                               "is not supported (only absolute)")
        act = config.get("hidden_act", "gelu")
        if act not in _ACTS:
            raise PackageError(f"config.json: hidden_act {act!r} is not supported ({', '.join(_ACTS)})")
        self.act = _ACTS[act]
        self.ops, self.exact = b.ops(), b.exact
        self.dtype = b.act_dtype
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.heads = int(config["num_attention_heads"])
        self.hidden = int(config["hidden_size"])
        if self.hidden % self.heads:
            raise PackageError(f"config.json: hidden_size {self.hidden} is not a multiple of num_attention_heads {self.heads}")
        p = _prefix(b)
        E = p + "embeddings."
        # Embedding tables stay as stored (rows are cast after the lookup: same numbers, less memory).
        self.word = b.tensor(E + "word_embeddings.weight")
        self.pos = b.tensor(E + "position_embeddings.weight")
        self.tok_type0 = b.tensor(E + "token_type_embeddings.weight")[0]  # token types are all 0
        self.emb_ln = (b.tensor(E + "LayerNorm.weight", self.dtype), b.tensor(E + "LayerNorm.bias", self.dtype))
        self.layers = torch.nn.ModuleList()
        self.norms = []
        for i in range(int(config["num_hidden_layers"])):
            L = f"{p}encoder.layer.{i}."
            m = torch.nn.ModuleDict({
                "qkv": b.projection(L + "attention.self.qkv",
                                    [L + "attention.self." + n for n in ("query", "key", "value")]),
                "o": b.linear(L + "attention.output.dense"),
                "up": b.linear(L + "intermediate.dense"),
                "down": b.linear(L + "output.dense"),
            })
            self.layers.append(m)
            self.norms.append(((b.tensor(L + "attention.output.LayerNorm.weight", self.dtype),
                                b.tensor(L + "attention.output.LayerNorm.bias", self.dtype)),
                               (b.tensor(L + "output.LayerNorm.weight", self.dtype),
                                b.tensor(L + "output.LayerNorm.bias", self.dtype))))
        head = config.get("vsr_classifier")
        self.labels: list[str] | None = None
        if head is not None:
            if head.get("pooling", "mean") != "mean":
                raise PackageError(f"config.json: vsr_classifier pooling {head.get('pooling')!r} is not supported (only mean)")
            self.normalize = bool(head.get("normalize", True))
            self.labels = labels(config, "vsr_classifier")
            # The head runs in fp32 whatever the activation dtype: it is tiny and decides the answer.
            self.cls_w = b.tensor("classifier.weight", torch.float32)
            self.cls_b = b.tensor("classifier.bias", torch.float32)
            if tuple(self.cls_w.shape) != (len(self.labels), self.hidden):
                raise PackageError(f"classifier.weight: shape {tuple(self.cls_w.shape)}, expected "
                                   f"[{len(self.labels)}, {self.hidden}] (labels x hidden_size)")
        else:
            self.normalize = True

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Last hidden state [B, S, H] in the activation dtype."""
        B, S = input_ids.shape
        T = B * S
        o, X = self.ops, self.exact
        lengths = attention_mask.sum(-1).to(torch.int32)
        pos = torch.arange(S, device=input_ids.device)
        e = (self.word[input_ids].to(self.dtype) + self.pos[pos].to(self.dtype)[None]
             + self.tok_type0.to(self.dtype)).reshape(T, self.hidden)
        qkv, x, _ = normed_product(o, self.layers[0]["qkv"], e, self.emb_ln[0], self.eps, bias=self.emb_ln[1],
                                   layer=True, exact=X)
        nh, dh = self.heads, self.hidden // self.heads
        for i, (m, (ln1, ln2)) in enumerate(zip(self.layers, self.norms)):
            q, k, v = (t.view(B, S, nh, dh) for t in qkv.split(m["qkv"].sizes, dim=1))
            a = o.attention(q, k, v, lengths, causal=False, scale=1.0 / math.sqrt(dh))
            d = m["o"](a.reshape(T, self.hidden))
            h, x, _ = normed_product(o, m["up"], d, ln1[0], self.eps, residual=x, bias=ln1[1], layer=True, exact=X)
            d = activated_product(o, m["down"], h, self.act, X)
            if i + 1 < len(self.layers):   # the next layer's q|k|v product reads this layer's output norm
                qkv, x, _ = normed_product(o, self.layers[i + 1]["qkv"], d, ln2[0], self.eps, residual=x,
                                                bias=ln2[1], layer=True, exact=X)
            else:
                x = o.layer_norm(d, ln2[0], ln2[1], self.eps, residual=x, exact=X)[0]
        return x.view(B, S, self.hidden)

    def pool(self, h: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Mean over real tokens, in fp32, L2-normalised when the head asks (always for embeddings)."""
        m = attention_mask.to(torch.float32)[..., None]
        e = (h.float() * m).sum(1) / m.sum(1).clamp(min=1.0)
        return F.normalize(e, p=2.0, dim=-1) if self.normalize else e

    def forward(self, input_ids, attention_mask, lengths=None) -> torch.Tensor:
        """Probabilities [B, L] (fp32) with a classifier head, else embeddings [B, H] (fp32)."""
        e = self.pool(self.encode(input_ids, attention_mask), attention_mask)
        if self.labels is None:
            return e
        return torch.softmax(e @ self.cls_w.t() + self.cls_b, dim=-1)
