"""Qwen3.5 text sequence classifiers (Qwen3_5TextForSequenceClassification).

The hybrid decoder: `layer_types` (config.json) says, layer by layer, "linear_attention" (Gated
DeltaNet) or "full_attention" (gated softmax attention); each layer is followed by a SwiGLU MLP.
Numerics as transformers' modeling_qwen3_5:
- RMSNorm is zero-centred: fp32 normalise, times (1 + w) in fp32, cast (layer norms, final norm,
  q/k norms); each layer norm carries the residual add before it;
- Gated DeltaNet: in_proj_qkv -> depthwise causal conv1d + SiLU -> q | k | v heads; beta =
  sigmoid(in_proj_b); g = -exp(A_log) * softplus(in_proj_a + dt_bias) (fp32); the chunked gated
  delta rule with L2-normalised q/k; the gated RMSNorm w * norm(o) * silu(in_proj_z) per value
  head; out_proj. transformers zeroes the padding's states before the mixer; right padding lies
  after every real token of a request, and the causal conv and the delta rule (given the lengths)
  never read it for a real one, so the mask is not applied (a real row's bytes are the same);
- full attention: q_proj gives query and gate per head ([query | gate] of 2 * head_dim), per-head
  q/k norms, rotate-half RoPE on the first head_dim * partial_rotary_factor dims (text positions
  make transformers' multimodal RoPE the plain one), causal GQA attention, times sigmoid(gate),
  o_proj;
- the score head (fp32) on the last real token of each right-padded request.
Products (`products`): q|k|v (q_proj's query and gate included), in_proj_qkv|z|b|a (one input;
where b and a cannot join qkv and z, e.g. left dense beside quantized ones: qkv|z and b|a), gate|up,
fused at load (runtime/fuse.py); o_proj, out_proj and down_proj. Every other operation is one of
vsr.runtime.models.ops: Triton kernels on the GPU path, their pure-torch references on the CPU.
Activations are 2-D [B*S, hidden].
Text only: a package with a vision tower (vision_config, or visual tensors) is refused.
"""
from __future__ import annotations

import torch

from vsr.runtime.errors import PackageError
from vsr.runtime.models.common import (Builder, DecoderRouter, labels, mlp_down, normed_product,
                                       request_lengths, rope_cos_sin, rope_inv_freq, rope_theta)

LAYER_TYPES = ("linear_attention", "full_attention")
# The old names transformers' configs remap on load (configuration_utils.remap_legacy_layer_types).
_LEGACY_LAYER_TYPES = {"mamba": "linear_attention", "attention": "full_attention"}
# A layer's products: (label, the package's Linear layers it runs, in output order), per mixer.
_DELTANET = (("linear_attn.in_proj", ("linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.in_proj_b",
                                      "linear_attn.in_proj_a")),
             ("linear_attn.out_proj", ("linear_attn.out_proj",)))
_ATTENTION = (("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
              ("self_attn.o_proj", ("self_attn.o_proj",)))
_MLP = (("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj")), ("mlp.down_proj", ("mlp.down_proj",)))
ARCHITECTURES = ("Qwen3_5TextForSequenceClassification", "Qwen3_5ForSequenceClassification")


def text_config(config: dict) -> dict:
    """The text model's config: config.json itself (qwen3_5_text) or its text_config (qwen3_5), with
    the head's labels from the top level. Refuses a vision tower."""
    if config.get("vision_config") is not None:
        raise PackageError("config.json: this Qwen3.5 package has a vision tower (vision_config); vsr runs "
                           "text-only Qwen3.5 routers (Qwen3_5TextForSequenceClassification, model_type "
                           "qwen3_5_text)")
    text = config.get("text_config")
    if text is None:
        return config
    out = dict(text)
    for key in ("id2label", "label2id", "architectures", "quantization_config", "pad_token_id"):
        if key in config and key not in out:
            out[key] = config[key]
    return out


def layer_types(cfg: dict) -> list[str]:
    """layer_types as config.json gives them; without the key, transformers' derivation from
    full_attention_interval (default 4: every fourth layer full attention)."""
    n = int(cfg["num_hidden_layers"])
    types = cfg.get("layer_types")
    if types is None:
        every = int(cfg.get("full_attention_interval", 4))
        return ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]
    if not isinstance(types, list) or len(types) < n:
        raise PackageError(f"config.json: layer_types must list at least num_hidden_layers={n} layer types")
    types = [_LEGACY_LAYER_TYPES.get(t, t) for t in types[:n]]
    bad = sorted({t for t in types if t not in LAYER_TYPES})
    if bad:
        raise PackageError(f"config.json: layer type(s) {', '.join(map(repr, bad))} are not supported "
                           f"(Qwen3.5 layers are {' or '.join(LAYER_TYPES)})")
    return types


def prefix(loader_or_builder) -> str:
    """Tensor-name prefix of the text model: "model." (Qwen3_5TextForSequenceClassification) or
    "model.language_model." (the multimodal class's layout, without its vision tower)."""
    lm = "model.language_model."
    if loader_or_builder.has(lm + "embed_tokens.weight"):
        return lm
    return "model."


def refuse_vision_tensors(loader) -> None:
    visual = [k for k in loader.keys() if k.startswith(("model.visual.", "visual."))]
    if visual:
        raise PackageError(f"this Qwen3.5 package holds a vision tower ({len(visual)} tensors such as "
                           f"{visual[0]!r}); vsr runs text-only Qwen3.5 routers")


def _layer_products(cfg: dict, loader) -> list[list[tuple[str, tuple[str, ...]]]]:
    """Per layer, its products (label, parts) with the tensor-name prefix."""
    refuse_vision_tensors(loader)
    p = prefix(loader)
    return [[(f"{p}layers.{i}.{label}", tuple(f"{p}layers.{i}.{n}" for n in parts))
             for label, parts in (_DELTANET if t == "linear_attention" else _ATTENTION) + _MLP]
            for i, t in enumerate(layer_types(cfg))]


def linear_names(config: dict, loader) -> list[str]:
    """The package's Linear layers (module names), as transformers names them."""
    return [n for layer in _layer_products(text_config(config), loader) for _, parts in layer for n in parts]


def products(config: dict, loader) -> list[tuple[str, tuple[str, ...]]]:
    """The products a forward runs: (label, Linear layers fused into it)."""
    return [prod for layer in _layer_products(text_config(config), loader) for prod in layer]


def rope_parameters(cfg: dict) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor), default RoPE only."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    factor = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
    return rope_theta(cfg), float(factor)


# ---- the model ------------------------------------------------------------------------------

class Qwen3_5Router(DecoderRouter):
    def __init__(self, config: dict, b: Builder):
        super().__init__()
        arch = (config.get("architectures") or [None])[0]
        if arch not in (None, *ARCHITECTURES):
            raise PackageError(f"config.json: architecture {arch!r} is not supported; Qwen3.5 packages must be "
                               "Qwen3_5TextForSequenceClassification (a router with a score head)")
        cfg = text_config(config)
        refuse_vision_tensors(b.loader)
        if cfg.get("hidden_act", "silu") != "silu":
            raise PackageError(f"config.json: hidden_act {cfg['hidden_act']!r} is not supported (only silu)")
        if int(cfg.get("linear_conv_kernel_dim", 4)) < 1:
            raise PackageError("config.json: linear_conv_kernel_dim must be positive")
        if cfg.get("attention_bias"):
            raise PackageError("config.json: attention_bias is not supported (Qwen3.5 projections have no bias)")
        self.dtype = b.act_dtype
        self.hidden = int(cfg["hidden_size"])
        self.attention_heads(cfg)
        self.lk_heads = int(cfg.get("linear_num_key_heads", 16))
        self.lv_heads = int(cfg.get("linear_num_value_heads", 32))
        self.lk_dim = int(cfg.get("linear_key_head_dim", 128))
        self.lv_dim = int(cfg.get("linear_value_head_dim", 128))
        if self.lv_heads % self.lk_heads:
            raise PackageError(f"config.json: linear_num_value_heads {self.lv_heads} is not a multiple of "
                               f"linear_num_key_heads {self.lk_heads}")
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        theta, factor = rope_parameters(cfg)
        self.rotary_dim = int(self.head_dim * factor)
        self.types = layer_types(cfg)
        self.labels = labels(cfg, "a Qwen3.5 router's score head")

        self.ops, self.exact = b.ops(), b.exact
        P = prefix(b)
        self.embed = b.tensor(P + "embed_tokens.weight")   # as stored; rows cast after the lookup
        self.layers = torch.nn.ModuleList()
        self.params: list[dict[str, torch.Tensor]] = []
        self.conv_dim = 2 * self.lk_heads * self.lk_dim + self.lv_heads * self.lv_dim
        vd, nh, nkv, dh = self.lv_heads * self.lv_dim, self.heads, self.kv_heads, self.head_dim
        # The fused products' parts, sliced by the forward: their output widths as config.json's heads say.
        widths = {"in_proj": [self.conv_dim, vd, self.lv_heads, self.lv_heads],
                  "qkv_proj": [2 * nh * dh, nkv * dh, nkv * dh]}
        for i, (t, prods) in enumerate(zip(self.types, _layer_products(cfg, b.loader))):
            L = f"{P}layers.{i}."
            self.layers.append(torch.nn.ModuleDict())
            for label, parts in prods:
                name = label.rsplit(".", 1)[1]
                act = "silu_mul" if name == "gate_up_proj" else None
                mod = b.projection(label, list(parts), act) if len(parts) > 1 else b.linear(parts[0])
                if name in widths and mod.sizes != widths[name]:
                    raise PackageError(f"{', '.join(parts)}: output widths {mod.sizes}, but config.json's heads "
                                       f"give {widths[name]}")
                self.layers[-1][name] = mod
                # in_proj's qkv | z and b | a as two products where the four parts cannot share one
                # (and the CPU reference does not stack them into one after all)
                apart = mod.split(2) if name == "in_proj" and mod.stacked is None else None
                if apart is not None:
                    self.layers[-1]["in_proj_qkvz"], self.layers[-1]["in_proj_ba"] = apart
            p = {"input_layernorm": b.tensor(L + "input_layernorm.weight", torch.float32),
                 "post_attention_layernorm": b.tensor(L + "post_attention_layernorm.weight", torch.float32)}
            if t == "linear_attention":
                conv = b.tensor(L + "linear_attn.conv1d.weight", self.dtype)
                if conv.dim() != 3 or conv.shape[:2] != (self.conv_dim, 1):
                    raise PackageError(f"{L}linear_attn.conv1d.weight: shape {tuple(conv.shape)}, expected "
                                       f"[{self.conv_dim}, 1, kernel] (depthwise over q|k|v)")
                p["conv"] = conv.reshape(self.conv_dim, -1).contiguous()
                p["neg_a"] = -b.tensor(L + "linear_attn.A_log", torch.float32).exp()   # transformers' -A_log.exp()
                p["dt_bias"] = b.tensor(L + "linear_attn.dt_bias", torch.float32)
                p["norm"] = b.tensor(L + "linear_attn.norm.weight", self.dtype)
            else:
                p["q_norm"] = b.tensor(L + "self_attn.q_norm.weight", torch.float32)
                p["k_norm"] = b.tensor(L + "self_attn.k_norm.weight", torch.float32)
            self.params.append(p)
        self.final_norm = b.tensor(P + "norm.weight", torch.float32)
        self.load_score(b)
        self.inv_freq = rope_inv_freq(theta, self.rotary_dim, b.device)

    def _deltanet(self, m, p, d, res, B: int, S: int, lengths):
        """A Gated DeltaNet layer's mixer on the residual stream d + res: (its output, d + res).
        in_proj gives qkv | z | b | a in one product where the four share a weight; else b | a
        runs apart on the norm's output (in_proj_qkvz and in_proj_ba: Projection.split)."""
        o, X = self.ops, self.exact
        c, vd = self.conv_dim, self.lv_heads * self.lv_dim
        apart = "in_proj_ba" in m
        qkvz, h, res = normed_product(o, m["in_proj_qkvz"] if apart else m["in_proj"], d, p["input_layernorm"],
                                      self.eps, residual=res, zero_centered=True, exact=X, keep_output=apart)
        ba = m["in_proj_ba"](h) if apart else qkvz[:, c + vd:]
        core = o.deltanet_mixer(qkvz[:, :c].unflatten(0, (B, S)), p["conv"], ba.unflatten(0, (B, S)), p["neg_a"],
                                p["dt_bias"], (self.lk_heads, self.lk_dim, self.lv_heads, self.lv_dim), lengths)
        y = o.gated_rms_norm(core.reshape(B * S, -1), qkvz[:, c:c + vd], p["norm"], self.eps, exact=X)
        return m["out_proj"](y), res

    def _attention(self, m, p, qkv, B: int, S: int, lengths, cos, sin):
        """Gated attention on the fused q_proj | k_proj | v_proj output qkv [T, 2*Hq*D + 2*Hkv*D]."""
        o, X = self.ops, self.exact
        nh, nkv, dh = self.heads, self.kv_heads, self.head_dim
        T = B * S
        qg = qkv[:, :2 * nh * dh].unflatten(-1, (nh, 2 * dh))     # per head [query | gate]
        q = qg[..., :dh].reshape(T, nh * dh)                         # the norm's input, contiguous
        k = qkv[:, 2 * nh * dh:(2 * nh + nkv) * dh]
        v = qkv[:, (2 * nh + nkv) * dh:].unflatten(0, (B, S)).unflatten(-1, (nkv, dh))
        q, k = o.qk_norm_rope(q, k, p["q_norm"], p["k_norm"], cos, sin, self.eps, rotary_dim=self.rotary_dim,
                              zero_centered=True, exact=X)
        a = o.attention(q.view(B, S, nh, dh), k.view(B, S, nkv, dh), v, lengths, causal=True, scale=dh ** -0.5,
                        gate=qg[..., dh:].unflatten(0, (B, S)))
        return m["o_proj"](a.reshape(T, nh * dh))

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, lengths: torch.Tensor | None = None
               ) -> torch.Tensor:
        """The final-normed hidden state [B, S, H] (rows past a request's length are finite padding)."""
        B, S = input_ids.shape
        lengths = request_lengths(input_ids, attention_mask, lengths)
        o, X = self.ops, self.exact
        x = self.embed[input_ids.reshape(B * S)].to(self.dtype)
        # [S, rotary_dim], in the activation dtype for the exact ops (which round them to it, as
        # transformers' rotary embedding returns them), fp32 for the approximate ones
        cos, sin = rope_cos_sin(S, self.inv_freq, self.dtype if X else None)
        d, res = x, None   # the residual stream is d + res, summed by the next norm (res None: d alone)
        for t, m, p in zip(self.types, self.layers, self.params):
            if t == "linear_attention":
                d, res = self._deltanet(m, p, d, res, B, S, lengths)
            else:
                qkv, _, res = normed_product(o, m["qkv_proj"], d, p["input_layernorm"], self.eps, residual=res,
                                             zero_centered=True, exact=X, keep_output=False)
                d = self._attention(m, p, qkv, B, S, lengths, cos, sin)
            gu, _, res = normed_product(o, m["gate_up_proj"], d, p["post_attention_layernorm"], self.eps,
                                        residual=res, zero_centered=True, exact=X, keep_output=False)
            d = mlp_down(o, m["gate_up_proj"], m["down_proj"], gu, "silu_mul", X)
        h = o.rms_norm(d, self.final_norm, self.eps, residual=res, zero_centered=True, exact=X)[0]
        return h.view(B, S, self.hidden)
