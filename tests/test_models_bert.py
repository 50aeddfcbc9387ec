"""The plain-torch BERT against transformers and sentence-transformers, on the real all-MiniLM-L6-v2."""
import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from tinypkgs import ROUTER_LABELS, TEST_TEXTS, Pkg, minilm_dir, minilm_router  # noqa: F401
from vsr.runtime.engine import load_engine


@pytest.fixture(scope="module")
def minilm_engine():
    return load_engine(Pkg(minilm_dir()))


@pytest.fixture(scope="module")
def hf_minilm():
    from transformers import BertModel

    return BertModel.from_pretrained(minilm_dir(), dtype=torch.float32).eval()


def _hf_mean_pool(model, batch):
    with torch.no_grad():
        h = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    m = batch.attention_mask[..., None].float()
    return h, F.normalize((h * m).sum(1) / m.sum(1), dim=-1)


def test_hidden_states_match_transformers_on_a_padded_batch(minilm_engine, hf_minilm):
    e = minilm_engine
    b = e.tokenizer.batch(TEST_TEXTS)
    # Padded per batch, not to the 128 tokens baked into MiniLM's tokenizer.json.
    assert b.input_ids.shape[1] == int(b.lengths.max()) < 128
    assert int(b.lengths.min()) < int(b.lengths.max())
    with torch.no_grad():
        ours = e.model.encode(b.input_ids, b.attention_mask)
    ref, _ = _hf_mean_pool(hf_minilm, b)
    real = b.attention_mask.bool()
    torch.testing.assert_close(ours[real], ref[real], atol=2e-5, rtol=1e-5)


def test_embedding_matches_sentence_transformers(minilm_engine):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(minilm_dir()), device="cpu")
    ref = st.encode(TEST_TEXTS, convert_to_tensor=True, normalize_embeddings=True).float()
    res = minilm_engine.predict(TEST_TEXTS)
    assert minilm_engine.labels is None and all(set(r) == {"embedding"} for r in res)
    ours = torch.tensor([r["embedding"] for r in res])
    assert ours.shape == (len(TEST_TEXTS), 384)
    torch.testing.assert_close(ours, ref, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(ours.norm(dim=-1), torch.ones(len(TEST_TEXTS)))


def test_classifier_head_matches_transformers_encoder_plus_head(minilm_router, hf_minilm):  # noqa: F811
    e = load_engine(Pkg(minilm_router))
    assert e.labels == ROUTER_LABELS and e.mode == "reference"
    b = e.tokenizer.batch(TEST_TEXTS)
    _, pooled = _hf_mean_pool(hf_minilm, b)
    t = load_file(minilm_router / "model.safetensors")
    ref = torch.softmax(pooled @ t["classifier.weight"].t() + t["classifier.bias"], dim=-1)
    res = e.predict(TEST_TEXTS, top_k=len(ROUTER_LABELS))
    for r, p in zip(res, ref):
        got = dict((lab, prob) for lab, prob in r["top"])
        torch.testing.assert_close(torch.tensor([got[lab] for lab in ROUTER_LABELS]), p, atol=1e-5, rtol=1e-4)
        assert r["choice"] == ROUTER_LABELS[int(p.argmax())]
    # The head spreads the answers over several labels: the check above is not a constant.
    assert len({r["choice"] for r in res}) >= 2


def test_bert_prefixed_names_load_the_same_model(tmp_path, minilm_engine):
    src = minilm_dir()
    for f in ("config.json", "tokenizer.json", "sentence_bert_config.json"):
        shutil.copyfile(src / f, tmp_path / f)
    t = load_file(src / "model.safetensors")
    save_file({"bert." + k: v for k, v in t.items()}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    e = load_engine(Pkg(tmp_path))
    L = "bert.encoder.layer.0.attention.self."
    assert e.fused[L + "qkv"] == (L + "query", L + "key", L + "value") and L + "qkv" in e.linears
    a = torch.tensor([r["embedding"] for r in e.predict(TEST_TEXTS[:3])])
    b = torch.tensor([r["embedding"] for r in minilm_engine.predict(TEST_TEXTS[:3])])
    assert torch.equal(a, b)


@pytest.mark.parametrize("dtype,tol", [("bfloat16", 3e-2), ("float16", 3e-3)])
def test_explicit_dtype_runs_the_same_weights_in_that_precision(dtype, tol, minilm_engine):
    e = load_engine(Pkg(minilm_dir()), dtype=dtype)
    assert e.act_dtype == getattr(torch, dtype)
    assert all(q.weight.weight.dtype == getattr(torch, dtype) for q in e.linears.values())
    a = torch.tensor([r["embedding"] for r in e.predict(TEST_TEXTS)])
    ref = torch.tensor([r["embedding"] for r in minilm_engine.predict(TEST_TEXTS)])
    assert not torch.equal(a, ref)  # really ran in lower precision
    torch.testing.assert_close(a, ref, atol=tol, rtol=0)


def test_a_bert_head_we_do_not_run_is_refused(tmp_path):
    from vsr.runtime.errors import PackageError

    cfg = json.loads((minilm_dir() / "config.json").read_text())
    cfg["architectures"] = ["BertForSequenceClassification"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    shutil.copyfile(minilm_dir() / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "model.safetensors").symlink_to(minilm_dir() / "model.safetensors")
    with pytest.raises(PackageError, match="BertForSequenceClassification"):
        load_engine(Pkg(tmp_path))
