"""benchmarks/bench_serve.py on the CPU: a tiny run end to end (the service in its own process, two
client processes, the in-process batcher, the canned server), its record in the `serve` schema."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_serve  # noqa: E402


def test_percentile_is_nearest_rank():
    xs = [float(i) for i in range(1, 101)]
    assert bench_serve.percentile(xs, 0.5) == 50.0 and bench_serve.percentile(xs, 0.99) == 99.0
    assert bench_serve.percentile([3.0], 0.99) == 3.0


@pytest.mark.parametrize("client", ["aiohttp", "httpx"])
def test_a_tiny_run_writes_the_serve_record(tmp_path, client):
    pytest.importorskip(client)
    out = tmp_path / "serve.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_serve.py"), "--device", "cpu",
                        "--concurrency", "1,4", "--requests", "24", "--warmup", "4", "--client-procs", "2",
                        "--max-batch", "8", "--texts", "64", "--client", client, "--out", str(out)],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    rec = json.loads(out.read_text())
    assert rec["benchmark"] == "serve" and rec["package"] == "vsr/intent-minilm" and rec["commit"]
    assert rec["client"].startswith(client + " ")
    assert rec["max_batch"] == 8 and rec["merge"] == "shared" and rec["client_procs"] == 2
    rows = rec["rows"]
    assert sorted((x["provider"], x["concurrency"]) for x in rows) == [("http", 1), ("http", 4),
                                                                        ("in-process", 1), ("in-process", 4)]
    for row in rows:
        for key in ("device", "concurrency", "provider", "req_per_s", "p50_ms", "p99_ms", "package", "requests",
                    "max_batch", "max_wait_ms", "replicas"):
            assert key in row, key
        assert row["device"] == "cpu" and row["requests"] == 24 and row["errors"] == 0
        assert row["req_per_s"] > 0 and 0 < row["p50_ms"] <= row["p99_ms"]
        if row["provider"] == "http":
            assert row["client_ceiling_req_per_s"] > 0 and isinstance(row["client_bound"], bool)
    assert [t["met"] for t in rec["targets"]] == [None, None, None]   # the H200's targets; no level 64 here
    lines = r.stdout.rstrip().splitlines()
    assert lines[-len(rows) - 2].startswith("provider") and lines[-1].startswith("in-process")   # the table last
