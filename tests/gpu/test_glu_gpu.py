"""The 27B-class gate|up product with its SwiGLU epilogue (GPU only), on the tiles the runtime runs
(the shipped cache's tile of each row bucket, the template's default where it has none), bf16,
dense, fp8 and int4 GPTQ/AWQ: the same bytes as the plain product of the same interleaved weight
with its columns put back in gate|up order, followed by the activation kernel (activation.silu_mul),
every output written (NaN-poisoned), at rows inside each bucket and at its edge. (The plain product
of the weight in gate|up order is another sum: a stream-K tile plan splits the K steps of other
columns there. It is checked within bf16's rounding.)"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from vsr.autotune.buckets import bucket_for
from vsr.kernels import activation, registry
from vsr.runtime import fuse

pytestmark = pytest.mark.gpu

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
N, K = 34816, 5120          # gate|up of hidden 5120, MLP 17408
ROWS = (1, 5, 16, 27, 64, 100, 128, 200, 256, 700, 1024, 2048, 3000)


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "int4-gptq", "int4-awq"])
def test_swiglu_product_is_the_plain_product_then_the_activation(fmt):
    from common_bench import make_weight, shipped_tile

    dev = torch.device("cuda")
    parts = [make_weight(fmt, N // 2, K, dev, seed=seed) for seed in (7, 8)]
    w, wi = fuse.fuse(parts), fuse.fuse(parts, interleave=True)
    t = registry.template_for(w, torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(1)
    for M in ROWS:
        p = t.problem(w, bucket_for(M), torch.bfloat16)
        tile = shipped_tile(t, p, dev) or t.default_tile(p)
        x = torch.randn(M, K, device=dev, generator=g).bfloat16()
        y = t.launch(x, wi, tile)
        want = activation.silu_mul(torch.cat([y[:, 0::2], y[:, 1::2]], 1))
        out = torch.full((M, N // 2), float("nan"), dtype=torch.bfloat16, device=dev)
        got = t.launch(x, wi, tile, out=out, glu=True)
        assert not torch.isnan(got).any(), (fmt, M, tile)
        assert torch.equal(got, want), (fmt, M, tile)
        plain = activation.silu_mul(t.launch(x, w, tile)).float()
        torch.testing.assert_close(got.float(), plain, rtol=2 ** -6, atol=2 ** -8 * plain.abs().max().item(),
                                   msg=lambda m: f"{fmt} at {M} rows on {tile}: {m}")
