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
