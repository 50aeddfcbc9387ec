"""On a GPU: tiles tuned with CUDA-graph timing by one process load untimed in another, and both
produce the same bytes (a small version of proof (a); benchmarks/bench_cache.py is the full one)."""
import json
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu

CHILD = r"""
import hashlib, json, sys, torch
from vsr.autotune import shapes, synth, tuner
from vsr.autotune.resolver import TileResolver
from vsr.kernels.registry import template_for
cache, fmt = sys.argv[1], sys.argv[2]
r = TileResolver(cache, "error", "cuda")
fs = shapes.FORMATS[fmt]
act = shapes.act_dtype_for(fs, None)
w = shapes.weight_for(fs, 1024, 512, act, "cuda", seed=5)
t = template_for(w, act)
out = {}
for b in (1, 16, 256):
    x = synth.random_activations(b, 512, act, "cuda", seed=b)
    y = t.launch(x, w, r.tile(t, t.problem(w, b, act)))
    out[str(b)] = hashlib.sha256(y.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()
print(json.dumps({"hashes": out, "timing_calls": r.timing_calls, "global": tuner.timing_calls()}))
"""


@pytest.mark.parametrize("fmt", ["bf16", "int4-awq"])
def test_tuned_cache_loads_untimed_and_identical(tmp_path, fmt):
    import hashlib

    from vsr.autotune import shapes, synth
    from vsr.autotune.resolver import TileResolver
    from vsr.kernels.registry import template_for

    cache = tmp_path / "c.db"
    r = TileResolver(cache, "tune", "cuda")
    fs = shapes.FORMATS[fmt]
    act = shapes.act_dtype_for(fs, None)
    w = shapes.weight_for(fs, 1024, 512, act, "cuda", seed=5)
    t = template_for(w, act)
    mine = {}
    for b in (1, 16, 256):
        x = synth.random_activations(b, 512, act, "cuda", seed=b)
        y = t.launch(x, w, r.tile(t, t.problem(w, b, act)))
        mine[str(b)] = hashlib.sha256(y.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()
    assert r.timing_calls > 0 and len(r.tuned) == 3
    out = subprocess.run([sys.executable, "-c", CHILD, str(cache), fmt], capture_output=True, text=True, check=True)
    child = json.loads(out.stdout.strip().splitlines()[-1])
    assert child["timing_calls"] == 0 and child["global"] == 0
    assert child["hashes"] == mine
