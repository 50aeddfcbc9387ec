"""benchmarks/bench_gemm.py's choice of peers, on the CPU: the providers timed are exactly those
named, each checked against its reference (the figures themselves come from the H200)."""
import argparse

import pytest


@pytest.fixture(scope="module")
def bench_gemm(bench_script):
    return bench_script("bench_gemm")


def test_peers_of_the_option(bench_gemm):
    ap = argparse.ArgumentParser()
    assert bench_gemm.peers_of(ap, None) == bench_gemm.PEERS
    assert bench_gemm.peers_of(ap, "none") == ()
    assert bench_gemm.peers_of(ap, "cublas-bf16,tinygemm") == ("cublas-bf16", "tinygemm")
    for bad in ("cublas", "tinygemm", "cublas-bf16,none"):
        with pytest.raises(SystemExit):   # argparse's error: unknown, no denominator, "none" in a list
            bench_gemm.peers_of(ap, bad)


def _cpu_stand_ins(bench_gemm, monkeypatch, graph_times):
    """The benchmark on the CPU: a 64 x 256 "qkv", every call run once in place of its eager
    timing (the figures 10, 11, 12, ... in the order the cases are timed), and `graph_times` in
    place of the steady-state graph timer bench_gemm calls (common_bench.steady_graph_ms)."""
    monkeypatch.setattr(bench_gemm, "DEV", "cpu")
    monkeypatch.setattr(bench_gemm, "SHAPES", {"qkv": (64, 256)})
    eager = iter(range(10, 1000))
    monkeypatch.setattr(bench_gemm, "eager_ms", lambda fn: (fn(), float(next(eager)))[1])
    monkeypatch.setattr(bench_gemm, "steady_graph_ms", graph_times)


def _run_all(cases, after=None, rest_s=0.0):
    """A graph-timer stand-in: runs every case's calls once and gives case i the figure 1 + i."""
    for i, fns in cases.items():
        for f in fns:
            f()
        if after:
            after(i)
    return {i: 1.0 + i for i in cases}, {}


CEIL = {"copy_TBps": 4.0, "bf16_TFLOPs": 700.0, "fp8_TFLOPs": 1400.0}


@pytest.mark.parametrize("peers", [("cublas-bf16",), ("cublas-bf16", "scaled_mm", "scaled_mm+quant"),
                                   ("cublas-bf16", "scaled_mm+quant")])
def test_only_the_named_peers_are_timed(bench_gemm, monkeypatch, peers):
    _cpu_stand_ins(bench_gemm, monkeypatch, _run_all)
    rows = bench_gemm.shape_rows("qkv", [1, 3], CEIL, lambda r: None, peers, formats=())
    assert sorted({r["provider"] for r in rows}) == sorted(peers)
    assert len(rows) == 2 * 2 * len(peers) and all(r["checked"] for r in rows)   # eager and graph, 2 Ms


def test_every_case_of_a_point_keeps_its_own_eager_and_graph_figures(bench_gemm, monkeypatch):
    # The peers and vsr at one M go to the graph timer in one call (each timed there in its own
    # steady state); each row keeps its own case's figures, eager and graph.
    calls = []

    def graph_times(cases, after=None, rest_s=0.0):
        calls.append(len(cases))
        return _run_all(cases, after)
    _cpu_stand_ins(bench_gemm, monkeypatch, graph_times)
    states = []   # the n-th reading gives temperature n
    monkeypatch.setattr(bench_gemm, "gpu_state", lambda: states.append(1) or {"temp_c": len(states)})
    made, every = [], bench_gemm.weight_copies
    monkeypatch.setattr(bench_gemm, "weight_copies", lambda fmt, *a: made.append(fmt) or every(fmt, *a))
    rows = bench_gemm.shape_rows("qkv", [2], CEIL, lambda r: None, ("cublas-bf16", "scaled_mm"), formats=("fp8",))
    assert calls == [3]
    assert sorted(made) == ["bf16", "fp8"], "fp8's weights are made once, for _scaled_mm and vsr alike"
    # Each graph row carries the GPU's state as its own timing ended; eager rows carry none.
    assert {r["provider"]: r["gpu"]["temp_c"] for r in rows if r["graph"]} == {"cublas-bf16": 1, "scaled_mm": 2,
                                                                               "vsr": 3}
    assert not any("gpu" in r for r in rows if not r["graph"])
    graph = {r["provider"]: r["ms"] for r in rows if r["graph"]}
    assert graph == {"cublas-bf16": 1.0, "scaled_mm": 2.0, "vsr": 3.0}
    assert {r["provider"]: r["ms"] for r in rows if not r["graph"]} == {"cublas-bf16": 10.0, "scaled_mm": 11.0,
                                                                        "vsr": 12.0}
    vsr = [r for r in rows if r["provider"] == "vsr"]
    # (Checked against the reference: under the interpreter the bf16 rows come within 2%, not
    # within bf16's tolerance; a wrong product is off by its own size.)
    assert len(vsr) == 2 and all(r["max_rel_err"] < 0.05 and r["tile_source"] == "default"
                                 and r["template"] == "fp8_w8a8" for r in vsr)


def test_a_case_the_graph_timer_refuses_keeps_its_eager_row_and_is_reported(bench_gemm, monkeypatch):
    logged = []

    def graph_times(cases, after=None, rest_s=0.0):
        times, _ = _run_all(cases)
        return {i: v for i, v in times.items() if i != 0}, {0: "RuntimeError: capture failed"}
    _cpu_stand_ins(bench_gemm, monkeypatch, graph_times)
    rows = bench_gemm.shape_rows("qkv", [1], CEIL, logged.append, ("cublas-bf16", "scaled_mm"), formats=())
    assert [(r["provider"], r["graph"]) for r in rows] == [("cublas-bf16", False), ("scaled_mm", False),
                                                           ("scaled_mm", True)]
    assert any("capture failed" in str(r.get("error")) for r in logged)


def test_the_results_file_is_written(bench_gemm, monkeypatch, tmp_path):
    # The writer runs only at the end of a long device run: a name it misses loses the whole run.
    monkeypatch.setattr(bench_gemm.torch.cuda, "get_device_name", lambda: "NVIDIA H200")
    out = tmp_path / "gemm.json"
    a = argparse.Namespace(out=str(out), sweep=0, cache=None, cache_formats="bf16", peers=("cublas-bf16",))
    rows = [{"format": "bf16", "shape": "qkv", "M": 1, "provider": "vsr", "graph": True, "ms": 0.02}]
    errors = [{"provider": "tinygemm", "M": 1, "error": "graph: RuntimeError: capture failed"}]
    bench_gemm.write(a, "abc1234", {"copy_TBps": 4.0}, rows, 0.0, partial=True, errors=errors)
    doc = __import__("json").loads(out.read_text())
    assert doc["partial"] is True and doc["rows"] == rows and doc["commit"] == "abc1234"
    assert doc["errors"] == errors, "a case left out is said in the file, not only in the log"
    assert doc["peers"] == ["cublas-bf16"] and [p.name for p in tmp_path.iterdir()] == ["gemm.json"], \
        "no temporary file left beside it"


def test_the_ratio_table_compares_figures_timed_alike_and_names_each_formats_peers(bench_gemm):
    # Graph figures where both sides have one (here vsr's eager figure would give 5x), each
    # format's own peers in its note (int4 GPTQ: tinygemm and gemlite; fp8: scaled_mm+quant), and
    # the share of copy bandwidth at M=1 (its floor over its time).
    def row(fmt, prov, ms, graph=True, floor=0.01):
        return dict(format=fmt, provider=prov, shape="qkv", M=1, graph=graph, ms=ms, floor_ms=floor, checked=True)
    rows = [row("bf16", "cublas-bf16", 0.04), row("bf16", "cublas-bf16", 0.05, graph=False),
            row("int4-gptq", "vsr", 0.02), row("int4-gptq", "vsr", 0.01, graph=False),
            row("int4-gptq", "tinygemm", 0.03), row("int4-gptq", "gemlite", 0.01),
            row("fp8", "vsr", 0.025), row("fp8", "scaled_mm+quant", 0.05)]
    table = {line.split(" | ")[0][2:]: line for line in bench_gemm.ratio_table(rows).splitlines()[2:]}
    assert table["int4-gptq"] == "| int4-gptq | 1 | 2.00x | 2.00x | qkv 1.50x tinygemm; qkv 0.50x gemlite; qkv 50% BW |"
    assert table["fp8"] == "| fp8 | 1 | 1.60x | 1.60x | qkv 2.00x sm+q; qkv 40% BW |"


def test_graph_figures_are_timed_from_rest_where_the_tuner_times_its_candidates_from_rest(bench_gemm, monkeypatch):
    # The power limiter's state carries over for seconds, so from the tuner's steady bucket
    # on every case starts from STEADY_REST_S idle seconds, as the tuner's candidates do; below it, none.
    rests = {}

    def graph_times(cases, after=None, rest_s=0.0):
        rests[len(rests)] = rest_s
        return _run_all(cases, after)
    _cpu_stand_ins(bench_gemm, monkeypatch, graph_times)
    from vsr.autotune import tuner
    low, high = tuner.STEADY_FROM_BUCKET // 2 + 1, tuner.STEADY_FROM_BUCKET   # buckets 256 and 256
    bench_gemm.shape_rows("qkv", [tuner.STEADY_FROM_BUCKET // 2, low, high], CEIL, lambda r: None, ("cublas-bf16",),
                          formats=())
    assert rests == {0: 0.0, 1: tuner.STEADY_REST_S, 2: tuner.STEADY_REST_S} and tuner.STEADY_REST_S > 0
