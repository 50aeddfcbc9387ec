"""On a GPU: a fresh process with this device's compiled-kernel bundle compiles no kernel and
answers as a process that compiled them (issue 39). Needs a bundle: `vsr-tune compile --package
vsr/intent-minilm --package vsr/intent-minilm-W4A16-GPTQ` (beside the shipped cache) first.
The built-in packages run where they are built on this machine; VSR_GPU_TEST_PACKAGES (package
folders, comma-separated) names others, e.g. built ones carried to a GPU machine."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

_RUN = """
import json, sys
from vsr.autotune import bundle
from vsr.runtime.engine import load_engine
from vsr.runtime.package import open_package
e = load_engine(open_package(sys.argv[1], device="cuda"), device="cuda")
probs = e.forward(["turn on the kitchen lights", "set a timer for ten minutes", "what's the weather"] * 11)
print(json.dumps({"bundle": bundle.active_path(), "stats": bundle.stats(), "probs": probs.tolist()}))
"""


def _fresh(pkg, cache_dir, bundle_env):
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache_dir), VSR_KERNEL_BUNDLE=bundle_env)
    env.pop("TRITON_INTERPRET", None)
    if bundle_env == "":
        env.pop("VSR_KERNEL_BUNDLE")
    p = subprocess.run([sys.executable, "-c", _RUN, pkg], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


PACKAGES = [p for p in os.environ.get("VSR_GPU_TEST_PACKAGES", "").split(",") if p] or [
    "vsr/intent-minilm", "vsr/intent-minilm-W4A16-GPTQ"]


@pytest.mark.parametrize("pkg", PACKAGES)
def test_fresh_process_with_bundle_compiles_nothing_and_answers_the_same(pkg, tmp_path):
    from vsr.runtime import builtin

    if pkg.startswith("vsr/") and not builtin.is_built(pkg):
        pytest.skip(f"{pkg} is not built on this machine (VSR_GPU_TEST_PACKAGES names package folders)")
    with_bundle = _fresh(pkg, tmp_path / "a", "")
    if with_bundle["bundle"] is None:
        pytest.skip("no compiled-kernel bundle for this device and Triton (vsr-tune compile makes one)")
    assert with_bundle["stats"]["compiles"] == 0 and with_bundle["stats"]["builds"] == 0, with_bundle["stats"]
    assert with_bundle["stats"]["bundle_misses"] == 0
    jit = _fresh(pkg, tmp_path / "b", "off")
    assert jit["bundle"] is None
    assert with_bundle["probs"] == jit["probs"]
