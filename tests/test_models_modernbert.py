"""ModernBertForSequenceClassification (global and local attention, GeGLU, RoPE per layer type, its
pooling and head) against transformers, dense and compressed by llm-compressor."""
import json
import shutil

import pytest
import torch

from tinypkgs import (assert_linears_agree, assert_logits_agree, linear_io, CALIBRATION, LONG_TEXT,  # noqa: F401
                      QWEN3_LABELS, TEST_TEXTS, Pkg, build_tiny_modernbert, compressed, tiny_modernbert)
from vsr.runtime.engine import load_engine
from vsr.runtime.errors import PackageError
from vsr.runtime.models import modernbert

TEXTS = TEST_TEXTS + [LONG_TEXT, " ".join(CALIBRATION[:3])]


def _ours_logits(e, b):
    with torch.no_grad():
        return e.model.logits(e.model.pool(e.model.encode(b.input_ids, b.attention_mask), b.attention_mask))


def _hf(path, dtype=torch.float32):
    from transformers import AutoModelForSequenceClassification

    # sdpa, as our reference path; the eager path gives the same numbers up to summation order.
    return AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype).eval()


def _hf_logits(m, b):
    with torch.no_grad():
        return m(input_ids=b.input_ids, attention_mask=b.attention_mask).logits.float()


@pytest.fixture(scope="module")
def tiny_modernbert_cls(tmp_path_factory):
    return build_tiny_modernbert(tmp_path_factory.mktemp("mb") / "cls", seed=1, pooling="cls")


@pytest.mark.parametrize("which", ["mean", "cls"])
def test_logits_match_transformers_on_a_padded_batch(which, request):
    path = request.getfixturevalue("tiny_modernbert" if which == "mean" else "tiny_modernbert_cls")
    e = load_engine(Pkg(path))
    assert e.mode == "reference" and e.model.pooling == which
    assert e.model.types == modernbert.layer_types(Pkg(path).config)
    assert "sliding_attention" in e.model.types and "full_attention" in e.model.types
    b = e.tokenizer.batch(TEXTS)
    # Requests longer than the local window (8: |i - j| <= 4), and padding.
    assert int(b.lengths.max()) > 2 * e.model.local_attention and int(b.lengths.min()) < 4
    ours = _ours_logits(e, b)
    ref = _hf_logits(_hf(path), b)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    assert ref.std() > 0.1
    torch.testing.assert_close(e.forward(TEXTS), torch.softmax(ref, -1), atol=1e-6, rtol=1e-5)
    alone = torch.cat([e.forward([t]) for t in TEXTS])
    torch.testing.assert_close(e.forward(TEXTS), alone, atol=1e-6, rtol=1e-5)
    assert all(r["choice"] in QWEN3_LABELS for r in e.predict(TEXTS[:2]))


def test_the_local_window_matters(tiny_modernbert):  # noqa: F811
    """Made global, the sliding layers give other logits: the window is really applied."""
    e = load_engine(Pkg(tiny_modernbert))
    b = e.tokenizer.batch(TEXTS)
    before = _ours_logits(e, b)
    e.model.local_attention = 20_000
    assert (before - _ours_logits(e, b)).abs().max() > 1e-3


def test_products_are_what_the_forward_runs(tiny_modernbert):  # noqa: F811
    from vsr.runtime import models

    e = load_engine(Pkg(tiny_modernbert))
    prods = models.products(Pkg(tiny_modernbert).config, None)
    assert [p for p, _ in prods] == list(e.linears) and all(parts == (p,) for p, parts in prods) and not e.fused
    assert e.linears["model.layers.0.attn.Wqkv"].out_features == 3 * 128
    assert e.linears["model.layers.0.mlp.Wi"].out_features == 2 * 256


@pytest.mark.parametrize("which", ["mean", "cls"])
def test_the_triton_ops_match_the_reference_under_the_interpreter(which, request):
    """The forward with ops.triton_ops() (every kernel under the Triton interpreter, fp32) gives the
    reference forward's numbers: the window, the RoPE form, the norms and GeGLU as wired here."""
    from vsr.runtime.models import ops

    path = request.getfixturevalue("tiny_modernbert" if which == "mean" else "tiny_modernbert_cls")
    e = load_engine(Pkg(path))
    # Short (the interpreter is slow) but past the local window (|i - j| <= 4), and padded.
    b = e.tokenizer.batch([TEST_TEXTS[2], TEST_TEXTS[3]])
    assert int(b.lengths.max()) > e.model.local_attention
    out = {}
    for name, op_set in (("reference", ops.REFERENCE), ("triton", ops.triton_ops())):
        e.model.ops = op_set
        with torch.no_grad():
            h = e.model.encode(b.input_ids, b.attention_mask)
            out[name] = h, e.model.logits(e.model.pool(h, b.attention_mask))
    (want, l_want), (got, l_got) = out["reference"], out["triton"]
    real = b.attention_mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=1e-5 * float(want.abs().max()), rtol=0)
    torch.testing.assert_close(l_got, l_want, atol=1e-5 * float(l_want.abs().max()), rtol=0)


def test_bf16_activations_match_transformers_in_bf16(tiny_modernbert):  # noqa: F811
    e = load_engine(Pkg(tiny_modernbert), dtype="bfloat16")
    b = e.tokenizer.batch(TEXTS)
    ours, ref = _ours_logits(e, b), _hf_logits(_hf(tiny_modernbert, torch.bfloat16), b)
    assert (ours - ref).abs().max() <= 0.05 * ref.abs().max()


def test_config_reading():
    assert modernbert.layer_types({"num_hidden_layers": 4}) == \
        ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    assert modernbert.layer_types({"num_hidden_layers": 3, "global_attn_every_n_layers": 2}) == \
        ["full_attention", "sliding_attention", "full_attention"]
    with pytest.raises(PackageError, match="'chunked_attention'"):
        modernbert.layer_types({"num_hidden_layers": 1, "layer_types": ["chunked_attention"]})
    assert modernbert.rope_theta({"global_rope_theta": 8e4}, "full_attention") == 8e4
    assert modernbert.rope_theta({}, "sliding_attention") == 1e4
    assert modernbert.rope_theta({"rope_parameters": {"full_attention": {"rope_type": "default",
                                                                         "rope_theta": 5e5}}}, "full_attention") == 5e5


def test_other_modernbert_heads_are_refused(tmp_path, tiny_modernbert):  # noqa: F811
    shutil.copytree(tiny_modernbert, tmp_path / "mlm")
    cfg = json.loads((tmp_path / "mlm" / "config.json").read_text())
    cfg["architectures"] = ["ModernBertForMaskedLM"]
    (tmp_path / "mlm" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PackageError, match="ModernBertForMaskedLM"):
        load_engine(Pkg(tmp_path / "mlm"))


FORMAT = {"FP8_DYNAMIC": "fp8", "W4A16": "int4", "W4A16_ASYM": "int4", "NVFP4": "nvfp4"}
MODEL_TOL = {"FP8_DYNAMIC": 0.1, "W4A16": 1e-4, "W4A16_ASYM": 1e-4, "NVFP4": 0.6}


# transformers 5.17 cannot load a ModernBERT package with packed weights (weight_packed: W4A16, NVFP4):
# ModernBertPreTrainedModel._init_weights reads `.weight` of the compressed Linear and raises. Those
# packages are checked against the unquantized model in transformers instead (below).
HF_LOADS = ("FP8_DYNAMIC",)
# Against the unquantized model: the quantization error itself, relative to the largest logit.
DENSE_TOL = {"W4A16": 0.3, "W4A16_ASYM": 0.3, "NVFP4": 0.6}


@pytest.mark.parametrize("scheme", [s for s in FORMAT if s not in HF_LOADS])
def test_packed_packages_run_close_to_the_unquantized_model(scheme, tiny_modernbert):  # noqa: F811
    path = compressed(tiny_modernbert, scheme)
    bf16 = scheme == "NVFP4"
    e = load_engine(Pkg(path), dtype="bfloat16" if bf16 else "auto")
    assert {q.weight.format for q in e.linears.values()} == {FORMAT[scheme]}
    b = e.tokenizer.batch(TEXTS)
    ours, ref = _ours_logits(e, b), _hf_logits(_hf(tiny_modernbert), b)
    assert 0 < float((ours - ref).abs().max())   # quantized: not the unquantized model's bytes
    assert_logits_agree(ours, ref, DENSE_TOL[scheme], scheme)


@pytest.mark.parametrize("scheme", HF_LOADS)
def test_compressed_package_agrees_with_transformers(scheme, tiny_modernbert):  # noqa: F811
    path = compressed(tiny_modernbert, scheme)
    bf16 = scheme == "NVFP4"
    e = load_engine(Pkg(path), dtype="bfloat16" if bf16 else "auto")
    assert {q.weight.format for q in e.linears.values()} == {FORMAT[scheme]}   # head.dense included
    hf = _hf(path, torch.bfloat16 if bf16 else torch.float32)
    b = e.tokenizer.batch(TEXTS)
    ours = _ours_logits(e, b)
    ref, seen = linear_io(hf, e.linears, lambda: _hf_logits(hf, b), e.fused)
    assert set(seen) == set(e.linears)
    # head.dense reads the pooled [B, H] state: transformers' compressed-tensors forward of a 2-D
    # input differs from per-row (per-request) activation scales by ~3e-2 here; not settled which
    # side is right for 2-D inputs, so only the model-level check covers it under FP8.
    assert_linears_agree(e, seen, scheme, bf16, skip=lambda n, x: scheme == "FP8_DYNAMIC" and x.dim() == 2)
    assert_logits_agree(ours, ref, MODEL_TOL[scheme], scheme)
