"""The NVFP4 template (emulated W4A4 and W4A16) against its pure-torch reference; conventions:
tests/kernel_cases.py.
"""
from __future__ import annotations

import pytest
import torch

from vsr.autotune.buckets import bucket_for
from vsr.kernels import nvfp4
from kernel_cases import DEV, K, ROWS, TILED, gen, assert_close, run, nvfp4_weight


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("w4a4", [True, False])
@pytest.mark.parametrize("M", ROWS)
def test_nvfp4_emulated_matches_reference(dtype, w4a4, M):
    g = gen(300 + M * 5 + w4a4)
    w = nvfp4_weight(g, w4a4, bias=M != 5, dtype=dtype)
    x = torch.randn(M, K, generator=g).to(dtype).to(DEV)
    x[0, :16] = 0  # an all-zero block: its scale becomes 0.125
    tile = nvfp4.default_tile(nvfp4.problem(w, bucket_for(M), dtype))
    assert_close(run(nvfp4.launch_emulated, x, w, tile), nvfp4.reference_linear(x, w))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_nvfp4_activation_quantization_is_bit_exact(dtype):
    g = gen(9)
    x = (torch.randn(5, K, generator=g) * 4).to(dtype)
    x[1, :16] = 0
    # Exact ties between e2m1 codes with a scale of exactly 1/gx... (gx = 1, amax 6 -> s = 1).
    x[2, :16] = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5,
                              -3.5, -5.0, 0.1])
    x = x.to(DEV)
    gx = torch.tensor(1.0, device=DEV)
    codes, s = nvfp4.quantize_activation_triton(x, gx)
    rc, rs = nvfp4.quantize_activation(x, gx)
    assert torch.equal(codes, rc)
    assert torch.equal(s.view(torch.uint8), rs.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_nvfp4_blocks_with_nan_follow_the_reference(dtype):
    # A 16-column block holding a NaN: the reference's scale is NaN and its codes 0, so the
    # emulated product's row is NaN; the row's other blocks, and the other rows, quantize as usual.
    g = gen(12)
    x = (torch.randn(3, K, generator=g) * 4).to(dtype)
    x[0, 20] = float("nan")
    x[1, 3] = float("inf")
    x = x.to(DEV)
    gx = torch.tensor(1.0, device=DEV)
    codes, s = nvfp4.quantize_activation_triton(x, gx)
    rc, rs = nvfp4.quantize_activation(x, gx)
    assert rs[0, 1].float().isnan() and s[0, 1].float().isnan() and not s[0, 0].float().isnan()
    assert torch.equal(codes, rc)
    sb, rb = s.view(torch.uint8), rs.view(torch.uint8)
    assert torch.equal(sb & 0x7F, rb & 0x7F), "the same scales (a NaN's sign aside)"
    w = nvfp4_weight(g, True, bias=False, dtype=dtype)
    y = run(nvfp4.launch_emulated, x, w, nvfp4.default_tile(nvfp4.problem(w, bucket_for(3), dtype)))
    assert y[0].isnan().all() and y[1:].isfinite().all()
    assert_close(y[1:], nvfp4.reference_linear(x[1:], w))


def test_nvfp4_emulated_tiled_path():
    g = gen(10)
    w = nvfp4_weight(g, True, bias=True, dtype=torch.float16)
    x = torch.randn(40, K, generator=g).half().to(DEV)
    assert_close(run(nvfp4.launch_emulated, x, w, TILED), nvfp4.reference_linear(x, w))
