"""fp8 W8A8 products accumulate as the peer BENCHMARKS.md names, and no worse (GPU only).

On Hopper an fp8 `tl.dot` adds its products into the accumulator in the tensor core's reduced
precision (Triton's default there), as `_scaled_mm(..., use_fast_accum=True)` does. On random
inputs the rounding errors cancel; on an input aligned with a weight row (one long dot product
without cancellation) they add up, to 8-23% of that output at K = 5120-17408, for vsr and for
the peer alike. This test holds one tile of each kernel
form of the fp8 template (path, wide or not, persistent or not) at four row buckets to the peer's
error on such an input, so a form that accumulated worse (bf16 partial sums, parts added in
lower precision) fails, and to the tuner's bound on a random one.
"""
from __future__ import annotations

import pytest
import torch

from vsr.autotune.buckets import bucket_for
from vsr.autotune.tuner import FP8_OPERAND_TOLERANCE, check_output
from vsr.kernels import fp8

pytestmark = pytest.mark.gpu

N, K = 512, 5120


def _weight(dev) -> fp8.Fp8Weight:
    g = torch.Generator(dev).manual_seed(3)
    codes = fp8.e4m3_rne(torch.randn(N, K, generator=g, device=dev) * 40)
    scale = (torch.rand(N, generator=g, device=dev) * 1e-3 + 1e-3).to(torch.bfloat16)
    return fp8.Fp8Weight(codes, scale)


def _inputs(w: fp8.Fp8Weight, M: int, dev) -> tuple[torch.Tensor, torch.Tensor]:
    """(x aligned with weight row 0: its dequantized values plus a little noise, x random), bf16."""
    g = torch.Generator(dev).manual_seed(1)
    rnd = torch.randn(M, K, device=dev, generator=g)
    row0 = w.weight[0].float() * w.weight_scale[0].float()
    aligned = row0[None, :] / row0.abs().max() * 3 + 0.1 * rnd
    return aligned.to(torch.bfloat16), rnd.to(torch.bfloat16)


def _row0_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest relative error of output column 0 (the aligned row's dot products)."""
    yf, rf = y.float(), ref.float()
    return ((yf[:, 0] - rf[:, 0]).abs() / rf[:, 0].abs().clamp_min(1e-30)).max().item()


def _tiles(w: fp8.Fp8Weight, M: int) -> dict[tuple, dict]:
    """One tile of each form (path, wide, persistent) the fp8 space offers at M's bucket."""
    p = fp8.problem(w, bucket_for(M), torch.bfloat16)
    out: dict[tuple, dict] = {}
    for t in fp8.search_space(p):
        out.setdefault((t["path"], "BLOCK_N2" in t, bool(t.get("PERSISTENT", 0))), t)
    return out


@pytest.mark.parametrize("M", [1, 16, 256, 1024])
def test_fp8_paths_accumulate_no_worse_than_scaled_mm_fast_accum(M, bench_script):
    dev = torch.device("cuda")
    if torch.cuda.get_device_capability(dev) < (9, 0):
        pytest.skip("the fp8 TMA and wgmma forms need compute capability 9.0+")
    cb = bench_script("common_bench")   # the peer: _scaled_mm on the reference's own codes and scales
    w = _weight(dev)
    aligned, rnd = _inputs(w, M, dev)

    peer = cb.scaled_mm(*cb.torch_quant(aligned), w, cb.scaled_mm_weight_scale(w), fast=True)
    ref = fp8.reference_linear(aligned, w)
    peer_err = _row0_error(peer, ref)

    tiles = _tiles(w, M)
    assert tiles, "the fp8 search space is empty"
    for form, tile in tiles.items():
        err = _row0_error(fp8.launch(aligned, w, tile), ref)
        assert err <= peer_err * 1.05 + 2e-3, f"{tile}: aligned-row error {err:.3e} against the peer's {peer_err:.3e}"
        bad = check_output(fp8.launch(rnd, w, tile), fp8.reference_linear(rnd, w), torch.bfloat16,
                           FP8_OPERAND_TOLERANCE)
        assert bad is None, f"{form}: random input: {bad}"
