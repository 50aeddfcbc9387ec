"""benchmarks/profile_points.py: each case it profiles is the product it names (the counters
themselves come from the H200 under Nsight Compute)."""
import torch

from vsr.kernels import dense, registry

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def test_its_cases_are_the_products_they_name(bench_script):
    pp = bench_script("profile_points")
    g = torch.Generator().manual_seed(5)
    w = dense.DenseWeight(torch.randn(48, 128, generator=g).half()).to(DEV)
    x = torch.randn(40, 128, generator=g).half().to(DEV)   # fp16: the interpreter's bf16 tl.dot is wrong
    t = registry.TEMPLATES["dense"]
    sk = dict(path="tma-sk", BLOCK_M=32, BLOCK_N=32, BLOCK_K=64, SPLIT_K=1, GROUP_M=8, num_warps=4, num_stages=2)
    cases = pp.cases(t, x, w, [{"name": "sk 32x32", "tile": sk}], gluon=False)
    assert [name for name, _ in cases] == ["cublas", "vsr shipped", "sk 32x32"]
    ref = t.reference(x, w).float()
    for name, call in cases:
        y = call()
        assert y.shape == (40, 48)
        torch.testing.assert_close(y.float(), ref, rtol=1e-2, atol=1e-2, msg=name)
