"""The engine (contract 9), the tokenizer's request checks and the package builder's contract."""
import hashlib
import json
import sys

import pytest
import torch
from safetensors import safe_open

from tinypkgs import (CALIBRATION, ROUTER_LABELS, TEST_TEXTS, Pkg, compressed, minilm_router,  # noqa: F401
                      needs_llmcompressor, random_bert, tiny_qwen3)
from vsr.runtime.compress import compress_package
from vsr.runtime.engine import load_engine
from vsr.runtime.errors import PackageError, RequestError


@pytest.fixture(scope="module")
def router(minilm_router):  # noqa: F811
    return load_engine(Pkg(minilm_router))


def test_predict_shape_order_and_top_k(router):
    res = router.predict(TEST_TEXTS, top_k=3)
    assert len(res) == len(TEST_TEXTS)
    for r in res:
        assert r["choice"] == r["top"][0][0] and len(r["top"]) == 3
        probs = [p for _, p in r["top"]]
        assert probs == sorted(probs, reverse=True) and all(0 <= p <= 1 for p in probs)
        assert all(lab in ROUTER_LABELS for lab, _ in r["top"])
    full = router.predict(TEST_TEXTS, top_k=100)  # clipped to the number of labels, summing to 1
    assert all(len(r["top"]) == len(ROUTER_LABELS) for r in full)
    assert all(abs(sum(p for _, p in r["top"]) - 1) < 1e-5 for r in full)
    # Answers follow the request order whatever the batching (length-sorted inside).
    rev = router.predict(TEST_TEXTS[::-1], top_k=3)
    assert [r["choice"] for r in rev] == [r["choice"] for r in res][::-1]
    for a, b in zip(rev, res[::-1]):
        assert a["top"][0][1] == pytest.approx(b["top"][0][1], abs=1e-6)


def test_batches_larger_than_one_chunk(router, monkeypatch):
    import vsr.runtime.engine as eng

    texts = [f"turn on light number {i}" + " please" * (i % 5) for i in range(11)]
    whole = router.forward(texts)
    monkeypatch.setattr(eng, "BATCH_SIZE", 4)
    torch.testing.assert_close(router.forward(texts), whole, atol=1e-6, rtol=1e-5)
    assert torch.isfinite(whole).all()


def test_request_checks(router):
    long = "lights " * 300
    ids, problems = router.tokenizer.encode_each(["turn on the lights", "", "   \n", long])
    assert problems[0] is None and ids[0] and ids[1:] == [None, None, None]
    assert "empty" in problems[1] and "empty" in problems[2]
    assert "too long" in problems[3] and "256" in problems[3]  # MiniLM's sentence-transformers limit, not truncated
    with pytest.raises(RequestError, match="request 1: empty"):
        router.predict(["fine", ""])
    with pytest.raises(RequestError, match="request 0: text is too long"):
        router.predict([long])


def test_modes_labels_and_weight_bytes(minilm_router):  # noqa: F811
    e = load_engine(Pkg(minilm_router), emulate=True)
    assert e.mode == "emulated"
    # Every tensor the model runs on, counted once: all of the file but the unused pooler and the
    # position_ids buffer; token_type_embeddings is counted whole (row 0 is a view of it).
    with safe_open(minilm_router / "model.safetensors", "pt") as f:
        total = sum(f.get_tensor(k).nbytes for k in f.keys()
                    if not k.startswith("pooler.") and k != "embeddings.position_ids")
    assert e.weight_bytes == total
    with pytest.raises(ValueError, match="dtype 'float64'"):
        load_engine(Pkg(minilm_router), dtype="float64")
    if not torch.cuda.is_available():
        from vsr.runtime.errors import DeviceRefusal

        with pytest.raises(DeviceRefusal, match="no CUDA device"):
            load_engine(Pkg(minilm_router), device="cuda")


def test_quantized_weight_bytes_are_smaller(minilm_router, router):  # noqa: F811
    e = load_engine(Pkg(compressed(minilm_router, "W4A16")))
    assert e.weight_bytes < router.weight_bytes * 0.75
    assert {q.weight.format for q in e.linears.values()} == {"int4"}


def _digest(d):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


@pytest.mark.parametrize("scheme", ["W4A16", "W4A16_ASYM"])
def test_compress_is_byte_identical_on_rebuild(tmp_path, tiny_qwen3, scheme):  # noqa: F811
    needs_llmcompressor()
    # GPTQ and AWQ: calibration data decides the weights, so the order and threads must be fixed.
    threads = torch.get_num_threads()
    a = compress_package(tiny_qwen3, tmp_path / "a", scheme, CALIBRATION[:6])
    b = compress_package(tiny_qwen3, tmp_path / "b", scheme, CALIBRATION[:6])
    assert _digest(a) == _digest(b)
    c = compress_package(tiny_qwen3, tmp_path / "c", scheme, CALIBRATION[6:12])
    assert _digest(c)["model.safetensors"] != _digest(a)["model.safetensors"]  # the data does matter
    assert torch.get_num_threads() == threads  # the one-thread build leaves the caller's setting alone


def test_compress_keeps_the_head_and_tokenizer(tmp_path, minilm_router):  # noqa: F811
    needs_llmcompressor()
    a = compress_package(minilm_router, tmp_path / "a", "FP8_DYNAMIC", CALIBRATION[:4])
    # Tokenizer files verbatim, head tensors and config keys kept.
    for f in ("tokenizer.json", "vocab.txt", "sentence_bert_config.json"):
        assert (a / f).read_bytes() == (minilm_router / f).read_bytes()
    cfg = json.loads((a / "config.json").read_text())
    src = json.loads((minilm_router / "config.json").read_text())
    assert cfg["vsr_classifier"] == src["vsr_classifier"] and cfg["id2label"] == src["id2label"]
    assert "classifier" not in json.dumps(cfg["quantization_config"]["config_groups"])
    assert "classifier" in cfg["quantization_config"]["ignore"]
    with safe_open(a / "model.safetensors", "pt") as f, safe_open(minilm_router / "model.safetensors", "pt") as g:
        for k in ("classifier.weight", "classifier.bias"):
            assert torch.equal(f.get_tensor(k), g.get_tensor(k))
        assert f.get_tensor("encoder.layer.0.attention.self.query.weight").dtype == torch.float8_e4m3fn
    e = load_engine(Pkg(a))
    assert e.labels == ROUTER_LABELS


def test_compress_errors_without_llmcompressor(tmp_path, tiny_qwen3, monkeypatch):  # noqa: F811
    # Both raise before llm-compressor is used, so they hold where the extra is absent too.
    with pytest.raises(PackageError, match="unknown compression scheme 'W3A3'"):
        compress_package(tiny_qwen3, tmp_path / "x", "W3A3", CALIBRATION)
    monkeypatch.setitem(sys.modules, "llmcompressor", None)  # as if the extra were not installed
    with pytest.raises(PackageError, match=r"pip install 'vsr\[quant\]'"):
        compress_package(tiny_qwen3, tmp_path / "x", "FP8_DYNAMIC", CALIBRATION)


def test_compress_errors(tmp_path, tiny_qwen3):  # noqa: F811
    needs_llmcompressor()  # these checks run after the import
    with pytest.raises(PackageError, match="calibration_texts is empty"):
        compress_package(tiny_qwen3, tmp_path / "x", "FP8_DYNAMIC", [])
    with pytest.raises(PackageError, match="exists and is not empty"):
        compress_package(tiny_qwen3, tiny_qwen3, "FP8_DYNAMIC", CALIBRATION)
    assert (tiny_qwen3 / "config.json").is_file()


@pytest.mark.gpu
def test_cuda_engine_runs_triton_and_agrees_with_the_reference(tiny_qwen3):  # noqa: F811
    e = load_engine(Pkg(tiny_qwen3), device="cuda")
    # dtype auto on a GPU: the package's own dtype (bf16), every Linear on its Triton template.
    assert e.mode == "triton" and e.act_dtype == torch.bfloat16
    assert all(q.mode == "triton" for q in e.linears.values())
    ref = load_engine(Pkg(tiny_qwen3), dtype="bfloat16")  # CPU reference, same activation dtype
    got, want = e.forward(TEST_TEXTS), ref.forward(TEST_TEXTS)
    torch.testing.assert_close(got, want, atol=3e-2, rtol=0)
    assert torch.equal(got, e.forward(TEST_TEXTS))  # deterministic run to run
    f32 = load_engine(Pkg(tiny_qwen3), device="cuda", dtype="float32")
    torch.testing.assert_close(f32.forward(TEST_TEXTS), load_engine(Pkg(tiny_qwen3)).forward(TEST_TEXTS),
                               atol=1e-4, rtol=1e-3)


def test_cuda_graphs_need_a_cuda_device(tiny_qwen3):  # noqa: F811
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        load_engine(Pkg(tiny_qwen3), cuda_graphs=True)
    assert load_engine(Pkg(tiny_qwen3)).graphed is None   # the default: on a CUDA device only


def test_the_cpu_runs_the_exact_set_and_refuses_the_approximate_one(tiny_qwen3):  # noqa: F811
    from vsr.runtime.engine import approximate_allowed

    fp8 = compressed(tiny_qwen3, "FP8_DYNAMIC")
    e = load_engine(Pkg(fp8), emulate=True)
    assert e.kernel_set == "exact" and load_engine(Pkg(fp8), emulate=True, kernel_set="exact").kernel_set == "exact"
    with pytest.raises(ValueError, match="approximate"):
        load_engine(Pkg(fp8), emulate=True, kernel_set="approximate")
    with pytest.raises(ValueError, match="kernel_set"):
        load_engine(Pkg(fp8), emulate=True, kernel_set="fast")
    # The rule: Triton kernels, a quantized layer and dtype auto; never a dense package, an
    # explicit dtype or the reference path.
    assert approximate_allowed("triton", ["dense", "fp8"], False)
    assert not approximate_allowed("triton", ["dense", "dense"], False)
    assert not approximate_allowed("triton", ["int4"], True)
    assert not approximate_allowed("reference", ["int4"], False)


def test_a_layer_runs_four_products(tiny_qwen3):  # noqa: F811
    e = load_engine(Pkg(tiny_qwen3))
    P = "model.layers.0."
    assert e.fused == {f"model.layers.{i}.{k}": tuple(f"model.layers.{i}.{p}" for p in v) for i in range(2)
                       for k, v in (("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj",
                                                           "self_attn.v_proj")),
                                    ("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj")))}
    assert sorted(n for n in e.linears if n.startswith(P)) == sorted(
        P + n for n in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"))
    # 4 heads and 2 KV heads of 32: q|k|v is 128 + 64 + 64 rows; gate|up 256 + 256.
    assert (e.linears[P + "self_attn.qkv_proj"].out_features, e.linears[P + "mlp.gate_up_proj"].out_features) == (
        256, 512)


@pytest.mark.gpu
@pytest.mark.parametrize("package,dtype", [("tiny_qwen3", "auto"), ("random_bert", "auto"),
                                           ("random_bert", "bfloat16")])
def test_cuda_graphs_replay_the_eager_forward_bit_for_bit(package, dtype, request, monkeypatch):
    # Each batch runs at a ladder shape; a shape's first call runs eagerly, its second is captured
    # (answered by the warm-up run), later ones replay. The answers are the eager engine's bytes on
    # every call. Batches of 1, 2, 3 and 32 requests (a 35-text list is a batch of 32 and one of 3),
    # shapes met again with other inputs; and with room for two graphs only, shapes evicted and
    # captured again.
    from collections import Counter

    from vsr.runtime import engine as engine_mod
    from vsr.runtime.engine import batch_shape
    pkg = Pkg(request.getfixturevalue(package))
    eager = load_engine(pkg, device="cuda", dtype=dtype, cuda_graphs=False)
    graphed = load_engine(pkg, device="cuda", dtype=dtype)   # CUDA graphs: the GPU default
    assert eager.graphed is None and graphed.graphed is not None
    assert eager.shape_ladder and graphed.shape_ladder and graphed.graphed.capture_at == 2
    lists = [TEST_TEXTS[:1], TEST_TEXTS[1:3], (TEST_TEXTS * 4)[:35], TEST_TEXTS[:1], TEST_TEXTS[1:3],
             TEST_TEXTS[5:6], TEST_TEXTS[7:8], TEST_TEXTS[:1]]
    keys, replays = [], []
    call, replay = engine_mod.GraphedForward.__call__, torch.cuda.CUDAGraph.replay
    monkeypatch.setattr(engine_mod.GraphedForward, "__call__",
                        lambda self, *t: (keys.append(tuple(tuple(x.shape) for x in t)), call(self, *t))[1])
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda self: (replays.append(self), replay(self))[1])
    for texts in lists:
        assert torch.equal(graphed.forward(texts), eager.forward(texts)), texts
    calls = Counter(keys)
    assert all(batch_shape(n, s, 10 ** 6) == (n, s) for (n, s), *_ in calls)   # the ladder's shapes
    assert graphed.graphed.captures == sum(c >= 2 for c in calls.values()) >= 1
    assert len(replays) == sum(max(0, c - 2) for c in calls.values()) >= 1   # lists 1 and 8: a third call
    assert set(graphed.graphed.seen) == {k for k, c in calls.items() if c == 1}
    for texts in lists:   # second pass: every shape captured, replayed from its third call on
        assert torch.equal(graphed.forward(texts), eager.forward(texts))
    calls = Counter(keys)
    assert graphed.graphed.captures == len(calls) and not graphed.graphed.seen
    assert len(replays) == sum(c - 2 for c in calls.values())
    # Against each batch at its own longest request: the answers of its own requests, none of the
    # extra rows' (tolerance: another shape may take other tiles).
    own = load_engine(pkg, device="cuda", dtype=dtype, shape_ladder=False, cuda_graphs=False)
    for texts in lists:
        torch.testing.assert_close(graphed.forward(texts), own.forward(texts), atol=2e-2, rtol=0)
    with pytest.raises(ValueError, match="at least 1"):
        engine_mod.GraphedForward(graphed.model, graphed.device, kept=0)
    small = engine_mod.GraphedForward(graphed.model, graphed.device, kept=2, capture_at=1)
    monkeypatch.setattr(graphed, "graphed", small)
    for texts in lists + lists:
        assert torch.equal(graphed.forward(texts), eager.forward(texts))
    assert len(small.graphs) == 2 and small.captures > len(calls)
    assert not small.seen, "captured at the first call: an evicted shape needs no count"
    # One graph kept, captured at a shape's second call: an evicted shape is captured again at
    # its next call; the shapes seen and not captured are at most SEEN_PER_GRAPH.
    one = engine_mod.GraphedForward(graphed.model, graphed.device, kept=1, capture_at=2)
    monkeypatch.setattr(graphed, "graphed", one)
    a, b = TEST_TEXTS[:1], (TEST_TEXTS * 4)[:32]   # two shapes
    for texts, captures in ((a, 0), (a, 1), (b, 1), (b, 2), (a, 3), (b, 4)):
        assert torch.equal(graphed.forward(texts), eager.forward(texts))
        assert one.captures == captures, (texts, captures)
    for words in (1, 5, 10, 18, 26, 34, 42):   # seven new shapes (two requests each), each seen once
        graphed.forward(["word " * words] * 2)
    assert len(one.seen) == engine_mod.SEEN_PER_GRAPH and one.captures == 4


def test_batch_shapes_lie_on_the_ladder():
    from vsr.runtime.engine import BATCH_SIZE, batch_shape
    assert [batch_shape(r, 9, 256)[0] for r in (1, 2, 3, 5, 8, 9, 17, 32)] == [1, 2, 4, 8, 8, 16, 32, 32]
    assert [batch_shape(1, t, 256)[1] for t in (1, 2, 3, 5, 8, 9, 63, 64, 65, 80, 81, 250)] == \
        [1, 2, 4, 8, 8, 16, 64, 64, 80, 80, 96, 256]
    assert batch_shape(3, 250, 250) == (4, 250) and batch_shape(BATCH_SIZE, 1, 1) == (BATCH_SIZE, 1)
    for r, t in ((0, 5), (3, 0), (3, 257), (BATCH_SIZE + 1, 5)):
        with pytest.raises(ValueError, match="at least one request"):
            batch_shape(r, t, 256)


@pytest.mark.parametrize("package", ["minilm_router", "random_bert", "tiny_qwen3"])
def test_a_batch_at_a_ladder_shape_gives_its_requests_answers(package, request):
    # The ladder is on for CUDA engines; asked for here on the CPU, where the reference runs: the
    # extra requests (copies of the last) and the masked tokens leave the answers as they were
    # (BERT's mean over the mask, Qwen3's last real token through `lengths`) and are not returned.
    # 37 requests: a batch of 32 and one of 5, which runs as 8.
    pkg = Pkg(request.getfixturevalue(package))
    plain, ladder = load_engine(pkg), load_engine(pkg, shape_ladder=True)
    assert not plain.shape_ladder and ladder.shape_ladder
    pads = []
    pad = ladder.tokenizer.pad
    ladder.tokenizer.pad = lambda ids, length=None: (pads.append((len(ids), length, max(map(len, ids)))),
                                                     pad(ids, length))[1]
    texts = (TEST_TEXTS * 5)[:37]
    got, want = ladder.forward(texts), plain.forward(texts)
    assert got.shape == want.shape == (37, want.shape[1])
    assert [p[0] for p in pads] == [32, 8] and all(p[1] in (1, 2, 4) or p[1] % 8 == 0 for p in pads)
    assert any(p[1] > p[2] for p in pads), "the test's batches were already at ladder shapes"
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_pad_puts_real_tokens_first_and_refuses_a_short_length(router):
    tok = router.tokenizer
    ids = tok.encode(TEST_TEXTS[:2])
    batch = tok.pad(ids, 16)
    assert batch.input_ids.shape == batch.attention_mask.shape == (2, 16)
    assert batch.lengths.tolist() == [len(x) for x in ids]
    for i, x in enumerate(ids):
        assert batch.input_ids[i, :len(x)].tolist() == x and bool(batch.attention_mask[i, :len(x)].all())
        assert not batch.attention_mask[i, len(x):].any() and bool((batch.input_ids[i, len(x):] == tok.pad_id).all())
    assert torch.equal(tok.pad(ids).input_ids, batch.input_ids[:, :max(map(len, ids))])   # its own longest
    with pytest.raises(ValueError, match="shorter than the batch's longest"):
        tok.pad(ids, max(len(x) for x in ids) - 1)


def test_a_broken_package_releases_its_safetensors_handles(tmp_path, minilm_router, monkeypatch):  # noqa: F811
    # A tensor missing from the file fails validation; the loader's handles are closed all the same.
    import shutil

    from safetensors.torch import load_file, save_file

    from vsr.runtime.loaders import PackageLoader

    broken = tmp_path / "broken"
    shutil.copytree(minilm_router, broken)
    tensors = load_file(broken / "model.safetensors")
    del tensors["encoder.layer.0.attention.self.query.weight"]
    save_file(tensors, str(broken / "model.safetensors"))
    closed = []
    real_close = PackageLoader.close
    monkeypatch.setattr(PackageLoader, "close", lambda self: closed.append(self) or real_close(self))
    with pytest.raises(PackageError, match="query.weight"):
        load_engine(Pkg(broken))
    assert len(closed) == 1 and not closed[0]._handles


def test_answer_reports_bad_requests_in_place_and_tokenizes_once(router, monkeypatch):
    texts = ["turn on the lights", "", "lights " * 300, "what is the temperature in the kitchen"]
    calls = []
    real = router.tokenizer.tokenizer
    monkeypatch.setattr(router.tokenizer, "tokenizer", type("T", (), {
        "encode": lambda self, t: calls.append(t) or real.encode(t),
        "encode_batch": lambda self, ts: calls.extend(ts) or real.encode_batch(ts)})())
    got = router.answer(texts, top_k=2)
    assert sorted(calls) == sorted([texts[0], texts[2], texts[3]])  # each non-empty text once
    assert got[1] == {"error": "empty text"} and "too long" in got[2]["error"]
    monkeypatch.undo()
    assert [got[0], got[3]] == router.predict([texts[0], texts[3]], top_k=2)


def test_a_broken_sentence_bert_config_is_a_package_error(tmp_path, minilm_router):  # noqa: F811
    import shutil

    from vsr.runtime.tokenize import token_limit

    broken = tmp_path / "pkg"
    shutil.copytree(minilm_router, broken)
    (broken / "sentence_bert_config.json").write_text("{not json")
    config = json.loads((broken / "config.json").read_text())
    with pytest.raises(PackageError, match="sentence_bert_config.json"):
        token_limit(broken, config)
    (broken / "sentence_bert_config.json").write_text("[256]")
    with pytest.raises(PackageError, match="sentence_bert_config.json.*not a JSON object"):
        token_limit(broken, config)


@pytest.mark.parametrize("n", ['"lots"', "[256]", '{"n": 256}'])
def test_a_non_integer_max_seq_length_is_a_package_error(tmp_path, n):
    from vsr.runtime.tokenize import token_limit

    (tmp_path / "sentence_bert_config.json").write_text(f'{{"max_seq_length": {n}}}')
    with pytest.raises(PackageError, match="sentence_bert_config.json: max_seq_length .* is not an integer"):
        token_limit(tmp_path, {"max_position_embeddings": 512})
