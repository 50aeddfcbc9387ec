"""PackageLoader on hand-made packages (shards, legacy g_idx, broken tensors) and QLinear.

The compressed-tensors-written packages are in test_reference_numerics.py; here the
tensors are written from FORMATS.md's formulas, which is the only way to get legacy
act-order (g_idx) layers: compressed-tensors >= 0.19 refuses to write them.
"""
from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from vsr.kernels import dense, fp8, int4, nvfp4
from vsr.kernels.int4 import Int4Weight, pack_int4
from vsr.runtime.errors import PackageError
from vsr.runtime.linear import QLinear, to_run_dtype
from vsr.kernels.builtin_formats import act_order_perm
from vsr.runtime.loaders import PackageLoader

G = 32
DEV = "cuda" if torch.cuda.is_available() else "cpu"   # the interpreter on CPU, the GPU where there is one


def int4_group(symmetric: bool, actorder: str | None = None, group_size: int = G) -> dict:
    return {"format": "pack-quantized", "targets": ["Linear"], "input_activations": None,
            "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": group_size,
                        "symmetric": symmetric, "actorder": actorder, "dynamic": False}}


FP8_GROUP = {"format": "float-quantized", "targets": ["Linear"],
             "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
             "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                                   "dynamic": True}}
NVFP4_GROUP = {"format": "nvfp4-pack-quantized", "targets": ["Linear"],
               "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                           "symmetric": True, "dynamic": False, "scale_dtype": "torch.float8_e4m3fn"},
               "input_activations": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                                     "symmetric": True, "dynamic": "local"}}


def write_pkg(d, tensors: dict, group: dict | None, ignore=(), shards: int = 1) -> tuple:
    config = {"model_type": "test", "torch_dtype": "float32"}
    if group is not None:
        config["quantization_config"] = {"quant_method": "compressed-tensors", "format": group["format"],
                                         "config_groups": {"group_0": group}, "ignore": list(ignore)}
    (d / "config.json").write_text(json.dumps(config))
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        per = math.ceil(len(names) / shards)
        for i in range(shards):
            fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: tensors[n] for n in names[i * per:(i + 1) * per]}
            save_file(part, str(d / fname), metadata={"format": "pt"})
            weight_map.update({n: fname for n in part})
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d, config


def random_g_idx(K: int, g: int, gen: torch.Generator) -> torch.Tensor:
    """Each of the ceil(K/g) groups gets exactly g columns (the last one the rest), in random column order."""
    groups = torch.arange(K) // g
    return groups[torch.randperm(K, generator=gen)].to(torch.int32)


def int4_tensors(N: int, K: int, symmetric: bool, g_idx: bool, bias: bool, gen) -> tuple[dict, dict]:
    """Random q, scales (and zero points, g_idx) written from FORMATS.md §5/§6; returns (tensors, truth)."""
    ng = math.ceil(K / G)
    q = torch.randint(-8, 8, (N, K), generator=gen, dtype=torch.int32)
    scale = torch.rand(N, ng, generator=gen) * 0.1 + 0.01
    t = {"lin.weight_packed": pack_int4(q + 8), "lin.weight_scale": scale,
         "lin.weight_shape": torch.tensor([N, K], dtype=torch.int64)}
    gi = random_g_idx(K, G, gen) if g_idx else (torch.arange(K) // G).to(torch.int32)
    zp = torch.zeros(N, ng, dtype=torch.int32)
    if not symmetric:
        zp = torch.randint(-8, 8, (N, ng), generator=gen, dtype=torch.int32)
        t["lin.weight_zero_point"] = pack_int4(zp + 8, dim=0)   # packed along N, signed domain + 8
    if g_idx:
        t["lin.weight_g_idx"] = gi
    if bias:
        t["lin.bias"] = torch.randn(N, generator=gen)
    gl = gi.long()
    W = (q - zp[:, gl]).float() * scale[:, gl]                  # W[n,k] = (q - zp[n,g(k)]) · scale[n,g(k)]
    return t, {"W": W, "bias": t.get("lin.bias")}


@pytest.mark.parametrize("symmetric", [True, False], ids=["gptq", "awq"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_legacy_g_idx_int4(tmp_path, symmetric, bias):
    gen = torch.Generator().manual_seed(7 + symmetric + 2 * bias)
    N, K = 196, 160                                # odd N (zero points pad to 25 words); K = 5 groups of 32
    t, truth = int4_tensors(N, K, symmetric, g_idx=True, bias=bias, gen=gen)
    pkg, config = write_pkg(tmp_path, t, int4_group(symmetric, "group"))
    loader = PackageLoader(pkg, config)
    w = loader.linear("lin")
    assert isinstance(w, Int4Weight) and w.act_perm is not None and w.symmetric is symmetric
    assert torch.equal(int4.dequantize_original_order(w), truth["W"])
    # The packed weight was permuted once: groups are contiguous runs of G columns in the stored order.
    assert torch.equal(int4.dequantize(w), truth["W"][:, w.act_perm])
    x = torch.randn(3, 4, K, generator=gen)
    want = x @ truth["W"].t() + (0 if truth["bias"] is None else truth["bias"])
    y = QLinear(w, "reference")(x)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("symmetric", [True, False], ids=["gptq", "awq"])
def test_int4_without_g_idx_and_stray_zero_point(tmp_path, symmetric):
    gen = torch.Generator().manual_seed(3)
    t, truth = int4_tensors(196, 96, symmetric, g_idx=False, bias=True, gen=gen)
    if symmetric:  # pitfall 9: a symmetric scheme ignores a zero point a writer left behind
        t["lin.weight_zero_point"] = torch.full((25, 3), 0x7777_7777, dtype=torch.int32)
    pkg, config = write_pkg(tmp_path, t, int4_group(symmetric, "static"))
    w = PackageLoader(pkg, config).linear("lin")
    assert w.act_perm is None and (w.zero_point is None) is symmetric
    assert torch.equal(int4.dequantize(w), truth["W"])


def test_identity_g_idx_needs_no_permutation(tmp_path):
    gen = torch.Generator().manual_seed(4)
    t, truth = int4_tensors(24, 64, True, g_idx=False, bias=False, gen=gen)
    t["lin.weight_g_idx"] = (torch.arange(64) // G).to(torch.int32)   # act-order file whose order is natural
    w = PackageLoader(*write_pkg(tmp_path, t, int4_group(True, "group"))).linear("lin")
    assert w.act_perm is None and torch.equal(int4.dequantize(w), truth["W"])


def test_g_idx_with_uneven_groups_is_refused():
    g = (torch.arange(64) // 16).to(torch.int32)
    g[0] = 1                                       # group 0 now has 15 columns, group 1 has 17
    with pytest.raises(ValueError, match=r"'lin.weight_g_idx'.*group 0 has 15 columns, expected 16"):
        act_order_perm(g, 64, 16, "lin.weight_g_idx")
    # Stable: within a group the columns keep their order; a short last group (8 of 16) is allowed.
    perm = act_order_perm((torch.arange(40) // 16).flip(0), 40, 16)
    assert torch.equal(perm, torch.cat([torch.arange(24, 40), torch.arange(8, 24), torch.arange(0, 8)]))


def test_shards_and_index(tmp_path):
    gen = torch.Generator().manual_seed(11)
    t = {f"layer{i}.weight": torch.randn(8 + i, 16, generator=gen) for i in range(3)}
    t["layer0.bias"] = torch.randn(8, generator=gen)
    t["emb.weight"] = torch.randn(5, 16, generator=gen)
    pkg, config = write_pkg(tmp_path, t, None, shards=3)
    assert not (pkg / "model.safetensors").exists()
    loader = PackageLoader(pkg, config)
    assert loader.keys() == sorted(t) and loader.has("emb.weight") and not loader.has("nope")
    assert torch.equal(loader.tensor("emb.weight"), t["emb.weight"])
    assert loader.check_linears(["layer0", "layer1", "layer2"]) == dict.fromkeys(["layer0", "layer1", "layer2"], "dense")
    w = loader.linear("layer0")
    assert torch.equal(w.weight, t["layer0.weight"]) and torch.equal(w.bias, t["layer0.bias"])
    # A shard the index names but the folder lacks: the error names the shard.
    missing = sorted(p.name for p in pkg.glob("model-*.safetensors"))[1]
    (pkg / missing).unlink()
    with pytest.raises(PackageError, match=missing):
        PackageLoader(pkg, config)


@pytest.mark.parametrize("text,message", [("{\"weight_map\": {", "broken JSON at line 1"),
                                          ("[]", "not a JSON object"),
                                          ("{\"metadata\": {}}", "no weight_map object")])
def test_a_broken_index_names_the_file_and_the_fault(tmp_path, text, message):
    t = {f"layer{i}.weight": torch.ones(4, 16) * (i + 1) for i in range(2)}
    pkg, config = write_pkg(tmp_path, t, None, shards=2)
    (pkg / "model.safetensors.index.json").write_text(text)
    with pytest.raises(PackageError, match=f"model.safetensors.index.json: .*{message}"):
        PackageLoader(pkg, config)


def test_no_weights_file(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(PackageError, match="no model.safetensors"):
        PackageLoader(tmp_path, {})


def _fp8_tensors(gen, N=12, K=32):
    W = torch.randn(N, K, generator=gen)
    s = W.abs().amax(1, keepdim=True) / fp8.FP8_MAX
    return {"lin.weight": fp8.e4m3_rne(W / s), "lin.weight_scale": s, "lin.bias": torch.randn(N, generator=gen)}


def _nvfp4_tensors(gen, N=12, K=64, act=True):
    t = {"lin.weight_packed": torch.randint(0, 256, (N, K // 2), generator=gen, dtype=torch.uint8),
         "lin.weight_scale": fp8.e4m3_rne(torch.rand(N, K // 16, generator=gen) * 100 + 1),
         "lin.weight_global_scale": torch.tensor([3000.0])}
    if act:
        t["lin.input_global_scale"] = torch.tensor([500.0])
    return t


def test_fp8_and_nvfp4_layers_load(tmp_path):
    gen = torch.Generator().manual_seed(5)
    d1 = tmp_path / "fp8"; d1.mkdir()
    t = _fp8_tensors(gen)
    w = PackageLoader(*write_pkg(d1, t, FP8_GROUP)).linear("lin")
    assert w.weight_scale.shape == (12,) and torch.equal(w.weight, t["lin.weight"])
    assert torch.equal(fp8.dequantize(w), t["lin.weight"].float() * t["lin.weight_scale"])
    d2 = tmp_path / "nv"; d2.mkdir()
    t = _nvfp4_tensors(gen)
    w = PackageLoader(*write_pkg(d2, t, NVFP4_GROUP)).linear("lin")
    assert w.quantizes_activations and w.bias is None and torch.equal(w.packed, t["lin.weight_packed"])
    d3 = tmp_path / "nva16"; d3.mkdir()
    w = PackageLoader(*write_pkg(d3, _nvfp4_tensors(gen, act=False), {**NVFP4_GROUP, "input_activations": None})).linear("lin")
    assert not w.quantizes_activations


# (package builder, tensor to break, how, the words the error must contain)
def _cases():
    gen = torch.Generator().manual_seed(1)
    i4, _ = int4_tensors(20, 64, False, g_idx=False, bias=True, gen=gen)
    return [
        ("int4", i4, "lin.weight_scale", "drop", "'lin.weight_scale' is missing"),
        ("int4", i4, "lin.weight_zero_point", "drop", "'lin.weight_zero_point' is missing"),
        ("int4", i4, "lin.weight_scale", torch.zeros(20, 3), "'lin.weight_scale' expected dtype F32/BF16/F16 shape [N, ceil(K/G)]=[20, 2], got dtype F32 shape [20, 3]"),
        ("int4", i4, "lin.weight_zero_point", torch.zeros(20, 2, dtype=torch.int32), "'lin.weight_zero_point' expected dtype I32 shape [ceil(N/8), ceil(K/G)]=[3, 2], got dtype I32 shape [20, 2]"),
        ("int4", i4, "lin.weight_packed", torch.zeros(20, 8, dtype=torch.int64), "'lin.weight_packed' expected dtype I32"),
        ("int4", i4, "lin.weight_packed", torch.zeros(20, 9, dtype=torch.int32), "'lin.weight_packed' expected shape [N, ceil(K/8)]=[20, 8]"),
        ("int4", i4, "lin.bias", torch.zeros(21), "'lin.bias' expected dtype F32/BF16/F16 shape [N]=[20], got dtype F32 shape [21]"),
        ("int4", i4, "lin.weight_scale", torch.zeros(20, 2, dtype=torch.int32), "'lin.weight_scale' expected dtype F32/BF16/F16"),
        ("fp8", _fp8_tensors(gen), "lin.weight", torch.zeros(12, 32), "'lin.weight' expected dtype F8_E4M3 shape [N, K], got dtype F32"),
        ("fp8", _fp8_tensors(gen), "lin.weight_scale", torch.zeros(12, 2), "'lin.weight_scale' expected dtype F32/BF16/F16 shape [N, 1]=[12, 1]"),
        ("nvfp4", _nvfp4_tensors(gen), "lin.weight_scale", torch.zeros(12, 4, dtype=torch.float32), "'lin.weight_scale' expected dtype F8_E4M3 shape [N, K/16]=[12, 4], got dtype F32"),
        ("nvfp4", _nvfp4_tensors(gen), "lin.input_global_scale", "drop", "'lin.input_global_scale' is missing"),
        ("nvfp4", _nvfp4_tensors(gen), "lin.weight_global_scale", torch.ones(2), "'lin.weight_global_scale' expected dtype F32 shape [1]"),
        ("nvfp4", _nvfp4_tensors(gen), "lin.weight_packed", torch.zeros(12, 12, dtype=torch.uint8), "K % 16 == 0"),
        ("dense", {"lin.weight": torch.randn(4, 8)}, "lin.weight", torch.zeros(4, 8, dtype=torch.int32), "'lin.weight' expected dtype F32/BF16/F16"),
        ("dense", {"lin.weight_packed": torch.zeros(4, 1, dtype=torch.int32)}, "lin.weight", "none", "'lin.weight' is missing (the layer has: weight_packed"),
    ]


GROUPS = {"int4": int4_group(False), "fp8": FP8_GROUP, "nvfp4": NVFP4_GROUP, "dense": None}


@pytest.mark.parametrize("fmt,tensors,name,how,needle", _cases(), ids=lambda v: v if isinstance(v, str) and len(v) < 30 else None)
def test_broken_tensors_are_named_before_any_load(tmp_path, monkeypatch, fmt, tensors, name, how, needle):
    t = dict(tensors)
    if isinstance(how, torch.Tensor):
        t[name] = how
    elif how == "drop":
        del t[name]
    pkg, config = write_pkg(tmp_path, t, GROUPS[fmt])
    loader = PackageLoader(pkg, config)
    # Validation reads headers only (int4 reads its 2-element weight_shape): no other tensor data.
    real = loader.tensor
    monkeypatch.setattr(loader, "tensor", lambda n: real(n) if n.endswith("weight_shape") else pytest.fail(f"read {n}"))
    with pytest.raises(PackageError) as e:
        loader.check_linears(["lin"])
    assert needle in str(e.value), str(e.value)
    assert str(pkg) in str(e.value)


def test_to_run_dtype_and_qlinear_shapes():
    gen = torch.Generator().manual_seed(2)
    dw = dense.DenseWeight(torch.randn(7, 24, generator=gen), torch.randn(7, generator=gen))
    half = to_run_dtype(dw, torch.float16)
    assert half.weight.dtype == torch.float16 and half.bias.dtype == torch.float16
    q = Int4Weight(pack_int4(torch.randint(0, 16, (7, 24), generator=gen)), torch.rand(7, 1, generator=gen), 24, 32)
    assert to_run_dtype(q, torch.bfloat16) is q         # quantized weights are never converted
    with pytest.raises(ValueError, match="run dtype"):
        to_run_dtype(dw, torch.int8)

    lin = QLinear(dw)
    x = torch.randn(2, 3, 24, generator=gen)
    y = lin(x)
    assert y.shape == (2, 3, 7) and torch.equal(y, dense.reference_linear(x.reshape(6, 24), dw).reshape(2, 3, 7))
    assert lin(torch.randn(0, 24)).shape == (0, 7)
    with pytest.raises(ValueError, match="input has 23 features"):
        lin(torch.randn(2, 23))
    # Module.to()/half() follow into the weight object; quantized ones keep their dtypes.
    lin.half()
    assert lin.weight.weight.dtype == torch.float16 and lin(x.half()).dtype == torch.float16
    ql = QLinear(q).to(torch.bfloat16)
    assert ql.weight is q
    with pytest.raises(ValueError, match="tile resolver"):
        QLinear(dw, "triton")


class _DefaultTiles:
    """A stand-in resolver: the template's own default tile, counting calls."""

    def __init__(self):
        self.calls = 0

    def tile(self, template, problem):
        self.calls += 1
        return template.default_tile(problem)


def test_qlinear_triton_mode_matches_reference():
    registry = pytest.importorskip("vsr.kernels.registry", reason="vsr.kernels.registry (the Triton templates) is not there")
    gen = torch.Generator().manual_seed(9)
    # fp32/fp16 activations only: the Triton interpreter's bf16 tl.dot is wrong.
    dw = dense.DenseWeight(torch.randn(37, 64, generator=gen), torch.randn(37, generator=gen)).to(DEV)
    tiles = _DefaultTiles()
    lin = QLinear(dw, "triton", tiles=tiles)
    x = torch.randn(2, 3, 64, generator=gen).to(DEV)
    torch.testing.assert_close(lin(x), QLinear(dw)(x), rtol=1e-5, atol=1e-5)
    assert tiles.calls == 1 and registry.template_for(dw, torch.float32).name == "dense"
    # The tile of a bucket is resolved once: again only for a new bucket, resolver, weight or emulate.
    lin(x)
    assert tiles.calls == 1
    lin(torch.randn(20, 64, generator=gen).to(DEV))                 # bucket 32
    assert tiles.calls == 2
    lin.tiles = other = _DefaultTiles()
    lin(x)
    assert other.calls == 1
    lin.weight = dense.DenseWeight(dw.weight.clone(), dw.bias)
    torch.testing.assert_close(lin(x), QLinear(dw)(x), rtol=1e-5, atol=1e-5)
    assert other.calls == 2
    lin.emulate = True
    lin(x)
    assert other.calls == 3


@pytest.mark.parametrize("fmt", ["fp8", "int4_g_idx", "int4_awq", "nvfp4_emulated"])
def test_loaded_layouts_run_on_the_triton_templates(tmp_path, fmt):
    """The loader's layouts (permuted g_idx weight, unpacked zero points, [N] fp8 scales) are what
    the Triton templates expect: triton mode equals reference mode on the same loaded weight."""
    pytest.importorskip("vsr.kernels.registry", reason="vsr.kernels.registry (the Triton templates) is not there")
    gen = torch.Generator().manual_seed(13)
    emulate = False
    if fmt == "fp8":
        t, group = _fp8_tensors(gen, N=20, K=64), FP8_GROUP
    elif fmt.startswith("int4"):
        t, _ = int4_tensors(20, 64, fmt == "int4_g_idx", g_idx=fmt == "int4_g_idx", bias=True, gen=gen)
        group = int4_group(fmt == "int4_g_idx", "group" if fmt == "int4_g_idx" else None)
    else:
        t, group, emulate = _nvfp4_tensors(gen, N=20, K=64), NVFP4_GROUP, True
    t = {k: (v.half() if v.dtype == torch.float32 and "global" not in k else v) for k, v in t.items()}
    w = PackageLoader(*write_pkg(tmp_path, t, group)).linear("lin").to(DEV)
    # fp16 activations: the Triton interpreter's bf16 tl.dot is wrong.
    x = torch.randn(5, 64, generator=gen).half().to(DEV)
    y = QLinear(w, "triton", tiles=_DefaultTiles(), emulate=emulate)(x)
    ref = QLinear(w, "reference")(x)
    torch.testing.assert_close(y.float(), ref.float(), rtol=2e-3, atol=2e-3 * ref.abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["dense", "fp8", "int4_g_idx", "int4_awq", "nvfp4a16", "nvfp4_emulated"])
def test_qlinear_cuda_triton_bf16(tmp_path, fmt):
    """On a GPU: Module.cuda() carries the loaded weight over, a dtype-only .to() keeps it there, and
    the Triton templates with bf16 activations agree with the reference over small and large buckets."""
    pytest.importorskip("vsr.kernels.registry", reason="vsr.kernels.registry (the Triton templates) is not there")
    gen = torch.Generator().manual_seed(17)
    N, K = 196, 256
    emulate = fmt == "nvfp4_emulated"
    if fmt == "dense":
        t, group = {"lin.weight": torch.randn(N, K, generator=gen), "lin.bias": torch.randn(N, generator=gen)}, None
    elif fmt == "fp8":
        t, group = _fp8_tensors(gen, N=N, K=K), FP8_GROUP
    elif fmt.startswith("int4"):
        t, _ = int4_tensors(N, K, fmt == "int4_g_idx", g_idx=fmt == "int4_g_idx", bias=True, gen=gen)
        group = int4_group(fmt == "int4_g_idx", "group" if fmt == "int4_g_idx" else None)
    else:
        t = _nvfp4_tensors(gen, N=N, K=K, act=emulate)
        group = NVFP4_GROUP if emulate else {**NVFP4_GROUP, "input_activations": None}
    t = {k: (v.bfloat16() if v.dtype == torch.float32 and "global" not in k else v) for k, v in t.items()}
    w = PackageLoader(*write_pkg(tmp_path, t, group)).linear("lin")
    lin = QLinear(w, "triton", tiles=_DefaultTiles(), emulate=emulate).cuda()
    lin.to(torch.bfloat16)
    assert lin._device().type == "cuda"
    ref = QLinear(w, "reference")
    for M in (1, 7, 300):
        x = torch.randn(M, K, generator=gen).bfloat16()
        y = lin(x.cuda()).cpu().float()
        r = ref(x).float()
        assert not torch.isnan(y).any()
        torch.testing.assert_close(y, r, rtol=2**-7, atol=2**-7 * r.abs().max().item())


def test_qlinear_names_the_layer_and_tile_when_a_tile_does_not_fit_the_gpu(monkeypatch):
    # Triton's OutOfResources only counts bytes; QLinear says which layer, rows and tile, and
    # what to do (fp8 with fp32 activations raises it at 513+ rows on a cache miss on Hopper).
    from triton.runtime.errors import OutOfResources
    from vsr.kernels import registry
    gen = torch.Generator().manual_seed(5)
    dw = dense.DenseWeight(torch.randn(7, 24, generator=gen).half())
    lin = QLinear(dw, "triton", tiles=_DefaultTiles())

    def too_big(*args, **kwargs):
        raise OutOfResources(327712, 232448, "shared memory")
    import dataclasses
    failing = dataclasses.replace(registry.TEMPLATES["dense"], launch=too_big)
    monkeypatch.setattr(registry, "template_for", lambda weight, act_dtype, emulate=False: failing)
    with pytest.raises(RuntimeError, match=r"QLinear\(dense, N=7, K=24\) at 600 rows \(bucket 1024, "
                                           r"torch.float16\): the dense tile .* does not fit this GPU") as e:
        lin(torch.randn(600, 24, generator=gen).half())
    assert "vsr-tune" in str(e.value) and "327712" in str(e.value)
    assert isinstance(e.value.__cause__, OutOfResources)
