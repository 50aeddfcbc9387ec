"""On a GPU: tiles tuned with CUDA-graph timing by one process load untimed in another process, and
both produce the same bytes (a small version of proof (a); benchmarks/bench_cache.py is the full one)."""
import json
import subprocess
import sys

import pytest

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
