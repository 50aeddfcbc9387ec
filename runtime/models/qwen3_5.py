"""Qwen3.5 text sequence classifiers (Qwen3_5TextForSequenceClassification) in plain torch, with
the Gated DeltaNet ops on Triton when the linears run the templates.

The hybrid decoder: `layer_types` (config.json) says, layer by layer, "linear_attention" (Gated
DeltaNet) or "full_attention" (gated softmax attention); each layer is followed by a SwiGLU MLP.
Numerics as transformers' modeling_qwen3_5:
- RMSNorm is zero-centred: fp32 normalise, times (1 + w) in fp32, cast (layer norms, final norm,
  q/k norms);
- Gated DeltaNet: in_proj_qkv -> depthwise causal conv1d + SiLU -> q | k | v heads; beta =
  sigmoid(in_proj_b); g = -exp(A_log) * softplus(in_proj_a + dt_bias) (fp32); the chunked gated
  delta rule with L2-normalised q/k (vsr.kernels.delta_rule); the gated RMSNorm
  w * norm(o) * silu(in_proj_z) per value head; out_proj;
- full attention: q_proj gives query and gate per head ([query | gate] of 2 * head_dim), per-head
  q/k norms, rotate-half RoPE on the first head_dim * partial_rotary_factor dims (text positions
  make transformers' multimodal RoPE the plain one), causal GQA attention, sigmoid(gate) times the
  output, o_proj;
- the score head (fp32) on the last real token of each right-padded request.
Text only: a package with a vision tower (vision_config, or visual tensors) is refused.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vsr.runtime.errors import PackageError
from vsr.runtime.models.common import Builder

LAYER_TYPES = ("linear_attention", "full_attention")
# The old names transformers' configs remap on load (configuration_utils.remap_legacy_layer_types).
_LEGACY_LAYER_TYPES = {"mamba": "linear_attention", "attention": "full_attention"}
_DELTANET = ("linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.in_proj_b",
             "linear_attn.in_proj_a", "linear_attn.out_proj")
_ATTENTION = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
_MLP = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
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


def linear_names(config: dict, loader) -> list[str]:
    cfg = text_config(config)
    refuse_vision_tensors(loader)
    p = prefix(loader)
    names = []
    for i, t in enumerate(layer_types(cfg)):
        mixer = _DELTANET if t == "linear_attention" else _ATTENTION
        names += [f"{p}layers.{i}.{m}" for m in mixer + _MLP]
    return names


def rope_parameters(cfg: dict) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor), default RoPE only."""
    params = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    rtype = params.get("rope_type", params.get("type", "default"))
    if rtype != "default":
        raise PackageError(f"config.json: rope_type {rtype!r} is not supported (only default RoPE)")
    theta = cfg.get("rope_theta", params.get("rope_theta"))
    if theta is None:
        raise PackageError("config.json: no rope_theta (neither top-level nor in rope_parameters)")
    factor = params.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))
    return float(theta), float(factor)


# ---- private pure-torch ops (the shared kernels/norm.py, rope.py, activation.py, attention.py
# ---- take these over: see each docstring) ---------------------------------------------------

def _zc_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3_5RMSNorm: fp32 normalise, times (1 + w) in fp32, cast to x's dtype
    (shared: norm.rms_norm(x, w, eps, zero_centered=True))."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w.float())).to(x.dtype)


def _gated_rms_norm(x: torch.Tensor, z: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3_5RMSNormGated over the last dim: w * norm(x) (cast to x's dtype first) * silu(z) in fp32."""
    xf = x.float()
    y = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (y * F.silu(z.float())).to(x.dtype)


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on the first cos.shape[-1] dims of x [B, H, S, D]
    (shared: rope.qk_norm_rope(..., rotary_dim=..., zero_centered=True) with the q/k norm)."""
    r = cos.shape[-1]
    xr = x[..., :r]
    return torch.cat((xr * cos + _rotate_half(xr) * sin, x[..., r:]), dim=-1)


def _causal_attention(q, k, v, attention_mask):
    """softmax(q k^T / sqrt(D)) v, causal and key-padding masked, GQA by repetition
    (shared: attention.attention(q, k, v, lengths, causal=True))."""
    S = q.shape[2]
    nh, nkv = q.shape[1], k.shape[1]
    if nkv != nh:
        k = k.repeat_interleave(nh // nkv, dim=1)
        v = v.repeat_interleave(nh // nkv, dim=1)
    causal = torch.ones(S, S, dtype=torch.bool, device=q.device).tril()
    allow = causal[None, None] & attention_mask.bool()[:, None, None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allow, scale=q.shape[-1] ** -0.5)


def _silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up (shared: activation.silu_mul on the fused gate|up output)."""
    return F.silu(gate) * up


# ---- the model ------------------------------------------------------------------------------

class Qwen3_5Router(torch.nn.Module):
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
        self.heads = int(cfg["num_attention_heads"])
        self.kv_heads = int(cfg.get("num_key_value_heads") or self.heads)
        self.head_dim = int(cfg.get("head_dim") or self.hidden // self.heads)
        if self.heads % self.kv_heads:
            raise PackageError(f"config.json: num_attention_heads {self.heads} is not a multiple of "
                               f"num_key_value_heads {self.kv_heads}")
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
        id2label = cfg.get("id2label")
        if not id2label:
            raise PackageError("config.json: a Qwen3.5 router needs id2label (its score head's labels)")
        self.labels = [id2label[str(i)] if str(i) in id2label else id2label[i] for i in range(len(id2label))]

        P = prefix(b)
        self.embed = b.tensor(P + "embed_tokens.weight")   # as stored; rows cast after the lookup
        self.layers = torch.nn.ModuleList()
        self.params: list[dict[str, torch.Tensor]] = []
        conv_dim = 2 * self.lk_heads * self.lk_dim + self.lv_heads * self.lv_dim
        for i, t in enumerate(self.types):
            L = f"{P}layers.{i}."
            mixer = _DELTANET if t == "linear_attention" else _ATTENTION
            self.layers.append(torch.nn.ModuleDict({m.split(".")[1]: b.linear(L + m) for m in mixer + _MLP}))
            p = {"input_layernorm": b.tensor(L + "input_layernorm.weight", torch.float32),
                 "post_attention_layernorm": b.tensor(L + "post_attention_layernorm.weight", torch.float32)}
            if t == "linear_attention":
                conv = b.tensor(L + "linear_attn.conv1d.weight", self.dtype)
                if conv.dim() != 3 or conv.shape[:2] != (conv_dim, 1):
                    raise PackageError(f"{L}linear_attn.conv1d.weight: shape {tuple(conv.shape)}, expected "
                                       f"[{conv_dim}, 1, kernel] (depthwise over q|k|v)")
                p["conv"] = conv.reshape(conv_dim, -1).contiguous()
                p["A_log"] = b.tensor(L + "linear_attn.A_log", torch.float32)
                p["dt_bias"] = b.tensor(L + "linear_attn.dt_bias", torch.float32)
                p["norm"] = b.tensor(L + "linear_attn.norm.weight", self.dtype)
            else:
                p["q_norm"] = b.tensor(L + "self_attn.q_norm.weight", torch.float32)
                p["k_norm"] = b.tensor(L + "self_attn.k_norm.weight", torch.float32)
            self.params.append(p)
        self.final_norm = b.tensor(P + "norm.weight", torch.float32)
        self.score = b.tensor("score.weight", torch.float32)
        if tuple(self.score.shape) != (len(self.labels), self.hidden):
            raise PackageError(f"score.weight: shape {tuple(self.score.shape)}, expected "
                               f"[{len(self.labels)}, {self.hidden}] (labels x hidden_size)")
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.rotary_dim, 2, dtype=torch.float32,
                                                       device=b.device) / self.rotary_dim))
        # The DeltaNet ops run on Triton exactly when the linears run the templates.
        self.kernels = any(getattr(m, "mode", "reference") == "triton" for m in b.linears.values())

    # -- ops on the reference or the Triton path ------------------------------------------------
    def _conv(self, x, w):
        from vsr.kernels import conv1d

        return (conv1d.causal_conv1d_silu if self.kernels else conv1d.causal_conv1d_silu_reference)(x, w)

    def _delta_rule(self, q, k, v, g, beta, lengths):
        from vsr.kernels import delta_rule

        f = delta_rule.chunk_gated_delta_rule if self.kernels else delta_rule.chunk_gated_delta_rule_reference
        return f(q, k, v, g, beta, lengths)

    def _rope(self, S: int, device):
        t = torch.arange(S, device=device, dtype=torch.float32)
        f = torch.outer(t, self.inv_freq)
        emb = torch.cat((f, f), dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def _deltanet(self, m, p, h, attention_mask, lengths):
        B, S, _ = h.shape
        h = h * attention_mask[:, :, None].to(h.dtype)   # transformers zeroes the padding's states
        kd = self.lk_heads * self.lk_dim
        mixed = self._conv(m["in_proj_qkv"](h), p["conv"])
        q = mixed[..., :kd].unflatten(-1, (self.lk_heads, self.lk_dim))
        k = mixed[..., kd:2 * kd].unflatten(-1, (self.lk_heads, self.lk_dim))
        v = mixed[..., 2 * kd:].unflatten(-1, (self.lv_heads, self.lv_dim))
        z = m["in_proj_z"](h).unflatten(-1, (self.lv_heads, self.lv_dim))
        beta = m["in_proj_b"](h).sigmoid()
        g = -p["A_log"].exp() * F.softplus(m["in_proj_a"](h).float() + p["dt_bias"])
        o = self._delta_rule(q, k, v, g, beta, lengths)
        o = _gated_rms_norm(o, z, p["norm"], self.eps).reshape(B, S, -1)
        return m["out_proj"](o)

    def _attention(self, m, p, h, attention_mask, cos, sin):
        B, S, _ = h.shape
        nh, nkv, dh = self.heads, self.kv_heads, self.head_dim
        qg = m["q_proj"](h).view(B, S, nh, 2 * dh)
        q, gate = qg[..., :dh], qg[..., dh:].reshape(B, S, nh * dh)
        q = _zc_rms_norm(q, p["q_norm"], self.eps).transpose(1, 2)
        k = _zc_rms_norm(m["k_proj"](h).view(B, S, nkv, dh), p["k_norm"], self.eps).transpose(1, 2)
        v = m["v_proj"](h).view(B, S, nkv, dh).transpose(1, 2)
        q, k = _partial_rope(q, cos, sin), _partial_rope(k, cos, sin)
        a = _causal_attention(q, k, v, attention_mask).transpose(1, 2).reshape(B, S, nh * dh)
        return m["o_proj"](a * torch.sigmoid(gate))

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        B, S = input_ids.shape
        x = self.embed[input_ids].to(self.dtype)
        cos, sin = self._rope(S, x.device)
        lengths = attention_mask.sum(-1).to(torch.int32)
        for t, m, p in zip(self.types, self.layers, self.params):
            h = _zc_rms_norm(x, p["input_layernorm"], self.eps)
            if t == "linear_attention":
                x = x + self._deltanet(m, p, h, attention_mask, lengths)
            else:
                x = x + self._attention(m, p, h, attention_mask, cos, sin)
            h = _zc_rms_norm(x, p["post_attention_layernorm"], self.eps)
            x = x + m["down_proj"](_silu_mul(m["gate_proj"](h), m["up_proj"](h)))
        return _zc_rms_norm(x, self.final_norm, self.eps)

    def forward(self, input_ids, attention_mask, lengths) -> torch.Tensor:
        """Probabilities [B, L] (fp32) from the score head on each request's last real token."""
        h = self.encode(input_ids, attention_mask)
        last = h[torch.arange(h.shape[0], device=h.device), lengths.to(h.device) - 1]
        return torch.softmax(self.logits(last), dim=-1)

    def logits(self, last_hidden: torch.Tensor) -> torch.Tensor:
        return last_hidden.float() @ self.score.t()
