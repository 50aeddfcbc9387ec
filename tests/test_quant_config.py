"""quantization_config parsing: formats from config.json alone, lenient keys, group matching, refusals."""
from __future__ import annotations

import copy
import json

import pytest
import torch

from vsr.runtime.errors import PackageError
from vsr.runtime.quant_config import QArgs, QuantConfig, package_formats, parse_quant_config

# Literal groups as llm-compressor 0.14 (compressed-tensors 0.19) writes them, every key present.
FP8_GROUP_019 = {
    "format": "float-quantized", "output_activations": None, "targets": ["Linear"],
    "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": None, "num_bits": 8,
                "observer": "minmax", "observer_kwargs": {}, "scale_dtype": None, "strategy": "channel",
                "symmetric": True, "type": "float", "zp_dtype": None},
    "input_activations": {"actorder": None, "block_structure": None, "dynamic": True, "group_size": None,
                          "num_bits": 8, "observer": None, "observer_kwargs": {}, "scale_dtype": None,
                          "strategy": "token", "symmetric": True, "type": "float", "zp_dtype": None},
}
AWQ_GROUP_019 = {
    "format": "pack-quantized", "input_activations": None, "output_activations": None, "targets": ["Linear"],
    "weights": {"actorder": None, "block_structure": None, "dynamic": False, "group_size": 128, "num_bits": 4,
                "observer": "memoryless_minmax", "observer_kwargs": {}, "scale_dtype": None, "strategy": "group",
                "symmetric": False, "type": "int", "zp_dtype": "torch.int8"},
}
# ct 0.20 leaves out the null keys; strategy may be missing too (inferred from group_size).
AWQ_GROUP_020 = {"targets": ["Linear"], "weights": {"dynamic": False, "group_size": 128, "num_bits": 4,
                                                      "symmetric": False, "type": "int", "future_key": 1}}
NVFP4_GROUP = {
    "format": "nvfp4-pack-quantized", "targets": ["Linear"], "output_activations": None,
    "weights": {"dynamic": False, "group_size": 16, "num_bits": 4, "scale_dtype": "torch.float8_e4m3fn",
                "strategy": "tensor_group", "symmetric": True, "type": "float", "zp_dtype": None},
    "input_activations": {"dynamic": "local", "group_size": 16, "num_bits": 4, "observer": "static_minmax",
                          "scale_dtype": "torch.float8_e4m3fn", "strategy": "tensor_group",
                          "symmetric": True, "type": "float"},
}


def qconfig(groups: dict, fmt: str | None = None, **extra) -> dict:
    qc = {"quant_method": "compressed-tensors", "quantization_status": "compressed", "version": "0.19.0",
          "config_groups": groups, "ignore": ["lm_head"], "kv_cache_scheme": None, "sparsity_config": {},
          "transform_config": {}, "global_compression_ratio": None}
    if fmt:
        qc["format"] = fmt
    qc.update(extra)
    return {"model_type": "qwen3", "dtype": "bfloat16", "quantization_config": qc}


def test_dense_package_without_quantization_config():
    assert package_formats({"model_type": "bert", "torch_dtype": "float32"}) == {"dense"}
    assert parse_quant_config({"model_type": "bert"}) is None


@pytest.mark.parametrize("groups,fmt,want", [
    ({"group_0": FP8_GROUP_019}, "float-quantized", "fp8"),
    ({"group_0": AWQ_GROUP_019}, "pack-quantized", "int4"),
    ({"group_0": AWQ_GROUP_020}, "pack-quantized", "int4"),   # per-group format missing: the global one
    ({"group_0": NVFP4_GROUP}, "nvfp4-pack-quantized", "nvfp4"),
    ({"group_0": {**NVFP4_GROUP, "input_activations": None}}, None, "nvfp4"),  # NVFP4A16
])
def test_formats_from_config_alone(groups, fmt, want):
    cfg = qconfig(groups, fmt)
    # "lm_head" is ignored, so one Linear layer stays dense.
    assert package_formats(cfg) == {want, "dense"}
    cfg["quantization_config"]["ignore"] = []
    assert package_formats(cfg) == {want}


def test_lenient_args_defaults_inference_and_dtype_strings():
    qc = QuantConfig(qconfig({"group_0": AWQ_GROUP_020}, "pack-quantized")["quantization_config"])
    w = qc.schemes["group_0"].weights
    assert (w.strategy, w.group_size, w.symmetric, w.actorder, w.scale_dtype) == ("group", 128, False, None, None)
    assert QArgs.parse({}, "x") == QArgs(num_bits=8, type="int", symmetric=True, strategy="tensor")
    assert QArgs.parse({"group_size": -1}, "x").strategy == "channel"
    assert QArgs.parse({"group_size": 32}, "x").strategy == "group"
    assert QArgs.parse({"scale_dtype": "torch.float8_e4m3fn"}, "x").scale_dtype == "float8_e4m3fn"
    assert QArgs.parse({"dynamic": "local"}, "x").dynamic == "local"
    assert QArgs.parse({"actorder": True}, "x").actorder == "group"
    with pytest.raises(PackageError, match="strategy 'diagonal'"):
        QArgs.parse({"strategy": "diagonal"}, "group 'g'")


@pytest.mark.parametrize("actorder,legacy", [(None, False), ("static", False), ("weight", False),
                                             ("group", True), ("dynamic", True)])
def test_int4_actorder_values(actorder, legacy):
    g = copy.deepcopy(AWQ_GROUP_019)
    g["weights"].update(actorder=actorder, symmetric=True, zp_dtype=None)
    s = QuantConfig(qconfig({"group_0": g})["quantization_config"]).scheme_for("model.layers.0.mlp.up_proj")
    assert s.format == "int4" and s.symmetric and s.legacy_act_order is legacy


def test_kv_cache_scheme_is_refused_not_ignored():
    kv = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
    with pytest.raises(PackageError, match="kv_cache_scheme.*float 8-bit"):
        parse_quant_config(qconfig({"group_0": FP8_GROUP_019}, kv_cache_scheme=kv))
    # kv_cache_scheme None parses, and the fp8 group is classified as without it.
    q = parse_quant_config(qconfig({"group_0": FP8_GROUP_019}, kv_cache_scheme=None))
    assert q.schemes["group_0"].format == "fp8"


def _bad(mutate) -> dict:
    g = copy.deepcopy(FP8_GROUP_019)
    mutate(g)
    return qconfig({"attn_group": g})


@pytest.mark.parametrize("cfg,needle", [
    (_bad(lambda g: g.update(format="foo-quantized")), "unknown compression format 'foo-quantized'"),
    (_bad(lambda g: g.update(format="int-quantized")), "unsupported compression format 'int-quantized'"),
    (_bad(lambda g: g.update(format="naive-quantized")), "unsupported compression format 'naive-quantized'"),
    (_bad(lambda g: g.update(format="mxfp4-pack-quantized")), "'mxfp4-pack-quantized'"),
    (_bad(lambda g: g.update(format="marlin-24")), "'marlin-24'"),
    (_bad(lambda g: g["weights"].update(strategy="block", block_structure=[128, 128])), "float 8-bit block"),
    (_bad(lambda g: g["input_activations"].update(dynamic=False, strategy="tensor")), "input activations"),
    (_bad(lambda g: g.update(output_activations=g["input_activations"])), "output activation"),
    (_bad(lambda g: g.update(format="pack-quantized", input_activations=None,
                             weights={**AWQ_GROUP_019["weights"], "num_bits": 8})), "int 8-bit group"),
    (_bad(lambda g: g.update(format="pack-quantized", weights=AWQ_GROUP_019["weights"])),
     "quantized input activations"),  # int4 weights with float8 activations (W4AFP8-like)
    (_bad(lambda g: g.update(format=None)), "no compression format"),
])
def test_unsupported_groups_name_the_group(cfg, needle):
    cfg["quantization_config"].pop("format", None)
    with pytest.raises(PackageError) as e:
        package_formats(cfg)
    assert "'attn_group'" in str(e.value) and needle in str(e.value)


def test_transform_config_and_sparsity_are_refused():
    with pytest.raises(PackageError, match="transform_config"):
        package_formats(qconfig({"g": FP8_GROUP_019}, transform_config={"config_groups": {"u": {}}}))
    with pytest.raises(PackageError, match="sparse-24-bitmask"):
        package_formats(qconfig({"g": FP8_GROUP_019}, sparsity_config={"format": "sparse-24-bitmask"}))
    with pytest.raises(PackageError, match="sparsity_config must be an object"):
        package_formats(qconfig({"g": FP8_GROUP_019}, sparsity_config=["sparse-24-bitmask"]))
    with pytest.raises(PackageError, match="quantization method 'gptq'"):
        package_formats({"quantization_config": {"quant_method": "gptq", "bits": 4}})


def test_matching_precedence_and_ignore():
    fp8 = dict(FP8_GROUP_019)
    int4 = dict(AWQ_GROUP_019)
    nv = dict(NVFP4_GROUP)
    groups = {
        "g_class": {**int4, "targets": ["Linear"]},
        # Among regexes the alphabetically first target string wins, not the most specific one:
        # "re:.*down.*" < "re:.*proj$" < "re:.*up_proj$".
        "g_regex_mid": {**nv, "targets": ["re:.*proj$"]},
        "g_regex_late": {**fp8, "targets": ["re:.*up_proj$"]},
        "g_regex_early": {**fp8, "targets": ["re:.*down.*"]},
        "g_exact": {**nv, "targets": ["model.layers.0.mlp.up_proj"]},
    }
    qc = parse_quant_config(qconfig(groups, ignore=["lm_head", "re:.*layers\\.1\\..*", "Embedding"]))
    assert qc.scheme_for("model.layers.0.mlp.up_proj").group == "g_exact"
    assert qc.scheme_for("model.layers.2.mlp.up_proj").group == "g_regex_mid"
    assert qc.scheme_for("model.layers.2.mlp.down_proj").group == "g_regex_early"
    assert qc.scheme_for("score").group == "g_class"
    assert qc.scheme_for("lm_head") is None                       # exact ignore
    assert qc.scheme_for("model.layers.1.mlp.up_proj") is None    # regex ignore: the ignore list comes first
    assert qc.scheme_for("embed", classes=("Embedding", "Module")) is None  # class-name ignore
    # re.match anchors at the start only, not at the end.
    qc2 = parse_quant_config(qconfig({"g": {**fp8, "targets": ["re:proj"]}, "h": {**int4, "targets": ["re:x\\.proj"]}}))
    assert qc2.scheme_for("x.proj").group == "h" and qc2.scheme_for("x.projy").group == "h"
    assert qc2.scheme_for("proj.y").group == "g" and qc2.scheme_for("y.x.proj") is None


def test_matching_agrees_with_the_library():
    ct = pytest.importorskip("compressed_tensors", reason="compressed-tensors is the test reference")
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config

    names = ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj", "model.layers.0.mlp.up_proj",
             "model.layers.0.mlp.down_proj", "model.layers.1.mlp.up_proj", "score", "lm_head"]
    groups = {
        "group_0": {**AWQ_GROUP_019, "targets": ["Linear"]},
        "group_1": {**FP8_GROUP_019, "targets": ["re:.*mlp\\..*", "re:.*k_proj$"]},
        "group_2": {**NVFP4_GROUP, "targets": ["re:.*up_proj$", "model.layers.1.mlp.up_proj"]},
    }
    raw = qconfig(groups, ignore=["lm_head", "re:.*q_proj$"])["quantization_config"]

    root = torch.nn.Module()
    for n in names:  # nested modules with these dotted names
        parent = root
        parts = n.split(".")
        for p in parts[:-1]:
            if not hasattr(parent, p):
                parent.add_module(p, torch.nn.Module())
            parent = getattr(parent, p)
        parent.add_module(parts[-1], torch.nn.Linear(32, 16))
    lib_cfg = QuantizationConfig.model_validate(
        {k: v for k, v in raw.items() if k not in ("version", "sparsity_config", "transform_config")})
    apply_quantization_config(root, lib_cfg, show_progress=False)

    ours = parse_quant_config({"quantization_config": raw})
    for n in names:
        lib_scheme = getattr(root.get_submodule(n), "quantization_scheme", None)
        s = ours.scheme_for(n)
        if lib_scheme is None:
            assert s is None, n
        else:
            assert s is not None and list(s.targets) == list(lib_scheme.targets), n


def test_config_json_roundtrip_is_plain_json():
    cfg = qconfig({"group_0": NVFP4_GROUP}, "nvfp4-pack-quantized")
    assert package_formats(json.loads(json.dumps(cfg))) == {"nvfp4", "dense"}
