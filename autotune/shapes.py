"""Shape specs and record-format names for vsr-tune: what to tune when no package is named.

A shape spec is "27b" (the 27B-class backbone of BENCHMARKS.md), "27b-hybrid" (the products a
27B-class Qwen3.5 adds to it), "minilm" (the built-in router's encoder), or "NxK[,NxK...]" (N
outputs, K inputs). A record format is a name the
registered formats' specs give (kernels/formats.py: bf16, fp16, fp32, fp8, int4-gptq, int4-awq,
nvfp4, nvfp4-emulated); each becomes a weight layout, an activation dtype and a template.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from vsr.autotune import synth
from vsr.kernels import formats

SHAPES_27B: tuple[tuple[str, int, int], ...] = (
    ("qkv", 10240, 5120), ("o", 5120, 8192), ("gate_up", 34816, 5120), ("down", 5120, 17408))
# all-MiniLM-L6-v2: hidden 384, intermediate 1536; q|k|v fused (3 x 384 outputs), o 384x384.
# The runtime's products (runtime/fuse.py): a layer runs qkv, o, up (gate_up) and down.
SHAPES_MINILM: tuple[tuple[str, int, int], ...] = (
    ("qkv", 1152, 384), ("o", 384, 384), ("up", 1536, 384), ("down", 384, 1536))
# Qwen3.5-27B's text model (benchmarks/e2e_models.qwen3_5_27b_config) as the runtime fuses it: a
# Gated DeltaNet layer runs in_proj_qkv|z|b|a as one product where the four parts share a format
# (2 x 16 key heads + 2 x 48 value heads of 128, then 2 x 48), else in_proj_qkv|z and in_proj_b|a
# apart (packages that leave b and a dense), and out_proj (48 x 128 in); a gated attention layer
# q|gate|k|v (2 x 24 + 2 x 4 heads of 256) and o (24 x 256 in, out_proj's shape); the MLP is
# gate_up and down of SHAPES_27B.
SHAPES_27B_HYBRID: tuple[tuple[str, int, int], ...] = (
    ("deltanet_in", 16480, 5120), ("deltanet_qkvz", 16384, 5120), ("deltanet_ba", 96, 5120),
    ("deltanet_out", 5120, 6144), ("attn_qkv", 14336, 5120))
NAMED = {"27b": SHAPES_27B, "27b-hybrid": SHAPES_27B_HYBRID, "minilm": SHAPES_MINILM}

_DT = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
       "fp32": torch.float32, "float32": torch.float32}


@dataclass(frozen=True)
class FormatSpec:
    name: str          # record name
    fmt: str           # weight format
    params: tuple      # format parameters for the synthetic weight
    emulate: bool = False
    act: str | None = None   # activation dtype of a quantized format ("fp8@fp32"); None: bf16 or --act-dtype


class _Records(Mapping):
    """Record name -> FormatSpec, read from the registered formats' records on each access."""

    def _specs(self) -> dict[str, FormatSpec]:
        return {name: FormatSpec(name, spec.name, r.params, r.emulate) for name, (spec, r) in formats.records().items()}

    def __getitem__(self, name: str) -> FormatSpec:
        return self._specs()[name]

    def __iter__(self):
        return iter(self._specs())

    def __len__(self) -> int:
        return len(self._specs())


FORMATS: Mapping[str, FormatSpec] = _Records()


def parse_shapes(spec: str) -> list[tuple[str, int, int]]:
    """'27b' | '27b-hybrid' | 'minilm' | 'NxK[,NxK...]' (names may be combined: '27b,minilm,64x128')."""
    out: list[tuple[str, int, int]] = []
    for part in spec.lower().split(","):
        part = part.strip()
        if part in NAMED:
            out += list(NAMED[part])
            continue
        m = re.fullmatch(r"(\d+)x(\d+)", part)
        if not m:
            raise ValueError(f"shape spec {part!r} is not one of {', '.join(NAMED)} or NxK (e.g. 10240x5120)")
        n, k = int(m.group(1)), int(m.group(2))
        if n < 1 or k < 1:
            raise ValueError(f"shape {part!r}: N and K must be positive")
        out.append((part, n, k))
    seen, uniq = set(), []
    for name, n, k in out:
        if (n, k) not in seen:
            seen.add((n, k))
            uniq.append((name, n, k))
    return uniq


def looks_like_shape_spec(target: str) -> bool:
    try:
        parse_shapes(target)
        return True
    except ValueError:
        return False


def parse_formats(spec: str) -> list[FormatSpec]:
    """'bf16,fp8,int4-gptq' or with an activation dtype for quantized formats: 'fp8@fp32'
    (the built-in router is an fp32 model: its FP8 sibling runs fp32 activations)."""
    out = []
    for f in spec.split(","):
        f = f.strip().lower()
        name, _, act = f.partition("@")
        if name not in FORMATS:
            raise ValueError(f"format {name!r} is not one of {', '.join(FORMATS)}")
        fs = FORMATS[name]
        if act:
            if act not in _DT:
                raise ValueError(f"activation dtype {act!r} in {f!r} is not one of {', '.join(_DT)}")
            if fs.fmt == "dense":
                raise ValueError(f"{f!r}: a dense format's activations are its weight dtype; name fp16/fp32 instead")
            fs = FormatSpec(f"{name}@{act}", fs.fmt, fs.params, fs.emulate, act)
        out.append(fs)
    return out


def act_dtype_for(spec: FormatSpec, act: str | None) -> torch.dtype:
    if spec.fmt == "dense":
        return _DT[dict(spec.params)["wdtype"]]
    return _DT[spec.act or act or "bf16"]


def weight_for(spec: FormatSpec, N: int, K: int, act_dtype: torch.dtype, device, seed: int = 0):
    return synth.random_weight(spec.fmt, N, K, dict(spec.params), act_dtype, device, seed, bias=True)


def format_label(key) -> str:
    """The record-format name of a cache key (ls --json's "format")."""
    try:
        spec = formats.of_template(key.template)
    except ValueError:
        return key.template
    return spec.label(key.template, json.loads(key.params))
