"""Start-up imports only what the request needs (issue 39, point 3), checked in fresh processes.

- `vsr-run --text ...` on a built package imports neither transformers, compressed-tensors,
  llm-compressor nor sentence-transformers (the builders and references), nor the tuner.
- A tile resolver whose every lookup hits the cache never imports vsr.autotune.tuner.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

FORBIDDEN = ("transformers", "compressed_tensors", "llmcompressor", "sentence_transformers", "vsr.autotune.tuner")

_RUN = """
import json, sys
from vsr.cli.run import main
try:
    main(["--text", "turn on the kitchen lights"])
except SystemExit as e:
    code = e.code
print(json.dumps({"rc": code, "modules": sorted(m for m in sys.modules if m.split(".")[0] in %r or m == "vsr.autotune.tuner")}))
""" % ({m.split(".")[0] for m in FORBIDDEN} | {"vsr"},)

_HIT = """
import json, sys, torch
from vsr.autotune.fake import FAKE_DENSE
from vsr.autotune.resolver import TileResolver
from vsr.kernels.dense import DenseWeight
w = DenseWeight(torch.randn(8, 32))
r = TileResolver(sys.argv[1], policy="error", device="cpu", use_shipped=False)
tile = r.tile(FAKE_DENSE, FAKE_DENSE.problem(w, 4, torch.float32))
print(json.dumps({"tile": tile, "timing_calls": r.timing_calls, "tuner": "vsr.autotune.tuner" in sys.modules}))
"""


def _python(code: str, *args: str) -> dict:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_run_path_imports_no_builder_and_no_tuner():
    from vsr.runtime import builtin
    builtin.resolve(builtin.BASE)   # built here first: building may import the builders, running must not
    got = _python(_RUN)
    assert got["rc"] == 0
    loaded = [m for m in got["modules"] if m.split(".")[0] in {f.split(".")[0] for f in FORBIDDEN[:4]}
              or m == "vsr.autotune.tuner"]
    assert loaded == [], f"the run path imported {loaded}"
    assert "vsr.runtime.engine" in got["modules"]   # (the check saw the run's modules)


def test_a_cache_hit_does_not_import_the_tuner(tmp_path):
    from vsr.autotune.fake import FAKE_DENSE
    from vsr.autotune.resolver import TileResolver
    from vsr.kernels.dense import DenseWeight

    cache = tmp_path / "t.db"
    w = DenseWeight(torch.randn(8, 32))
    tuned, _ = TileResolver(cache, policy="tune", device="cpu", use_shipped=False,
                            timer=lambda fn: (fn(), 1.0)[1]).tune(FAKE_DENSE, FAKE_DENSE.problem(w, 4, torch.float32))
    got = _python(_HIT, str(cache))
    assert got["tile"] == tuned and got["timing_calls"] == 0
    assert got["tuner"] is False, "a cache hit imported vsr.autotune.tuner"
