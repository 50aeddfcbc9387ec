"""benchmarks/variants.py's studies build, run and check every case: their orchestration under the
interpreter on a tiny shape (the figures themselves come from the H200)."""
import json
import signal
import subprocess
import sys

import pytest
import torch

from vsr.kernels import gemm

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def variants(bench_script):
    return bench_script("variants")


@pytest.fixture
def on_a_tiny_shape(variants, monkeypatch, run_each_once):
    """setup(N, K, timed=None, copies=None): the studies on this machine's device, fp16 x (the interpreter's bf16
    tl.dot is wrong, so bf16 outputs could not be checked), one shape "tiny" [N, K], timing
    replaced by running each call once (run_each_once; `timed` collects how many calls each
    timing got)."""
    def setup(N, K, timed=None, copies=None):
        monkeypatch.setattr(variants, "DEV", DEV)
        if copies:   # time over the first `copies` weight copies only (the interpreter is slow)
            every = variants.weight_copies
            monkeypatch.setattr(variants, "weight_copies", lambda *a: every(*a)[:copies])
        monkeypatch.setattr(variants, "ACT", torch.float16)
        monkeypatch.setattr(variants, "SHAPES", {"tiny": (N, K)})
        monkeypatch.setattr(variants, "graph_ms", run_each_once(1.0, timed))
        # No H200 tiles: the templates' defaults (no benchmark file of tuned tiles, no shipped cache).
        monkeypatch.setattr(variants, "TUNED_FROM", variants.Path("/nonexistent"))
        monkeypatch.setattr(variants, "SHIPPED_CACHE", variants.Path("/nonexistent/cache.json"))
    return setup


def test_the_study_runs_checks_and_times_every_case(variants, on_a_tiny_shape):
    # The study on a tiny shape, timing replaced by running the calls: every case is built, run,
    # checked against its reference and recorded (the figures themselves come from the H200).
    # M=1: the GEMV too; M=130 is bucket 256: the 128-row tiles too.
    timed = []     # one entry per graph_ms call: how many calls it replayed
    on_a_tiny_shape(64, 256, timed)
    rows = variants.study_int4_x(["tiny"], [1, 130], lambda r: None)
    cases = [r for r in rows if r["variant"] != "cublas-bf16"]
    assert cases and all("error" not in r for r in cases), [r.get("error") for r in cases]
    assert all(r["ok"] for r in cases), [(r["variant"], r["tile"], r["rel_err"]) for r in cases if not r["ok"]]
    # Each row (baselines included) timed once, over every weight copy (int4 and bf16 copies alike).
    copies = len(variants._weights("int4-gptq", 64, 256, DEV))
    assert timed == [copies] * len(rows)
    assert {r["variant"] for r in cases} == {"default tile", "gemv", "slices"}
    assert {r["tile"]["num_warps"] for r in cases if r["M"] == 1} >= {2, 4, 8}
    assert any(r["tile"]["BLOCK_M"] == 128 for r in cases if r["M"] == 130)


def test_a_stopped_run_keeps_the_rows_it_logged(variants, monkeypatch, tmp_path):
    # Run 11's study was stopped by its time limit before it wrote its file: a stopped run now
    # writes its rows (whole, by rename) as it stops, and every SAVE_EVERY_S seconds before.
    def study(shapes, ms, log):
        for m in ms:
            log({"study": "fake", "shape": shapes[0], "M": m, "variant": "v", "ms": 1.0})
        raise TimeoutError("stopped")
    monkeypatch.setitem(variants.STUDIES, "fake", (study, "1,2,3"))
    monkeypatch.setattr(variants, "SAVE_EVERY_S", float("inf"))   # only the write at the stop
    out = tmp_path / "v.json"
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(TimeoutError):
        variants.main(["--study", "fake", "--shapes", "qkv", "--out", str(out)])
    assert signal.getsignal(signal.SIGTERM) is handler, "main put back the caller's SIGTERM handler"
    doc = json.loads(out.read_text())
    assert doc["partial"] is True and [r["M"] for r in doc["rows"]] == [1, 2, 3]
    assert [p.name for p in tmp_path.iterdir()] == ["v.json"], "no temporary file left beside it"


def test_a_running_study_rewrites_its_file_every_save_interval(variants, monkeypatch, tmp_path):
    # While a study runs, its file is rewritten once SAVE_EVERY_S has passed since the last write
    # (0 here: after every row), partial and whole, so a run killed outright keeps what it logged.
    out = tmp_path / "v.json"
    seen = []

    def study(shapes, ms, log):
        for m in ms:
            log({"study": "fake", "shape": shapes[0], "M": m, "variant": "v", "ms": 1.0})
            doc = json.loads(out.read_text())
            seen.append((doc["partial"], [r["M"] for r in doc["rows"]]))
    monkeypatch.setitem(variants.STUDIES, "fake", (study, "1,2"))
    monkeypatch.setattr(variants, "SAVE_EVERY_S", 0.0)
    variants.main(["--study", "fake", "--shapes", "qkv", "--out", str(out)])
    assert seen == [(True, [1]), (True, [1, 2])]
    assert json.loads(out.read_text())["partial"] is False


def test_a_run_killed_by_its_time_limit_keeps_the_rows_it_logged(variants, tmp_path):
    # `timeout` stops a run with SIGTERM: the run writes the rows it has before it exits.
    out = tmp_path / "v.json"
    code = (f"import importlib.util, os, signal\n"
            f"spec = importlib.util.spec_from_file_location('v', {variants.__file__!r})\n"
            f"m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            f"def study(shapes, ms, log):\n"
            f"    for m_ in (1, 2):\n"
            f"        log({{'study': 'fake', 'shape': 'qkv', 'M': m_, 'variant': 'v', 'ms': 1.0}})\n"
            f"    os.kill(os.getpid(), signal.SIGTERM)\n"
            f"m.STUDIES['fake'] = (study, '1')\n"
            f"m.SAVE_EVERY_S = float('inf')\n"
            f"m.main(['--study', 'fake', '--shapes', 'qkv', '--out', {str(out)!r}])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["partial"] is True and [r["M"] for r in doc["rows"]] == [1, 2], "no periodic write: the rows come from the stop"


@pytest.mark.parametrize("study,ms,block_ms", [("int4-join", [1, 20], {16, 32}), ("int4-join-tiles", [20], {32}),
                                               ("int4-join-wide", [130], {64, 128, 256})])
def test_the_join_studies_check_every_case(variants, on_a_tiny_shape, study, ms, block_ms):
    # The int4 join studies (the template's join path beside its default tile) on a tiny shape
    # (three BLOCK_K steps), fp16 x: each case matches the reference; M=130 (bucket 256) takes the
    # wide study's 256-row tiles too.
    on_a_tiny_shape(64, 384)
    rows = variants.STUDIES[study][0](["tiny"], ms, lambda r: None)
    cases = [r for r in rows if r["variant"] != "cublas-bf16"]   # the default tile's rows too
    assert cases and all("error" not in r for r in cases), [r.get("error") for r in cases]
    assert all(r["ok"] for r in cases), [(r["tile"], r["rel_err"]) for r in cases if not r["ok"]]
    assert {r["tile"]["BLOCK_M"] for r in cases if r["variant"] == "join"} == block_ms
    assert {r["variant"] for r in cases} == {"default tile", "join"}
    assert all(r["study"] == study for r in rows)


def test_the_streamk_study_checks_every_case(variants, monkeypatch, on_a_tiny_shape):
    # The stream-K study on a tiny shape (K = 3-6 steps), fp16 x: every case of both formats
    # matches its reference, with the leftover tiles shared over the interpreter's 4 "multiprocessors".
    on_a_tiny_shape(160, 384)
    # Small tiles (the interpreter's time grows with them): 6 or 15 tiles, 3 or 6 K steps.
    monkeypatch.setattr(variants, "SK_TILES", ((32, 64, 128, 4, 2), (16, 32, 64, 4, 3)))
    rows = variants.study_streamk(["tiny"], [40], lambda r: None)
    cases = [r for r in rows if r["variant"] != "cublas-bf16"]
    assert cases and all("error" not in r for r in cases), [r.get("error") for r in cases]
    assert all(r["ok"] for r in cases), [(r["format"], r["tile"], r["rel_err"]) for r in cases if not r["ok"]]
    assert {r["format"] for r in cases} == {"bf16", "fp8"}
    assert len(rows) - len(cases) == 1, "one cuBLAS baseline per shape and M, shared by both formats"
    assert {r["tile"]["path"] for r in cases if r["variant"] == "stream-K"} == {"tma-sk"}
    assert len([r for r in cases if r["variant"] == "stream-K"]) == 2 * len(variants.SK_TILES)


def test_the_fp8_prologue_study_checks_every_case(variants, on_a_tiny_shape):
    # The fp8-prologue study on a tiny shape (K = 304: two register blocks, 256 + 64, 16 lanes of
    # the second masked): every prologue plan gives the reference quantization's bits, every
    # whole call its reference output.
    on_a_tiny_shape(48, 304)
    rows = variants.study_fp8_prologue(["tiny"], [1, 20], lambda r: None)
    prologue = [r for r in rows if r.get("part") == "prologue"]
    calls = [r for r in rows if r.get("part") == "fp8"]
    assert all("error" not in r for r in prologue + calls), [r.get("error") for r in prologue + calls]
    assert prologue and all(r["ok"] for r in prologue), [r["variant"] for r in prologue if not r["ok"]]
    assert calls and all(r["ok"] for r in calls), [(r["variant"], r["rel_err"]) for r in calls if not r["ok"]]
    assert {r["variant"] for r in calls} >= {"run-14 prologue + product", "new prologue + product",
                                             "product alone (x prequantized)"}
    assert any(r["plan"]["block_b"] == 64 for r in prologue) and any(r["plan"]["chunked"] for r in prologue)
    # The division form beside the 1/s product, at each M (fp16 x divides either way: same bits).
    assert [r["M"] for r in prologue if r["variant"] == "two blocks, division"] == [1, 20]


def test_the_fixup_study_checks_every_case(variants, monkeypatch, on_a_tiny_shape):
    # The fixup study on a tiny shape: each "shipped" split or stream-K tile both ways, the extra
    # transposed-product splits at M <= 16 and int4's other splits, all checked against the
    # reference. The shipped tiles are small ones, for the interpreter's sake.
    on_a_tiny_shape(64, 256)
    monkeypatch.setattr(gemm, "multiprocessors", lambda device: 3)
    monkeypatch.setattr(variants, "FIXUP_SWAP", dict(rows=32, kbytes=64, stages=(2, 3), splits=(2,)))

    def shipped(template, problem):
        if template.name == "int4_w4a16":
            return variants.gemm_tiles.tile("swap", 16, 32, 64, 2, 4, 2)
        if problem.bucket <= 16:
            return variants.gemm_tiles.swap_tile(64, 32, 2, split=2)
        return variants.gemm_tiles.tile("tma-sk", 32, 32, 64, 1, 4, 2)
    monkeypatch.setattr(variants, "_shipped_tile", shipped)
    rows = variants.study_fixup(["tiny"], [16, 40], lambda r: None)
    cases = [r for r in rows if r["variant"] != "cublas-bf16"]
    assert all("error" not in r and r["ok"] for r in cases), [(r["variant"], r.get("error")) for r in cases]
    both = ["shipped, in-kernel fixup", "shipped, reduction kernel"]
    got = {(f, m): sorted(r["variant"] for r in cases if (r["format"], r["M"]) == (f, m))
           for f in ("bf16", "fp8", "int4-gptq", "int4-awq") for m in (16, 40)}
    for f in ("bf16", "fp8"):
        assert got[(f, 16)] == both + ["swap split 2, fixup"] * 2, got
        assert got[(f, 40)] == both, got
    for f in ("int4-gptq", "int4-awq"):
        assert got[(f, 16)] == ["shipped at split 4, fixup"] + both, got   # split 1 (of 2) is no split
        assert got[(f, 40)] == both, got
    assert all(r["tile"].get("FIXUP") == (r["variant"] != "shipped, reduction kernel") for r in cases)


def test_the_int4_fixup_tiles_study_checks_every_case(variants, monkeypatch, on_a_tiny_shape):
    on_a_tiny_shape(64, 256)
    monkeypatch.setattr(variants, "INT4_FIXUP_TILES", dict(rows=(32,), stages=(2,), splits=(1, 2)))
    monkeypatch.setattr(variants, "_shipped_tile", lambda template, problem: variants.gemm_tiles.tile(
        "join", 16, 32, 128, 2, 4, 2))
    rows = variants.study_int4_fixup_tiles(["tiny"], [16], lambda r: None)
    cases = [r for r in rows if r["variant"] != "cublas-bf16"]
    assert all("error" not in r and r["ok"] for r in cases), [(r["variant"], r.get("error")) for r in cases]
    assert sorted(r["variant"] for r in cases) == ["join 32 rows, split 1", "join 32 rows, split 2", "shipped"]
    assert [r["tile"].get("FIXUP", 0) for r in cases if r["variant"] != "shipped"] == [0, 1]


def test_the_capture_counters_study_checks_every_case(variants, monkeypatch, on_a_tiny_shape, run_each_once):
    # Only shipped tiles with the in-kernel fixup get cases: three each, all checked; the timer
    # (run once, as if capturing) takes the study's pre-zeroed counters in the third, until they
    # run out; the study's counters are the shipped ones again afterwards, error or not.
    on_a_tiny_shape(64, 256)
    shipped_counters = variants.common.tile_counters
    once = run_each_once(1.0)

    def capturing_once(fns, **options):
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
        try:
            return once(fns)
        finally:
            monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(variants, "graph_ms", capturing_once)

    def shipped(template, problem):
        if template.name == "int4_w4a16" and problem.bucket == 16:
            return variants.gemm_tiles.tile("join", 16, 32, 128, 2, 4, 2) | {"FIXUP": 1}
        return variants.gemm_tiles.tile("join", 16, 32, 128, 2, 4, 2) if template.name == "int4_w4a16" else None
    monkeypatch.setattr(variants, "_shipped_tile", shipped)
    # Two output tiles a launch (16 rows; 64 columns, 32 a tile): room for every weight copy but the last.
    copies = len(variants._weights("int4-gptq", 64, 256, DEV))
    monkeypatch.setattr(variants, "PREZEROED_COUNTERS", 2 * (copies - 1))
    rows = variants.study_capture_counters(["tiny"], [16, 40], lambda r: None)
    cases = [r for r in rows if r["variant"] != "cublas-bf16"]
    assert all("error" not in r and r["ok"] for r in cases), [(r["variant"], r.get("error")) for r in cases]
    for f in ("int4-gptq", "int4-awq"):
        got = [(r["variant"], r["tile"].get("FIXUP")) for r in cases if (r["format"], r["M"]) == (f, 16)]
        assert got == [("fixup, tile_counters as it is", 1), ("reduction kernel", 0),
                       ("fixup, counters zeroed before", 1)], got
    assert not any(r["M"] == 40 for r in cases)   # no fixup tile there: nothing to compare
    pre = [(r["counters_handed_out"], r["fallbacks"]) for r in cases if r["variant"] == "fixup, counters zeroed before"]
    assert pre == [(2 * (copies - 1), 1)] * 2, pre
    assert variants.common.tile_counters is shipped_counters

    def fail(*args, **kwargs):
        assert variants.common.tile_counters is not shipped_counters   # the study's, while it runs
        raise RuntimeError("a case failed")
    calls = []
    monkeypatch.setattr(variants, "_run_cases", lambda *a, **k: fail() if calls.append(a[3]) or len(calls) == 2 else None)
    with pytest.raises(RuntimeError, match="a case failed"):
        variants.study_capture_counters(["tiny"], [16], lambda r: None)
    assert variants.common.tile_counters is shipped_counters


def test_prezeroed_counters_hand_out_each_slice_once_while_capturing(variants, monkeypatch):
    # While capturing: disjoint zeroed slices of the buffer until it is used up, then the shipped
    # function (counted). Eager calls always go to the shipped one.
    calls = []
    pre = variants.PrezeroedCounters(lambda device, tiles: calls.append(tiles) or "shipped", 10, "cpu")
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert pre(cuda, 4) == "shipped" and calls == [4] and pre.off == 0
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    a, b = pre(cuda, 4), pre(cuda, 6)
    assert (a.numel(), b.numel()) == (4, 6) and b.data_ptr() == a.data_ptr() + 16
    assert not a.any() and not b.any() and pre.off == 10
    assert pre(cuda, 1) == "shipped" and pre.fallbacks == 1 and calls == [4, 1]


def test_the_int4_x_split_study_checks_every_case(variants, monkeypatch, on_a_tiny_shape):
    on_a_tiny_shape(64, 256)
    monkeypatch.setattr(variants, "_shipped_tile", lambda template, problem: variants.gemm_tiles.tile(
        "slices" if problem.bucket == 1 else "join", 16, 32, 128, 2, 4, 2))
    rows = variants.study_int4_x_split(["tiny"], [1, 16], lambda r: None)
    cases = [r for r in rows if r["variant"] != "cublas-bf16"]
    assert all("error" not in r and r["ok"] for r in cases), [(r["variant"], r.get("error")) for r in cases]
    assert [(r["format"], r["M"], r["variant"]) for r in cases] == [
        (f, 1, v) for f in ("int4-gptq", "int4-awq") for v in ("slice-order copy", "X_SPLIT")]
    assert [r["tile"].get("X_SPLIT", 0) for r in cases] == [0, 1, 0, 1]


def test_shipped_tile_takes_the_exact_key_else_one_of_another_source_or_triton(variants, monkeypatch, tmp_path):
    # The studies read the shipped cache's tiles through the autotune store and keys: the exact
    # key's tile where the cache has it, else one tuned for another kernel source or Triton (its
    # lineage); any other field must match.
    import dataclasses
    from vsr.autotune.device_id import current_device_identity
    from vsr.autotune.keys import make_key
    from vsr.autotune.store import Entry, open_store
    from vsr.kernels import registry
    from vsr.kernels.template import Problem
    monkeypatch.setattr(variants, "DEV", DEV)
    t = registry.TEMPLATES["dense"]
    p = Problem(N=64, K=256, bucket=16, act_dtype=torch.float16, params=(("wdtype", "float16"),))
    key = make_key(t, p, current_device_identity(torch.device(DEV)))
    tile = variants.gemm_tiles.tile("tma-swap", 16, 32, 64, 2, 4, 3)
    path = tmp_path / "cache.json"
    store = open_store(path)
    store.put(Entry(dataclasses.replace(key, source_hash="0" * 16), tile))
    store.put(Entry(dataclasses.replace(key, source_hash="0" * 16, N=128), dict(tile, BLOCK_N=64)))
    store.close()
    monkeypatch.setattr(variants, "SHIPPED_CACHE", path)   # a fresh path: read anew (cached by path)
    assert variants._shipped_tile(t, p) == tile
    assert variants._shipped_tile(t, dataclasses.replace(p, bucket=32)) is None
    # Another Triton's tile counts too, and the exact key's wins over both (the first by key order without it).
    exact = dict(tile, num_stages=4)
    path = tmp_path / "cache2.json"
    store = open_store(path)
    store.put(Entry(dataclasses.replace(key, source_hash="0" * 16), tile))
    store.put(Entry(dataclasses.replace(key, triton="0.0.1"), dict(tile, num_warps=8)))
    store.close()
    monkeypatch.setattr(variants, "SHIPPED_CACHE", path)
    assert variants._shipped_tile(t, p) == tile
    store = open_store(path)
    store.put(Entry(key, exact))
    store.close()
    monkeypatch.setattr(variants, "SHIPPED_CACHE", tmp_path / "cache3.json")
    path.rename(tmp_path / "cache3.json")
    assert variants._shipped_tile(t, p) == exact


def test_the_wide_study_checks_every_case(variants, monkeypatch, on_a_tiny_shape):
    on_a_tiny_shape(96, 128, copies=1)
    monkeypatch.setattr(variants, "_shipped_tile", lambda template, problem: template.default_tile(problem))
    # Two wide tiles and one weight copy: the interpreter takes ~1 s a launch at bucket 256.
    every = variants.gemm_tiles.wide_tiles
    monkeypatch.setattr(variants.gemm_tiles, "wide_tiles", lambda bk, bucket: every(bk, bucket)[:2])
    rows = variants.study_wide(["tiny"], [129, 3], lambda r: None)
    # M=3's bucket has no wide tiles: its rows are the shipped tile's alone.
    assert [(r["format"], r["variant"]) for r in rows if r["M"] == 3 and r["variant"] != "cublas-bf16"] == [
        ("bf16", "shipped"), ("fp8", "shipped")]
    cases = [r for r in rows if r["variant"] != "cublas-bf16" and r["M"] == 129]
    assert all("error" not in r and r["ok"] for r in cases), [(r["variant"], r.get("error")) for r in cases]
    n = 3
    assert [r["format"] for r in cases] == ["bf16"] * n + ["fp8"] * n
    assert [r["variant"] for r in cases][:3] == ["shipped", "wide 128x128+32 w8 s3", "wide 128x128+32 w8 s4"]
    assert all(r["tile"].get("BLOCK_N2") for r in cases[1:n] + cases[n + 1:])
    assert cases[n + 1]["tile"]["BLOCK_K"] == 128 and cases[n + 1]["tile"].get("PDL") == cases[n]["tile"].get("PDL")


def test_the_wide_64_study_runs_64_row_wide_tiles_on_one_warpgroup(variants, monkeypatch, on_a_tiny_shape):
    on_a_tiny_shape(96, 128, copies=1)
    monkeypatch.setattr(variants, "_shipped_tile", lambda template, problem: None)
    monkeypatch.setattr(variants, "WIDE_64", variants.WIDE_64[2:4])   # 64 + 16, 3 and 4 stages
    rows = variants.study_wide_64(["tiny"], [129], lambda r: None)
    cases = [r for r in rows if r["variant"] != "cublas-bf16"]
    assert all("error" not in r and r["ok"] for r in cases), [(r["variant"], r.get("error")) for r in cases]
    assert [r["variant"] for r in cases] == ["wide 64x64+16 w4 s3", "wide 64x64+16 w4 s4"] * 2
    assert all(r["study"] == "wide-64" and r["tile"]["BLOCK_M"] == 64 and r["tile"]["num_warps"] == 4
               and r["tile"]["BLOCK_N2"] == 16 for r in cases)


def test_the_wide_few_study_takes_the_m64_k_steps_and_leaves_out_what_does_not_fit(variants, monkeypatch,
                                                                                   on_a_tiny_shape):
    on_a_tiny_shape(96, 256, copies=1)
    monkeypatch.setattr(variants, "_shipped_tile", lambda template, problem: None)
    monkeypatch.setattr(variants, "WIDE_FEW", ((64, 16, 4), (128, 32, 4)))
    monkeypatch.setattr(variants.gemm_tiles, "SMEM_LIMIT", 200_000)   # 64 x 160 at 4 stages takes 229376 bytes
    rows = variants.study_wide_few(["tiny"], [16], lambda r: None)
    cases = [r for r in rows if r["variant"] != "cublas-bf16"]
    assert all("error" not in r and r["ok"] for r in cases), [(r["variant"], r.get("error")) for r in cases]
    assert [r["variant"] for r in cases] == ["wide 64x64+16 w4 s4"] * 2
    assert [(r["format"], r["tile"]["BLOCK_K"]) for r in cases] == [("bf16", 128), ("fp8", 256)]
    # Without a shipped tile, fp8's wide tiles take the bucket's prologue knobs (PDL at bucket 16).
    assert {k: cases[1]["tile"][k] for k in ("PRO_WARPS", "PDL")} == variants.fp8.prologue_defaults(16) == {
        "PRO_WARPS": 0, "PDL": 1}


def test_the_gluon_ws_harness_checks_every_case_into_poisoned_buffers(bench_script, monkeypatch, run_each_once):
    # benchmarks/gluon_ws.py's kernels need an sm_90 GPU; its harness runs here on stand-ins:
    # every case is checked into a NaN-filled output (the stream-K workspace poisoned for that call
    # only), then timed; a stand-in that leaves one element unwritten fails its row.
    pytest.importorskip("triton.experimental.gluon", reason="this Triton has no Gluon")
    g = bench_script("gluon_ws")
    variants = sys.modules["variants"]   # gluon_ws checks and times through variants.timed_case
    monkeypatch.setattr(g, "DEV", "cpu")
    monkeypatch.setattr(g, "SHAPES", {"tiny": (48, 64)})
    monkeypatch.setattr(g, "CONFIGS", [dict(BM=64, BN=64, BK=64, stages=2, warps=4)])
    monkeypatch.setattr(g, "SK_CONFIGS", [dict(BM=64, BN=32, BK=64, stages=2, warps=4)])
    monkeypatch.setattr(variants, "graph_ms", run_each_once(1.0))
    monkeypatch.setattr(g, "shipped_tile", lambda *a: {"path": "stand-in"})
    dense = g.registry.TEMPLATES["dense"]
    product = lambda x, w: (x.float() @ w.float().t()).to(x.dtype)   # noqa: E731
    checked_out, poisons = [], []

    def fake_ws(x, w, cfg, out=None):
        checked_out.append(out is not None and bool(out.isnan().all()))
        y = product(x, w)
        if out is not None:
            out.copy_(y)
            if cfg["BN"] == 64 and x.shape[0] == 3:   # the plain stand-in at M=3 leaves one element unwritten
                out[0, 0] = float("nan")
        return y

    def fake_sk(x, w, cfg, out=None, poison=False):
        poisons.append(poison)
        return fake_ws(x, w, cfg, out)

    monkeypatch.setattr(g, "ws_gemm", fake_ws)
    monkeypatch.setattr(g, "ws_sk_gemm", fake_sk)
    monkeypatch.setitem(g.registry.TEMPLATES, "dense", type("Stand", (), dict(
        name=dense.name, problem=staticmethod(dense.problem), reference=staticmethod(dense.reference),
        launch=staticmethod(lambda x, w, tile, out=None: out.copy_(product(x, w.weight)) if out is not None
                            else product(x, w.weight))))())
    rows = []
    monkeypatch.setattr(g, "write_atomic", lambda path, text: rows.extend(json.loads(text)["rows"]))
    assert g.main(["--shapes", "tiny", "--ms", "3,20", "--out", "/nonexistent/x.json"]) == 1
    rows = rows[-8:]   # the last write holds every row: M = 3 and 20, cuBLAS, shipped, ws, ws-sk each
    assert [r["variant"].split()[0] for r in rows] == ["cublas-bf16", "vsr", "ws", "ws-sk"] * 2
    assert [r.get("ok") for r in rows if r["variant"] != "cublas-bf16"] == [True, False, True, True, True, True]
    assert all(r["ms"] == 1.0 for r in rows if r.get("ok"))
    copies = len(g.weight_copies("bf16", 48, 64, "cpu"))   # each timed call cycles through them all
    once = [True] + [False] * copies   # checked into NaN (poisoned), then timed (not)
    assert checked_out == once * 4
    assert poisons == once * 2


def test_the_sk_256_study_walks_256_row_tiles_stream_k(variants, monkeypatch, on_a_tiny_shape):
    on_a_tiny_shape(96, 256, copies=1)
    monkeypatch.setattr(variants, "_shipped_tile", lambda template, problem: None)
    # 300 rows: two 256-row blocks (the second 44 rows live) x two 64-column blocks = 4 tiles on 3
    # programs: one tile left over, its K steps (4 for fp16, 2 for fp8) shared, its parts added by
    # the reduction kernel, then by the fixup; and the plain 256-row tile.
    monkeypatch.setattr(gemm, "multiprocessors", lambda device: 3)
    reductions = []
    kernel = gemm.streamk_reduce_kernel

    class Spy:
        def __getitem__(self, grid):
            reductions.append(grid)
            return kernel[grid]
    monkeypatch.setattr(gemm, "streamk_reduce_kernel", Spy())
    monkeypatch.setattr(variants, "SK_256", (("tma-sk", 64, 8, 3, 0), ("tma-sk", 64, 8, 3, 1), ("tma", 64, 8, 3, 0)))
    rows = variants.study_sk_256(["tiny"], [300], lambda r: None)
    cases = [r for r in rows if r["variant"] != "cublas-bf16"]
    assert all("error" not in r and r["ok"] for r in cases), [(r["variant"], r.get("error")) for r in cases]
    assert [r["variant"] for r in cases] == ["tma-sk 256x64 w8 s3", "tma-sk 256x64 w8 s3 fixup", "tma 256x64 w8 s3"] * 2
    assert [r["tile"]["BLOCK_K"] for r in cases] == [64] * 3 + [128] * 3
    assert all(r["study"] == "sk-256" and r["tile"]["BLOCK_M"] == 256 for r in cases)
    # The reduction ran for the plain stream-K tiles only (the fixup tiles add their parts themselves):
    # one leftover tile, rows in 16-row programs (its 256-row block or the 44 live rows).
    assert reductions and all(g[0] == 1 for g in reductions), reductions


def test_the_sk_reduce_study_checks_each_form_of_the_reduction(variants, monkeypatch, on_a_tiny_shape):
    on_a_tiny_shape(96, 256, copies=1)
    # 3 programs: a leftover tile whose parts the reduction adds (M=200: 256 x 128 tiles, one row
    # block, 1 tile; M=400: 128 x 256 tiles, 4 row blocks: 4 tiles, 1 left over).
    monkeypatch.setattr(gemm, "multiprocessors", lambda device: 3)
    monkeypatch.setattr(variants, "SK_REDUCE_FORMS", ((16, 4), (8, 4), (64, 8), None))
    kernel, rows_default = gemm.streamk_reduce_kernel, gemm.STREAMK_REDUCE_ROWS
    rows = variants.study_sk_reduce(["tiny"], [200, 400], lambda r: None)
    assert gemm.streamk_reduce_kernel is kernel and gemm.STREAMK_REDUCE_ROWS == rows_default, "put back"
    cases = [r for r in rows if r["variant"] != "cublas-bf16"]
    assert [r["variant"] for r in cases] == ["reduce 16 rows w4", "reduce 8 rows w4", "reduce 64 rows w8",
                                             "product alone"] * 2
    assert [r["tile"]["BLOCK_M"] for r in cases] == [256] * 4 + [128] * 4
    assert all("error" not in r for r in cases), [r.get("error") for r in cases]
    assert [r["ok"] for r in cases] == [True, True, True, None] * 2
    # Without the reduction the output is incomplete: each point's forms above did depend on it.
    t = variants.registry.TEMPLATES["dense"]
    w = variants._weights("bf16", 96, 256, DEV)[0]
    for r in cases[3::4]:
        x = torch.randn(r["M"], 256, device=DEV).half()
        with variants._reduce_form(None):
            assert not variants.checked_launch(t.launch, x, w, r["tile"], t.reference(x, w))[0], r["M"]


def test_the_int4_m1_study_checks_every_case(variants, on_a_tiny_shape, monkeypatch):
    # int4-m1 (runs 28-29) at M=1 and 2, every case checked. A shipped tile that copies x into slice order:
    # it, the same reading x in place (X_ROW), every other X_ROW tile of the bucket-1 space, and
    # the shipped tile with x handed over already in slice order (the copy taken out of the call;
    # the shipped slice_order is back afterwards). A shipped tile that reads x in place (the
    # bucket-1 default): it and the other X_ROW tiles only.
    on_a_tiny_shape(64, 1024, copies=1)
    t = variants.registry.TEMPLATES["int4_w4a16"]
    shipped_order = variants.int4.slice_order
    for copying in (True, False):
        monkeypatch.setattr(variants, "_shipped_tile",
                            lambda t, p: dict(t.default_tile(p), X_SPLIT=0 if copying else 1))
        rows = variants.study_int4_m1(["tiny"], [1], lambda r: None)
        cases = [r for r in rows if r["variant"] != "cublas-bf16"]
        assert all(r["ok"] for r in cases), [(r["variant"], r.get("error"), r.get("rel_err")) for r in cases]
        assert variants.int4.slice_order is shipped_order
        for fmt in ("int4-gptq", "int4-awq"):
            w = variants._weights(fmt, 64, 1024, variants.DEV)[0]
            others = [c for c in variants.int4_tiles.slices_tiles(t.problem(w, 1, torch.float16))
                      if c.get("X_SPLIT")][1:]   # the X_ROW tiles but the default's
            got = [(r["variant"], r["tile"]) for r in cases if r["format"] == fmt]
            head = ([("shipped", dict(t.default_tile(t.problem(w, 1, torch.float16)), X_SPLIT=0))]
                    if copying else [("shipped", got[0][1])])
            if copying:
                head.append(("shipped, X_ROW", dict(head[0][1], X_SPLIT=1)))
            tail = [("shipped, no x copy", head[0][1])] if copying else []
            assert got == head + [("slices, X_ROW", c) for c in others] + tail, fmt
    # At M=2 (bucket 2) a copying shipped tile of 16 rows holds both rows in place (X_ROW), and
    # the bucket's other X_ROW tiles follow.
    monkeypatch.setattr(variants, "_shipped_tile", lambda t, p: dict(t.default_tile(p), X_SPLIT=0))
    rows = variants.study_int4_m1(["tiny"], [2], lambda r: None)
    cases = [r for r in rows if r["variant"] != "cublas-bf16"]
    assert all(r["ok"] for r in cases), [(r["variant"], r.get("error"), r.get("rel_err")) for r in cases]
    for fmt in ("int4-gptq", "int4-awq"):
        p = t.problem(variants._weights(fmt, 64, 1024, variants.DEV)[0], 2, torch.float16)
        shipped = dict(t.default_tile(p), X_SPLIT=0)
        others = [c for c in variants.int4_tiles.slices_tiles(p) if c.get("X_SPLIT") and c != dict(shipped, X_SPLIT=1)]
        assert others and all(c["BLOCK_M"] >= 16 for c in others)
        assert [(r["variant"], r["tile"]) for r in cases if r["format"] == fmt] == (
            [("shipped", shipped), ("shipped, X_ROW", dict(shipped, X_SPLIT=1))]
            + [("slices, X_ROW", c) for c in others] + [("shipped, no x copy", shipped)]), fmt


def test_the_fp8_call_parts_study_checks_every_case(variants, on_a_tiny_shape):
    # Run 33's A-B-A study of fp8's call and its parts: every whole call and the product alone
    # give the reference output, and the prologue alone is timed with the tile's plan.
    on_a_tiny_shape(48, 304)
    rows = variants.study_fp8_call_parts(["tiny"], [20], lambda r: None)
    calls = [r for r in rows if r.get("part") == "fp8"]
    assert [r["variant"] for r in calls] == ["fp8.launch", "product alone (x prequantized)",
                                             "prologue, then product", "fp8.launch again"]
    assert all(r["ok"] for r in calls), [(r["variant"], r.get("error"), r.get("rel_err")) for r in calls]
    assert [r["variant"] for r in rows if r.get("part") == "prologue"] == ["prologue alone"]


def test_the_steady_picks_study_times_a_keys_best_recorded_candidates(variants, monkeypatch, on_a_tiny_shape):
    # Run 33: a key's best recorded candidates (of those that passed), timed again by the
    # steady-state timer in STEADY_PICKS_PASSES passes, each checked first, the shipped one marked.
    import common_bench
    from vsr.kernels import registry
    on_a_tiny_shape(48, 256)
    t = registry.TEMPLATES["fp8_w8a8"]
    space = t.search_space(t.problem(variants._weights("fp8", 48, 256, DEV)[0], 16, torch.float16))[:4]
    cands = [dict(tile=tile, ms=ms, ok=ok) for tile, ms, ok in zip(space, (0.3, 0.1, 0.2, 0.05),
                                                                   (True, True, True, False))]
    from vsr.autotune.store import Entry
    looked_up = []

    def shipped_entry(template, problem, device, cache):   # the shipped cache's entry: fp8's only
        looked_up.append((template.name, problem.bucket, cache))
        return Entry(key=None, tile=space[2], candidates=cands) if template.name == "fp8_w8a8" else None
    monkeypatch.setattr(variants, "shipped_entry", shipped_entry)
    passes, rests = [], []
    monkeypatch.setattr(variants.tuner, "STEADY_FROM_BUCKET", 16)   # 16 rows timed from rest, as 256+ are

    def steady(cases, rest_s=0.0):
        passes.append(sorted(cases))
        rests.append(rest_s)
        for fns in cases.values():
            for f in fns:
                f()
        return {i: 1.0 + i for i in cases}, {}
    monkeypatch.setattr(common_bench, "steady_graph_ms", steady)
    rows = [r for r in variants.study_steady_picks(["tiny"], [16], lambda r: None) if "recorded_ms" in r]
    assert passes == [[0, 1, 2]] * variants.STEADY_PICKS_PASSES
    assert rests == [variants.tuner.STEADY_REST_S] * variants.STEADY_PICKS_PASSES
    # fp8 only: the bf16 key is not in this cache. Best recorded first; the failed candidate left out.
    assert [r["recorded_ms"] for r in rows] == [0.1, 0.2, 0.3] and [r["shipped"] for r in rows] == [False, True, False]
    assert all(r["ok"] for r in rows) and [r["ms"] for r in rows] == [1.0, 2.0, 3.0]
    assert looked_up == [("dense", 16, variants.SHIPPED_CACHE), ("fp8_w8a8", 16, variants.SHIPPED_CACHE)]


def test_the_steady_ab_study_times_both_tiles_of_each_key_that_differs_in_turn(variants, monkeypatch,
                                                                              on_a_tiny_shape, tmp_path):
    # Run 34: where the shipped cache and --against give a key different tiles, both are checked,
    # then timed STEADY_AB_PASSES times, the order flipped each time; keys whose tiles agree (or
    # that a cache lacks) are not timed.
    import common_bench
    from vsr.kernels import registry
    on_a_tiny_shape(48, 256)
    t = registry.TEMPLATES["fp8_w8a8"]
    space = t.search_space(t.problem(variants._weights("fp8", 48, 256, DEV)[0], 16, torch.float16))[:2]
    against = tmp_path / "old.json"
    monkeypatch.setattr(variants, "STEADY_AB_AGAINST", against)

    def tile_of(template, problem, device, cache):
        if template.name == "fp8_w8a8":
            return dict(space[0] if cache == against else space[1])
        return None if template.name == "dense" else dict(space[0])   # bf16 in neither; int4 the same in both
    monkeypatch.setattr(variants, "shipped_tile", tile_of)
    orders = []

    def steady(cases, rest_s=0.0):
        assert rest_s == 0.0   # 16 rows: below the tuner's steady buckets, no rest
        orders.append(list(cases))
        for fns in cases.values():
            for f in fns:
                f()
        return {k: {"shipped": 1.0, "against": 2.0}[k] + len(orders) for k in cases}, {}
    monkeypatch.setattr(common_bench, "steady_graph_ms", steady)
    rows = [r for r in variants.study_steady_ab(["tiny"], [16], lambda r: None) if r["variant"] != "cublas-bf16"]
    assert orders == [["shipped", "against"], ["against", "shipped"]] * (variants.STEADY_AB_PASSES // 2)
    assert [(r["format"], r["variant"]) for r in rows] == [("fp8", "shipped"), ("fp8", "against")]
    assert rows[0]["tile"] == space[1] and rows[1]["tile"] == space[0] and all(r["ok"] for r in rows)
    assert rows[0]["ms_passes"] == [1.0 + i for i in range(1, variants.STEADY_AB_PASSES + 1)]
    assert rows[1]["ms"] == 2.0 + (1 + variants.STEADY_AB_PASSES) / 2


def test_the_steady_order_study_times_both_tiles_in_its_sequence_four_ways(variants, monkeypatch,
                                                                           on_a_tiny_shape, tmp_path):
    # NOTES run 34 item 5: A (shipped) and B (--against) in STEADY_ORDER, by a fresh capture per
    # timing (outputs inside the graph or allocated once) and by graphs captured once up front.
    import common_bench
    from vsr.kernels import registry
    on_a_tiny_shape(48, 256, copies=2)
    t = registry.TEMPLATES["fp8_w8a8"]
    space = t.search_space(t.problem(variants._weights("fp8", 48, 256, DEV)[0], 16, torch.float16))[:2]
    against = tmp_path / "old.json"
    monkeypatch.setattr(variants, "STEADY_AB_AGAINST", against)
    monkeypatch.setattr(variants, "STEADY_ORDER", "ABBA")
    monkeypatch.setattr(variants, "shipped_tile", lambda template, problem, device, cache: (
        dict(space[0] if cache == against else space[1]) if template.name == "fp8_w8a8" else None))
    fresh_outs = []

    def steady(cases):   # times each case once, by how many calls it makes
        for fns in cases.values():
            for f in fns:
                fresh_outs.append(f())
        return {k: 1.0 for k in cases}, {}
    monkeypatch.setattr(common_bench, "steady_graph_ms", steady)
    captures, rewound = [], []

    def capture(fn, target_ms):   # the cycle captured must write the outputs fresh-out timed into
        outs = fresh_outs[-copies:]
        for o in outs:
            o.fill_(float("nan"))
        fn()
        assert all(torch.isfinite(o).all() for o in outs)
        captures.append(fn)
        if fail_capture and len(captures) == 2:
            raise RuntimeError("capture failed")
        return fn, 2, len(captures)
    replays = []

    def replay(graph):   # the graph (here the cycle it would hold) is not run: only which one is replayed
        replays.append(graph)
        return 4.0
    monkeypatch.setattr(variants.tuner, "capture_graph", capture)
    monkeypatch.setattr(variants.tuner, "replay_ms", replay)
    monkeypatch.setattr(variants.common, "rewind_capture_counters", rewound.append)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)   # tuner.release_captures' wait, here on the CPU
    monkeypatch.setattr(variants.tuner, "STEADY_WARM_MS", 8.0)
    sleeps = []
    monkeypatch.setattr(variants.time, "sleep", sleeps.append)
    copies = len(variants._weights("fp8", 48, 256, DEV))
    fail_capture = False
    rows = [r for r in variants.study_steady_order(["tiny"], [16], lambda r: None) if "mode" in r]
    n = len(variants.STEADY_ORDER)
    assert [r["mode"] for r in rows] == ["fresh"] * n + ["fresh-out"] * n + ["captured"] * n + ["captured-rest"] * n
    assert all("".join(r["which"] for r in rows[i:i + n]) == "ABBA" for i in range(0, 4 * n, n))
    # Each timing's `after` is the tile timed just before it, across the modes too.
    assert [r["after"] for r in rows] == ["what ran before this key", "A", "B", "B"] + ["A", "A", "B", "B"] * 3
    assert all(r["tile"] == (space[1] if r["which"] == "A" else space[0]) for r in rows)
    # Each tile captured once; the captured timings, with and without a rest before each, replay
    # only those two graphs (warm-up: two replays of 4 ms reach 8 ms; then 9 timed), per call
    # 4 ms / (2 captured cycles x copies); only the rest mode sleeps, once a timing.
    # (with the rest the probe replay comes before it and no longer counts: 1 + 2 + 9 replays).
    assert len(captures) == 2 and set(replays) == set(captures) and len(replays) == n * (2 + 9) + n * (1 + 2 + 9)
    assert all(r["ms"] == 4.0 / (2 * copies) for r in rows[2 * n:]) and rewound == [1]
    assert sleeps == [variants.STEADY_ORDER_REST_S] * n
    # fresh-out writes into outputs allocated once: the same tensors every time.
    outs = fresh_outs[n * copies:]
    assert len({o.data_ptr() for o in outs}) == copies
    # A key whose second capture fails gives one error row, the first graph's counters given back.
    captures.clear(), rewound.clear(), replays.clear(), fresh_outs.clear(), sleeps.clear()
    fail_capture = True
    rows = [r for r in variants.study_steady_order(["tiny"], [16], lambda r: None) if r["variant"] != "cublas-bf16"]
    assert [r["mode"] for r in rows[:-1]] == ["fresh"] * n + ["fresh-out"] * n and not replays
    assert rows[-1]["variant"] == "error" and "capture failed" in rows[-1]["error"] and rewound == [1]


def test_the_steady_rest_study_times_the_captured_pair_after_each_rest(variants, monkeypatch, on_a_tiny_shape,
                                                                        tmp_path):
    # Run 35: the captured graphs only, in STEADY_ORDER with no rest, then after each rest length.
    from vsr.kernels import registry
    on_a_tiny_shape(48, 256)
    t = registry.TEMPLATES["fp8_w8a8"]
    space = t.search_space(t.problem(variants._weights("fp8", 48, 256, DEV)[0], 16, torch.float16))[:2]
    against = tmp_path / "old.json"
    monkeypatch.setattr(variants, "STEADY_AB_AGAINST", against)
    monkeypatch.setattr(variants, "STEADY_ORDER", "AB")
    monkeypatch.setattr(variants, "STEADY_REST_LENGTHS_S", (0.5, 2.0))
    monkeypatch.setattr(variants, "shipped_tile", lambda template, problem, device, cache: (
        dict(space[0] if cache == against else space[1]) if template.name == "fp8_w8a8" else None))
    monkeypatch.setattr(variants.tuner, "capture_graph", lambda fn, target_ms: (fn, 2, "mark"))
    monkeypatch.setattr(variants.tuner, "replay_ms", lambda graph: 4.0)
    monkeypatch.setattr(variants.common, "rewind_capture_counters", lambda mark: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(variants.tuner, "STEADY_WARM_MS", 8.0)
    sleeps = []
    monkeypatch.setattr(variants.time, "sleep", sleeps.append)
    rows = [r for r in variants.study_steady_rest(["tiny"], [16], lambda r: None) if "mode" in r]
    assert [(r["mode"], r["which"]) for r in rows] == [(m, k) for m in ("captured", "rest 0.5 s", "rest 2 s")
                                                       for k in "AB"]
    assert sleeps == [0.5, 0.5, 2.0, 2.0] and all(r["study"] == "steady-rest" for r in rows)


def test_the_steady_ab_study_asks_for_the_cache_it_compares_with(variants, monkeypatch):
    monkeypatch.setattr(variants, "STEADY_AB_AGAINST", None)
    with pytest.raises(SystemExit, match="--against"):
        variants.study_steady_ab(["qkv"], [256], lambda r: None)

@pytest.mark.gpu
def test_the_fp8_overlap_study_gives_the_calls_bytes(variants, monkeypatch):
    # The overlapped forms (a side stream: CUDA only) are checked against the reference and give
    # fp8.launch's bytes where the chunks keep the call's tile.
    if not torch.cuda.is_available():
        pytest.skip("CUDA streams")
    monkeypatch.setattr(variants, "SHAPES", {"tiny": (256, 512)})
    monkeypatch.setattr(variants, "graph_ms", lambda fns, **options: (fns[0](), 1.0)[1])
    rows = variants.study_fp8_overlap(["tiny"], [512], lambda r: None)
    calls = [r for r in rows if r.get("part") == "fp8"]
    assert calls and all(r["ok"] for r in calls), [(r["variant"], r.get("error")) for r in calls]
    assert all(r["same_bytes"] for r in calls if "chunk's tile" not in r["variant"])


def test_the_interleave_and_power_trace_studies_check_and_time_every_case(variants, monkeypatch, on_a_tiny_shape):
    # Run 33's timing-order studies on a tiny shape, their timers replaced by running each call
    # once: vsr's bf16 and fp8 cases checked first (fp16 x on the CPU), every case timed in each form.
    import common_bench
    on_a_tiny_shape(48, 256)
    ran = []

    def interleaved(cases):
        ran.append(("interleaved", sorted(cases)))
        for fns in cases.values():
            for f in fns:
                f()
        return {k: 1.0 for k in cases}, {}

    def trace(fns):
        for f in fns:
            f()
        # 0-10 ms: 2 and 1 (median 1.5); the last 100 ms (from 300 - 100 ms): 3, 4 and 6 (median 4)
        return [(0.0, 2.0), (5.0, 1.0), (50.0, 9.0), (200.0, 3.0), (250.0, 4.0), (300.0, 6.0)]
    monkeypatch.setattr(common_bench, "interleaved_graph_ms", interleaved)
    monkeypatch.setattr(common_bench, "replay_trace", trace)
    names = ["cublas-bf16", "scaled_mm", "vsr-bf16", "vsr-fp8"]
    rows = variants.study_interleave(["tiny"], [16], lambda r: None)
    checks = [r for r in rows if r["variant"] == "check"]
    assert [r["format"] for r in checks] == ["bf16", "fp8"] and all(r["ok"] for r in checks), checks
    forms = [r for r in rows if "ms_by_case" in r]
    assert [r["variant"] for r in forms] == ["sequential", "interleaved", "sequential, reversed",
                                                    "interleaved, again"]
    assert all(sorted(r["ms_by_case"]) == names for r in forms) and ran == [("interleaved", names)] * 2
    rows = variants.study_power_trace(["tiny"], [16], lambda r: None)
    traces = [r for r in rows if "last_100ms" in r]
    assert [r["variant"] for r in traces[:4]] == [r["variant"] for r in traces[4:]][::-1] and len(traces) == 8
    # each row names the case timed just before it; the first follows the point's cuBLAS baseline
    assert traces[0]["after"] == "cublas-bf16 baseline"
    assert [r["after"] for r in traces[1:]] == [r["variant"] for r in traces[:-1]]
    assert all(r["first_10ms"] == 1.5 and r["last_100ms"] == 4.0 for r in traces)


def test_the_cublas_baseline_is_timed_in_its_own_steady_state(variants, monkeypatch):
    # Every study's ratio denominator is timed as bench_gemm times cuBLAS since run 33, so that a
    # steady-state vsr figure is not divided by an unwarmed one.
    got = []
    monkeypatch.setattr(variants, "graph_ms", lambda fns, **options: got.append(options) or 2.0)
    rows = []
    assert variants.cublas_baseline(rows, lambda r: None, torch.ones(2, 4), [], study="s", M=2) == 2.0
    assert got == [{"warm_ms": variants.tuner.STEADY_WARM_MS, "rest_s": 0.0}]
    assert rows == [dict(study="s", M=2, variant="cublas-bf16", ms=2.0)]
    # From the tuner's steady buckets, from rest, as bench_gemm times it (run 35).
    variants.cublas_baseline(rows, lambda r: None, torch.ones(variants.tuner.STEADY_FROM_BUCKET, 4), [], study="s")
    assert got[-1] == {"warm_ms": variants.tuner.STEADY_WARM_MS, "rest_s": variants.tuner.STEADY_REST_S}
