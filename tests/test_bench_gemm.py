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


@pytest.mark.parametrize("peers", [("cublas-bf16",), ("cublas-bf16", "scaled_mm", "scaled_mm+quant"),
                                   ("cublas-bf16", "scaled_mm+quant")])
def test_only_the_named_peers_are_timed(bench_gemm, monkeypatch, run_each_once, peers):
    # CPU stand-ins for the GPU: the device, and timing replaced by running the calls once.
    monkeypatch.setattr(bench_gemm, "DEV", "cpu")
    monkeypatch.setattr(bench_gemm, "timings", run_each_once([(True, 1.0)]))
    ceil = {"copy_TBps": 4.0, "bf16_TFLOPs": 700.0, "fp8_TFLOPs": 1400.0}
    rows = bench_gemm.peer_rows("qkv", 64, 256, [1, 3], ceil, lambda r: None, peers)
    assert sorted({r["provider"] for r in rows}) == sorted(peers)
    assert len(rows) == 2 * len(peers) and all(r["checked"] for r in rows)


def test_the_results_file_is_written(bench_gemm, monkeypatch, tmp_path):
    # Run 14's first bench_gemm stopped on the H200 when its writer met an unimported name.
    monkeypatch.setattr(bench_gemm.torch.cuda, "get_device_name", lambda: "NVIDIA H200")
    out = tmp_path / "gemm.json"
    a = argparse.Namespace(out=str(out), sweep=0, cache=None, cache_formats="bf16", peers=("cublas-bf16",))
    rows = [{"format": "bf16", "shape": "qkv", "M": 1, "provider": "vsr", "graph": True, "ms": 0.02}]
    bench_gemm.write(a, "abc1234", {"copy_TBps": 4.0}, rows, 0.0, partial=True)
    doc = __import__("json").loads(out.read_text())
    assert doc["partial"] is True and doc["rows"] == rows and doc["commit"] == "abc1234"
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
