"""benchmarks/profile_points.py: each case it profiles is the product it names (the counters
themselves come from the H200 under Nsight Compute)."""
import pytest
import torch

from vsr.autotune import shapes, synth
from vsr.kernels import dense, registry

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("fmt", ["bf16", "int4-awq"])
def test_its_cases_are_the_products_they_name(bench_script, fmt):
    pp = bench_script("profile_points")
    g = torch.Generator().manual_seed(5)
    wd = dense.DenseWeight(torch.randn(48, 256, generator=g).half()).to(DEV)
    x = torch.randn(40, 256, generator=g).half().to(DEV)   # fp16: the interpreter's bf16 tl.dot is wrong
    fs = shapes.FORMATS[fmt]
    w = wd if fmt == "bf16" else synth.random_weight(fs.fmt, 48, 256, dict(fs.params), torch.float16, DEV, 3)
    t = registry.template_for(w, x.dtype)
    extra = []
    if fmt == "bf16":
        extra = [{"name": "sk 32x32", "tile": dict(path="tma-sk", BLOCK_M=32, BLOCK_N=32, BLOCK_K=64, SPLIT_K=1,
                                                   GROUP_M=8, num_warps=4, num_stages=2)}]
    cases = pp.cases(t, x, w, wd, extra, gluon=False)
    assert [c[0] for c in cases] == ["cublas", "vsr shipped"] + [e["name"] for e in extra]
    refs = {"cublas": registry.TEMPLATES["dense"].reference(x, wd).float(), "vsr shipped": t.reference(x, w).float()}
    for name, call, ref in cases:
        want = refs.get(name, refs["vsr shipped"])
        torch.testing.assert_close(ref.float(), want, rtol=1e-2, atol=1e-2, msg=name)
        y = call()
        assert y.shape == (40, 48)
        torch.testing.assert_close(y.float(), want, rtol=1e-2, atol=1e-2, msg=name)
