"""The FP8 W8A8 template against its pure-torch reference: the per-token activation quantization's
bytes, every path and prologue plan, the launch decisions; conventions: tests/kernel_cases.py.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch
import triton
import triton.language as tl

from vsr.autotune.buckets import bucket_for
from vsr.autotune.tuner import candidates
from vsr.kernels import common, fp8, gemm
from vsr.kernels.template import Problem
from kernel_cases import (
    DEV, K, N, ROWS, TILED, gen, FP8_GPU_TOL, assert_close, run, TMA, SWAP, BF16_ON_GPU, fp8_weight,
    KernelSpy,
)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("M", ROWS)
@pytest.mark.parametrize("bias", [True, False])
def test_fp8_matches_reference(dtype, M, bias):
    g = gen(100 + M * 7 + bias)
    w = fp8_weight(g, dtype, bias)
    x = (torch.randn(M, K, generator=g) * 3).to(dtype).to(DEV)
    tile = fp8.default_tile(fp8.problem(w, bucket_for(M), dtype))
    tol = FP8_GPU_TOL if DEV == "cuda" and dtype == torch.float32 else None
    assert_close(run(fp8.launch, x, w, tile), fp8.reference_linear(x, w), tol)


@pytest.mark.parametrize("M", [600, 2100])   # buckets 1024 (stream-K) and 4096 (persistent)
def test_fp8_with_fp32_activations_at_large_buckets_matches_reference(M):
    # fp8._fit_fp32_epilogue: the 128 x 256 default tiles of buckets >= 1024 at half the K step
    # (64 fp8 columns), so that the fp32 output's epilogue fits the shared memory beside them.
    g = gen(900 + M)
    w = fp8_weight(g, torch.float32, True)
    x = (torch.randn(M, K, generator=g) * 3).to(DEV)
    tile = fp8.default_tile(fp8.problem(w, bucket_for(M), torch.float32))
    assert (tile["BLOCK_M"], tile["BLOCK_N"], tile["BLOCK_K"]) == (128, 256, 64), tile
    tol = FP8_GPU_TOL if DEV == "cuda" else None
    assert_close(run(fp8.launch, x, w, tile), fp8.reference_linear(x, w), tol)


# Prologue plans: the row in one register block (K a power of two), in two (K = 320 = 256 + 64,
# both full; 300 = 256 + 64 with 20 lanes of the second masked), and in chunked passes (300:
# a last, partial chunk).
PLANS = [(K, None), (320, None), (300, None), (300, fp8.ProloguePlan(128, 0, True, 2))]


@pytest.mark.parametrize("dtype", [torch.float16, BF16_ON_GPU, torch.float32])
@pytest.mark.parametrize("Kx,plan", PLANS)
def test_fp8_activation_quantization_is_bit_exact(dtype, Kx, plan):
    g = gen(5 + Kx)
    x = (torch.randn(6, Kx, generator=g) * 5).to(dtype)
    x[2] = 0                                   # all-zero row: scale becomes eps
    x[3, :] = 0
    x[3, 0] = 448.0                            # s = 1 exactly: the quotients are the values themselves
    x[3, 1:9] = torch.tensor([34.0, -34.0, 36.0, 0.0029296875, 0.0048828125, 1e-4, 447.0, 300.0])  # ties
    x[4, Kx - 1] = -1000.0                     # the row's amax in its last column (in the second block, if any)
    x = x.to(DEV)
    xq, s = fp8.quantize_activation_triton(x, plan)
    rq, rs = fp8.quantize_activation(x)
    assert torch.equal(xq.view(torch.uint8), rq.view(torch.uint8))
    assert torch.equal(s, rs[:, 0])


def test_fp8_prologue_plans():
    assert fp8.prologue_plan(5120) == fp8.ProloguePlan(4096, 1024, False, 8)
    assert fp8.prologue_plan(17408) == fp8.ProloguePlan(16384, 1024, False, 16)
    assert fp8.prologue_plan(8192) == fp8.ProloguePlan(8192, 0, False, 16)
    assert fp8.prologue_plan(384) == fp8.ProloguePlan(256, 128, False, 1)
    assert fp8.prologue_plan(fp8.PROLOGUE_REGISTER_K + 16).chunked
    for k in (1, 3, 16, 300, 5120, 17408, fp8.PROLOGUE_REGISTER_K):   # the blocks cover K, the second no wider than the first
        p = fp8.prologue_plan(k)
        assert p.block_a <= k <= p.block_a + p.block_b and p.block_b <= p.block_a


@pytest.mark.parametrize("Kx,bias", [(K, True), (200, False)])
def test_fp8_gemv_path(Kx, bias):
    g = gen(31 + Kx)
    w = fp8.Fp8Weight(fp8.e4m3_rne(torch.randn(N, Kx, generator=g) * 40), (torch.rand(N, generator=g) * 0.01 + 1e-3).half(),
                      torch.randn(N, generator=g).half() if bias else None).to(DEV)
    x = (torch.randn(1, Kx, generator=g) * 3).half().to(DEV)
    tile = {"path": "gemv", "BLOCK_M": 1, "BLOCK_N": 8, "BLOCK_K": 64, "SPLIT_K": 1, "num_warps": 4, "num_stages": 2}
    assert_close(run(fp8.launch, x, w, tile), fp8.reference_linear(x, w))
    # The default at one row: the transposed TMA product where 16-byte rows allow it (K=256),
    # the GEMV where not (K=200).
    assert fp8.default_tile(fp8.problem(w, 1, torch.float16))["path"] == ("tma-swap" if Kx % 16 == 0 else "gemv")


def test_fp8_tiled_and_tma_paths(monkeypatch):
    # 4 tiles of 32x32 at M=40: 3 "multiprocessors" leave one to stream-K's shared K steps.
    monkeypatch.setattr(gemm, "multiprocessors", lambda device: 3)
    g = gen(6)
    w = fp8_weight(g, torch.float16, True)
    x = torch.randn(40, K, generator=g).half().to(DEV)
    assert_close(run(fp8.launch, x, w, TILED), fp8.reference_linear(x, w))
    assert_close(run(fp8.launch, x, w, dict(TMA, BLOCK_K=128)), fp8.reference_linear(x, w))
    assert_close(run(fp8.launch, x, w, dict(TMA, BLOCK_K=128, PERSISTENT=1)), fp8.reference_linear(x, w))
    assert_close(run(fp8.launch, x, w, dict(TMA, BLOCK_K=128, path="tma-sk")), fp8.reference_linear(x, w))
    for M, split in ((1, 2), (7, 1)):
        xs = torch.randn(M, K, generator=g).half().to(DEV)
        assert_close(run(fp8.launch, xs, w, dict(SWAP, BLOCK_K=128, SPLIT_K=split)), fp8.reference_linear(xs, w))


@pytest.mark.parametrize("dtype", [torch.float16, BF16_ON_GPU, torch.float32])
def test_fp8_rows_with_nan_or_inf_follow_the_reference(dtype):
    # torch's amax keeps a NaN, so the reference's scale and whole row are NaN; an inf row's scale
    # is inf, its finite values quantize to zero and the inf itself to NaN (inf / inf). The
    # kernel's max must not drop the NaN (a NaN clamped to 448 would leave a finite, wrong row).
    # NaN codes are compared as NaN: the sign of a NaN differs between CPU and GPU arithmetic.
    g = gen(91)
    x = (torch.randn(5, K, generator=g) * 3).to(dtype)
    x[0, 5] = float("nan")
    x[1, 3] = float("inf")
    x[2, 7] = -float("inf")
    x[3] = 0.0
    x[3, K - 1] = float("nan")                  # NaN in an otherwise all-zero row (the eps rule)
    x = x.to(DEV)
    xq, s = fp8.quantize_activation_triton(x)
    rq, rs = fp8.quantize_activation(x)
    torch.testing.assert_close(s, rs[:, 0], rtol=0, atol=0, equal_nan=True)
    codes, ref = xq.view(torch.uint8).cpu(), rq.view(torch.uint8).cpu()
    nan, ref_nan = codes & 0x7F == 0x7F, ref & 0x7F == 0x7F
    assert torch.equal(nan, ref_nan) and nan[0].all() and nan[3].all() and not nan[4].any()
    assert torch.equal(codes[~nan], ref[~ref_nan])
    w = fp8_weight(g, dtype, True)
    y = run(fp8.launch, x, w, fp8.default_tile(fp8.problem(w, bucket_for(5), dtype)))
    # NaN rows give NaN outputs; inf rows, NaN on the GPU as in the reference, and on the CPU
    # something not finite (the interpreter decodes the e4m3 NaN code as 480).
    assert y[[0, 3]].isnan().all() and not y[[1, 2]].isfinite().any() and y[4].isfinite().all()
    if DEV == "cuda":
        assert y[[1, 2]].isnan().all()
    assert_close(y[4:], fp8.reference_linear(x[4:], w), FP8_GPU_TOL if DEV == "cuda" and dtype == torch.float32 else None)


def test_bf16_quotient_by_the_reciprocal_is_the_division():
    # The prologue's bf16 rule (fp8._quantize_chunk, BF16_RCP): bf16(fp32(v · fp32(1/s))) ==
    # bf16(fp32(v / s)) for bf16 v and s, checked for every pair of significands (v from 0 up
    # through subnormals, s normal) at several exponent gaps, in torch's own arithmetic.
    v = torch.arange(0, 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)   # every v >= 0
    v = v[torch.isfinite(v)]
    s_sig = torch.arange(128, 256, dtype=torch.float32) / 128          # the 128 normal significands
    for e in (-125, -60, -7, 0, 9, 60, 119):
        s = (s_sig * 2.0 ** e).to(torch.bfloat16)
        q_div = (v.float()[:, None] / s.float()[None, :]).to(torch.bfloat16)
        q_rcp = (v.float()[:, None] * (1.0 / s.float())[None, :]).to(torch.bfloat16)
        assert torch.equal(q_div.view(torch.int16), q_rcp.view(torch.int16)), f"s exponent {e}"


def test_fp8_bf16_prologue_branches_run_everywhere():
    # The bf16 prologue's two branches, product with 1/s and division, on any device: scales that
    # are powers of two make every quotient exact, so the interpreter's truncating bf16 casts give
    # the reference's bits too. Rows: s = 2^-3 and 2^-124 (the product), 2^-126 (below 2^-125: the
    # division), each over random values from s to its amax, of either sign. (Subnormal scales
    # and values are checked on the GPU only: the interpreter flushes them to zero.)
    g = gen(93)
    x = (1 + torch.rand(3, K, generator=g) * 447) * torch.sign(torch.rand(3, K, generator=g) - 0.5)
    for row, e in enumerate((-3, -124, -126)):
        x[row] *= 2.0 ** e
        x[row, row] = 448 * 2.0 ** e
    x = x.to(torch.bfloat16).to(DEV)
    xq, s = fp8.quantize_activation_triton(x)
    rq, rs = fp8.quantize_activation(x)
    assert rs[:, 0].float().tolist() == [2.0 ** -3, 2.0 ** -124, 2.0 ** -126]
    assert torch.equal(s, rs[:, 0]) and torch.equal(xq.view(torch.uint8), rq.view(torch.uint8))
    assert (xq.view(torch.uint8) & 0x7F != 0).float().mean() > 0.9, "the rows quantize to non-zero codes"


@pytest.mark.skipif(DEV != "cuda", reason="bf16 casts need the GPU (the interpreter truncates them)")
def test_fp8_bf16_prologue_is_bit_exact_over_wide_ranges():
    # bf16 rows whose amax spans the exponent range (scales 2^-133 to about 2^112), subnormal scales
    # (the division path) included.
    g = gen(77)
    x = torch.randn(512, 1024, generator=g) * 2.0 ** torch.randint(-140, 120, (512, 1), generator=g).float()
    # Row 0: s = 2^-124 (the product's branch) over subnormal values whose quotients are not zero
    # in e4m3 (a multiply that flushed subnormals to zero would lose them), and both zeros.
    x[0] = 0.0
    x[0, :7] = torch.tensor([448 * 2.0 ** -124, 2.0 ** -130, -(2.0 ** -131), 3 * 2.0 ** -133, 2.0 ** -133, 0.0, -0.0])
    x = x.to(torch.bfloat16).to(DEV)
    xq, s = fp8.quantize_activation_triton(x)
    rq, rs = fp8.quantize_activation(x)
    assert rs[0, 0].float().item() == 2.0 ** -124 and (rq[0, 1:5].view(torch.uint8) & 0x7F != 0).all()
    assert (rs[:, 0].float() < 2.0 ** -125).any() and (rs[:, 0].float() > 1.0).any()
    assert torch.equal(s, rs[:, 0]) and torch.equal(xq.view(torch.uint8), rq.view(torch.uint8))


def test_fp8_launch_decisions(monkeypatch):
    # fp8.launch's choices, recorded on any device: the prologue's warps (PRO_WARPS) and PDL come
    # from the tile (the default tiles: PDL up to bucket 64; 4 warps from bucket 4096, M = 3000
    # included), a tile without them running plain; PDL only where the device has it. With PDL the prologue
    # releases its dependent and the product waits; the product is passed PDL_PREFETCH_LINES either
    # way (launch_tma prefetches only with the wait). Up to 64 rows the kernels run as usual
    # (without PDL, which the interpreter lacks) and are checked against the reference; beyond,
    # the calls are only recorded.
    g = gen(95)
    w = fp8_weight(g, torch.float16, True)
    seen = {}
    real_quantize, real_product, real_features = fp8.quantize_activation_triton, fp8.launch_product, common.device_features

    def quantize(x, plan=None, release=False):
        seen.update(release=release, warps=plan.warps)
        if x.shape[0] > 64:
            return (torch.zeros(x.shape, dtype=fp8.FP8_DTYPE, device=x.device),
                    torch.ones(x.shape[0], dtype=x.dtype, device=x.device))
        return real_quantize(x, plan, False)

    def product(xq, xs, w_, y, tile, wait=False, prefetch=0, glu=False):
        seen.update(wait=wait, prefetch=prefetch, glu=glu)
        if xq.shape[0] <= 64:
            real_product(xq, xs, w_, y, tile)
    monkeypatch.setattr(fp8, "quantize_activation_triton", quantize)
    monkeypatch.setattr(fp8, "launch_product", product)

    def check(M, tile, release, warps, supported=True):
        feats = dataclasses.replace(real_features(torch.device(DEV)), pdl=supported)
        monkeypatch.setattr(common, "device_features", lambda device: feats)
        seen.clear()
        x = torch.randn(M, K, generator=g).half().to(DEV)
        y = fp8.launch(x, w, tile)
        if M <= 64:
            assert_close(y, fp8.reference_linear(x, w))
        assert seen == dict(release=release, wait=release, prefetch=gemm.PDL_PREFETCH_LINES, warps=warps,
                            glu=False), \
            (M, tile, seen)
    own = fp8.prologue_plan(K).warps   # the plan's own warps (1 at K = 256)
    assert own not in (2, 8, fp8.PROLOGUE_LARGE_WARPS)
    # Tiles without the knobs (hand-written): the plan's own warps, no PDL, at any M.
    check(4, TILED, False, own)
    check(3000, TILED, False, own)
    # The tile's knobs, whatever M is (the tile is its bucket's); one missing: its plain value.
    check(4, dict(TILED, PDL=0, PRO_WARPS=0), False, own)
    check(100, dict(TILED, PDL=1, PRO_WARPS=2), True, 2)
    check(3000, dict(TILED, PDL=0, PRO_WARPS=0), False, own)
    check(3000, dict(TILED, PRO_WARPS=8), False, 8)
    check(5, dict(TILED, PDL=1), True, own)
    # The default tiles of M's row bucket: M = 3000 lies in bucket 4096 and takes its warps.
    for M, release, warps in ((64, True, own), (65, False, own), (2048, False, own),
                              (3000, False, fp8.PROLOGUE_LARGE_WARPS)):
        check(M, fp8.default_tile(fp8.problem(w, bucket_for(M), torch.float16)), release, warps)
    # PDL in the tile on a device without it: off, no error.
    check(4, dict(TILED, PDL=1, PRO_WARPS=0), False, own, supported=False)


def test_fp8_tiles_carry_the_prologue_knobs_by_bucket():
    # default_tile sets PRO_WARPS and PDL from the row bucket, device-independently; every tile of
    # the search space carries them, the default's variants (other warps from bucket 1024, PDL
    # flipped at 128-256) come last, and a 16-candidate sweep times the last of them.
    w = fp8_weight(gen(94), torch.float16, False)
    for M, warps, pdl in ((1, 0, 1), (64, 0, 1), (65, 0, 0), (2048, 0, 0), (2049, 4, 0), (3000, 4, 0), (9000, 4, 0)):
        d = fp8.default_tile(fp8.problem(w, bucket_for(M), torch.float16))
        assert (d["PRO_WARPS"], d["PDL"]) == (warps, pdl), M
        assert fp8.tile_prologue(d, K) == (fp8.prologue_plan(K, warps or None), bool(pdl))
    assert fp8.tile_prologue({}, K) == (fp8.prologue_plan(K), False), "a tile without the knobs runs plain"
    for (Nx, Kx), b, variants in (((37, 256), 1024, [dict(PRO_WARPS=8), dict(PRO_WARPS=4)]),
                                  ((37, 256), 4096, [dict(PRO_WARPS=0), dict(PRO_WARPS=8)]),
                                  ((10240, 5120), 1024, [dict(PRO_WARPS=4)]),     # the plan's own: 8 warps
                                  ((10240, 5120), 8192, [dict(PRO_WARPS=8)]),
                                  ((5120, 17408), 4096, [dict(PRO_WARPS=0), dict(PRO_WARPS=8)]),   # 16, 8
                                  ((10240, 5120), 128, [dict(PDL=1)]), ((10240, 5120), 256, [dict(PDL=1)]),
                                  ((10240, 5120), 64, []), ((10240, 5120), 512, []), ((10240, 5120), 1, [])):
        p = Problem(N=Nx, K=Kx, bucket=b, act_dtype=torch.bfloat16, params=w.params())
        space, d = fp8.search_space(p), fp8.default_tile(p)
        assert space[0] == d and all(c["PRO_WARPS"] == d["PRO_WARPS"] and c["PDL"] == d["PDL"]
                                     for c in space[:len(space) - len(variants)])
        assert space[len(space) - len(variants):] == [dict(d, **v) for v in variants], (Nx, Kx, b)
        if variants and Nx > 37:
            assert space[-1] in candidates(space, 16, fp8.TEMPLATE.pick_group)


def test_launch_tma_prefetches_only_with_wait(monkeypatch):
    # The one gate of the weight-row prefetch (fp8.launch passes its `prefetch` through): the TMA
    # kernel gets PREFETCH only when launched as a programmatic dependent (recorded, not run).
    calls = []
    monkeypatch.setattr(gemm, "tma_gemm_kernel", KernelSpy(calls))
    w = fp8_weight(gen(98), torch.float16, False)
    xq = fp8.e4m3_rne(torch.randn(8, K, generator=gen(99))).to(DEV)
    y = torch.empty(8, N, dtype=torch.float16, device=DEV)
    for wait in (False, True):
        gemm.launch_tma(xq, w.weight, y, dict(TMA, BLOCK_K=128), owner=w, wait=wait, prefetch=4)
    # launch_pdl is named only when set: ROCm's Triton refuses a launch naming it (common.pdl_option)
    assert [(kw["WAIT"], kw["PREFETCH"], kw.get("launch_pdl", "absent")) for _, _, kw in calls] == [
        (False, 0, "absent"), (True, 4, True)]


def test_gemv_and_tiled_launches_name_launch_pdl_only_when_waiting(monkeypatch):
    # common.pdl_option on gemm.py's other two launch sites (ROCm's Triton refuses the option by
    # name, False included). Recorded, not run.
    calls = []
    monkeypatch.setattr(gemm, "gemv_kernel", KernelSpy(calls, "gemv"))
    monkeypatch.setattr(gemm, "tiled_gemm_kernel", KernelSpy(calls, "tiled"))
    w = torch.randn(N, K, generator=gen(95)).half().to(DEV)
    for wait in (False, True):
        gemm.launch_gemv(torch.randn(1, K, generator=gen(94)).half().to(DEV), w,
                         torch.empty(1, N, dtype=torch.float16, device=DEV), dict(TILED, BLOCK_M=1), wait=wait)
        gemm.launch_tiled(torch.randn(8, K, generator=gen(93)).half().to(DEV), w,
                          torch.empty(8, N, dtype=torch.float16, device=DEV), TILED, wait=wait)
    assert [(name, kw.get("launch_pdl", "absent")) for name, _, kw in calls] == [
        ("gemv", "absent"), ("tiled", "absent"), ("gemv", True), ("tiled", True)]


def test_streamk_reduction_runs_only_for_leftover_tiles_launched_as_usual(monkeypatch):
    # The reduction kernel runs once per leftover tile (x row chunks), only when tiles are left
    # over for it, and never as the product's programmatic dependent (that form lost, H200 run
    # 18), even where the product is one itself (wait: after fp8's prologue). Recorded, not run.
    calls = []
    monkeypatch.setattr(gemm, "tma_streamk_kernel", KernelSpy(calls, "product"))
    monkeypatch.setattr(gemm, "streamk_reduce_kernel", KernelSpy(calls, "reduce"))
    monkeypatch.setattr(gemm, "multiprocessors", lambda device: 3)
    w = fp8_weight(gen(97), torch.float16, False)
    tile = dict(TMA, path="tma-sk", BLOCK_K=128)   # 32x32 tiles: N=37 makes 2 column blocks
    for wait in (False, True):   # the product as a dependent itself (after fp8's prologue) or not
        for M in (40, 20, 70):   # 4 tiles on 3 programs: 1 left over; 2 tiles, both; 6 tiles, none
            xq = fp8.e4m3_rne(torch.randn(M, K, generator=gen(M))).to(DEV)
            gemm.launch_tma(xq, w.weight, torch.empty(M, N, dtype=torch.float16, device=DEV), tile, owner=w, wait=wait)
    seen = [(name, grid, kw.get("launch_pdl"), kw.get("WAIT")) for name, grid, kw in calls]
    assert seen == [step for wait in (False, True) for step in (
        ("product", (3,), wait or None, wait), ("reduce", (1, 2), None, None),
        ("product", (3,), wait or None, wait), ("reduce", (2, 2), None, None),
        ("product", (3,), wait or None, wait))], seen
    assert all("RELEASE" not in kw for name, _, kw in calls if name == "reduce")


def test_fp8_prologue_refuses_a_short_plan():
    g = gen(96)
    x = torch.randn(2, K, generator=g).half().to(DEV)
    with pytest.raises(ValueError, match="covers 192 of the row's 256 columns"):
        fp8.quantize_activation_triton(x, plan=fp8.ProloguePlan(128, 64, False, 1))


@triton.jit
def _e4m3_encode_kernel(v_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    v = tl.load(v_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + offs, common.e4m3_encode(v), mask=offs < n)


@triton.jit
def _e4m3_decode_kernel(c_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, common.e4m3_decode(tl.load(c_ptr + offs)))


def test_e4m3_decode_gives_torchs_value_of_every_code():
    # All 256 codes, the NaN pair (0x7F, 0xFF) included, against torch's cast of the same bits.
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    ref = codes.view(fp8.FP8_DTYPE).float()
    out = torch.full((256,), 7.0, device=DEV)
    _e4m3_decode_kernel[(1,)](codes.to(DEV), out, BLOCK=256)
    assert ref[0x7F].isnan() and ref[0xFF].isnan()
    torch.testing.assert_close(out.cpu(), ref, rtol=0, atol=0, equal_nan=True)


def test_e4m3_encode_gives_torchs_codes_and_0x7f_for_nan():
    # Every e4m3 value, the midpoints between neighbours (ties to even), points just either side
    # of them, the subnormal range, zero of either sign and random values within ±448.
    vals = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fp8.FP8_DTYPE).float()
    vals = vals[vals.isfinite()].unique()
    mids = (vals[1:] + vals[:-1]) / 2
    g = gen(97)
    finite = torch.cat([vals, mids, mids * (1 + 2**-12), mids * (1 - 2**-12), torch.tensor([0.0, -0.0]),
                        torch.linspace(-2**-5, 2**-5, 301), (torch.rand(2000, generator=g) * 2 - 1) * 448])
    v = torch.cat([finite, torch.tensor([float("nan"), -float("nan")])])
    out = torch.empty(v.numel(), dtype=torch.uint8, device=DEV)
    _e4m3_encode_kernel[(1,)](v.to(DEV), out, v.numel(), BLOCK=common.next_pow2(v.numel()))
    out = out.cpu()
    n = finite.numel()
    assert torch.equal(out[:n], finite.to(fp8.FP8_DTYPE).view(torch.uint8))
    assert out[n:].tolist() == [0x7F, 0x7F]


def test_device_features_are_read_once_per_device(monkeypatch):
    # CPU (the interpreter): nothing NVIDIA's. CUDA devices, faked here: pdl from sm_90, the
    # hardware e4m3 conversion from sm_89, none on ROCm; an index-less "cuda" is the current device.
    cpu = common.device_features(torch.device("cpu"))
    assert cpu == common.DeviceFeatures(nvidia=False, capability=None, pdl=False, hardware_e4m3=False)
    assert common.device_features(torch.device("cpu")) is cpu and not common.pdl_supported(torch.device("cpu"))
    reads = []
    caps = {7: (8, 9), 8: (9, 0), 9: (8, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: reads.append(d.index) or caps[d.index])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 8)
    monkeypatch.setattr(torch.version, "hip", None)
    smem = {7: 101376, 8: 232448, 9: 166912}
    smem_reads = []
    monkeypatch.setattr(common, "_max_shared_memory", lambda d: smem_reads.append(d.index) or smem[d.index])
    common._device_features.cache_clear()
    try:
        ada, hopper, ampere = (common.device_features(torch.device("cuda", i)) for i in (7, 8, 9))
        assert (ada.pdl, ada.hardware_e4m3, hopper.pdl, hopper.hardware_e4m3) == (False, True, True, True)
        assert (ada.shared_memory, hopper.shared_memory, ampere.shared_memory) == (101376, 232448, 166912)
        assert cpu.shared_memory is None
        assert ampere.nvidia and not ampere.pdl and not ampere.hardware_e4m3 and ampere.capability == (8, 0)
        assert common.device_features(torch.device("cuda")) is hopper and common.pdl_supported(torch.device("cuda"))
        assert reads == [7, 8, 9] and smem_reads == [7, 8, 9], "one read per device"
        monkeypatch.setattr(torch.version, "hip", "6.0")
        common._device_features.cache_clear()
        rocm = common.device_features(torch.device("cuda", 8))
        assert not (rocm.nvidia or rocm.pdl or rocm.hardware_e4m3)
    finally:
        common._device_features.cache_clear()


def test_fp8_scale_rule_on_cuda_is_the_reciprocal_product():
    # torch on CUDA divides by a Python number as a product with the fp32 reciprocal; the kernel's
    # RECIPROCAL switch reproduces it (checked on CPU through the interpreter, where torch divides).
    amax = torch.tensor([13.937500762939453, 0.30273, 447.99], dtype=torch.float32)
    prod = (amax * (torch.tensor(1.0) / 448.0)).float()
    assert not torch.equal(prod, amax / 448.0), "a value where the two rules differ"
    x = torch.zeros(3, 16)
    x[:, 0] = amax
    hw = common.device_features(torch.device(DEV)).hardware_e4m3
    xq = torch.empty((3, 16), dtype=fp8.FP8_DTYPE if hw else torch.uint8, device=DEV)
    s = torch.empty(3, device=DEV)
    fp8._act_quant_kernel[(3,)](x.to(DEV), xq, s, 16, 16, 1e-7, BLOCK_A=16, BLOCK_B=0, CHUNKED=False,
                                RECIPROCAL=True, HW_CVT=hw, RELEASE=False, BF16_RCP=False)
    assert torch.equal(s.cpu(), prod)
