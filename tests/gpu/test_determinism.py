"""Two processes, the same inputs and tiles: byte-identical outputs for every format (GPU only),
of each product template and of whole forwards (the 27B-class Qwen3 and Qwen3.5 routers cut to a
few layers, random weights, every kernel of the forward: norms, RoPE, attention, the Gated DeltaNet
ops, the score head; eager and through a CUDA graph, with right-padded requests), whose bytes are
also the same with the kernels launched as programmatic dependents (kernels.pdl).

Run alone as `python tests/gpu/test_determinism.py` it prints, as JSON, the sha256 of each
output; the test starts that twice and compares. Split-K tiles (plain and transposed, with the
reduction kernel and with the in-kernel fixup) and persistent and stream-K tiles are included on
purpose: partial sums meet in a fixed-order reduction, never through atomics (the fixup's one
atomic counts arrivals, so which program adds the partials changes from run to run, but not the
order it adds them in), and a persistent program computes each of its tiles whole.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SHAPE = (5120, 8192)          # the 27B-class "o" layer: split-K matters at K = 8192
ROWS = (1, 16, 64, 1024)


def outputs() -> dict[str, str]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from common_bench import make_weight
    from vsr.autotune.buckets import bucket_for
    from vsr.kernels import registry
    dev = torch.device("cuda")
    N, K = SHAPE
    out = {}
    for fmt in ("bf16", "fp8", "int4-gptq", "int4-awq", "nvfp4-emulated"):
        w = make_weight(fmt, N, K, dev, seed=3, bias=True)
        t = registry.template_for(w, torch.bfloat16, emulate=fmt == "nvfp4-emulated")
        g = torch.Generator(device=dev).manual_seed(4)
        for m in ROWS:
            x = torch.randn(m, K, generator=g, device=dev).to(torch.bfloat16)
            tiles = [t.default_tile(t.problem(w, bucket_for(m), x.dtype))]
            if m <= 16:  # a split-K tile on purpose (BLOCK_K 128 fits every format's group)
                tiles.append(dict(tiles[0], path="splitk", BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=8))
            # The other split and persistent paths: the transposed TMA product split in four,
            # int4's transposed split-K tile, and a persistent TMA tile (more tiles than programs).
            if t.name in ("dense", "fp8_w8a8") and m <= 16:
                tiles.append(dict(tiles[0], path="tma-swap", BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, SPLIT_K=4,
                                  num_warps=4, num_stages=4))
                tiles.append(dict(tiles[-1], FIXUP=1))
            if t.name == "int4_w4a16" and 1 < m <= 128:
                tiles.append(dict(tiles[0], path="swap", BLOCK_M=min(64, m), BLOCK_N=128, BLOCK_K=128, SPLIT_K=4,
                                  num_warps=4, num_stages=3))
                tiles.append(dict(tiles[0], path="slices", BLOCK_M=min(64, max(16, m)), BLOCK_N=128, BLOCK_K=128,
                                  SPLIT_K=4, num_warps=4, num_stages=3))
                tiles.append(dict(tiles[0], path="join", BLOCK_M=min(64, max(16, m)), BLOCK_N=64, BLOCK_K=128,
                                  SPLIT_K=4, num_warps=4, num_stages=3))
                tiles.append(dict(tiles[-1], FIXUP=1))   # the shipped cache's int4 pick at M = 16-64
            if m == 1024 and tiles[0]["path"] in ("tma", "dequant-tma"):
                tiles.append(dict(tiles[0], PERSISTENT=1))
            if m == 1024 and tiles[0]["path"] in ("tma-sk", "dequant-sk"):
                tiles.append(dict(tiles[0], FIXUP=1))
            for i, tile in enumerate(tiles):
                y = t.launch(x, w, tile)
                torch.cuda.synchronize()
                out[f"{fmt}/M={m}/tile{i}"] = hashlib.sha256(y.view(torch.uint8).cpu().numpy().tobytes()).hexdigest()
    out.update(forwards())
    return out


def forwards() -> dict[str, str]:
    """sha256 of the probabilities and final hidden states of whole forwards, per model and format."""
    from bench_e2e import build_vsr
    from e2e_models import MODELS
    from vsr.autotune.resolver import TileResolver
    from vsr.kernels import pdl
    from vsr.runtime.engine import GraphedForward
    dev = torch.device("cuda")
    tiles = TileResolver(None, device=dev)
    out = {}
    for model_name, layers in (("qwen3", 2), ("qwen3_5", 4)):
        make_config, loader_class = MODELS[model_name][:2]
        config = make_config(layers)
        for fmt in ("bf16", "fp8", "int4-gptq"):
            model, _, kernel_set = build_vsr(config, loader_class(config, fmt, device=dev), dev, tiles, "auto")
            g = torch.Generator(device="cpu").manual_seed(5)
            ids = torch.randint(1, config["vocab_size"], (3, 200), generator=g).to(dev)
            lengths = torch.tensor([200, 131, 7], dtype=torch.int32, device=dev)
            mask = (torch.arange(200, device=dev)[None] < lengths[:, None]).long()
            with torch.inference_mode():
                probs = model(ids, mask, lengths)
                hidden = model.encode(ids, mask, lengths)
                graphed = GraphedForward(model, dev, kept=1, capture_at=1)
                graphed(ids, mask, lengths)
                replay = graphed(ids, mask, lengths)
                with pdl.programmatic_forward():   # kernels as programmatic dependents: same bytes
                    probs_pdl = model(ids, mask, lengths)
                    graphed_pdl = GraphedForward(model, dev, kept=1, capture_at=1)
                    graphed_pdl(ids, mask, lengths)
                    replay_pdl = graphed_pdl(ids, mask, lengths)
            torch.cuda.synchronize()
            for name, t in (("probs", probs), ("hidden", hidden), ("graph", replay)):
                out[f"{model_name}/{fmt}/{kernel_set}/{name}"] = hashlib.sha256(
                    t.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()
            assert torch.equal(replay, probs), f"{model_name}/{fmt}: the graph's replay differs from eager"
            assert torch.equal(probs_pdl, probs) and torch.equal(replay_pdl, probs), \
                f"{model_name}/{fmt}: programmatic dependent launch changed the bytes"
            del model
            torch.cuda.empty_cache()
    return out


@pytest.mark.gpu
def test_two_processes_give_identical_bytes():
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    runs = []
    for _ in range(2):
        p = subprocess.run([sys.executable, __file__], capture_output=True, text=True, env=env, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    assert runs[0].keys() == runs[1].keys() and len(runs[0]) >= 30 + 18
    diff = [k for k in runs[0] if runs[0][k] != runs[1][k]]
    assert diff == [], f"outputs differ between processes: {diff}"


if __name__ == "__main__":
    print(json.dumps(outputs(), sort_keys=True))
