"""The 27B-class routers of benchmarks/bench_e2e.py: their configs, random weights in each format,
and transformers' twin of each over the same weights.

qwen3_27b_config(): Qwen3ForSequenceClassification at the 27B-class shapes of BENCHMARKS.md
(hidden 5120, 64 layers, 64 query / 8 KV heads of 128, MLP 17408) with a two-label score head.
qwen3_5_27b_config(): Qwen3.5-27B's text shapes (hidden 5120, 64 layers with every fourth full
attention, MLP 17408; attention 24 query / 4 KV heads of 256 with rotary on 64 dims; Gated DeltaNet
16 key / 48 value heads of 128, conv kernel 4) and a 5-label score head.

RandomQwen3Loader / RandomQwen3_5Loader: the PackageLoader interface (keys / has / tensor / linear /
check_linears) over seeded random weights made on a device when asked for, so
vsr.runtime.models.qwen3.Qwen3Router and qwen3_5.Qwen3_5Router build through a Builder without a
package on disk (some 50 GB in bf16). A loader's Linear layers come in one benchmark format
(common_bench.FORMATS): "bf16" is the dense random weight ~ N(0, 1/K) that tensor() gives; any
other format is common_bench.make_weight's random weight of that format (the one bench_gemm and the
tuner time; int4's and NVFP4's: Gaussian weights quantized as GPTQ, AWQ and NVFP4 packages are,
whose power draw is a package's), its scales multiplied so that the dequantized weight's spread is
that of the dense one, 1/sqrt(K) (activations stay O(1) through 64 layers, as in a trained model).

transformers_twin(): transformers' model of the same config, built on the meta device and given the
vsr model's own tensors (its linears as views of the fused weights): no second copy of the weights
but the gate|up ones of a SwiGLU product, whose interleaved rows are copied in gate|up order.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import sys
import zlib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common_bench import make_weight  # noqa: E402

from vsr.autotune import shapes as tune_shapes  # noqa: E402
from vsr.kernels import formats  # noqa: E402
from vsr.kernels.dense import DenseWeight  # noqa: E402
from vsr.runtime import fuse  # noqa: E402

QWEN3_LABELS = ["a", "b"]
QWEN3_5_LABELS = ["a", "b", "c", "d", "e"]


def qwen3_27b_config(num_layers: int = 64) -> dict:
    return {
        "architectures": ["Qwen3ForSequenceClassification"], "model_type": "qwen3", "dtype": "bfloat16",
        "vocab_size": 151936, "hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": num_layers,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 40960, "hidden_act": "silu", "attention_bias": False,
        "use_sliding_window": False, "tie_word_embeddings": False,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
        "id2label": {str(i): label for i, label in enumerate(QWEN3_LABELS)}, "pad_token_id": 0,
    }


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
        "id2label": {str(i): label for i, label in enumerate(QWEN3_5_LABELS)}, "pad_token_id": 0,
    }


def qwen3_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of Qwen3ForSequenceClassification: name -> shape."""
    H, mlp = config["hidden_size"], config["intermediate_size"]
    nh, nkv, dh = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], H), "model.norm.weight": (H,),
              "score.weight": (len(config["id2label"]), H)}
    for i in range(config["num_hidden_layers"]):
        L = f"model.layers.{i}."
        shapes.update({L + "input_layernorm.weight": (H,), L + "post_attention_layernorm.weight": (H,),
                       L + "self_attn.q_proj.weight": (nh * dh, H), L + "self_attn.k_proj.weight": (nkv * dh, H),
                       L + "self_attn.v_proj.weight": (nkv * dh, H), L + "self_attn.o_proj.weight": (H, nh * dh),
                       L + "self_attn.q_norm.weight": (dh,), L + "self_attn.k_norm.weight": (dh,),
                       L + "mlp.gate_proj.weight": (mlp, H), L + "mlp.up_proj.weight": (mlp, H),
                       L + "mlp.down_proj.weight": (H, mlp)})
    return shapes


def qwen3_5_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor of Qwen3_5TextForSequenceClassification: name -> shape."""
    H, mlp = config["hidden_size"], config["intermediate_size"]
    nh, nkv, dh = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    kh, vh = config["linear_num_key_heads"], config["linear_num_value_heads"]
    kd, vd = config["linear_key_head_dim"] * kh, config["linear_value_head_dim"] * vh
    conv = config["linear_conv_kernel_dim"]
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], H), "model.norm.weight": (H,),
              "score.weight": (len(config["id2label"]), H)}
    for i, t in enumerate(config["layer_types"]):
        L = f"model.layers.{i}."
        shapes.update({L + "input_layernorm.weight": (H,), L + "post_attention_layernorm.weight": (H,),
                       L + "mlp.gate_proj.weight": (mlp, H), L + "mlp.up_proj.weight": (mlp, H),
                       L + "mlp.down_proj.weight": (H, mlp)})
        if t == "linear_attention":
            A = L + "linear_attn."
            shapes.update({A + "in_proj_qkv.weight": (2 * kd + vd, H), A + "in_proj_z.weight": (vd, H),
                           A + "in_proj_b.weight": (vh, H), A + "in_proj_a.weight": (vh, H),
                           A + "out_proj.weight": (H, vd), A + "conv1d.weight": (2 * kd + vd, 1, conv),
                           A + "A_log": (vh,), A + "dt_bias": (vh,),
                           A + "norm.weight": (config["linear_value_head_dim"],)})
        else:
            A = L + "self_attn."
            shapes.update({A + "q_proj.weight": (2 * nh * dh, H), A + "k_proj.weight": (nkv * dh, H),
                           A + "v_proj.weight": (nkv * dh, H), A + "o_proj.weight": (H, nh * dh),
                           A + "q_norm.weight": (dh,), A + "k_norm.weight": (dh,)})
    return shapes


# The field of each quantized weight format that scales its dequantized values, and whether it
# multiplies (+1) or divides (-1) them (kernels/fp8.py, int4.py, nvfp4.py: dequantize).
_SCALE_FIELDS = {"fp8": ("weight_scale", 1), "int4": ("scale", 1), "nvfp4": ("global_scale", -1)}


@functools.cache
def _weight_spread(fmt: str, device: str) -> float:
    """The standard deviation of make_weight's dequantized values in format `fmt` (it depends on the
    format's random codes and scales, not on N or K): a probe weight's product with N(0, 1) rows
    through the format's reference, divided by sqrt(K)."""
    N, K = 256, 1024
    w = make_weight(fmt, N, K, torch.device(device), seed=7)
    g = torch.Generator(device=device).manual_seed(8)   # (not the weight's seed: its first rows would be x's)
    x = torch.randn(64, K, generator=g, device=device)
    y = formats.get(w.format).reference(x, w).float()
    return y.std().item() / math.sqrt(K)


def random_linear(fmt: str, N: int, K: int, device, seed: int):
    """A random weight [N, K] of benchmark format `fmt` (not bf16) on `device`, its dequantized
    values spread as N(0, 1/K)'s (module docstring). The factor depends on fmt and K only, so the
    parts of a fused product (q, k, v; gate, up) keep equal global scales and fuse."""
    w = make_weight(fmt, N, K, device, seed=seed)
    field, sign = _SCALE_FIELDS[w.format]
    factor = (K ** -0.5 / _weight_spread(fmt, str(torch.device(device)))) ** sign
    scale = getattr(w, field)
    return dataclasses.replace(w, **{field: (scale.float() * factor).to(scale.dtype)})


class RandomLoader:
    """Seeded random weights of `shapes` on `device`, made per tensor when asked for (a Builder reads
    each once); plain tensors in `dtype`, Linear layers in benchmark format `fmt` (module docstring).
    The same seed gives the same tensors, on any call."""

    def __init__(self, config: dict, shapes: dict, fmt: str = "bf16", device="cuda", dtype=torch.bfloat16,
                 seed: int = 0):
        if fmt not in tune_shapes.FORMATS:
            raise ValueError(f"format {fmt!r} is not one of {', '.join(tune_shapes.FORMATS)}")
        self.config, self.shapes, self.fmt = config, shapes, fmt
        self.device, self.dtype, self.seed = torch.device(device), dtype, seed
        self.weight_format = tune_shapes.FORMATS[fmt].fmt

    def keys(self) -> list[str]:
        return sorted(self.shapes)

    def has(self, name: str) -> bool:
        return name in self.shapes

    def _seed(self, name: str) -> int:
        """A tensor's seed: of its name, so a model of fewer layers has the first layers of a deeper one."""
        return self.seed * 1_000_003 + zlib.crc32(name.encode())

    def _norm(self, name: str, shape, g) -> torch.Tensor:
        """A norm's weight (overridden per model)."""
        return 1 + torch.randn(shape, generator=g, device=self.device) * 0.05

    def tensor(self, name: str) -> torch.Tensor:
        shape = self.shapes[name]
        g = torch.Generator(device=self.device).manual_seed(self._seed(name))
        if len(shape) == 1:
            return self._norm(name, shape, g).to(self.dtype)
        scale = 0.02 if "embed" in name else shape[-1] ** -0.5
        return (torch.randn(shape, generator=g, device=self.device) * scale).to(self.dtype)

    def linear(self, name: str):
        w = name + ".weight"
        if self.weight_format == "dense":
            return DenseWeight(self.tensor(w).to(tune_shapes.act_dtype_for(tune_shapes.FORMATS[self.fmt], None)))
        N, K = self.shapes[w]
        return random_linear(self.fmt, N, K, self.device, self._seed(w))

    def check_linears(self, names) -> dict[str, str]:
        missing = [n for n in names if not self.has(n + ".weight")]
        if missing:
            raise KeyError(f"no random tensor for Linear layer(s) {', '.join(missing[:3])}")
        return {n: self.weight_format for n in names}

    def linear_shape(self, name: str) -> tuple[int, int]:
        return self.shapes[name + ".weight"]


class RandomQwen3Loader(RandomLoader):
    """Qwen3's random weights: norms (multipliers) around 1."""

    def __init__(self, config: dict, fmt: str = "bf16", device="cuda", dtype=torch.bfloat16, seed: int = 0):
        super().__init__(config, qwen3_shapes(config), fmt, device, dtype, seed)


class RandomQwen3_5Loader(RandomLoader):
    """Qwen3.5's random weights: zero-centred norms (small offsets around 1 + 0), the gated norm
    around 1, A_log = log U(0.01, 16) and dt_bias 1 as transformers initialises them."""

    def __init__(self, config: dict, fmt: str = "bf16", device="cuda", dtype=torch.bfloat16, seed: int = 0):
        super().__init__(config, qwen3_5_shapes(config), fmt, device, dtype, seed)

    def _norm(self, name: str, shape, g) -> torch.Tensor:
        t = torch.randn(shape, generator=g, device=self.device) * 0.05
        return t + 1 if name.endswith("linear_attn.norm.weight") else t

    def tensor(self, name: str) -> torch.Tensor:
        shape = self.shapes[name]
        if name.endswith("A_log"):
            g = torch.Generator(device=self.device).manual_seed(self._seed(name))
            return torch.empty(shape, device=self.device).uniform_(0.01, 16, generator=g).log()
        if name.endswith("dt_bias"):
            return torch.ones(shape, device=self.device)
        return super().tensor(name)


MODELS = {"qwen3": (qwen3_27b_config, RandomQwen3Loader), "qwen3_5": (qwen3_5_27b_config, RandomQwen3_5Loader)}


# ---- transformers' twin over the same tensors ------------------------------------------------

def _hf_classes(model: str):
    if model == "qwen3":
        from transformers import Qwen3Config, Qwen3ForSequenceClassification
        return Qwen3Config, Qwen3ForSequenceClassification
    from transformers import Qwen3_5TextConfig, Qwen3_5TextForSequenceClassification
    return Qwen3_5TextConfig, Qwen3_5TextForSequenceClassification


def dense_linear_tensors(builder, loader) -> dict[str, torch.Tensor]:
    """Every Linear layer's weight tensor (package name + ".weight") as the vsr model holds it: a
    fused product's parts as row views of its one weight. A SwiGLU product's rows interleave gate
    and up: called, and its views read, while they are in gate|up order (bench_e2e.gate_up_order).
    Dense (bf16) models only."""
    out = {}
    for label, mod in builder.linears.items():
        w = mod.weight
        if w.format != "dense":
            raise ValueError(f"{label}: transformers' twin takes dense weights, not {w.format}")
        names = builder.fused.get(label, (label,))
        for n, view in zip(names, w.weight.split([loader.linear_shape(n)[0] for n in names])):
            out[n + ".weight"] = view
    return out


def transformers_twin(model: str, config: dict, builder, loader, shared: dict[str, torch.Tensor]):
    """transformers' sequence classifier of `config` in bf16 with sdpa attention, on the loader's
    device, its tensors those of the vsr model `builder` built (dense_linear_tensors: built and run
    inside bench_e2e.gate_up_order) and `shared`
    (e.g. the embedding), any other made again by the loader (the same seed: the same values).
    Built on the meta device: nothing is allocated twice."""
    cfg_cls, model_cls = _hf_classes(model)
    cfg = cfg_cls.from_dict(dict(config))
    cfg._attn_implementation = "sdpa"
    cfg.dtype = torch.bfloat16
    with torch.device("meta"):
        hf = model_cls(cfg)
    tensors = {**dense_linear_tensors(builder, loader), **shared}
    for name, p in list(hf.named_parameters()):
        t = tensors[name] if name in tensors else loader.tensor(name)
        if tuple(t.shape) != tuple(p.shape):
            raise ValueError(f"{name}: the loader's tensor is {tuple(t.shape)}, transformers wants {tuple(p.shape)}")
        owner, _, attr = name.rpartition(".")
        setattr(hf.get_submodule(owner), attr, torch.nn.Parameter(t.to(loader.device), requires_grad=False))
    for name, mod in list(hf.named_modules()):   # buffers (the rotary tables) are made again on the device
        if any(b.is_meta for b in mod.buffers(recurse=False)):
            if not type(mod).__name__.endswith("RotaryEmbedding"):
                raise ValueError(f"transformers' {type(mod).__name__} ({name}) has buffers this twin cannot make")
            owner, _, attr = name.rpartition(".")
            setattr(hf.get_submodule(owner), attr, type(mod)(config=mod.config).to(loader.device))
    meta = [n for n, t in [*hf.named_parameters(), *hf.named_buffers()] if t.is_meta]
    if meta:
        raise ValueError(f"transformers' twin still has meta tensors: {', '.join(meta[:3])}")
    return hf.eval()


class TransformersRouter(torch.nn.Module):
    """forward(input_ids, attention_mask, lengths) -> probabilities [B, L] (fp32), as the vsr routers
    (transformers pools the last token that is not pad_token_id: the benchmark's requests hold none);
    encode(...) -> the final-normed hidden states [B, S, H]."""

    def __init__(self, hf):
        super().__init__()
        self.hf = hf

    def forward(self, input_ids, attention_mask, lengths) -> torch.Tensor:
        logits = self.hf(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        return torch.softmax(logits.float(), dim=-1)

    def encode(self, input_ids, attention_mask, lengths=None) -> torch.Tensor:
        return self.hf.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
