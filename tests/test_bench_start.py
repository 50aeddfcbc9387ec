"""benchmarks/bench_start.py: the children's bytecode environment and the targets read off its rows."""
from pathlib import Path


def test_bytecode_is_written_where_the_environment_forbids_it(bench_script, tmp_path):
    bench = bench_script("bench_start")
    env, note = bench.bytecode_env({"PATH": "/bin", "PYTHONDONTWRITEBYTECODE": "1"}, tmp_path)
    assert "PYTHONDONTWRITEBYTECODE" not in env and Path(env["PYTHONPYCACHEPREFIX"]).parent == tmp_path
    assert env["PATH"] == "/bin" and "PYTHONDONTWRITEBYTECODE was set" in note
    same, note = bench.bytecode_env({"PATH": "/bin"}, tmp_path)
    assert same == {"PATH": "/bin"} and note == "as the environment writes it"


def test_targets_read_the_rows_by_role(bench_script):
    bench = bench_script("bench_start")
    row = dict(role="quantized", bundle=True, triton_cache="empty", requests=1, first_answer_s=2.7, total_s=3.0)
    big = dict(row, requests=2048, total_s=5.0)
    warm = dict(big, bundle=False, triton_cache="warm", total_s=4.0)
    t = {x["target"]: x for x in bench.targets_of([row, big, warm], "cuda", 2048)}
    assert t["int4 first answer, bundle, empty Triton cache"]["met"] is True
    assert t["router first answer, bundle, empty Triton cache"]["met"] is None   # not run
    assert t["2048 requests, bundle, empty Triton cache / kernels compiled"]["value"] == 1.25
