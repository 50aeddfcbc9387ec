"""The 27B-class Qwen3.5 text router for benchmarks/bench_e2e.py: its config and random weights.

qwen3_5_27b_config(): Qwen3.5-27B's text shapes (hidden 5120, 64 layers with every fourth full
attention, MLP 17408; attention 24 query / 4 KV heads of 256 with rotary on 64 dims; Gated DeltaNet
16 key / 48 value heads of 128, conv kernel 4) and a 5-label score head. RandomQwen3_5Loader: the
PackageLoader interface (keys / has / tensor / linear / check_linears) over seeded random dense
weights made on a device, so vsr.runtime.models.qwen3_5.Qwen3_5Router builds without a package on
disk (55 GB in bf16); a format's weights are made from these by the bench's own quantizers.
"""
from __future__ import annotations

import torch

from vsr.kernels.dense import DenseWeight

LABELS = ["a", "b", "c", "d", "e"]


def qwen3_5_27b_config(num_layers: int = 64) -> dict:
    types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(num_layers)]
    return {
        "architectures": ["Qwen3_5TextForSequenceClassification"], "model_type": "qwen3_5_text",
        "dtype": "bfloat16", "vocab_size": 248320, "hidden_size": 5120, "intermediate_size": 17408,
        "num_hidden_layers": num_layers, "layer_types": types, "num_attention_heads": 24,
        "num_key_value_heads": 4, "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
        "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 262144, "hidden_act": "silu",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25},
        "id2label": {str(i): l for i, l in enumerate(LABELS)}, "pad_token_id": 0,
    }


def qwen3_5_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of the text classifier: name -> shape (Qwen3_5TextForSequenceClassification's layout)."""
    H, I = config["hidden_size"], config["intermediate_size"]
    nh, nkv, dh = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    kh, vh = config["linear_num_key_heads"], config["linear_num_value_heads"]
    kd, vd = config["linear_key_head_dim"] * kh, config["linear_value_head_dim"] * vh
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], H), "model.norm.weight": (H,),
              "score.weight": (len(config["id2label"]), H)}
    for i, t in enumerate(config["layer_types"]):
        L = f"model.layers.{i}."
        shapes.update({L + "input_layernorm.weight": (H,), L + "post_attention_layernorm.weight": (H,),
                       L + "mlp.gate_proj.weight": (I, H), L + "mlp.up_proj.weight": (I, H),
                       L + "mlp.down_proj.weight": (H, I)})
        if t == "linear_attention":
            A = L + "linear_attn."
            shapes.update({A + "in_proj_qkv.weight": (2 * kd + vd, H), A + "in_proj_z.weight": (vd, H),
                           A + "in_proj_b.weight": (vh, H), A + "in_proj_a.weight": (vh, H),
                           A + "out_proj.weight": (H, vd), A + "conv1d.weight": (2 * kd + vd, 1, 4),
                           A + "A_log": (vh,), A + "dt_bias": (vh,), A + "norm.weight": (config["linear_value_head_dim"],)})
        else:
            A = L + "self_attn."
            shapes.update({A + "q_proj.weight": (2 * nh * dh, H), A + "k_proj.weight": (nkv * dh, H),
                           A + "v_proj.weight": (nkv * dh, H), A + "o_proj.weight": (H, nh * dh),
                           A + "q_norm.weight": (dh,), A + "k_norm.weight": (dh,)})
    return shapes


class RandomQwen3_5Loader:
    """Seeded random weights of `config` in `dtype` on `device`, made per tensor when asked for
    (a Builder reads each once). Linear weights ~ N(0, 1/K) keep activations O(1) through 64 layers."""

    def __init__(self, config: dict, device="cuda", dtype=torch.bfloat16, seed: int = 0):
        self.config, self.device, self.dtype, self.seed = config, torch.device(device), dtype, seed
        self.shapes = qwen3_5_shapes(config)
        self._index = {n: i for i, n in enumerate(sorted(self.shapes))}

    def keys(self) -> list[str]:
        return sorted(self.shapes)

    def has(self, name: str) -> bool:
        return name in self.shapes

    def tensor(self, name: str) -> torch.Tensor:
        shape = self.shapes[name]
        g = torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 + self._index[name])
        if name.endswith("A_log"):
            return torch.empty(shape, device=self.device).uniform_(0.01, 16, generator=g).log()
        if name.endswith("dt_bias"):
            return torch.ones(shape, device=self.device)
        if len(shape) == 1:   # zero-centred norms: small offsets around (1 + 0); the gated norm around 1
            t = torch.randn(shape, generator=g, device=self.device) * 0.05
            return (t + 1 if name.endswith("linear_attn.norm.weight") else t).to(self.dtype)
        fan_in = shape[-1] if len(shape) == 2 else shape[-1]
        scale = 0.02 if "embed" in name else fan_in ** -0.5
        return (torch.randn(shape, generator=g, device=self.device) * scale).to(self.dtype)

    def linear(self, name: str) -> DenseWeight:
        return DenseWeight(self.tensor(name + ".weight"), None)

    def check_linears(self, names) -> dict[str, str]:
        return {n: "dense" for n in names if self.has(n + ".weight")}
