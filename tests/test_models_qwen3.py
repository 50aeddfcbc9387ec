"""The plain-torch Qwen3 sequence classifier against transformers on a small random model."""
import json

import pytest
import torch

from tinypkgs import QWEN3_LABELS, TEST_TEXTS, Pkg, tiny_qwen3  # noqa: F401
from vsr.runtime.engine import load_engine
from vsr.runtime.errors import PackageError
from vsr.runtime.models.common import rope_theta


def _ours_logits(e, b):
    with torch.no_grad():
        h = e.model.encode(b.input_ids, b.attention_mask)
        return e.model.logits(h[torch.arange(h.shape[0]), b.lengths - 1])


def _hf_logits(path, b, dtype=torch.float32):
    from transformers import Qwen3ForSequenceClassification

    m = Qwen3ForSequenceClassification.from_pretrained(path, dtype=dtype).eval()
    with torch.no_grad():
        return m(input_ids=b.input_ids, attention_mask=b.attention_mask).logits.float()


def test_logits_match_transformers_on_a_right_padded_batch(tiny_qwen3):  # noqa: F811
    e = load_engine(Pkg(tiny_qwen3))
    # A bf16 package on the CPU runs fp32 activations over its exact bf16 weights.
    assert e.mode == "reference" and e.act_dtype == torch.float32
    assert Pkg(tiny_qwen3).config["dtype"] == "bfloat16"
    b = e.tokenizer.batch(TEST_TEXTS)
    assert int(b.lengths.min()) < int(b.lengths.max())
    assert not (b.input_ids[b.attention_mask.bool()] == e.tokenizer.pad_id).any()  # HF pools by pad id
    ours = _ours_logits(e, b)
    ref = _hf_logits(tiny_qwen3, b)  # bf16 weights upcast exactly to fp32
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    assert ref.std() > 0.1  # spread logits: the comparison is not between near-constants
    probs = e.forward(TEST_TEXTS)
    torch.testing.assert_close(probs, torch.softmax(ref, -1), atol=1e-6, rtol=1e-5)


def test_padding_does_not_change_an_answer(tiny_qwen3):  # noqa: F811
    e = load_engine(Pkg(tiny_qwen3))
    together = e.forward(TEST_TEXTS)
    alone = torch.cat([e.forward([t]) for t in TEST_TEXTS])
    torch.testing.assert_close(together, alone, atol=1e-6, rtol=1e-5)
    res = e.predict(TEST_TEXTS, top_k=2)
    assert all(r["choice"] in QWEN3_LABELS and len(r["top"]) == 2 for r in res)


def test_bf16_activations_match_transformers_in_bf16(tiny_qwen3):  # noqa: F811
    e = load_engine(Pkg(tiny_qwen3), dtype="bfloat16")
    b = e.tokenizer.batch(TEST_TEXTS)
    ours, ref = _ours_logits(e, b), _hf_logits(tiny_qwen3, b, torch.bfloat16)
    # Same numerics up to accumulation order: a few bf16 ulps of the logits' scale.
    assert (ours - ref).abs().max() <= 0.03 * ref.abs().max()


def test_the_triton_ops_match_the_reference_under_the_interpreter(tiny_qwen3):  # noqa: F811
    """The forward with ops.triton_ops() (every kernel under the Triton interpreter, fp32) gives the
    reference forward's numbers."""
    from vsr.runtime.models import ops

    e = load_engine(Pkg(tiny_qwen3))
    b = e.tokenizer.batch([TEST_TEXTS[2], TEST_TEXTS[0]])
    lengths = b.lengths.to(torch.int32)
    out = {}
    for name, op_set in (("reference", ops.REFERENCE), ("triton", ops.triton_ops())):
        e.model.ops = op_set
        with torch.no_grad():
            out[name] = e.model.encode(b.input_ids, b.attention_mask, lengths)
    want, got = out["reference"], out["triton"]
    real = b.attention_mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=1e-4 * float(want.abs().max()), rtol=0)


def test_rope_theta_from_either_config_style():
    assert rope_theta({"rope_theta": 5e5}) == 5e5
    assert rope_theta({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}) == 1e6
    with pytest.raises(PackageError, match="rope_type 'yarn'"):
        rope_theta({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}})
    with pytest.raises(PackageError, match="no rope_theta"):
        rope_theta({})


def test_unsupported_architecture_is_named(tmp_path, tiny_qwen3):  # noqa: F811
    cfg = json.loads((tiny_qwen3 / "config.json").read_text())
    cfg["architectures"] = ["Qwen3ForCausalLM"]
    for f in tiny_qwen3.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PackageError, match="Qwen3ForCausalLM"):
        load_engine(Pkg(tmp_path))
