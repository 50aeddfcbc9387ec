"""The Qwen3.5 hybrid classifier (Gated DeltaNet + gated attention) against transformers, dense and
compressed by llm-compressor; the family check and the refusals."""
import json
import shutil

import pytest
import torch

from tinypkgs import (assert_linears_agree, assert_logits_agree, linear_io, LONG_TEXT, QWEN3_LABELS,  # noqa: F401
                      TEST_TEXTS, Pkg, compressed, tiny_qwen3_5)
from vsr.runtime.engine import load_engine
from vsr.runtime.errors import PackageError
from vsr.runtime.models import qwen3_5

TEXTS = TEST_TEXTS + [LONG_TEXT]


def _ours_logits(e, b):
    with torch.no_grad():
        h = e.model.encode(b.input_ids, b.attention_mask)
        return e.model.logits(h[torch.arange(h.shape[0]), b.lengths - 1])


def _hf(path, dtype=torch.float32):
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype).eval()


def _hf_logits(m, b):
    with torch.no_grad():
        return m(input_ids=b.input_ids, attention_mask=b.attention_mask).logits.float()


class _Keys:
    """The tensor names of a package (what linear_names reads of a loader)."""

    def __init__(self, path):
        from safetensors import safe_open

        with safe_open(path / "model.safetensors", "pt") as f:
            self.names = set(f.keys())

    def keys(self):
        return sorted(self.names)

    def has(self, name):
        return name in self.names


def _copy_with_config(src, dst, **changes):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_logits_match_transformers_on_a_right_padded_batch(tiny_qwen3_5):  # noqa: F811
    e = load_engine(Pkg(tiny_qwen3_5))
    assert e.mode == "reference" and e.act_dtype == torch.float32
    assert e.model.types == qwen3_5.layer_types(Pkg(tiny_qwen3_5).config) == \
        ["linear_attention", "full_attention", "full_attention", "linear_attention"]
    b = e.tokenizer.batch(TEXTS)
    assert int(b.lengths.max()) > 64 and int(b.lengths.min()) < 8   # crosses a chunk; padded
    ours = _ours_logits(e, b)
    ref = _hf_logits(_hf(tiny_qwen3_5), b)   # bf16 weights upcast exactly to fp32
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)
    assert ref.std() > 0.1
    torch.testing.assert_close(e.forward(TEXTS), torch.softmax(ref, -1), atol=1e-5, rtol=1e-4)


def test_padding_does_not_change_an_answer(tiny_qwen3_5):  # noqa: F811
    e = load_engine(Pkg(tiny_qwen3_5))
    together = e.forward(TEXTS)
    alone = torch.cat([e.forward([t]) for t in TEXTS])
    torch.testing.assert_close(together, alone, atol=1e-6, rtol=1e-5)
    assert all(r["choice"] in QWEN3_LABELS for r in e.predict(TEXTS))


def test_bf16_activations_match_transformers_in_bf16(tiny_qwen3_5):  # noqa: F811
    e = load_engine(Pkg(tiny_qwen3_5), dtype="bfloat16")
    b = e.tokenizer.batch(TEXTS)
    ours, ref = _ours_logits(e, b), _hf_logits(_hf(tiny_qwen3_5, torch.bfloat16), b)
    assert (ours - ref).abs().max() <= 0.05 * ref.abs().max()


def test_products_are_what_the_forward_runs(tiny_qwen3_5):  # noqa: F811
    """models.products (what vsr-tune tunes) names the engine's products: q|k|v, in_proj_qkv|z|b|a
    and gate|up fused, o_proj, out_proj and down_proj alone."""
    from vsr.runtime import models

    e = load_engine(Pkg(tiny_qwen3_5))
    prods = dict(models.products(Pkg(tiny_qwen3_5).config, _Keys(tiny_qwen3_5)))
    assert set(prods) == set(e.linears)
    assert {n: p for n, p in prods.items() if len(p) > 1} == e.fused
    L0, L1 = "model.layers.0.", "model.layers.1."
    assert prods[L0 + "linear_attn.in_proj"] == tuple(L0 + f"linear_attn.in_proj_{p}" for p in ("qkv", "z", "b", "a"))
    assert prods[L1 + "self_attn.qkv_proj"] == tuple(L1 + f"self_attn.{p}_proj" for p in "qkv")
    assert sorted(n.split(".", 3)[3] for n in prods if n.startswith(L0)) == sorted(
        ["linear_attn.in_proj", "linear_attn.out_proj", "mlp.gate_up_proj", "mlp.down_proj"])
    # Query and gate per head (2 * 4 * 32), then k and v (2 * 32 each); conv channels 2*2*32 + 4*32,
    # z 4*32, b and a 4 each.
    assert e.linears[L1 + "self_attn.qkv_proj"].out_features == 256 + 64 + 64
    assert e.linears[L0 + "linear_attn.in_proj"].out_features == 256 + 128 + 8


def test_the_triton_ops_match_the_reference_under_the_interpreter(tiny_qwen3_5):  # noqa: F811
    """The forward with ops.triton_ops() (every kernel under the Triton interpreter, fp32) gives the
    reference forward's numbers: each op is wired with the arguments its kernel expects."""
    from vsr.runtime.models import ops

    e = load_engine(Pkg(tiny_qwen3_5))
    b = e.tokenizer.batch([TEST_TEXTS[2], TEST_TEXTS[0]])   # short (the interpreter is slow), padded
    lengths = b.lengths.to(torch.int32)
    out = {}
    for name, op_set in (("reference", ops.REFERENCE), ("triton", ops.triton_ops())):
        e.model.ops = op_set
        with torch.no_grad():
            h = e.model.encode(b.input_ids, b.attention_mask, lengths)
            out[name] = h, op_set.last_token_score(h.view(-1, h.shape[-1]), lengths, e.model.score)
    (want, s_want), (got, s_got) = out["reference"], out["triton"]
    real = b.attention_mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=1e-4 * float(want.abs().max()), rtol=0)
    torch.testing.assert_close(s_got, s_want, atol=1e-5 * float(s_want.abs().max()), rtol=0)


def test_head_counts_that_do_not_fit_the_weights_are_refused(tmp_path, tiny_qwen3_5):  # noqa: F811
    path = _copy_with_config(tiny_qwen3_5, tmp_path / "dn", linear_key_head_dim=16)
    with pytest.raises(PackageError, match=r"in_proj_qkv, .*in_proj_a: output widths \[256, 128, 4, 4\].*\[192, 128, 4, 4\]"):
        load_engine(Pkg(path))
    path = _copy_with_config(tiny_qwen3_5, tmp_path / "kv", num_key_value_heads=1)
    with pytest.raises(PackageError, match=r"q_proj, .*v_proj: output widths \[256, 64, 64\].*\[256, 32, 32\]"):
        load_engine(Pkg(path))


def test_layer_types_are_read_as_given():
    cfg = {"num_hidden_layers": 3, "layer_types": ["full_attention", "linear_attention", "full_attention"]}
    assert qwen3_5.layer_types(cfg) == cfg["layer_types"]
    assert qwen3_5.layer_types({"num_hidden_layers": 4, "layer_types": ["mamba", "attention", "mamba", "mamba"]}) \
        == ["linear_attention", "full_attention", "linear_attention", "linear_attention"]
    # No layer_types: transformers' own derivation (every full_attention_interval-th layer).
    assert qwen3_5.layer_types({"num_hidden_layers": 4}) == ["linear_attention"] * 3 + ["full_attention"]
    with pytest.raises(PackageError, match="'sliding_attention'"):
        qwen3_5.layer_types({"num_hidden_layers": 2, "layer_types": ["linear_attention", "sliding_attention"]})


def test_a_vision_tower_is_refused(tmp_path, tiny_qwen3_5):  # noqa: F811
    path = _copy_with_config(tiny_qwen3_5, tmp_path / "vl", model_type="qwen3_5",
                             architectures=["Qwen3_5ForSequenceClassification"], vision_config={"depth": 2})
    with pytest.raises(PackageError, match="vision tower"):
        load_engine(Pkg(path))
    # Visual tensors without a vision_config are refused too, before any weight loads.
    from safetensors.torch import load_file, save_file

    path = _copy_with_config(tiny_qwen3_5, tmp_path / "visual")
    t = load_file(path / "model.safetensors")
    t["model.visual.patch_embed.proj.weight"] = torch.zeros(4, 4)
    save_file(t, path / "model.safetensors")
    with pytest.raises(PackageError, match="vision tower.*model.visual.patch_embed"):
        load_engine(Pkg(path))


def test_a_text_config_package_loads(tmp_path, tiny_qwen3_5):  # noqa: F811
    """model_type qwen3_5 with the text model's fields in text_config (max_position_embeddings, the
    token limit, included) and no vision tower."""
    cfg = json.loads((tiny_qwen3_5 / "config.json").read_text())
    top = {k: cfg.pop(k) for k in ("architectures", "id2label", "label2id", "dtype")}
    path = _copy_with_config(tiny_qwen3_5, tmp_path / "tc")
    (path / "config.json").write_text(json.dumps({**top, "model_type": "qwen3_5", "text_config": cfg}))
    e, ref = load_engine(Pkg(path)), load_engine(Pkg(tiny_qwen3_5))
    assert e.tokenizer.limit == cfg["max_position_embeddings"] == 256
    assert torch.equal(e.forward(TEXTS), ref.forward(TEXTS))
    (path / "config.json").write_text(json.dumps({**top, "model_type": "qwen3_5", "max_position_embeddings": 100,
                                                  "text_config": cfg}))
    assert load_engine(Pkg(path)).tokenizer.limit == 100   # the top level's own value first
    (path / "config.json").write_text(json.dumps({**top, "model_type": "qwen3_5", "text_config": {
        k: v for k, v in cfg.items() if k != "max_position_embeddings"}}))
    with pytest.raises(PackageError, match="no max_position_embeddings"):
        load_engine(Pkg(path))


@pytest.mark.parametrize("mtype,arch", [("qwen3_next", "Qwen3NextForSequenceClassification"),
                                        ("qwen3_5_moe_text", "Qwen3_5MoeForSequenceClassification"),
                                        (None, "Qwen3MoeForSequenceClassification")])
def test_unsupported_architectures_are_named(tmp_path, tiny_qwen3_5, mtype, arch):  # noqa: F811
    path = _copy_with_config(tiny_qwen3_5, tmp_path / "x", model_type=mtype, architectures=[arch])
    with pytest.raises(PackageError, match=f"{arch}.*not supported"):
        load_engine(Pkg(path))
    path = _copy_with_config(tiny_qwen3_5, tmp_path / "y", architectures=["Qwen3_5ForCausalLM"])
    with pytest.raises(PackageError, match="Qwen3_5ForCausalLM"):
        load_engine(Pkg(path))


# ---- compressed by llm-compressor --------------------------------------------------------------

FORMAT = {"FP8_DYNAMIC": "fp8", "W4A16": "int4", "W4A16_ASYM": "int4", "NVFP4": "nvfp4"}
# Whole-model tolerance relative to the largest logit (as tests/test_models_compressed.py): FP8
# quantizes activations per token and NVFP4 per 16 values, so flipped codes compound over layers.
MODEL_TOL = {"FP8_DYNAMIC": 0.1, "W4A16": 1e-4, "W4A16_ASYM": 1e-4, "NVFP4": 0.6}


@pytest.mark.parametrize("scheme", list(FORMAT))
def test_compressed_package_agrees_with_transformers(scheme, tiny_qwen3_5):  # noqa: F811
    path = compressed(tiny_qwen3_5, scheme)
    bf16 = scheme == "NVFP4"    # transformers cannot run an fp32 NVFP4 package
    e = load_engine(Pkg(path), dtype="bfloat16" if bf16 else "auto")
    # Every linear of both layer kinds is quantized, in_proj_b/in_proj_a included (llm-compressor
    # targets every Linear); the conv1d stays dense.
    assert {q.weight.format for q in e.linears.values()} == {FORMAT[scheme]}
    runs = [p for n in e.linears for p in e.fused.get(n, (n,))]
    assert any("in_proj_a" in n for n in runs) and any("self_attn.q_proj" in n for n in runs)
    assert sorted(runs) == sorted(qwen3_5.linear_names(Pkg(path).config, _Keys(path)))   # each Linear once
    # llm-compressor gives one NVFP4 global scale to q/k/v and gate/up only: the DeltaNet's
    # in_proj_qkv, z, b and a keep their own, so they run as separate products there.
    fused = {"gate_up_proj", "qkv_proj"} | (set() if scheme == "NVFP4" else {"in_proj"})
    assert {n.rsplit(".", 1)[1] for n in e.fused} == fused
    hf = _hf(path, torch.bfloat16 if bf16 else torch.float32)
    b = e.tokenizer.batch(TEXTS)
    ours = _ours_logits(e, b)
    ref, seen = linear_io(hf, e.linears, lambda: _hf_logits(hf, b), e.fused)
    assert set(seen) == set(e.linears)
    assert_linears_agree(e, seen, scheme, bf16)
    clear = assert_logits_agree(ours, ref, MODEL_TOL[scheme], scheme)
    if not bf16:
        assert clear.float().mean() >= 0.5   # the top-1 check covers most requests


def _with_dense(src, dst, parts):
    """A copy of the FP8 package src whose Linear layers ending in `parts` are dense again: their
    e4m3 codes times their scales in bf16, named in the quantization config's ignore list."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    shutil.copytree(src, dst)
    with safe_open(src / "model.safetensors", "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    dense = sorted(k[:-len(".weight")] for k in tensors if k.endswith(tuple(f"{p}.weight" for p in parts)))
    for n in dense:
        w = tensors.pop(n + ".weight").float() * tensors.pop(n + ".weight_scale").float()
        tensors[n + ".weight"] = w.to(torch.bfloat16)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"]["ignore"] += dense
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst, dense


def test_dense_b_and_a_beside_quantized_qkv_and_z_run_as_two_products(tmp_path, monkeypatch, tiny_qwen3_5):  # noqa: F811
    """A package that leaves in_proj_b / in_proj_a dense beside FP8 in_proj_qkv / in_proj_z runs
    qkv|z and b|a as one product each (fuse.fuse_runs), tuned as such, and still agrees with
    transformers."""
    path, dense = _with_dense(compressed(tiny_qwen3_5, "FP8_DYNAMIC"), tmp_path / "mixed",
                              ("in_proj_b", "in_proj_a"))
    assert len(dense) == 2 * 2   # two DeltaNet layers
    with pytest.warns(UserWarning, match=r"in_proj_qkv, .*in_proj_a run as 2 products, not one"):
        e = load_engine(Pkg(path))
    L0 = "model.layers.0.linear_attn."
    assert e.fused[L0 + "in_proj_qkv|in_proj_z"] == (L0 + "in_proj_qkv", L0 + "in_proj_z")
    assert e.fused[L0 + "in_proj_b|in_proj_a"] == (L0 + "in_proj_b", L0 + "in_proj_a")
    assert e.linears[L0 + "in_proj_qkv|in_proj_z"].weight.format == "fp8"
    assert e.linears[L0 + "in_proj_b|in_proj_a"].weight.format == "dense"
    m = e.model.layers[0]
    assert not m["in_proj"].fused and m["in_proj"].runs == [2, 2]
    assert m["in_proj_qkvz"].fused and m["in_proj_ba"].fused
    runs = [p for n in e.linears for p in e.fused.get(n, (n,))]
    assert sorted(runs) == sorted(qwen3_5.linear_names(Pkg(path).config, _Keys(path)))   # each Linear once
    # what vsr-tune tunes for it: the same two products (the package opened past the CPU's FP8 refusal)
    from vsr.cli.tune import package_jobs
    from vsr.runtime import package
    monkeypatch.setattr(package, "open_package", lambda p, **kw: Pkg(p))
    jobs = package_jobs(str(path), "cpu", [16], None)
    assert {j["label"] for j in jobs if j["label"].startswith(L0 + "in_proj")} == {
        L0 + "in_proj_qkv|in_proj_z (fp8)", L0 + "in_proj_b|in_proj_a (dense)"}
    hf = _hf(path)
    b = e.tokenizer.batch(TEXTS)
    ours, ref = _ours_logits(e, b), _hf_logits(hf, b)
    err, scale = float((ours - ref).abs().max()), float(ref.abs().max())
    assert err <= MODEL_TOL["FP8_DYNAMIC"] * scale, f"logits differ by {err:.3g} (scale {scale:.3g})"
