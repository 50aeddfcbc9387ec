"""llm-compressor packages of both models load and run through our engine and agree with transformers.

Built once per session with vsr.runtime.compress.compress_package (tinypkgs). transformers
decompresses / fake-quantizes compressed-tensors packages on load, so it is an independent
implementation of the same numerics. Two levels:
- every Linear layer: our QLinear on the exact input transformers fed that layer must give
  its output (tight tolerances: the formats' numerics are the same);
- the whole model: logits / probabilities within a per-format tolerance (quantized
  activations flip a few rounding decisions that then compound over layers), and the same
  top choice wherever transformers' own margin is clear.
NVFP4 runs in bf16 on both sides: transformers cannot run an fp32 NVFP4 package (pitfall 10).
"""
import pytest
import torch
import torch.nn.functional as F

from tinypkgs import (assert_linears_agree, assert_logits_agree, linear_io, TEST_TEXTS, Pkg, compressed,  # noqa: F401
                      minilm_router, tiny_qwen3)
from vsr.runtime.engine import load_engine

pytestmark = pytest.mark.slow

FORMAT = {"FP8_DYNAMIC": "fp8", "W4A16": "int4", "W4A16_ASYM": "int4", "NVFP4": "nvfp4", "NVFP4-AWQ": "nvfp4"}
# Whole-model tolerance, relative to the largest reference output.
MODEL_TOL = {"FP8_DYNAMIC": 0.1, "W4A16": 1e-5, "W4A16_ASYM": 1e-5, "NVFP4": 0.6, "NVFP4-AWQ": 0.6}
CASES = [("qwen3", s) for s in FORMAT] + [("minilm", s) for s in ("FP8_DYNAMIC", "W4A16", "W4A16_ASYM", "NVFP4")]


def _hf_model(kind, path, dtype):
    from transformers import AutoModel, AutoModelForSequenceClassification

    cls = AutoModelForSequenceClassification if kind == "qwen3" else AutoModel
    return cls.from_pretrained(path, dtype=dtype).eval()


def _outputs(kind, e, hf, b):
    """(ours, transformers') scores: Qwen3 logits, MiniLM pooled embeddings."""
    with torch.no_grad():
        h = e.model.encode(b.input_ids, b.attention_mask)
        if kind == "qwen3":
            ours = e.model.logits(h[torch.arange(h.shape[0]), b.lengths - 1])
            ref = hf(input_ids=b.input_ids, attention_mask=b.attention_mask).logits.float()
        else:
            ours = e.model.pool(h, b.attention_mask)
            hh = hf(input_ids=b.input_ids, attention_mask=b.attention_mask).last_hidden_state.float()
            m = b.attention_mask[..., None].float()
            ref = F.normalize((hh * m).sum(1) / m.sum(1), dim=-1)
    return ours, ref


@pytest.mark.parametrize("kind,scheme", CASES, ids=[f"{k}-{s}" for k, s in CASES])
def test_compressed_package_agrees_with_transformers(kind, scheme, request):
    src = request.getfixturevalue("tiny_qwen3" if kind == "qwen3" else "minilm_router")
    path = compressed(src, scheme)
    bf16 = scheme.startswith("NVFP4")
    e = load_engine(Pkg(path), dtype="bfloat16" if bf16 else "auto")
    assert e.mode == "reference"
    assert {q.weight.format for q in e.linears.values()} == {FORMAT[scheme]}
    hf = _hf_model(kind, path, torch.bfloat16 if bf16 else torch.float32)

    # Layer level: what transformers fed and got from every Linear we run (a fused product, q|k|v
    # or gate|up, against its parts' outputs side by side).
    b = e.tokenizer.batch(TEST_TEXTS)
    (ours, ref), seen = linear_io(hf, e.linears, lambda: _outputs(kind, e, hf, b), e.fused)
    assert set(seen) == set(e.linears)
    # llm-compressor gives q/k/v and gate/up one NVFP4 global scale on Llama-style names only
    # (q_proj, ...): BERT's query/key/value keep their own, so they run as three products.
    assert any(len(ps) > 1 for ps in e.fused.values()) == (kind == "qwen3" or not scheme.startswith("NVFP4"))
    assert_linears_agree(e, seen, scheme, bf16)

    # Model level.
    if kind == "qwen3":
        assert_logits_agree(ours, ref, MODEL_TOL[scheme], scheme)
    else:
        err, scale = float((ours - ref).abs().max()), float(ref.abs().max())
        assert err <= MODEL_TOL[scheme] * scale, f"{scheme}: embeddings differ by {err:.3g} (scale {scale:.3g})"
        # Each request is still nearest to its own reference embedding.
        assert torch.equal((ours @ ref.t()).argmax(-1), torch.arange(len(TEST_TEXTS)))
    # And the engine answers end to end.
    res = e.predict(TEST_TEXTS[:2])
    assert all("choice" in r for r in res)


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", ["FP8_DYNAMIC", "W4A16", "W4A16_ASYM"])
def test_compressed_package_on_triton_agrees_with_the_reference(scheme, tiny_qwen3):  # noqa: F811
    path = compressed(tiny_qwen3, scheme)
    gpu = load_engine(Pkg(path), device="cuda")  # auto: the package's bf16, Triton templates
    assert gpu.mode == "triton" and gpu.act_dtype == torch.bfloat16
    ref = load_engine(Pkg(path), dtype="bfloat16")  # the exact numerics in the same activation dtype
    got, want = gpu.forward(TEST_TEXTS), ref.forward(TEST_TEXTS)
    # FP8 quantizes activations: a differently ordered sum can move a value to the next code.
    torch.testing.assert_close(got, want, atol=5e-2 if scheme == "FP8_DYNAMIC" else 3e-2, rtol=0)
    assert torch.equal(got, gpu.forward(TEST_TEXTS))


def test_plain_minilm_as_llm_compressor_writes_it_answers_with_embeddings(tmp_path):
    """all-MiniLM-L6-v2 itself (BertModel, no head), compressed: an embedding, close to the dense one."""
    from tinypkgs import CALIBRATION, minilm_dir
    from vsr.runtime.compress import compress_package

    path = compress_package(minilm_dir(), tmp_path / "minilm-FP8", "FP8_DYNAMIC", CALIBRATION[:4])
    e = load_engine(Pkg(path), emulate=True)
    assert e.labels is None and e.mode == "emulated"
    res = e.predict(TEST_TEXTS)
    got = torch.tensor([r["embedding"] for r in res])
    dense = torch.tensor([r["embedding"] for r in load_engine(Pkg(minilm_dir())).predict(TEST_TEXTS)])
    cos = (got * dense).sum(-1)
    assert not torch.equal(got, dense) and bool((cos > 0.99).all()), cos
