"""The fused-quantization FP8 variant of benchmarks/variants.py (timed on the GPU against the
shipped prologue + product) computes the reference's numbers: checked here under the interpreter."""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from vsr.kernels import fp8

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def variants():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("vsr_bench_variants", BENCH / "variants.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("M,K", [(5, 96), (40, 200)])   # 200: a masked last K step
def test_fused_quantization_variant_matches_reference(variants, dtype, M, K):
    g = torch.Generator().manual_seed(M + K)
    N = 37
    w = fp8.Fp8Weight(fp8.e4m3_rne(torch.randn(N, K, generator=g) * 40),
                      (torch.rand(N, generator=g) * 0.01 + 1e-3).to(dtype)).to(DEV)
    x = (torch.randn(M, K, generator=g) * 3).to(dtype).to(DEV)
    x[1] = 0                                         # an all-zero row: scale eps
    tile = {"path": "tiled", "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "SPLIT_K": 1, "GROUP_M": 2,
            "num_warps": 4, "num_stages": 2}
    y = torch.full((M, N), float("nan"), dtype=dtype, device=DEV)
    variants.launch_fused(x, w, tile, out=y)
    torch.testing.assert_close(y, fp8.reference_linear(x, w), rtol=2e-3, atol=2e-3)
    # Same roundings as the shipped path on the same tile: the same bits.
    assert torch.equal(y, fp8.launch(x, w, tile))


@pytest.mark.parametrize("use_tma", [False, True])
@pytest.mark.parametrize("symmetric,split,K,G,bk", [(True, 1, 256, 64, 64), (False, 2, 224, 64, 64)])  # 224: a zero-filled tail
def test_int4_swap_variants_match_reference(variants, use_tma, symmetric, split, K, G, bk):
    from vsr.kernels import int4
    g = torch.Generator().manual_seed(K + split + use_tma)
    N, M, KG = 37, 5, -(-K // G)
    zp = None if symmetric else torch.randint(0, 16, (N, KG), generator=g, dtype=torch.int32)
    w = int4.Int4Weight(int4.pack_int4(torch.randint(0, 16, (N, K), generator=g, dtype=torch.int32)),
                        (torch.rand(N, KG, generator=g) * 0.05 + 1e-3).half(), K, G, zp, None,
                        torch.randn(N, generator=g).half()).to(DEV)
    x = torch.randn(M, K, generator=g).half().to(DEV)
    tile = {"path": "swap", "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": bk, "SPLIT_K": split, "GROUP_M": 2,
            "num_warps": 4, "num_stages": 2}
    y = torch.full((M, N), float("nan"), dtype=torch.float16, device=DEV)
    variants.launch_int4_swap(x, w, tile, use_tma, out=y)
    torch.testing.assert_close(y, int4.reference_linear(x, w), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("tma_store", [False, True])
@pytest.mark.parametrize("fmt", ["fp16", "fp8"])
def test_persistent_variant_matches_reference(variants, tma_store, fmt):
    from vsr.kernels import dense
    g = torch.Generator().manual_seed(70 + tma_store)
    M, N, K = 37, 40, 128                      # ragged M: the last row tile is clipped
    x = torch.randn(M, K, generator=g).half().to(DEV)
    tile = {"path": "tma", "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 32, "SPLIT_K": 1, "GROUP_M": 2,
            "num_warps": 4, "num_stages": 2}
    y = torch.full((M, N), float("nan"), dtype=torch.float16, device=DEV)
    if fmt == "fp16":
        w = dense.DenseWeight(torch.randn(N, K, generator=g).half()).to(DEV)
        variants.launch_persistent(x, w.weight, y, tile, tma_store, programs=3)
        ref = dense.reference_linear(x, w)
    else:
        w = fp8.Fp8Weight(fp8.e4m3_rne(torch.randn(N, K, generator=g) * 40),
                          (torch.rand(N, generator=g) * 0.01 + 1e-3).half()).to(DEV)
        xq, xs = fp8.quantize_activation_triton(x)
        variants.launch_persistent(xq, w.weight, y, tile, tma_store, rs=xs, cs=w.weight_scale, programs=3)
        ref = fp8.reference_linear(x, w)
    torch.testing.assert_close(y, ref, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("study,ms", [("fp8-fused", [16]), ("int4-mid", [16]), ("persistent", [256])])
def test_each_study_runs_every_case(variants, monkeypatch, study, ms):
    # The studies' orchestration on a tiny shape, timing replaced by a count: every case is built,
    # run and recorded (the figures themselves come from the H200).
    monkeypatch.setattr(variants, "DEV", DEV)
    monkeypatch.setattr(variants, "SHAPES", {"tiny": (64, 256)})
    monkeypatch.setattr(variants, "graph_ms", lambda fns: [f() for f in fns] and 1.0)
    rows = variants.STUDIES[study][0](["tiny"], ms, lambda r: None)
    cases = [r for r in rows if r["variant"] != "cublas-bf16"]
    assert cases and all("error" not in r and r["ms"] == 1.0 for r in cases), [r.get("error") for r in cases]
