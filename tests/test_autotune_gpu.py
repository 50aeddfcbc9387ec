"""On a GPU: tiles tuned with CUDA-graph timing by one process load untimed in another process, and
both produce the same bytes (a small version of proof (a); benchmarks/bench_cache.py is the full one)."""
import json
import subprocess
import sys

import pytest

from tinypkgs import tiny_qwen3  # noqa: F401

pytestmark = pytest.mark.gpu

# One process runs this with policy "tune" (times candidates, records the winners); another
# with policy "error" must find every key and time nothing.
RUN = r"""
import hashlib, json, sys, torch
from vsr.autotune import shapes, synth, tuner
from vsr.autotune.resolver import TileResolver
from vsr.kernels.registry import template_for
cache, fmt, policy = sys.argv[1], sys.argv[2], sys.argv[3]
r = TileResolver(cache, policy, "cuda")
fs = shapes.FORMATS[fmt]
act = shapes.act_dtype_for(fs, None)
w = shapes.weight_for(fs, 1024, 512, act, "cuda", seed=5)
t = template_for(w, act)
out = {}
for b in (1, 16, 256):
    x = synth.random_activations(b, 512, act, "cuda", seed=b)
    y = t.launch(x, w, r.tile(t, t.problem(w, b, act)))
    out[str(b)] = hashlib.sha256(y.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()
print(json.dumps({"hashes": out, "timing_calls": r.timing_calls, "global": tuner.timing_calls(),
                  "tuned": len(r.tuned)}))
"""


def run(cache, fmt: str, policy: str) -> dict:
    out = subprocess.run([sys.executable, "-c", RUN, str(cache), fmt, policy], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("fmt", ["bf16", "int4-awq"])
def test_tuned_cache_loads_untimed_and_identical(tmp_path, fmt):
    cache = tmp_path / "c.db"
    tuner_run = run(cache, fmt, "tune")
    assert tuner_run["timing_calls"] > 0 and tuner_run["tuned"] == 3
    loader_run = run(cache, fmt, "error")
    assert loader_run["timing_calls"] == 0 and loader_run["global"] == 0
    assert loader_run["hashes"] == tuner_run["hashes"]


@pytest.mark.parametrize("scheme", [None, "FP8_DYNAMIC", "W4A16"])
def test_a_tuned_package_runs_on_the_gpu_with_miss_policy_error(tmp_path, tiny_qwen3, scheme):  # noqa: F811
    """vsr-tune PACKAGE records every product the GPU forward runs (the fused shapes): the engine
    then answers with --miss-policy error, graphed and eager."""
    from click.testing import CliRunner

    from tinypkgs import TEST_TEXTS, Pkg, compressed
    from vsr.autotune.buckets import bucket_for
    from vsr.cli.tune import main as tune
    from vsr.runtime.engine import batch_shape, load_engine

    pkg = tiny_qwen3 if scheme is None else compressed(tiny_qwen3, scheme)
    texts = TEST_TEXTS[:3]
    probe = load_engine(Pkg(pkg), device="cuda", cuda_graphs=False)
    ids = probe.tokenizer.encode_checked(texts)
    n, s = batch_shape(len(ids), max(map(len, ids)), probe.tokenizer.limit)
    cache = tmp_path / "fresh.db"
    res = CliRunner().invoke(tune, [str(pkg), "--buckets", str(bucket_for(n * s)), "--max-candidates", "1",
                                    "--autotune-cache", str(cache), "--json"])
    assert res.exit_code == 0, res.output
    for graphs in (True, False):
        e = load_engine(Pkg(pkg), device="cuda", autotune_cache=cache, miss_policy="error", cuda_graphs=graphs)
        assert e.kernel_set == ("exact" if scheme is None else "approximate")
        for _ in range(3):   # eager, captured, replayed
            assert e.forward(texts).shape == (3, 5)
