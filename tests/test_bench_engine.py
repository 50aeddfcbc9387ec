"""benchmarks/bench_engine.py's traffic study: its workloads (the timing itself needs a GPU)."""


def test_traffic_workloads_cover_every_request_once_in_order(bench_script):
    b = bench_script("bench_engine")
    texts = b.traffic(1024)
    loads = b.workloads(1024)
    assert set(loads) == {"file", "calls"}
    for calls in loads.values():
        assert [t for c in calls for t in c] == texts
    assert [len(c) for c in loads["file"]] == [64] * 16
    sizes = [len(c) for c in loads["calls"]]
    assert all(1 <= k <= 32 for k in sizes) and len(set(sizes)) == 32   # every call size from 1 to 32


def test_the_eager_engines_are_eager(bench_script, monkeypatch):
    # CUDA graphs are load_engine's GPU default: an engine of an eager row must ask for eager.
    b = bench_script("bench_engine")
    monkeypatch.setattr(b, "load_engine", lambda pkg, **kw: kw)
    engines = b.batch_engines("pkg", "float32")
    assert {name: kw["cuda_graphs"] for name, kw in engines.items()} == {
        "vsr-eager-own": False, "vsr-eager": False, "vsr-graphs": True}
    assert engines["vsr-eager-own"]["shape_ladder"] is False
