"""benchmarks/targets.py on a made-up bench_gemm result: which targets hold, the points that
miss, the time each needs and its share of the floor, graph figures before eager ones."""
import pytest


@pytest.fixture(scope="module")
def targets(bench_script):
    return bench_script("targets")


def row(fmt, prov, M, ms, graph=True, shape="qkv", floor=None, checked=True):
    return dict(format=fmt, provider=prov, shape=shape, M=M, ms=ms, graph=graph,
                floor_ms=floor if floor is not None else ms / 10, checked=checked)


def result(rows):
    return {"rows": rows, "commit": "test"}


def by_name(evaluated):
    return {t["target"]: t for t in evaluated}


def test_a_miss_names_its_point_the_time_it_needs_and_the_floor(targets):
    rows = [row("bf16", "cublas-bf16", 1, 30.0), row("bf16", "cublas-bf16", 1, 1.0, graph=False),
            row("int4-gptq", "vsr", 1, 12.0, floor=6.0), row("int4-gptq", "vsr", 1, 5.0, graph=False),
            row("int4-awq", "vsr", 1, 9.0, floor=6.0)]
    t = by_name(targets.evaluate(result(rows)))["int4 >= 3.0x at M=1"]
    # graph figures count: GPTQ is 30 / 12 = 2.5x (its eager 5.0 and cuBLAS's eager 1.0 are not used)
    assert t["met"] is False and t["points"] == 2
    (miss,) = t["misses"]
    assert (miss["format"], miss["M"], miss["ratio"]) == ("int4-gptq", 1, 2.5)
    assert miss["need_us"] == pytest.approx(10_000.0) and miss["of_floor"] == pytest.approx(0.6)
    assert "int4-gptq      qkv      M=1     2.50x: 12000.0 us, 10000.0 needed" in targets.report([t])


def test_targets_held_missed_and_not_measured(targets):
    rows = [row("bf16", "cublas-bf16", M, 10.0) for M in (1, 1024)]
    rows += [row("fp8", "vsr", 1, 5.0), row("fp8", "vsr", 1024, 5.8),            # 2.0x; 1.72x < 1.8
             row("bf16", "vsr", 1, 9.0, floor=8.0), row("bf16", "vsr", 1024, 12.0),  # 1.11x; 0.83x
             row("int4-gptq", "vsr", 1024, 1.0), row("int4-gptq", "tinygemm", 1024, 2.0),
             row("int4-gptq", "gemlite", 1024, 0.5)]
    t = by_name(targets.evaluate(result(rows)))
    assert t["fp8 (with its quantization) >= 1.6x at every M"]["met"] is True
    assert [m["M"] for m in t["fp8 (with its quantization) >= 1.8x at M >= 1024"]["misses"]] == [1024]
    assert [m["M"] for m in t["bf16: no point below 0.9x"]["misses"]] == [1024]
    gm = t["bf16 geomean >= 1.0x"]
    assert gm["met"] is False and gm["value"] == pytest.approx((10 / 9 * 10 / 12) ** 0.5, abs=1e-3)
    assert t["int4 >= 3.0x at M=1"]["met"] is None   # no int4 row at M=1
    peers = t["int4 faster than tinygemm and gemlite at every M >= 16"]
    assert peers["points"] == 2 and [m["peer"] for m in peers["misses"]] == ["gemlite"]
    bw = t["M=1: >= 80% of copy bandwidth, every format, graph-replayed"]   # bf16 8/9, fp8 0.5 / 5
    assert bw["points"] == 2 and [(m["format"], m["share"]) for m in bw["misses"]] == [("fp8", 0.1)]


def test_an_unchecked_point_misses_whatever_its_speed(targets):
    rows = [row("bf16", "cublas-bf16", 4096, 10.0), row("int4-awq", "vsr", 4096, 1.0, checked=False)]
    t = by_name(targets.evaluate(result(rows)))["int4 >= 0.9x at M=4096"]
    assert t["met"] is False and "UNCHECKED" in targets.report([t])


def test_figures_are_compared_timed_alike(targets):
    # cuBLAS has only an eager figure where vsr has both: the ratio is eager to eager (30 / 20),
    # never graph to eager (30 / 12 would meet 2.0x); the bandwidth target takes graph figures
    # only, and a point with none is not measured.
    rows = [row("bf16", "cublas-bf16", 16, 30.0, graph=False),
            row("int4-gptq", "vsr", 16, 12.0), row("int4-gptq", "vsr", 16, 20.0, graph=False),
            row("fp8", "vsr", 1, 9.0, graph=False, floor=1.0)]
    t = by_name(targets.evaluate(result(rows)))
    (miss,) = t["int4 >= 2.0x at M=16"]["misses"]
    assert miss["ratio"] == 1.5 and miss["us"] == 20_000.0
    assert t["M=1: >= 80% of copy bandwidth, every format, graph-replayed"]["met"] is None


def test_an_unchecked_point_misses_the_peer_and_geomean_targets_too(targets):
    rows = [row("bf16", "cublas-bf16", 64, 10.0), row("bf16", "vsr", 64, 5.0, checked=False),
            row("int4-gptq", "vsr", 64, 1.0, checked=False), row("int4-gptq", "tinygemm", 64, 9.0)]
    t = by_name(targets.evaluate(result(rows)))
    assert t["bf16 geomean >= 1.0x"]["met"] is False and t["bf16 geomean >= 1.0x"]["value"] == 2.0
    peers = t["int4 faster than tinygemm and gemlite at every M >= 16"]
    assert peers["met"] is False and "9.00x tinygemm UNCHECKED" in targets.report([peers])


def test_results_of_one_commit_on_different_shapes_are_read_as_one(targets):
    a = result([row("bf16", "cublas-bf16", 1, 30.0), row("int4-gptq", "vsr", 1, 12.0)])
    b = result([row("bf16", "cublas-bf16", 1, 20.0, shape="down"), row("int4-gptq", "vsr", 1, 5.0, shape="down")])
    t = by_name(targets.evaluate(targets.join_results([a, b])))["int4 >= 3.0x at M=1"]
    # each shape against its own run's cuBLAS: qkv 30 / 12 = 2.5x misses, down 20 / 5 = 4x holds
    assert t["points"] == 2 and [(m["shape"], m["ratio"]) for m in t["misses"]] == [("qkv", 2.5)]


def test_joined_results_keep_every_parts_errors_and_time(targets):
    a = dict(result([row("bf16", "cublas-bf16", 1, 30.0)]), errors=[], peers=["cublas-bf16"], wall_s=100.0,
             partial=False, ceilings={"copy_TBps": 4.2})
    b = dict(result([row("int4-gptq", "vsr", 1, 12.0)]), errors=[{"format": "int4-gptq", "error": "x"}],
             peers=["cublas-bf16", "tinygemm"], wall_s=50.0, partial=True, ceilings={"copy_TBps": 4.1})
    j = targets.join_results([a, b])
    assert j["errors"] == [{"format": "int4-gptq", "error": "x"}] and j["peers"] == ["cublas-bf16", "tinygemm"]
    assert j["wall_s"] == 150.0 and j["partial"] is True and j["ceilings"] == {"copy_TBps": 4.2}
    assert len(j["rows"]) == 2


def test_results_that_overlap_or_differ_in_commit_are_refused(targets):
    a = result([row("bf16", "cublas-bf16", 1, 30.0)])
    with pytest.raises(ValueError, match="both time"):
        targets.join_results([a, result([row("bf16", "cublas-bf16", 1, 31.0)])])
    with pytest.raises(ValueError, match="different commits"):
        targets.join_results([a, {**result([row("bf16", "cublas-bf16", 1, 20.0, shape="o")]), "commit": "other"}])


def test_the_command_line_takes_several_results(targets, tmp_path, capsys):
    import json
    paths = []
    for i, shape in enumerate(("qkv", "down")):
        p = tmp_path / f"r{i}.json"
        p.write_text(json.dumps(result([row("bf16", "cublas-bf16", 1, 30.0, shape=shape),
                                        row("bf16", "vsr", 1, 20.0, shape=shape, floor=18.0)])))
        paths.append(str(p))
    out = tmp_path / "t.json"
    assert targets.main(paths + ["--out", str(out)]) == 0
    t = by_name(json.loads(out.read_text())["targets"])
    assert t["bf16: no point below 0.9x"]["points"] == 2 and t["bf16: no point below 0.9x"]["met"] is True
    assert "r0.json, " in capsys.readouterr().out
