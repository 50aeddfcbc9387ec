"""benchmarks/bench_e2e.py: the whole run on the CPU at a tiny config (reference kernels, no graphs),
its results file, the random weights, the floor and target arithmetic; on a GPU, the 27B-class
shapes at two layers."""
import json

import pytest
import torch


@pytest.fixture(scope="module")
def bench(bench_script):
    return bench_script("bench_e2e")


def tiny(bench, model: str, layers: int) -> dict:
    """A tiny config of the model (hidden 64, heads of 16), every other key the 27B-class one's."""
    c = bench.e2e_models.MODELS[model][0](layers)
    c.update(vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=2048)
    if model == "qwen3_5":
        c.update(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)
    return c


def run(bench, tmp_path, model, layers, *args):
    cfg = tmp_path / f"{model}.json"
    cfg.write_text(json.dumps(tiny(bench, model, layers)))
    out = tmp_path / f"e2e-{model}.json"
    assert bench.main(["--model", model, "--device", "cpu", "--config", str(cfg), "--configs", "1x128",
                       "--reps", "1", "--warm", "0", "--out", str(out), *args]) == 0
    return json.loads(out.read_text())


SCHEMA = {"format", "config", "model", "provider", "graph", "ms", "floor_ms", "checked"}


def test_a_cpu_run_writes_every_provider_checked_in_the_e2e_schema(bench, tmp_path, capsys):
    res = run(bench, tmp_path, "qwen3", 2, "--formats", "bf16,fp8")
    assert res["benchmark"] == "e2e" and res["partial"] is False and res["errors"] == []
    assert {"device", "torch", "commit", "ceilings"} <= set(res)
    rows = res["rows"]
    assert {(r["format"], r["provider"]) for r in rows} == {
        ("bf16", "vsr"), ("bf16", "cublas-bf16"), ("bf16", "transformers"), ("fp8", "vsr"), ("fp8", "scaled_mm+quant")}
    for r in rows:
        assert SCHEMA <= set(r) and r["model"] == "qwen3" and r["config"] == "1x128" and r["graph"] is False
        assert r["checked"] is True and r["ms"] > 0 and r["floor_ms"] > 0
    vsr = [r for r in rows if r["provider"] == "vsr"]
    assert all({"products_ms", "rest_ms"} <= set(r) for r in vsr)   # None on the CPU, with the reason
    assert all(r["split_error"] == "no CUDA device" for r in vsr)
    hf = next(r for r in rows if r["provider"] == "transformers")
    # transformers' own numerics on the same weights (its score head in bf16): close, not equal
    assert hf["check"]["hidden_rel_err"] < bench.CHECK_TOL["bf16"][0] and 0 < hf["check"]["prob_err"] < 0.02
    printed = capsys.readouterr().out
    assert "| 1x128 |" in printed and "vsr BF16 <= 0.6x transformers BF16 at 1x128" in printed


def test_a_qwen3_5_run_with_transformers_and_a_quantized_format(bench, tmp_path):
    res = run(bench, tmp_path, "qwen3_5", 4, "--formats", "bf16,int4-awq", "--providers", "vsr,transformers")
    rows = res["rows"]
    assert {(r["format"], r["provider"]) for r in rows} == {
        ("bf16", "vsr"), ("bf16", "transformers"), ("int4-awq", "vsr")}
    assert all(r["checked"] and r["model"] == "qwen3_5" for r in rows)
    hf = next(r for r in rows if r["provider"] == "transformers")
    assert hf["fla"] is (__import__("importlib").util.find_spec("fla") is not None)


def test_first_layers_is_the_model_of_fewer_layers(bench):
    """A forward cut to its first n layers (the check's) is the forward of the n-layer model (the
    loader seeds each tensor by its name, so the shallower model has the deeper one's first layers)."""
    em = bench.e2e_models
    for model in ("qwen3", "qwen3_5"):
        built = {}
        for n in (5, 4):
            c = tiny(bench, model, n)
            loader = em.MODELS[model][1](c, "bf16", "cpu")
            m, b, _ = bench.build_vsr(c, loader, "cpu", None, "auto")
            hf = em.TransformersRouter(em.transformers_twin(model, c, b, loader, {}))
            built[n] = (m, hf)
        x = bench.make_inputs(2, 16, 512, "cpu")
        with torch.inference_mode():
            for deep, shallow in zip(built[5], built[4]):
                full = deep(*x)
                with bench.first_layers(deep, 4):
                    cut = deep(*x)
                assert torch.equal(cut, shallow(*x)) and not torch.equal(cut, full)
                assert torch.equal(deep(*x), full)   # restored


def test_the_peers_swap_in_and_out(bench):
    em = bench.e2e_models
    c = tiny(bench, "qwen3", 2)
    model, b, _ = bench.build_vsr(c, em.RandomQwen3Loader(c, "fp8", "cpu"), "cpu", None, "auto")
    x = bench.make_inputs(1, 16, 512, "cpu")
    with torch.inference_mode():
        want = model(*x)
        with bench.linears_as(model, bench.ScaledMMLinear):
            kinds = {type(m).__name__ for m in model.modules()}
            assert "ScaledMMLinear" in kinds and "QLinear" not in kinds
            peer = model(*x)
        assert torch.equal(model(*x), want)
    assert (peer - want).abs().max() < 0.05


def test_the_cublas_peer_of_a_swiglu_product_is_its_plain_product_then_the_activation(bench):
    """A QLinear with a SwiGLU epilogue (rows interleaved) becomes F.linear on the rows in gate|up
    order and the runtime's activation kernel: what the model ran before the fused epilogue."""
    from vsr.kernels import dense
    from vsr.runtime import fuse
    from vsr.runtime.linear import QLinear

    g = torch.Generator().manual_seed(5)
    w = dense.DenseWeight(torch.randn(24, 64, generator=g), torch.randn(24, generator=g))
    gate, up = dense.DenseWeight(w.weight[:12], w.bias[:12]), dense.DenseWeight(w.weight[12:], w.bias[12:])
    q = QLinear(fuse.fuse([gate, up], interleave=True), "reference", glu=True)
    x = torch.randn(3, 64, generator=g)
    want = q(x)
    with bench.gate_up_order(q):
        peer = bench.CublasLinear(q)
        torch.testing.assert_close(peer(x), torch.nn.functional.silu(x @ w.weight[:12].t() + w.bias[:12])
                                   * (x @ w.weight[12:].t() + w.bias[12:]), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(peer(x), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(q(x), want)
    assert torch.equal(bench.CublasLinear(QLinear(w))(x), torch.nn.functional.linear(x, w.weight, w.bias))


def test_vsr_act_runs_a_swiglu_product_plain_and_restores_it(bench):
    """The vsr-act provider's model: a SwiGLU QLinear inside is a plain product of its rows in
    gate|up order (the Projection no longer activated, so the model applies the activation kernel);
    after it, the SwiGLU product again, the same bytes."""
    from vsr.kernels import dense
    from vsr.runtime import fuse
    from vsr.runtime.linear import QLinear
    from vsr.runtime.models.common import Projection

    g = torch.Generator().manual_seed(6)
    w = dense.DenseWeight(torch.randn(24, 64, generator=g), torch.randn(24, generator=g))
    gate, up = dense.DenseWeight(w.weight[:12], w.bias[:12]), dense.DenseWeight(w.weight[12:], w.bias[12:])
    q = QLinear(fuse.fuse([gate, up], interleave=True), "reference", glu=True)
    proj = Projection([q], [12, 12], True)
    x = torch.randn(3, 64, generator=g)
    want = proj(x)
    assert proj.activated == "silu_mul" and want.shape == (3, 12)
    with bench.swiglu_by_activation_kernel(proj):
        assert proj.activated is None and not q.glu
        torch.testing.assert_close(proj(x), torch.nn.functional.linear(x, w.weight, w.bias), rtol=1e-5, atol=1e-5)
    assert q.glu and proj.activated == "silu_mul" and torch.equal(proj(x), want)


def test_gate_up_order_reorders_the_rows_in_place_and_back(bench):
    """Inside gate_up_order a SwiGLU QLinear's row tensors (weight, scales, bias) are the plain fused
    weight's, in their own storage; after it, the interleaved bytes again."""
    from vsr.autotune import synth
    from vsr.runtime import fuse
    from vsr.runtime.linear import QLinear

    gate, up = (synth.random_weight("fp8", 12, 64, {}, torch.bfloat16, "cpu", seed=s, bias=True) for s in (3, 4))
    side, inter = fuse.fuse([gate, up]), fuse.fuse([gate, up], interleave=True)
    q = QLinear(fuse.fuse([gate, up], interleave=True), "reference", glu=True)
    fields = [f for f in ("weight", "weight_scale", "bias") if torch.is_tensor(getattr(inter, f, None))]
    assert len(fields) == 3
    ptrs = [getattr(q.weight, f).data_ptr() for f in fields]
    with bench.gate_up_order(q):
        for f, ptr in zip(fields, ptrs):
            assert torch.equal(getattr(q.weight, f), getattr(side, f)) and getattr(q.weight, f).data_ptr() == ptr, f
    for f in fields:
        assert torch.equal(getattr(q.weight, f), getattr(inter, f)), f


def test_the_fp8_peers_of_a_swiglu_product_take_its_rows_in_gate_up_order(bench):
    """An fp8 QLinear with a SwiGLU epilogue: the scaled_mm+quant peer is its plain product on the
    gate|up rows then the activation kernel; the unquantized twin's product is the plain one (the
    model applies the activation after it, the twin having no epilogue)."""
    from vsr.autotune import synth
    from vsr.kernels import activation
    from vsr.runtime import fuse
    from vsr.runtime.linear import QLinear

    gate, up = (synth.random_weight("fp8", 12, 64, {}, torch.bfloat16, "cpu", seed=s, bias=True) for s in (1, 2))
    side, inter = fuse.fuse([gate, up]), fuse.fuse([gate, up], interleave=True)
    q = QLinear(fuse.fuse([gate, up], interleave=True), "reference", glu=True)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(6)).bfloat16()
    plain = bench.ScaledMMLinear(QLinear(side))(x)
    assert plain.shape == (3, 24)
    with bench.gate_up_order(q):
        assert torch.equal(bench.ScaledMMLinear(q)(x), activation.silu_mul(plain))
        assert torch.equal(bench.UnquantizedLinear(q)(x), bench.UnquantizedLinear(QLinear(side))(x))
    assert not torch.equal(bench.UnquantizedLinear(QLinear(inter))(x), bench.UnquantizedLinear(QLinear(side))(x))


def test_the_unquantized_twin_and_its_check(bench):
    """The FP8 model with each weight dequantized (bf16 activations, reference ops) is a model of its
    own, near the quantized one; a row whose hidden states are no further from it than
    UNQUANTIZED_MARGIN times the exact reference's passes, one further (or not finite) fails."""
    em = bench.e2e_models
    c = tiny(bench, "qwen3", 2)
    model, b, _ = bench.build_vsr(c, em.RandomQwen3Loader(c, "fp8", "cpu"), "cpu", None, "auto")
    x = bench.make_inputs(2, 16, 512, "cpu")
    with torch.inference_mode():
        with bench.reference_path(model):
            ref = bench.outputs(model, x)
        with bench.unquantized_path(model):
            assert "UnquantizedLinear" in {type(m).__name__ for m in model.modules()}
            unq = bench.outputs(model, x)
        assert "UnquantizedLinear" not in {type(m).__name__ for m in model.modules()}
    dist = bench.compare(*ref, unq, "fp8")
    assert 0 < dist["hidden_rel_err"] < 0.2 and 0 < dist["prob_err"]
    h, p = ref
    same = bench.against_unquantized(h, p, unq, dist)
    assert same["ok"] and same["prob_err"] == dist["prob_err"] and same["reference_prob_err"] == dist["prob_err"]
    far = bench.against_unquantized(unq[0] + 2 * (h - unq[0]), p, unq, dist)
    assert not far["ok"] and far["hidden_rel_err"] > bench.UNQUANTIZED_MARGIN * dist["hidden_rel_err"]
    assert not bench.against_unquantized(h, p + float("nan"), unq, dist)["ok"]


def test_random_quantized_weights_spread_as_the_dense_ones(bench):
    em = bench.e2e_models
    from vsr.kernels import formats
    from vsr.runtime import fuse
    x = torch.randn(32, 1024)
    for fmt in ("fp8", "int4-gptq", "int4-awq", "nvfp4"):
        w = em.random_linear(fmt, 512, 1024, "cpu", seed=3)
        std = formats.get(w.format).reference(x, w).float().std().item() / 1024 ** 0.5
        assert std == pytest.approx(1024 ** -0.5, rel=0.15), fmt
    # q, k, v of one K get the same factor: nvfp4's global scales stay equal and the parts fuse
    parts = [em.random_linear("nvfp4", n, 256, "cpu", seed=s) for s, n in ((1, 64), (2, 32), (3, 32))]
    assert fuse.fuse(parts) is not None


def test_the_floor_is_the_weights_bytes_or_the_products_flops(bench):
    ceil = {"copy_TBps": 2.0, "bf16_TFLOPs": 500.0, "fp8_TFLOPs": 1000.0}
    wbytes, macs = 46e9, 23e9
    # one request of 128 tokens: the weights' bytes, 46 GB at 2 TB/s
    assert bench.floor_ms("bf16", wbytes, macs, 128, ceil) == pytest.approx(23.0)
    # 2048 tokens: the FLOPs, 2 * 23e9 * 2048 at 500 TFLOP/s (fp8 at its own, doubled, rate)
    assert bench.floor_ms("bf16", wbytes, macs, 2048, ceil) == pytest.approx(188.416)
    assert bench.floor_ms("fp8", wbytes / 2, macs, 2048, ceil) == pytest.approx(94.208)
    assert bench.floor_ms("int4-gptq", wbytes / 4, macs, 2048, ceil) == pytest.approx(188.416)


def row(fmt, prov, cfg, ms, graph=True, floor=10.0, checked=True, split=None, model="qwen3"):
    r = dict(model=model, format=fmt, provider=prov, config=cfg, ms=ms, graph=graph, floor_ms=floor, checked=checked)
    if split:
        r.update(products_ms=split[0], rest_ms=split[1])
    return r


def test_targets_pair_rows_timed_alike_and_name_each_point(bench_script):
    et = bench_script("e2e_targets")
    rows = [row("bf16", "vsr", "1x128", 12.0, split=(10.0, 2.0)), row("bf16", "vsr", "1x128", 30.0, graph=False),
            row("fp8", "vsr", "1x128", 6.0, split=(5.7, 0.3)), row("fp8", "vsr", "1x128", 5.0, graph=False),
            row("int4-gptq", "vsr", "1x128", 11.0, checked=False),
            row("bf16", "transformers", "1x128", 25.0, graph=False),   # its capture failed: eager only
            row("bf16", "cublas-bf16", "16x128", 100.0), row("bf16", "vsr", "16x128", 99.0)]
    t = {x["target"]: x for x in et.evaluate({"rows": rows})}
    floor = t["vsr BF16 <= 1.3x its floor at 1x128"]
    assert floor["met"] is True and floor["points"][0]["ratio"] == pytest.approx(1.2)
    fp8 = t["FP8 <= 0.55x vsr BF16 at 1x128"]["points"][0]   # graph against graph: 6 / 12
    assert fp8["ratio"] == pytest.approx(0.5) and fp8["graph"] is True and fp8["need_ms"] == pytest.approx(6.6)
    assert t["int4 GPTQ and AWQ <= 0.85x vsr BF16 at 1x128"]["met"] is False   # unchecked misses
    hf = t["vsr BF16 <= 0.6x transformers BF16 at 1x128"]["points"][0]   # eager against eager: 30 / 25
    assert hf["graph"] is False and hf["ratio"] == pytest.approx(1.2) and not hf["met"]
    assert t["vsr BF16 <= 1.0x cuBLAS BF16 at 1x1024 and 16x128"]["met"] is True
    rest = t["everything but the products <= 10% of a forward's device time"]
    assert [(p["format"], p["met"]) for p in rest["points"]] == [("bf16", False), ("fp8", True)]
    assert t["int4 <= 1.0x vsr BF16 at 1x1024 and 16x128"]["met"] is None
    text = et.report(list(t.values()))
    assert "MISSED       qwen3: vsr BF16 <= 0.6x transformers BF16 at 1x128" in text
    assert "16.7% of 12.00 ms device time" in text and "UNCHECKED" in text


def test_parts_of_one_commit_merge_and_others_are_refused(bench_script):
    et = bench_script("e2e_targets")
    a = {"commit": "c", "rows": [row("bf16", "vsr", "1x128", 12.0)]}
    b = {"commit": "c", "rows": [row("fp8", "vsr", "1x128", 6.0)]}
    assert len(et.merge([a, b])["rows"]) == 2
    # what describes the run is both parts', not the first's alone
    a.update(formats=["bf16"], providers=["vsr", "cublas-bf16"], configs=["1x128"], modes=["graph"], wall_s=10.0,
             partial=False, not_run=[], tiles={"cache": "x", "stale": 2, "missed": []})
    b.update(formats=["fp8"], providers=["vsr", "scaled_mm+quant"], configs=["1x128"], modes=["graph"], wall_s=5.5,
             partial=True, not_run=[{"format": "nvfp4"}], tiles={"cache": "x", "stale": 1, "missed": ["k3"]})
    m = et.merge([a, b])
    assert m["formats"] == ["bf16", "fp8"] and m["providers"] == ["vsr", "cublas-bf16", "scaled_mm+quant"]
    assert m["configs"] == ["1x128"] and m["wall_s"] == 15.5 and m["partial"] is True
    assert m["not_run"] == [{"format": "nvfp4"}] and m["tiles"] == {"cache": "x", "stale": 3, "missed": ["k3"]}
    with pytest.raises(ValueError, match="both time"):
        et.merge([a, a])
    with pytest.raises(ValueError, match="different commits"):
        et.merge([a, {**b, "commit": "d"}])


def test_targets_py_reads_e2e_parts(bench_script, tmp_path, capsys):
    targets = bench_script("targets")
    paths = []
    for i, r in enumerate([row("bf16", "vsr", "1x128", 12.0), row("fp8", "vsr", "1x128", 7.0)]):
        paths.append(tmp_path / f"e2e-{i}.json")
        paths[-1].write_text(json.dumps({"benchmark": "e2e", "commit": "c", "rows": [r]}))
    assert targets.main([str(p) for p in paths]) == 0
    assert "MISSED       qwen3: FP8 <= 0.55x vsr BF16 at 1x128" in capsys.readouterr().out


def test_kernel_split_sums_the_product_templates_kernels(bench):
    names = bench.product_kernel_names()
    assert {"tma_gemm_kernel", "_int4_slices_kernel", "int4_wgmma_kernel", "_act_quant_kernel"} <= names
    assert "_norm_kernel" not in names
    s = bench.split_kernels([("tma_gemm_kernel", 300.0), ("_norm_kernel", 50.0), ("tma_gemm_kernel", 200.0),
                             ("Memcpy DtoD", 10.0)], names)
    assert s["products_ms"] == pytest.approx(0.5) and s["rest_ms"] == pytest.approx(0.06)
    assert s["kernels"][0] == {"name": "tma_gemm_kernel", "ms": 0.5, "product": True}


def test_unknown_names_are_refused(bench):
    with pytest.raises(SystemExit):
        bench.parse(["--formats", "bf16,int8"])
    with pytest.raises(SystemExit):
        bench.parse(["--providers", "vllm"])


@pytest.mark.gpu
@pytest.mark.parametrize("model, layers, formats", [("qwen3", 2, "bf16,fp8,int4-awq,nvfp4"),
                                                    ("qwen3_5", 4, "bf16,int4-gptq")])
def test_the_27b_class_shapes_at_a_few_layers_on_the_gpu(bench, tmp_path, model, layers, formats):
    """Every provider at the real shapes, a few layers: each row checked, vsr's graphed, its device
    time split into the products and the rest; nvfp4 recorded as not run where the GPU refuses it."""
    out = tmp_path / "e2e.json"
    assert bench.main(["--model", model, "--layers", str(layers), "--formats", formats, "--configs", "1x128",
                       "--modes", "graph,eager", "--reps", "2", "--warm", "0", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["errors"] == [] and res["rows"]
    assert all(r["checked"] for r in res["rows"]), [r for r in res["rows"] if not r["checked"]]
    vsr = [r for r in res["rows"] if r["provider"] == "vsr"]
    assert any(r["graph"] for r in vsr) and all(r["products_ms"] > 0 for r in vsr)
    ran = {r["format"] for r in res["rows"]} | {x["format"] for x in res["not_run"]}
    assert ran == set(formats.split(","))


def test_vsr_pdl_is_vsr_within_programmatic_forward(bench, tmp_path):
    # vsr-pdl runs only when asked for; off a GPU with PDL it launches exactly as vsr does
    res = run(bench, tmp_path, "qwen3", 2, "--formats", "bf16", "--providers", "vsr,vsr-pdl")
    rows = {r["provider"]: r for r in res["rows"]}
    assert set(rows) == {"vsr", "vsr-pdl"} and all(r["checked"] for r in rows.values())
    assert rows["vsr-pdl"]["check"] == rows["vsr"]["check"]
    assert "vsr-pdl" not in bench.parse([]).providers


def test_tiles_read_as_another_device_are_stale_only_for_other_kernels(bench_script, tmp_path):
    # --cache-as-device reads another device's entries: an entry of this kernel source is current
    # (its key names the other device, as every such key does), one tuned for other kernels is stale.
    import dataclasses
    from vsr.autotune.device_id import current_device_identity
    from vsr.autotune.keys import make_key
    from vsr.autotune.store import Entry, JsonStore
    from vsr.kernels import dense
    be = bench_script("bench_e2e")
    other = dataclasses.replace(current_device_identity(torch.device("cpu")), name="Other Device")
    tile = dense.TEMPLATE.default_tile(dense.TEMPLATE.problem(dense.DenseWeight(torch.zeros(64, 32)), 16,
                                                              torch.float32))
    problems = [dense.TEMPLATE.problem(dense.DenseWeight(torch.zeros(n, 32)), 16, torch.float32) for n in (64, 128)]
    path = tmp_path / "cache.json"
    store = JsonStore(path)
    current = make_key(dense.TEMPLATE, problems[0], other)
    older = dataclasses.replace(make_key(dense.TEMPLATE, problems[1], other), source_hash="0" * 16)
    for key in (current, older):
        store.put(Entry(key=key, tile=dict(tile), ms=1.0))
    store.close()
    tiles = be.CacheTiles(path, "default", "cpu", as_device="Other Device")
    assert tiles.tile(dense.TEMPLATE, problems[0]) == tile and tiles.summary()["stale"] == 0
    assert tiles.tile(dense.TEMPLATE, problems[1]) == tile and tiles.summary()["stale"] == 1
    assert tiles.summary()["missed"] == []
