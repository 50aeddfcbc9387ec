"""Every Triton template against its pure-torch reference, on small shapes.

Without a GPU these run under the Triton interpreter (tests/conftest.py), whose bf16
tl.dot is wrong: activations here are fp16 and fp32. Shapes: N odd (37), K a multiple
of the int4 group and of 16, row counts in buckets 1, 8 and 64 (split-K paths) plus an
explicit tiled tile. Outputs are pre-filled with NaN so an unwritten element fails.
"""
from __future__ import annotations

import dataclasses

import types

import pytest
import torch
import triton
import triton.language as tl

from vsr.autotune.buckets import bucket_for
from vsr.autotune.tuner import FP8_OPERAND_TOLERANCE, TOLERANCES, candidates, same_bytes
from vsr.kernels import common, dense, fp8, gemm, gemm_tiles, int4, nvfp4, registry
from vsr.kernels.template import Problem

DEV = "cuda" if torch.cuda.is_available() else "cpu"
N, K = 37, 256
# (rtol, atol as a fraction of max|ref|) per output dtype: the kernels differ from the
# references only in the order of fp32 sums (and, for fp8, not at all in the quantization).
# The tuner's own bounds: a tile that passes here passes the tuner's reference check.
TOL = TOLERANCES
ROWS = (1, 5, 40)          # buckets 1, 8, 64
TILED = {"path": "tiled", "BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": 1, "GROUP_M": 2,
         "num_warps": 4, "num_stages": 2}


def gen(seed):
    return torch.Generator().manual_seed(seed)


# Hopper's fp8 tensor cores accumulate in reduced precision inside a tl.dot (as _scaled_mm
# with use_fast_accum does): on a GPU, fp8 products meet fp16-level tolerances, not fp32's.
FP8_GPU_TOL = FP8_OPERAND_TOLERANCE


def assert_close(y, ref, tol=None):
    assert y.shape == ref.shape and y.dtype == ref.dtype
    assert not torch.isnan(y).any(), "kernel left unwritten (NaN-poisoned) outputs"
    rtol, atol = tol or TOL[ref.dtype]
    scale = ref.float().abs().max().item()
    assert scale > 0
    err = (y.float() - ref.float()).abs()
    bound = atol * scale + rtol * ref.float().abs()
    assert (err <= bound).all(), f"max error {err.max().item():.3g} (max |ref| {scale:.3g})"


def run(template_launch, x, w, tile):
    out = torch.full((x.shape[0], w.N), float("nan"), dtype=x.dtype, device=x.device)
    y = template_launch(x, w, tile, out=out)
    assert y.data_ptr() == out.data_ptr()
    return y


# --- dense -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("M", ROWS)
@pytest.mark.parametrize("bias", [True, False])
def test_dense_matches_reference(dtype, M, bias):
    g = gen(M * 7 + bias)
    w = dense.DenseWeight(torch.randn(N, K, generator=g).to(dtype),
                          torch.randn(N, generator=g).to(dtype) if bias else None).to(DEV)
    x = torch.randn(M, K, generator=g).to(dtype).to(DEV)
    tile = dense.default_tile(dense.problem(w, bucket_for(M), dtype))
    assert_close(run(dense.launch, x, w, tile), dense.reference_linear(x, w))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("Kx,bias", [(256, True), (200, False)])   # 200: a masked tail in the last step
def test_dense_gemv_path(dtype, Kx, bias):
    g = gen(41 + Kx + bias)
    w = dense.DenseWeight(torch.randn(N, Kx, generator=g).to(dtype),
                          torch.randn(N, generator=g).to(dtype) if bias else None).to(DEV)
    x = torch.randn(1, Kx, generator=g).to(dtype).to(DEV)
    tiles = [t for t in dense.search_space(dense.problem(w, 1, dtype)) if t["path"] == "gemv"]
    assert tiles, "bucket 1 offers the GEMV"
    for tile in tiles[:2]:
        assert_close(run(dense.launch, x, w, dict(tile, BLOCK_K=64)), dense.reference_linear(x, w))


def test_f32_precision_by_dtype_and_device():
    assert common.f32_precision(torch.zeros(1, dtype=torch.bfloat16)) == ""
    assert common.f32_precision(torch.zeros(1, dtype=torch.float16)) == ""
    assert common.f32_precision(torch.zeros(1)) == "ieee"   # the CPU (the interpreter)
    if torch.cuda.is_available():
        want = "ieee" if torch.version.hip else "tf32x3"
        assert common.f32_precision(torch.zeros(1, device="cuda")) == want


def test_dense_fp32_is_not_plain_tf32():
    # Values whose products need more than tf32's 10 mantissa bits: a plain tf32 product would be
    # off by ~1e-3, an IEEE or tf32x3 one (common.f32_precision) by under 1e-6.
    g = gen(3)
    w = dense.DenseWeight((1 + torch.rand(N, K, generator=g) * 2 ** -12).float()).to(DEV)
    x = (1 + torch.rand(4, K, generator=g) * 2 ** -12).float().to(DEV)
    y = dense.launch(x, w, dense.default_tile(dense.problem(w, 4, torch.float32)))
    ref = (x.double() @ w.weight.double().t())
    assert ((y.double() - ref).abs() / ref.abs()).max().item() < 1e-6


def test_dense_tiled_path_and_uneven_k():
    g = gen(4)
    Kodd = 200  # not a multiple of BLOCK_K: masked tail
    w = dense.DenseWeight(torch.randn(N, Kodd, generator=g).half(), torch.randn(N, generator=g).half()).to(DEV)
    x = torch.randn(40, Kodd, generator=g).half().to(DEV)
    assert_close(run(dense.launch, x, w, TILED), dense.reference_linear(x, w))
    split = dict(TILED, SPLIT_K=3)
    assert_close(run(dense.launch, x, w, split), dense.reference_linear(x, w))


@pytest.mark.parametrize("fmt", ["dense", "fp8"])
def test_128_row_split_k_tiles_of_bucket_128(fmt):
    # The dense and fp8 spaces' split-K tiles over all 128 rows (gemm_tiles.gemm_space, bucket 128),
    # on a product of few 128-column tiles, each against the reference; 100 rows: a partial row tile.
    g = gen(5 + (fmt == "fp8"))
    Nw, Kw = 256, 2048
    if fmt == "dense":
        mod, w = dense, dense.DenseWeight(torch.randn(Nw, Kw, generator=g).half(), torch.randn(Nw, generator=g).half())
    else:
        mod, w = fp8, fp8.Fp8Weight(fp8.e4m3_rne(torch.randn(Nw, Kw, generator=g) * 40),
                                    (torch.rand(Nw, generator=g) * 0.01 + 1e-3).half(), torch.randn(Nw, generator=g).half())
    w = w.to(DEV)
    x = torch.randn(100, Kw, generator=g).half().to(DEV)
    tiles = [t for t in mod.search_space(mod.problem(w, 128, torch.float16)) if t["path"] == "splitk" and t["BLOCK_M"] == 128]
    assert {(t["BLOCK_K"], t["SPLIT_K"]) for t in tiles} == {(64, 8), (64, 16), (128, 4), (128, 8)}, tiles
    for tile in tiles:
        assert_close(run(mod.launch, x, w, tile), mod.reference_linear(x, w))


TMA = dict(TILED, path="tma")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_dense_tma_path_with_a_misaligned_activation_view(dtype):
    # x starts 2 or 4 bytes past an aligned address: the launcher copies it once rather than
    # hand a misaligned base to the copy engine (or switch paths behind the tile's back).
    g = gen(21)
    w = dense.DenseWeight(torch.randn(N, K, generator=g).to(dtype), torch.randn(N, generator=g).to(dtype)).to(DEV)
    flat = torch.randn(40 * K + 1, generator=g).to(dtype).to(DEV)
    x = flat[1:].view(40, K)
    assert x.data_ptr() % 16 != 0
    tile = dict(TMA, BLOCK_K=32 if dtype == torch.float32 else 64)
    assert_close(run(dense.launch, x, w, tile), dense.reference_linear(x, w))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("bias", [True, False])
def test_dense_wide_tma_tiles_cover_every_output(dtype, bias, monkeypatch):
    # Wide tiles (BLOCK_N2: BLOCK_N + BLOCK_N2 weight rows per program, two products): N = 77 makes
    # a second tile whose second block lies wholly past N (zero-filled, never stored) and rows
    # 20 two row blocks; every output written (poisoned) by a grid of wide tiles (the spy).
    calls = []
    monkeypatch.setattr(gemm, "tma_gemm_kernel", KernelSpy(calls, real=gemm.tma_gemm_kernel))
    g = gen(160)
    w = dense.DenseWeight(torch.randn(77, K, generator=g).to(dtype),
                          torch.randn(77, generator=g).to(dtype) if bias else None).to(DEV)
    x = torch.randn(20, K, generator=g).to(dtype).to(DEV)
    for bn, bn2 in ((32, 16), (16, 32)):
        tile = dict(TMA, BLOCK_M=16, BLOCK_N=bn, BLOCK_N2=bn2, BLOCK_K=32 if dtype == torch.float32 else 64)
        assert_close(run(dense.launch, x, w, tile), dense.reference_linear(x, w))
        assert calls[-1][1] == (2 * 2,) and calls[-1][2]["BLOCK_N2"] == bn2   # 2 row blocks x 2 of 48 rows


@pytest.mark.parametrize("fmt", ["fp8", "int4 dequant-tma"])
def test_fp8_and_int4_dequant_wide_tiles_cover_every_output(fmt, monkeypatch):
    # The other templates whose TMA tiles reach launch_tma take the wide form too (fp8's product
    # with its scales, int4's transient dense copy); N = 37 ends inside the second block.
    calls = []
    monkeypatch.setattr(gemm, "tma_gemm_kernel", KernelSpy(calls, real=gemm.tma_gemm_kernel))
    g = gen(162)
    x = torch.randn(20, K, generator=g).half().to(DEV)
    if fmt == "fp8":
        w, launch, ref = fp8_weight(g, torch.float16, True), fp8.launch, fp8.reference_linear
        tile = dict(TMA, BLOCK_M=16, BLOCK_N=32, BLOCK_N2=16, BLOCK_K=128)
    else:
        w, launch, ref = int4_weight(g, 64, False, False, True), int4.launch, int4.reference_linear
        tile = dict(TMA, path="dequant-tma", BLOCK_M=16, BLOCK_N=32, BLOCK_N2=16, BLOCK_K=64)
    assert_close(run(launch, x, w, tile), ref(x, w))
    assert calls[-1][1] == (2,) and calls[-1][2]["BLOCK_N2"] == 16


def test_wide_tiles_only_where_the_kernel_has_them():
    g = gen(161)
    w = dense.DenseWeight(torch.randn(N, K, generator=g).half()).to(DEV)
    x = torch.randn(5, K, generator=g).half().to(DEV)
    for tile in (dict(TILED, BLOCK_N2=16), dict(TMA, path="tma-sk", BLOCK_N2=16),
                 dict(TMA, path="tma-swap", BLOCK_N2=16), dict(TMA, BLOCK_N2=16, PERSISTENT=1),
                 dict(TMA, path="dequant-tma", BLOCK_N2=16)):   # int4's wide path, not dense's
        with pytest.raises(ValueError, match="BLOCK_N2"):
            dense.launch(x, w, tile)
    # int4's wide tiles are its transient dense product's ("dequant-tma"): a "tma" one is refused.
    with pytest.raises(ValueError, match="BLOCK_N2"):
        int4.launch(x, int4_weight(g, 128, True, False, False, torch.float16), dict(TMA, BLOCK_N2=16))
    # The dense and fp8 spaces offer them at buckets 128-2048 only and int4's at 256-2048 (its
    # transient dense copy's), as one-tile-per-program TMA tiles.
    spaces = {"dense": (dense, w), "fp8": (fp8, fp8_weight(g, torch.bfloat16, False)),
              "int4": (int4, int4_weight(g, 128, True, False, False, torch.bfloat16))}
    for name, (mod, wt) in spaces.items():
        for bucket in (64, 128, 256, 512, 1024, 2048):
            wide = [t for t in mod.search_space(mod.problem(wt, bucket, torch.bfloat16)) if t.get("BLOCK_N2")]
            offered = (256, 512, 1024, 2048) if name == "int4" else (128, 256, 512, 1024, 2048)
            assert bool(wide) == (bucket in offered), (name, bucket)
            assert all(t["path"] in ("tma", "dequant-tma") and not t.get("PERSISTENT") for t in wide)


def test_weight_descriptor_is_built_once_per_weight_and_tile():
    g = gen(23)
    w = dense.DenseWeight(torch.randn(N, K, generator=g).half()).to(DEV)
    x = torch.randn(40, K, generator=g).half().to(DEV)
    tile = dict(TMA, BLOCK_K=64)
    first = run(dense.launch, x, w, tile)
    cached = dict(w._tma_descriptors)
    assert len(cached) == 1
    assert torch.equal(run(dense.launch, x, w, tile), first)
    assert w._tma_descriptors == cached and all(w._tma_descriptors[k] is v for k, v in cached.items())
    run(dense.launch, x, w, dict(tile, BLOCK_N=64))                # another block shape: its own descriptor
    assert len(w._tma_descriptors) == 2
    w2 = dense.DenseWeight(w.weight.clone())                       # a new weight object: nothing shared
    assert_close(run(dense.launch, x, w2, tile), dense.reference_linear(x, w2))
    assert len(w2._tma_descriptors) == 1
    # a SwiGLU product reads the [2, N / 2, K] view alone: one descriptor, not the plain one too
    w3 = dense.DenseWeight(w.weight[: N // 2 * 2].clone())
    dense.launch(x, w3, tile, glu=True)
    assert [k[1] for k in w3._tma_descriptors] == [(2, N // 2, K)]


SWAP = dict(TMA, path="tma-swap", BLOCK_M=16, BLOCK_N=32, BLOCK_K=64)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("M,split,bias,bm", [(1, 1, True, 16), (5, 3, False, 16), (20, 2, True, 16),
                                             (27, 1, False, 32), (40, 2, True, 32)])
def test_dense_tma_swap_path(dtype, M, split, bias, bm):
    # The transposed TMA product: rows past M (zero-filled by the copy engine), an odd N, a K
    # split into 3 parts of 2 BLOCK_K tiles (the last one short), two row blocks at M=20 and 40;
    # 32 rows of x (bucket 32's candidates) at M=27 and 40.
    g = gen(31 + M + split)
    w = dense.DenseWeight(torch.randn(N, K + 64 * (split == 3), generator=g).to(dtype),
                          torch.randn(N, generator=g).to(dtype) if bias else None).to(DEV)
    x = torch.randn(M, w.K, generator=g).to(dtype).to(DEV)
    tile = dict(SWAP, BLOCK_M=bm, SPLIT_K=split, BLOCK_K=32 if dtype == torch.float32 else 64)
    assert_close(run(dense.launch, x, w, tile), dense.reference_linear(x, w))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_dense_persistent_tma_tile(dtype, monkeypatch):
    # 4 output tiles (2 x 2) on 3 programs: one program walks two.
    monkeypatch.setattr(gemm, "multiprocessors", lambda device: 3)
    g = gen(32)
    w = dense.DenseWeight(torch.randn(N, K, generator=g).to(dtype), torch.randn(N, generator=g).to(dtype)).to(DEV)
    x = torch.randn(40, K, generator=g).to(dtype).to(DEV)
    tile = dict(TMA, BLOCK_K=32 if dtype == torch.float32 else 64, PERSISTENT=1)
    y = run(dense.launch, x, w, tile)
    assert_close(y, dense.reference_linear(x, w))
    if DEV == "cuda":   # same tile, one program per output tile: the same bytes
        assert torch.equal(y, run(dense.launch, x, w, dict(tile, PERSISTENT=0)))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("programs,M,Kx,bias", [(3, 40, K, True), (4, 70, K, False), (7, 33, 264, True),
                                               (64, 5, K, False), (2, 40, 264, False), (64, 20, K, True)])
def test_dense_streamk_tma_tile(dtype, programs, M, Kx, bias, monkeypatch):
    # "tma-sk": whole waves of 32x32 tiles (2 column blocks of N=37) per program, the leftover
    # tiles' K steps shared out; 40 rows on 3 programs: 4 tiles, 1 left over; 70 rows on 4: 6
    # tiles, 2 left over; 33 rows on 7: 4 tiles, all shared, K=264 ending in a part step (5 of
    # 64 columns, 9 of 32 in fp32); 5 rows on 64: 2 tiles of 4 (fp32: 8) K steps for 64
    # programs, most of which get none; 40 rows on 2: whole waves only, no reduction; 20 rows on
    # 64: one row block, whose 20 rows take two of the reduction's 16-row programs (the second
    # holding 4 live rows).
    monkeypatch.setattr(gemm, "multiprocessors", lambda device: programs)
    g = gen(33)
    w = dense.DenseWeight(torch.randn(N, Kx, generator=g).to(dtype),
                          torch.randn(N, generator=g).to(dtype) if bias else None).to(DEV)
    x = torch.randn(M, Kx, generator=g).to(dtype).to(DEV)
    tile = dict(TMA, path="tma-sk", BLOCK_K=32 if dtype == torch.float32 else 64)
    y = run(dense.launch, x, w, tile)
    assert_close(y, dense.reference_linear(x, w))
    assert torch.equal(y, run(dense.launch, x, w, tile)), "the same tile and device give the same bytes"


def test_tma_tile_refuses_unaligned_rows():
    g = gen(22)
    w = dense.DenseWeight(torch.randn(N, 100, generator=g).half()).to(DEV)   # 200-byte rows
    x = torch.randn(4, 100, generator=g).half().to(DEV)
    with pytest.raises(ValueError, match="needs K·bytes % 16 == 0"):
        dense.launch(x, w, TMA)
    d = dense.default_tile(dense.problem(w, 64, torch.float16))
    assert d["path"] == "tiled", "the default tile of such a layer takes pointer loads"
    assert_close(run(dense.launch, x, w, d), dense.reference_linear(x, w))


# --- fp8 ---------------------------------------------------------------------------------

def fp8_weight(g, dtype, bias):
    return fp8.Fp8Weight(fp8.e4m3_rne(torch.randn(N, K, generator=g) * 40),
                         (torch.rand(N, generator=g) * 0.01 + 1e-3).to(dtype),
                         torch.randn(N, generator=g).to(dtype) if bias else None).to(DEV)


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


# The interpreter rounds fp32 -> bf16 casts toward zero (Triton 3.9: 200.86 -> 200, not 201), so
# bf16 bit-exactness is checked where the kernels really run, on the GPU.
BF16_ON_GPU = pytest.param(torch.bfloat16, marks=pytest.mark.skipif(
    DEV != "cuda", reason="the Triton interpreter truncates fp32 -> bf16 casts; checked on the GPU"))


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


class KernelSpy:
    """Stands in for a @triton.jit kernel: each launch, kernel[grid](*args, **kw), is appended to
    `calls` as (name, grid, kw), and not run, or run by `real` when given."""

    def __init__(self, calls: list, name: str = "", real=None):
        self.calls, self.name, self.real = calls, name, real

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.calls.append((self.name, grid, kw))
            if self.real is not None:
                return self.real[grid](*args, **kw)
        return launch


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


# --- int4 --------------------------------------------------------------------------------

def int4_weight(g, G, symmetric, act_order, bias, dtype=torch.float16, Kx=K):
    """A random int4 weight [N, Kx] with groups of G (the last one partial when G does not divide Kx)."""
    KG = -(-Kx // G)
    u = torch.randint(0, 16, (N, Kx), generator=g, dtype=torch.int32)
    scale = (torch.rand(N, KG, generator=g) * 0.05 + 1e-3).to(dtype)
    zp = None if symmetric else torch.randint(0, 16, (N, KG), generator=g, dtype=torch.int32)
    perm = torch.randperm(Kx, generator=g) if act_order else None
    b = torch.randn(N, generator=g).to(dtype) if bias else None
    return int4.Int4Weight(int4.pack_int4(u), scale, Kx, G, zp, perm, b).to(DEV)


@pytest.mark.parametrize("symmetric,act_order", [(True, False), (True, True), (False, False)])
@pytest.mark.parametrize("M", ROWS)
def test_int4_matches_reference(symmetric, act_order, M):
    g = gen(200 + M + 3 * symmetric + act_order)
    w = int4_weight(g, 64, symmetric, act_order, bias=M != 5)
    x = torch.randn(M, K, generator=g).half().to(DEV)
    tile = int4.default_tile(int4.problem(w, bucket_for(M), torch.float16))
    assert_close(run(int4.launch, x, w, tile), int4.reference_linear(x, w))


@pytest.mark.parametrize("path", ["splitk", "gemv", "dequant"])
def test_int4_fp32_activations_every_path(path):
    g = gen(16)
    w = int4_weight(g, 64, False, False, bias=True, dtype=torch.float32)
    M = 1 if path == "gemv" else 6
    x = torch.randn(M, K, generator=g).float().to(DEV)
    tile = dict(TILED, path=path, SPLIT_K=2 if path == "splitk" else 1, BLOCK_M=1 if path == "gemv" else 32)
    assert_close(run(int4.launch, x, w, tile), int4.reference_linear(x, w))


@pytest.mark.parametrize("symmetric,act_order", [(True, False), (False, True)])
@pytest.mark.parametrize("split", [1, 3])
def test_int4_swap_path(symmetric, act_order, split):
    g = gen(60 + split + 2 * symmetric)
    w = int4_weight(g, 64, symmetric, act_order, bias=split == 1)
    x = torch.randn(5, K, generator=g).half().to(DEV)
    tile = dict(TILED, path="swap", BLOCK_M=16, SPLIT_K=split)
    assert_close(run(int4.launch, x, w, tile), int4.reference_linear(x, w))


def test_int4_swap_path_uneven_k_and_fp32():
    g = gen(66)
    Kodd = 196               # a partial last word, a masked last BLOCK_K step
    w = int4_weight(g, 32, False, False, True, torch.float32, Kx=Kodd)
    x = torch.randn(3, Kodd, generator=g).float().to(DEV)
    tile = dict(TILED, path="swap", BLOCK_M=16, BLOCK_K=32, SPLIT_K=2)
    assert_close(run(int4.launch, x, w, tile), int4.reference_linear(x, w))


SLICES = dict(TILED, path="slices", BLOCK_M=16, BLOCK_N=32, BLOCK_K=128)


@pytest.mark.parametrize("dtype", [torch.float16, BF16_ON_GPU])
@pytest.mark.parametrize("symmetric,act_order", [(True, False), (False, True)])
@pytest.mark.parametrize("M,split,warps", [(1, 1, 4), (5, 2, 4), (40, 1, 4), (70, 2, 4), (1, 2, 2), (40, 1, 2)])
def test_int4_slices_path(dtype, symmetric, act_order, M, split, warps):
    # On NVIDIA GPUs the nibbles convert two at a time in PTX (bf16 from sm_90); under the
    # interpreter, the fp32 twin. M=70 spans two row blocks. 2 warps: mma.sync on Hopper, not wgmma
    # (the interpreter ignores num_warps: those cases test something on a GPU only).
    g = gen(90 + M + split + 2 * symmetric + warps)
    w = int4_weight(g, 128, symmetric, act_order, bias=M != 5, dtype=dtype)
    x = torch.randn(M, K, generator=g).to(dtype).to(DEV)
    tile = dict(SLICES, BLOCK_M=16 if M < 40 else 64, SPLIT_K=split, num_warps=warps)
    assert_close(run(int4.launch, x, w, tile), int4.reference_linear(x, w))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_int4_slices_path_uneven_k(dtype):
    # K = 300: neither whole words nor whole 128-column blocks (x is zero-padded; the last word is
    # partial), three splits of which the last is short; fp32 activations (common.f32_precision).
    g = gen(95)
    Kodd = 300
    w = int4_weight(g, 128, False, False, True, dtype, Kx=Kodd)
    x = torch.randn(3, Kodd, generator=g).to(dtype).to(DEV)
    assert_close(run(int4.launch, x, w, dict(SLICES, SPLIT_K=3)), int4.reference_linear(x, w))


@pytest.mark.parametrize("dtype,M,split,Kx,symmetric,act_order", [
    (torch.float16, 1, 1, K, True, False), pytest.param(torch.bfloat16, 5, 2, K, False, True, marks=BF16_ON_GPU.marks), (torch.float16, 70, 2, K, False, False),
    (torch.float16, 3, 3, 300, True, False), (torch.float32, 2, 1, 300, False, False),
    (torch.float16, 1, 3, 300, False, True), (torch.float32, 1, 2, 300, True, False)])
def test_int4_slices_x_split_reads_x_as_stored(dtype, M, split, Kx, symmetric, act_order, monkeypatch):
    # X_SPLIT: x as stored, each step's block split into its eight slices in registers, instead of
    # the slice-order copy: the same operands in the same order, so the same bytes (a slice taken
    # wrongly fails), and no copy made. K = 300: a partial last word, a masked last block. M <= 2
    # on 16-row tiles: the rows-in-place form (X_ROW: row m's slice j summed in column 8m + j, the
    # eight added up at the end), the same sum in another order: within the reference's tolerance.
    g = gen(130 + M + split)
    w = int4_weight(g, 128, symmetric, act_order, True, dtype, Kx=Kx)
    x = torch.randn(M, Kx, generator=g).to(dtype).to(DEV)
    tile = dict(SLICES, BLOCK_M=16 if M < 40 else 64, SPLIT_K=split)
    copied = run(int4.launch, x, w, tile)
    assert_close(copied, int4.reference_linear(x, w))
    monkeypatch.setattr(int4, "slice_order", lambda *a: pytest.fail("X_SPLIT made the slice-order copy"))
    split_x = run(int4.launch, x, w, dict(tile, X_SPLIT=1))
    if 8 * M <= tile["BLOCK_M"]:   # (test_int4_slices_x_row_reads_its_rows_in_place holds it to the copied form)
        assert_close(split_x, int4.reference_linear(x, w))
    else:
        assert torch.equal(split_x, copied)


@triton.jit
def _x_row_operands_kernel(x_ptr, out_ptr, stride_xm, M, k0, K, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    xs = int4._x_row_slices(x_ptr, stride_xm, M, k0, K, BLOCK_M, BLOCK_K)
    at = out_ptr + tl.arange(0, BLOCK_K // 8)[:, None] * BLOCK_M + tl.arange(0, BLOCK_M)[None, :]
    for j in tl.static_range(8):
        tl.store(at + j * (BLOCK_K // 8) * BLOCK_M, xs[j])


@pytest.mark.parametrize("M,bm,k0,Kx", [(1, 16, 0, 128), (2, 16, 128, 300), (2, 32, 0, 100), (4, 32, 128, 256)])
def test_int4_x_row_operands_take_only_the_rows_and_columns_of_x(M, bm, k0, Kx):
    # X_ROW's eight operands of one step, stored: operand j holds x[m, k0 + 8w + j] at [w, 8m + j]
    # and zeros elsewhere, also where the rows past M and the columns past K hold NaN (a read of
    # them would leave NaN: the kernel's store masks those rows, so only this sees it).
    g = gen(200 + M + bm + k0)
    buf = torch.full((M + 2, Kx + 64), float("nan"), dtype=torch.float16)
    buf[:M, :Kx] = torch.randn(M, Kx, generator=g).half()
    buf = buf.to(DEV)
    out = torch.full((8, 16, bm), float("nan"), dtype=torch.float16, device=DEV)
    _x_row_operands_kernel[(1,)](buf, out, buf.stride(0), M, k0, Kx, BLOCK_M=bm, BLOCK_K=128)
    want = torch.zeros(8, 16, bm, dtype=torch.float16)
    for j in range(8):
        for m in range(M):
            k = k0 + 8 * torch.arange(16) + j
            ok = k < Kx
            want[j, ok, 8 * m + j] = buf.cpu()[m, k[ok]]
    assert torch.equal(out.cpu(), want)


def slices_launches(monkeypatch) -> list[dict]:
    """The constexpr flags of every launch of int4's slices kernel from here on (X_SPLIT's general
    form gives the reference's result at any M too: the tests of X_ROW check that it ran)."""
    seen, kernel = [], int4._int4_slices_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                seen.append({k: kw[k] for k in ("X_SPLIT", "X_ROW")})
                return kernel[grid](*args, **kw)
            return launch
    monkeypatch.setattr(int4, "_int4_slices_kernel", Spy())
    return seen


@pytest.mark.parametrize("dtype,M,split,fixup,bm,Kx,symmetric,act_order", [
    (torch.float16, 1, 2, True, 16, K, False, False), (torch.float16, 1, 3, False, 64, 300, True, True),
    (torch.float32, 1, 2, True, 16, 300, False, False), (torch.float16, 1, 1, False, 16, 1000, False, False),
    pytest.param(torch.bfloat16, 1, 4, True, 16, 1000, False, True, marks=BF16_ON_GPU.marks),
    (torch.float16, 2, 2, True, 16, 300, False, False), (torch.float32, 2, 1, False, 16, 1000, True, False),
    (torch.float16, 3, 2, False, 32, 300, False, True), (torch.float16, 4, 3, True, 32, K, True, False),
    (torch.float16, 2, 1, False, 64, 300, False, False),
    (torch.float16, 3, 2, False, 16, 300, False, False)])   # 3 rows, room for 2: X_SPLIT's general form
def test_int4_slices_x_row_reads_its_rows_in_place(dtype, M, split, fixup, bm, Kx, symmetric, act_order,
                                                    monkeypatch):
    # X_ROW (X_SPLIT at M <= BLOCK_M / 8): x's rows read in place from a buffer poisoned with NaN
    # past K and in the rows around them, rows a stride apart (a read past K shows here; rows
    # past M land in outputs the store masks: the operand test above checks those reads),
    # with split K, the in-kernel fixup, 16-64-row tiles, partial words and blocks (K = 300,
    # 1000), act_order and zero points: the reference's result, and the copied form's up to the
    # order of the fp32 sums.
    g = gen(170 + split + bm + Kx + M)
    w = int4_weight(g, 128, symmetric, act_order, True, dtype, Kx=Kx)
    buf = torch.full((M + 2, Kx + 64), float("nan"), dtype=dtype, device=DEV)
    buf[1:1 + M, :Kx] = torch.randn(M, Kx, generator=g).to(dtype).to(DEV)
    x = buf[1:1 + M, :Kx]
    tile = dict(SLICES, BLOCK_M=bm, SPLIT_K=split, FIXUP=int(fixup), X_SPLIT=1)
    launches = slices_launches(monkeypatch)
    got = run(int4.launch, x, w, tile)
    ref = int4.reference_linear(x, w)
    assert_close(got, ref)
    copied = run(int4.launch, x, w, dict(tile, X_SPLIT=0))
    assert launches == [{"X_SPLIT": True, "X_ROW": 8 * M <= bm}, {"X_SPLIT": False, "X_ROW": False}], launches
    # Two orders of the same fp32 sums differ by at most Kx·eps32·Σ|x_k·W_nk| (Higham's bound on
    # each, for round-to-nearest fp32 adds, as the MMA's accumulator and the fixup make them), and
    # each result's rounding to x's dtype adds up to half an ulp (allowed: 2·eps·|y|, two ulps or
    # more): a fixed multiple of eps·max|y| is too tight for fp32 outputs, whose rounding hides nothing.
    xp = x if w.act_perm is None else x[:, w.act_perm]
    sums = xp.float().abs() @ int4.dequantize(w).abs().t()
    if w.bias is not None:
        sums = sums + w.bias.float().abs()
    bound = Kx * torch.finfo(torch.float32).eps * sums + 2 * torch.finfo(dtype).eps * copied.float().abs()
    err = (got.float() - copied.float()).abs()
    assert (err <= bound).all(), f"X_ROW against the copied form: max error {err.max().item():.3g}"


def test_int4_bucket_1_default_reads_x_in_place(monkeypatch):
    # The bucket-1 default tile (group 128, half-precision x) is an X_ROW slices tile, run end to
    # end through the template: the reference's result with and without zero points and act_order.
    t = registry.TEMPLATES["int4_w4a16"]
    for i, (symmetric, act_order, Kx) in enumerate(((True, False, K), (False, True, 300))):
        g = gen(190 + i)
        w = int4_weight(g, 128, symmetric, act_order, True, torch.float16, Kx=Kx)
        tile = t.default_tile(t.problem(w, 1, torch.float16))
        assert tile["path"] == "slices" and tile.get("X_SPLIT") == 1, tile
        x = torch.randn(1, Kx, generator=g).half().to(DEV)
        launches = slices_launches(monkeypatch)
        assert_close(run(t.launch, x, w, tile), int4.reference_linear(x, w))
        assert [k["X_ROW"] for k in launches] == [True], launches


@pytest.mark.parametrize("dtype", [torch.float16, BF16_ON_GPU])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("M,split,Kx,act_order", [(16, 1, K, False), (40, 2, K, True), (3, 3, 300, False),
                                                   (150, 1, 300, False)])
@pytest.mark.parametrize("scale_w", [False, True])
def test_int4_join_path(dtype, symmetric, M, split, Kx, act_order, scale_w):
    # The nibble pairs joined back into natural K order (a wrong join order fails), one tl.dot per
    # step over x as stored; K = 300: a partial last word and a masked last step; act_order: x
    # gathered by the weight's column permutation before the kernel. scale_w: the group scale on
    # the weight tile, the products chained in one accumulator.
    g = gen(120 + M + split + symmetric)
    w = int4_weight(g, 128, symmetric, act_order, True, dtype, Kx=Kx)
    x = torch.randn(M, Kx, generator=g).to(dtype).to(DEV)
    # M=150: 128 rows of x on 8 warps (the join tile of buckets 128-256, here on this test's 32
    # weight rows), over two row blocks (the second partial).
    tile = dict(SLICES, path="join", BLOCK_M=16 if M <= 16 else 64 if M <= 64 else 128, SPLIT_K=split,
                num_warps=8 if M > 64 else 4, SCALE_W=int(scale_w))
    assert_close(run(int4.launch, x, w, tile), int4.reference_linear(x, w))


# The tile fields that give each path the SCALE_W numerics (the frag path has no other form).
SCALED = {"join": {"SCALE_W": 1}, "frag": {}}


@pytest.mark.parametrize("dtype", [torch.float16, BF16_ON_GPU])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("M,bm,bn,bk,split,Kx,act_order", [(16, 16, 32, 128, 1, K, False), (40, 64, 64, 64, 2, K, True),
                                                          (3, 16, 32, 16, 3, 300, False), (150, 128, 32, 32, 1, 300, False),
                                                          (70, 64, 128, 256, 1, K, False)])
def test_int4_frag_path(dtype, symmetric, M, bm, bn, bk, split, Kx, act_order):
    # The operand built in the MMA's fragment order ([n, c, h, l, e] -> k = 16c + 8h + 2l + e: a
    # wrong word, byte or nibble order fails), for BLOCK_K 16-256 (one to sixteen 16-column
    # chunks a step); K = 300: a partial last word, words past K8 and a masked last step;
    # act_order: x gathered by the weight's column permutation; 128 weight rows: two warpgroups
    # of rows; a partial block of x's rows (M = 150 on 128) and of weight rows (N = 37).
    g = gen(130 + M + split + symmetric)
    w = int4_weight(g, 128 if bk <= 128 else 256, symmetric, act_order, True, dtype, Kx=Kx)
    x = torch.randn(M, Kx, generator=g).to(dtype).to(DEV)
    tile = dict(SLICES, path="frag", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split,
                num_warps=8 if bm > 64 or bn > 64 else 4)
    y = run(int4.launch, x, w, tile)
    assert_close(y, int4.reference_linear(x, w))
    assert_close(y, _rounded_weight_linear(x, w), tuple(t / 2 for t in TOL[dtype]))


def test_int4_frag_path_refuses_fp32_activations_and_odd_block_k():
    w = int4_weight(gen(126), 128, True, False, bias=False)
    with pytest.raises(AssertionError, match="bf16/fp16"):
        int4.launch(torch.randn(2, K).to(DEV), w, dict(SLICES, path="frag"))
    with pytest.raises(AssertionError, match="power-of-two BLOCK_K"):
        int4.launch(torch.randn(2, K).half().to(DEV), w, dict(SLICES, path="frag", BLOCK_K=8))


@pytest.mark.parametrize("dtype", [torch.float16, BF16_ON_GPU])
@pytest.mark.parametrize("symmetric,act_order,fixup", [(True, False, 0), (False, True, 1)])
def test_int4_tail_tiles_split_their_last_weight_rows(dtype, symmetric, act_order, fixup):
    # TAIL_TILES: the last blocks of BLOCK_N weight rows launched apart with K split TAIL_SPLIT ways
    # (N = 37 on 16-row blocks: the tail is the partial block and the one before it). The rows
    # before the tail are the plain tile's launch on them, byte for byte; the tail is split over
    # K (reduction kernel or in-kernel fixup), x gathered once for both launches.
    g = gen(140 + symmetric + act_order)
    w = int4_weight(g, 128, symmetric, act_order, True, dtype)
    x = torch.randn(40, K, generator=g).to(dtype).to(DEV)
    tile = dict(SLICES, path="frag", BLOCK_M=64, BLOCK_N=16, BLOCK_K=64, SPLIT_K=1, FIXUP=fixup)
    y = run(int4.launch, x, w, dict(tile, TAIL_TILES=2, TAIL_SPLIT=3))
    assert_close(y, int4.reference_linear(x, w))
    assert torch.equal(y[:, :N - 21], run(int4.launch, x, w, tile)[:, :N - 21])
    # The two row parts are made once and kept on the weight (what a launch keeps on them, made once).
    parts = [p for _, p in w._row_parts.values()]
    assert torch.equal(run(int4.launch, x, w, dict(tile, TAIL_TILES=2, TAIL_SPLIT=3)), y)
    assert [p.N for p in parts] == [N - 21, 21]
    assert len(w._row_parts) == 2 and all(a is b for (_, a), b in zip(w._row_parts.values(), parts))
    w.scale = w.scale.clone()   # replaced tensors: new parts in the old ones' places
    assert_close(run(int4.launch, x, w, dict(tile, TAIL_TILES=2, TAIL_SPLIT=3)), int4.reference_linear(x, w))
    assert len(w._row_parts) == 2 and not any(a is b for (_, a), b in zip(w._row_parts.values(), parts))


def test_int4_space_offers_tails_where_a_last_wave_is_nearly_empty():
    # The 27B-class gate|up (34816 rows) at 128 rows on 64-row frag tiles: 544 programs, two a
    # multiprocessor on the H200's 132, so the last 16 blocks are the tail and the rest fill two whole
    # waves; the RS form's whole-K tiles likewise, one program a multiprocessor (two with OCC): 272
    # blocks of 128 rows leave 8, 544 of 64 rows on two programs 16, 136 of 256 rows 4. qkv's frag
    # tiles split K, so their grids are sized already, and its RS grids fill under one wave: none.
    from vsr.kernels import int4_tiles
    t = int4.TEMPLATE
    w = int4_weight(gen(144), 128, True, False, bias=False)
    for N, want in ((34816, True), (10240, False)):
        p = dataclasses.replace(t.problem(w, 128, torch.bfloat16), N=N, K=5120)
        tails = [c for c in t.search_space(p) if c.get("TAIL_TILES")]
        assert bool(tails) == want
        assert {c["path"] for c in tails} == ({"frag", "wgmma"} if want else set())
        for c in tails:
            per_sm = c.get("OCC", 1) if c["path"] == "wgmma" else int4_tiles._frag_programs_per_sm(c)
            blocks = N // c["BLOCK_N"]
            assert c["SPLIT_K"] == 1 and c["TAIL_SPLIT"] in (8, 16), c
            assert (blocks - c["TAIL_TILES"]) % (gemm_tiles.SMS * per_sm) == 0, c
            assert 0 < c["TAIL_TILES"] < gemm_tiles.SMS * per_sm / 2, c
            assert c["path"] == "frag" or c.get("RS"), c
        assert {c["TAIL_TILES"] for c in tails if c["path"] == "frag"} <= {16}
        assert {(c["BLOCK_N"], c["TAIL_TILES"]) for c in tails if c["path"] == "wgmma"} <= {(128, 8), (64, 16), (256, 4)}


def test_int4_tail_tiles_are_refused_where_they_cannot_run():
    w = int4_weight(gen(143), 128, True, False, bias=False)
    x = torch.randn(4, K).half().to(DEV)
    tile = dict(SLICES, path="frag", BLOCK_M=16, BLOCK_N=16, BLOCK_K=64)
    for bad in (dict(tile, TAIL_TILES=3, TAIL_SPLIT=2), dict(tile, TAIL_TILES=1),
                dict(tile, path="dequant", TAIL_TILES=1, TAIL_SPLIT=2)):
        with pytest.raises(ValueError, match="TAIL_TILES"):
            int4.launch(x, w, bad)
    with pytest.raises(ValueError, match="SwiGLU"):
        int4.launch(x, w, dict(tile, TAIL_TILES=1, TAIL_SPLIT=2), glu=True)


def test_int4_wgmma_words_descriptor_is_built_once_per_weight_and_block():
    # The packed words' TMA descriptor is kept on the weight (host time per call otherwise), per
    # block shape, and rebuilt for a weight whose words moved.
    from vsr.kernels import int4_wgmma
    w = int4_weight(gen(129), 128, True, False, bias=False)
    words = lambda block: gemm.weight_descriptor(w, w.packed, block, int4_wgmma.words_descriptor)  # noqa: E731
    d = words([128, 8])
    assert words([128, 8]) is d and d.block_shape == [128, 8]
    assert words([128, 16]) is not d
    assert gemm.weight_descriptor(w, w.packed, [128, 8]) is not d   # Triton's kind: another descriptor
    w.packed = w.packed.clone()
    assert words([128, 8]) is not d


def test_int4_rs_scale_and_zero_point_words():
    # The RS form's one gather a step for AWQ: each word holds the scale's 16 bits and the zero point
    # above them; made once a weight (anew for replaced zero points); GPTQ, scales in another dtype
    # than x's and fp32 scales keep the scale tensor itself.
    from vsr.kernels import int4_wgmma
    for dt in (torch.bfloat16, torch.float16):
        w = int4_weight(gen(131), 128, False, False, bias=False, dtype=dt)
        words = int4_wgmma.rs_scales(w, dt)
        assert words.dtype == torch.int32 and words.shape == w.scale.shape and words.is_contiguous()
        assert torch.equal((words & 0xFFFF).to(torch.int16).view(dt), w.scale)
        assert torch.equal(words >> 16, w.zero_point)
        assert int4_wgmma.rs_scales(w, dt) is words
        w.zero_point = w.zero_point.flip(0).contiguous()
        assert torch.equal(int4_wgmma.rs_scales(w, dt) >> 16, w.zero_point)
        assert int4_wgmma.rs_scales(w, torch.float16 if dt == torch.bfloat16 else torch.bfloat16) is w.scale
    gptq = int4_weight(gen(132), 128, True, False, bias=False, dtype=torch.bfloat16)
    assert int4_wgmma.rs_scales(gptq, torch.bfloat16) is gptq.scale
    fp32 = int4_weight(gen(133), 128, False, False, bias=False, dtype=torch.float32)
    assert int4_wgmma.rs_scales(fp32, torch.float32) is fp32.scale


def test_int4_wgmma_path_is_refused_off_hopper_and_with_what_it_lacks(monkeypatch):
    # The Gluon wgmma path (int4_wgmma.py) runs on sm_90 only: anywhere else (the interpreter, Ampere,
    # Blackwell) the launch says so before any kernel; on Hopper it refuses the SwiGLU epilogue and
    # the in-kernel fixup but in the RS form (SwiGLU there without FIXUP), fp32 x, a K whose x or
    # packed rows are not whole 16-byte TMA rows and an RS tile whose weight rows do not come 16 to
    # each of its warps.
    # (Its numerics: tests/gpu/test_int4_wgmma_gpu.py.)
    w = int4_weight(gen(127), 128, True, False, bias=False)
    x = torch.randn(32, K).half().to(DEV)
    tile = dict(SLICES, path="wgmma", BLOCK_M=32, BLOCK_N=128, BLOCK_K=64, SPLIT_K=2)
    for dev in (common.device_features(x.device), common.DeviceFeatures(True, (8, 0), True, False),
                common.DeviceFeatures(True, (10, 0), True, True)):
        monkeypatch.setattr(common, "device_features", lambda d, dev=dev: dev)
        with pytest.raises(ValueError, match=r"Hopper \(sm_90\) only"):
            int4.launch(x, w, tile)
    monkeypatch.setattr(common, "device_features", lambda d: common.DeviceFeatures(True, (9, 0), True, True))
    even = int4.Int4Weight(w.packed[:36], w.scale[:36], w.K, w.group_size)   # gate and up rows in pairs
    for t in (tile, dict(tile, RS=1, FIXUP=1)):   # SwiGLU: the RS form's, without FIXUP
        with pytest.raises(ValueError, match="SwiGLU on its RS tiles without FIXUP"):
            int4.launch(x, even, t, glu=True)
    with pytest.raises(ValueError, match="no in-kernel fixup"):
        int4.launch(x, w, dict(tile, FIXUP=1))
    with pytest.raises(ValueError, match="num_warps=16"):   # an RS tile's FIXUP passes on to the RS launch
        int4.launch(x, w, dict(tile, RS=1, FIXUP=1, num_warps=16))
    with pytest.raises(AssertionError, match="bf16/fp16 x"):
        int4.launch(x.float(), w, tile)
    for warps in (16, 3):
        with pytest.raises(ValueError, match=f"num_warps={warps} .*16 of its BLOCK_N=128"):
            int4.launch(x, w, dict(tile, RS=1, num_warps=warps))
    with pytest.raises(ValueError, match="num_warps=8 .*16 of its BLOCK_N=64"):   # each partition's rows
        int4.launch(x, w, dict(tile, RS=1, PARTS=2, num_warps=8))
    with pytest.raises(ValueError, match="one partition or two"):
        int4.launch(x, w, dict(tile, RS=1, PARTS=4, num_warps=1))
    for k in (K - 4, K - 8):   # x rows of 504 bytes; x rows of 496 bytes, packed rows of 124
        odd = int4_weight(gen(128), 128, True, False, bias=False, Kx=k)
        with pytest.raises(ValueError, match="by TMA"):
            int4.launch(torch.randn(32, k).half().to(DEV), odd, tile)


def test_int4_rs_partitions_share_the_register_file():
    # With two MMA partitions the loader's warpgroup gives back all but its own registers and the
    # partitions share the rest: never more than the register file held at launch, and more than
    # each warpgroup started with.
    from vsr.kernels import int4_wgmma
    for warps, parts, occ in ((4, 2, 1), (8, 2, 1), (4, 2, 2)):
        regs = int4_wgmma.max_registers(warps * parts, 0, occ)
        got = int4_wgmma.partition_registers(regs, warps * parts, 24)
        groups = warps * parts // 4
        assert got % 8 == 0 and regs < got <= 256 and got * groups + 24 <= regs * (groups + 1), (warps, parts, got)
    assert int4_wgmma.partition_registers(168, 8, 24) == 240


def test_int4_rs_split_tiles_come_with_and_without_the_in_kernel_fixup():
    # Every RS tile of the space that splits K is offered twice: its partials added by the
    # reduction kernel, and by the last split in the kernel (FIXUP); no whole-K tile and no tile of
    # the unpacking form carries FIXUP.
    for N, K in ((10240, 5120), (5120, 8192), (34816, 5120), (5120, 17408)):
        for b in (64, 128, 256):
            p = Problem(N=N, K=K, bucket=b, act_dtype=torch.bfloat16,
                        params=(("act_order", False), ("bits", 4), ("group", 128), ("symmetric", False)))
            tiles = [t for t in int4.TEMPLATE.search_space(p) if t["path"] == "wgmma"]
            fixed = [t for t in tiles if t.get("FIXUP")]
            assert all(t.get("RS") and t["SPLIT_K"] > 1 and not t.get("TAIL_TILES") for t in fixed)
            plain = [t for t in tiles if t.get("RS") and t["SPLIT_K"] > 1 and not t.get("FIXUP")]
            assert sorted(map(repr, fixed)) == sorted(repr(dict(t, FIXUP=1)) for t in plain) and fixed, (N, K, b)


def test_the_tuner_prunes_no_int4_wgmma_tile_of_the_space():
    # Every wgmma tile of the space at 64-256 rows compiles for sm_90 without spilling
    # (tests/test_kernels_sm90_compile.py), so the tuner's fit estimate must let each one be timed:
    # a PARTS tile's accumulator is split between its partitions (256 x 128 on two partitions of
    # 4 warps: 128 registers a thread, not 256).
    from vsr.autotune.tuner import prune_reason
    w = types.SimpleNamespace(format="int4")
    x = torch.empty(1, 8, dtype=torch.bfloat16)
    seen = 0
    for N, K in ((10240, 5120), (5120, 8192), (34816, 5120), (5120, 17408)):
        for b in (64, 128, 256):
            p = Problem(N=N, K=K, bucket=b, act_dtype=torch.bfloat16,
                        params=(("act_order", False), ("bits", 4), ("group", 128), ("symmetric", True)))
            for t in (t for t in int4.TEMPLATE.search_space(p) if t.get("path") == "wgmma"):
                assert prune_reason(t, w, x, gemm_tiles.SMEM_LIMIT) is None, t
                seen += t.get("PARTS", 1) == 2 and t["BLOCK_M"] == 256
    assert seen > 0
    assert "registers" in prune_reason({"BLOCK_M": 256, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4,
                                        "num_stages": 3}, w, x, None)


def test_int4_frag_pairs_need_scales_in_x_dtype():
    # The packed multiply takes both operands in x's dtype: bf16 scales under fp16 x (or fp32
    # scales) take the fp32 twin, as do devices without the pairs.
    from vsr.kernels.common import DeviceFeatures
    hopper = DeviceFeatures(nvidia=True, capability=(9, 0), pdl=True, hardware_e4m3=True)
    ampere = DeviceFeatures(nvidia=True, capability=(8, 0), pdl=False, hardware_e4m3=False)
    assert int4.frag_pairs(torch.bfloat16, torch.bfloat16, hopper)
    assert int4.frag_pairs(torch.float16, torch.float16, ampere)
    assert not int4.frag_pairs(torch.bfloat16, torch.bfloat16, ampere)
    assert not int4.frag_pairs(torch.float16, torch.bfloat16, hopper)
    assert not int4.frag_pairs(torch.bfloat16, torch.float32, hopper)
    assert not int4.frag_pairs(torch.float16, torch.float16, DeviceFeatures(False, (9, 4), False, False))


@pytest.mark.parametrize("triton_version,ptxas,waits", [
    ((3, 9), (13, 4), False), ((3, 9), (13, 6), False), ((3, 9), (13, 0), True), ((3, 9), (12, 9), True),
    ((3, 9), None, True), ((3, 8), (13, 4), True), ((3, 6), (13, 4), True), ((3, 6), (12, 8), True)])
def test_int4_register_operand_kernels_wait_unless_triton_and_ptxas_keep_the_operand(
        monkeypatch, triton_version, ptxas, waits):
    # Only Triton >= 3.9 assembled by ptxas >= 13.4 keeps a pending wgmma's register operand intact
    # (docs/kernels.md, "int4_w4a16"); a ptxas that cannot be asked counts as an older one.
    from vsr.kernels.common import DeviceFeatures
    monkeypatch.setattr(int4, "_TRITON", triton_version)
    monkeypatch.setattr(int4, "ptxas_release", lambda arch: ptxas)
    assert int4.mma_wait(DeviceFeatures(nvidia=True, capability=(9, 0), pdl=True, hardware_e4m3=True)) is waits
    assert not int4.mma_wait(DeviceFeatures(nvidia=True, capability=(10, 0), pdl=True, hardware_e4m3=True))
    assert not int4.mma_wait(DeviceFeatures(nvidia=False, capability=(9, 4), pdl=False, hardware_e4m3=False))


def test_ptxas_release_reads_the_ptxas_triton_uses(monkeypatch):
    from triton.backends.nvidia import compiler
    int4.ptxas_release.cache_clear()
    monkeypatch.setattr(compiler, "get_ptxas_version",
                        lambda arch: "ptxas: NVIDIA (R) Ptx optimizing assembler\nCuda compilation tools, release 13.4, V13.4.1")
    assert int4.ptxas_release(90) == (13, 4)
    int4.ptxas_release.cache_clear()
    monkeypatch.setattr(compiler, "get_ptxas_version", lambda arch: (_ for _ in ()).throw(FileNotFoundError("ptxas")))
    assert int4.ptxas_release(90) is None
    int4.ptxas_release.cache_clear()


def _rounded_weight_linear(x, w):
    """x·Wᵀ + b with W = (u - zu)·s rounded once to x's dtype (the transient dequantization's
    numerics, and SCALE_W's), accumulated in fp32."""
    W = int4.dequantize(w).to(x.dtype).float()
    xp = x if w.act_perm is None else x[:, w.act_perm]
    return (xp.float() @ W.t() + w.bias.float()).to(x.dtype)


@pytest.mark.parametrize("dtype,scale_dtype", [(torch.float16, "x"), (torch.float16, torch.bfloat16),
                                               pytest.param(torch.bfloat16, "x", marks=BF16_ON_GPU.marks)])
@pytest.mark.parametrize("symmetric,act_order", [(True, False), (False, True)])
@pytest.mark.parametrize("M,bm,split,fixup", [(300, 256, 1, 0), (70, 64, 2, 1), (20, 16, 3, 0)])
@pytest.mark.parametrize("path", ["join", "frag"])
def test_int4_join_scale_w_rounds_each_weight_once(dtype, scale_dtype, symmetric, act_order, M, bm, split, fixup, path):
    # SCALE_W's numerics are the transient dequantization's: each weight (u - zu)·s rounded to x's
    # dtype, so the output agrees with x·W_rounded to within the output's own rounding and the
    # fp32 accumulation (held to half the template's tolerance; the exact check is the next
    # test). M=300 on 256 rows of x (the tiles of buckets 256-1024); bf16 scales under fp16 x take
    # the fp32 multiply (a bf16 scale need not be exact in fp16).
    g = gen(160 + M + symmetric)
    w = int4_weight(g, 128, symmetric, act_order, True, dtype)
    if scale_dtype != "x":
        w = dataclasses.replace(w, scale=w.scale.to(scale_dtype))
    x = torch.randn(M, K, generator=g).to(dtype).to(DEV)
    tile = dict(SLICES, path=path, BLOCK_M=bm, SPLIT_K=split, FIXUP=fixup, num_warps=8 if bm > 64 else 4,
                **SCALED[path])
    y = run(int4.launch, x, w, tile)
    rtol, atol = TOL[dtype]
    assert_close(y, _rounded_weight_linear(x, w), (rtol / 2, atol / 2))
    assert_close(y, int4.reference_linear(x, w))


@pytest.mark.parametrize("dtype", [torch.float16, BF16_ON_GPU])
@pytest.mark.parametrize("bm,split", [(64, 1), (256, 2)])
@pytest.mark.parametrize("path", ["join", "frag"])
def test_int4_join_scale_w_is_exact_on_two_hot_rows(dtype, bm, split, path):
    # Rows of x with two ones (columns k1, k2 of the same or different groups), no bias: each
    # output is W_rounded[n, k1] + W_rounded[n, k2], exact in fp32 (terms within 2^13 of each
    # other), then rounded once; so with SCALE_W the output equals that bit for bit. A kernel
    # that scaled the exact integer sum instead (the fp32-scaled form: round(s·(u1 + u2 - 2zu)))
    # or rounded a weight twice differs on some of them.
    g = gen(170 + bm)
    w = int4_weight(g, 128, False, False, False, dtype)
    M = 96
    k = torch.stack([torch.randint(0, K, (M,), generator=g), torch.randint(0, K, (M,), generator=g)], 1)
    k[: M // 2, 1] = (k[: M // 2, 0] // 128) * 128 + (k[: M // 2, 0] + 1 + k[: M // 2, 1] % 127) % 128   # same group
    x = torch.zeros(M, K)
    x[torch.arange(M)[:, None], k] = 1.0
    assert (x.sum(1) == 2).all()
    x = x.to(dtype).to(DEV)
    Wr = int4.dequantize(w).to(dtype).float()
    expect = (Wr[:, k[:, 0]] + Wr[:, k[:, 1]]).t().to(dtype)
    tile = dict(SLICES, path=path, BLOCK_M=bm, SPLIT_K=split, num_warps=8 if bm > 64 else 4, **SCALED[path])
    assert torch.equal(run(int4.launch, x, w, tile).cpu(), expect.cpu())
    unrounded = int4.reference_linear(x, w).cpu()
    assert not torch.equal(unrounded, expect.cpu()), "the case must tell a weight rounded first from one not"


@pytest.mark.parametrize("symmetric", [True, False])
def test_int4_wide_join_tiles_of_the_space(symmetric):
    # The space's join tiles of 256 weight rows (int4_tiles._WIDE_JOIN: BLOCK_K 64, SCALE_W) at
    # buckets 16-1024, on 300 weight rows (a whole block and a partial one) and rows of x past one
    # block from 256, against the reference in a NaN-filled output.
    from vsr.autotune import synth
    from vsr.kernels import int4_tiles
    t = int4.TEMPLATE
    w = synth.random_weight("int4", 300, K, dict(group=128, symmetric=symmetric), torch.float16, DEV, 41)
    seen = 0
    for bucket, M in ((16, 13), (64, 40), (128, 100), (256, 150), (1024, 600)):
        x = torch.randn(M, K, generator=gen(42 + M)).half().to(DEV)
        tiles = [c for c in t.search_space(t.problem(w, bucket, x.dtype)) if c["path"] == "join" and c["BLOCK_N"] == 256]
        assert len(tiles) == len(int4_tiles._WIDE_JOIN[64 if bucket <= 64 else min(bucket, 256)])
        for tile in tiles:
            assert tile["BLOCK_K"] == 64 and tile["SCALE_W"] == 1
            assert_close(run(int4.launch, x, w, tile), int4.reference_linear(x, w))
            seen += 1
    assert seen == 12


@pytest.mark.gpu
@pytest.mark.parametrize("symmetric", [True, False])
def test_int4_scale_w_tiles_of_the_space_are_right_and_repeatable(symmetric):
    # Every SCALE_W tile the search space offers at bucket 256, on the 27B "o" layer (K = 8192, so
    # the tiles split K), against the reference in a NaN-filled output, and the same bytes from a
    # second launch. (The 256 x 128 tile fails this with zero points at 3 stages on the H200 with
    # Triton 3.6, wrong and varying; the space holds it at 2.)
    from vsr.autotune import synth
    from vsr.kernels import int4_tiles
    t = int4.TEMPLATE
    N, Kx = 5120, 8192
    w = synth.random_weight("int4", N, Kx, dict(group=128, symmetric=symmetric), torch.bfloat16, DEV, 31)
    x = torch.randn(256, Kx, generator=gen(32)).to(torch.bfloat16).to(DEV)
    ref = int4.reference_linear(x, w)
    tiles = [c for c in t.search_space(t.problem(w, 256, x.dtype)) if c.get("SCALE_W")]
    assert len(tiles) == len(int4_tiles._SCALED_JOIN[256]) + len(int4_tiles._WIDE_JOIN[256])
    assert all(c["SPLIT_K"] > 1 for c in tiles if c["BLOCK_M"] == 256 and c["BLOCK_N"] == 128)
    for tile in tiles:
        y1, y2 = run(int4.launch, x, w, tile), run(int4.launch, x, w, tile)
        assert_close(y1, ref)
        assert same_bytes(y1, y2), tile


@pytest.mark.gpu
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_int4_frag_tiles_of_the_space_are_right_and_repeatable(symmetric, dtype):
    # Every frag tile of the space at buckets 16-1024 (PTX pairs with the packed scale multiply), on
    # the 27B "o" layer (K = 8192: most tiles split K), in a NaN-filled output: within the
    # template's tolerance of the reference, within half of it of the rounded-weight product
    # (SCALE_W's numerics), and the same bytes from a second launch.
    from vsr.autotune import synth
    t = int4.TEMPLATE
    N, Kx = 5120, 8192
    w = synth.random_weight("int4", N, Kx, dict(group=128, symmetric=symmetric), dtype, DEV, 33, bias=True)
    seen = 0
    for bucket, M in ((16, 13), (64, 64), (128, 100), (256, 256), (1024, 600)):
        x = torch.randn(M, Kx, generator=gen(34 + M)).to(dtype).to(DEV)
        ref, rounded = int4.reference_linear(x, w), _rounded_weight_linear(x, w)
        for tile in [c for c in t.search_space(t.problem(w, bucket, x.dtype)) if c["path"] == "frag"]:
            y1, y2 = run(int4.launch, x, w, tile), run(int4.launch, x, w, tile)
            assert_close(y1, ref)
            assert_close(y1, rounded, tuple(v / 2 for v in TOL[dtype]))
            assert same_bytes(y1, y2), tile
            seen += 1
    assert seen == 2 + 3 + 3 + 3 + 2


def test_int4_join_path_refuses_fp32_activations():
    w = int4_weight(gen(125), 128, True, False, bias=False)
    with pytest.raises(AssertionError, match="bf16/fp16"):
        int4.launch(torch.randn(2, K).to(DEV), w, dict(SLICES, path="join"))


def test_int4_ptx_pairs_only_where_ptxas_takes_them():
    # sub.bf16x2 needs sm_90: bf16 on Ampere/Ada takes the portable twin (it failed to compile there).
    assert int4.ptx_pairs(torch.float16, (8, 0)) and int4.ptx_pairs(torch.float16, (9, 0))
    assert int4.ptx_pairs(torch.bfloat16, (9, 0)) and int4.ptx_pairs(torch.bfloat16, (10, 0))
    assert not any(int4.ptx_pairs(torch.bfloat16, c) for c in ((8, 0), (8, 6), (8, 9)))
    assert not int4.ptx_pairs(torch.float32, (9, 0))


def test_int4_no_rows_return_before_any_path(monkeypatch):
    # M=0 (an empty batch reaching the launcher directly): int4.launch returns the empty output
    # before it dispatches on the path. The cases are paths that show it: the GEMV, which refuses
    # any M but 1 if reached, and the large-M path, whose transient dense copy must not be built
    # (the join and swap cases this test had ran the same return and showed nothing more).
    g = gen(97)
    w = int4_weight(g, 128, False, False, bias=True)
    x = torch.randn(0, K, generator=g).half().to(DEV)
    monkeypatch.setattr(int4, "dequantize_transient", lambda *a: pytest.fail("a dense copy built for no rows"))
    gemv = {"path": "gemv", "BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 128, "SPLIT_K": 1, "num_warps": 4,
            "num_stages": 2}
    for tile in (SLICES, gemv, dict(TILED, path="dequant")):
        assert int4.launch(x, w, tile).shape == (0, N)


def test_int4_slice_order_is_a_permutation_within_blocks():
    x = torch.arange(1, 2 * 300 + 1, dtype=torch.float32).reshape(2, 300)    # no zeros of its own
    xs = int4.slice_order(x, 128)
    assert xs.shape == (2, 384)
    for col in range(384):                     # column j·16 + w of a block holds x[8·w + j], or padding
        blk, r = divmod(col, 128)
        j, wd = divmod(r, 16)
        k = blk * 128 + 8 * wd + j
        assert torch.equal(xs[:, col], x[:, k] if k < 300 else torch.zeros(2)), col


def test_int4_tiled_path_and_group_128():
    g = gen(7)
    w = int4_weight(g, 128, False, False, bias=True)
    x = torch.randn(40, K, generator=g).half().to(DEV)
    assert_close(run(int4.launch, x, w, dict(TILED, BLOCK_K=128)), int4.reference_linear(x, w))


def test_int4_dequant_path_for_large_buckets(monkeypatch):
    # (dequant-sk: 4 tiles of 32x32 on 3 "multiprocessors", one of them shared out by K steps)
    monkeypatch.setattr(gemm, "multiprocessors", lambda device: 3)
    g = gen(13)
    for sym in (True, False):
        w = int4_weight(g, 64, sym, True, bias=True)
        x = torch.randn(40, K, generator=g).half().to(DEV)
        for path in ("dequant", "dequant-tma", "dequant-sk"):
            assert_close(run(int4.launch, x, w, dict(TILED, path=path)), int4.reference_linear(x, w))
        assert_close(run(int4.launch, x, w, dict(TILED, path="dequant-tma", PERSISTENT=1)), int4.reference_linear(x, w))
    # K neither a multiple of the dequantization step nor of 8, group 32 (pointer-load tile only:
    # TMA needs 16-byte rows).
    Kodd = 204
    w = int4_weight(g, 32, False, False, False, Kx=Kodd)
    x = torch.randn(40, Kodd, generator=g).half().to(DEV)
    assert_close(run(int4.launch, x, w, dict(TILED, path="dequant", BLOCK_K=32)), int4.reference_linear(x, w))


@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("G,bk", [(32, 128), (128, 64)])   # a step spans 4 groups; a group spans 2 steps
def test_int4_gemv_path_uneven_k(split, G, bk):
    g = gen(14 + split + G)
    # K not a multiple of 8 nor of BLOCK_K (masked tails).
    Kodd = 204
    w = int4_weight(g, G, False, False, True, Kx=Kodd)
    x = torch.randn(1, Kodd, generator=g).half().to(DEV)
    tile = {"path": "gemv", "BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": bk, "SPLIT_K": split, "num_warps": 4,
            "num_stages": 2}
    assert_close(run(int4.launch, x, w, tile), int4.reference_linear(x, w))


def test_int4_refuses_block_k_across_groups():
    g = gen(8)
    w = int4_weight(g, 32, True, False, bias=False)
    x = torch.randn(2, K, generator=g).half().to(DEV)
    with pytest.raises(AssertionError, match="must divide the group size"):
        int4.launch(x, w, dict(TILED, BLOCK_K=64))


# --- nvfp4 -------------------------------------------------------------------------------

def nvfp4_weight(g, w4a4, bias, dtype):
    W = torch.randn(N, K, generator=g)
    gw = torch.tensor(448.0 * 6.0 / W.abs().max().item())
    codes, bs = nvfp4.quantize_activation(W, gw)  # the same per-16 rounding makes a valid weight
    return nvfp4.Nvfp4Weight(nvfp4.pack_fp4(codes), bs, gw, torch.tensor(37.5) if w4a4 else None,
                             torch.randn(N, generator=g).to(dtype) if bias else None).to(DEV)


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


# --- shared behaviour ----------------------------------------------------------------------

def test_same_tile_twice_gives_identical_bytes():
    g = gen(11)
    w = int4_weight(g, 64, False, False, bias=True)
    x = torch.randn(5, K, generator=g).half().to(DEV)
    tile = dict(int4.default_tile(int4.problem(w, 8, torch.float16)), SPLIT_K=4)
    a = int4.launch(x, w, tile)
    b = int4.launch(x, w, tile)
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_launch_refuses_wrong_shapes_and_dtypes():
    g = gen(12)
    w = dense.DenseWeight(torch.randn(N, K, generator=g).half()).to(DEV)
    tile = dense.default_tile(dense.problem(w, 1, torch.float16))
    with pytest.raises(AssertionError, match="K=256"):
        dense.launch(torch.randn(1, K + 1).half().to(DEV), w, tile)
    with pytest.raises(AssertionError, match="one dtype"):
        dense.launch(torch.randn(1, K).float().to(DEV), w, tile)
    with pytest.raises(ValueError, match="lacks BLOCK_K"):
        dense.launch(torch.randn(1, K).half().to(DEV), w, {k: v for k, v in tile.items() if k != "BLOCK_K"})


@pytest.mark.parametrize("path", ["tma", "tma-sk", "tma-swap"])
def test_dense_tma_paths_take_no_rows(path):
    # M=0 (an empty batch reaching a launcher directly): an empty output, nothing launched.
    g = gen(34)
    w = dense.DenseWeight(torch.randn(N, K, generator=g).half()).to(DEV)
    y = dense.launch(torch.empty(0, K, dtype=torch.float16, device=DEV), w, dict(TMA, path=path))
    assert y.shape == (0, N)


# --- the in-kernel fixup (tile field FIXUP) ---------------------------------------------------
def _fixup_cases():
    """(name, launch, reference, x, weight, tile, programs): split-K and stream-K launches of every
    template that adds its splits' partials in the kernel when asked. programs: the multiprocessors
    stream-K shares out over (None: not stream-K)."""
    g = gen(140)
    dw = dense.DenseWeight(torch.randn(N, K + 64, generator=g).half(), torch.randn(N, generator=g).half()).to(DEV)
    dw32 = dense.DenseWeight(torch.randn(N, K, generator=g), None).to(DEV)
    fw = fp8_weight(g, torch.float16, True)
    iw = int4_weight(g, 128, False, True, True, torch.float16, Kx=300)
    iws = int4_weight(g, 64, True, False, True)
    iw128 = int4_weight(g, 128, True, False, False)
    x = {M: torch.randn(M, K, generator=g).half().to(DEV) for M in (1, 5, 20, 40, 70)}
    x320 = {M: torch.randn(M, K + 64, generator=g).half().to(DEV) for M in (5, 40)}
    x300 = torch.randn(40, 300, generator=g).half().to(DEV)
    x32 = torch.randn(33, K, generator=g).to(DEV)
    dwk = dense.DenseWeight(dw.weight[:, :K].contiguous(), dw.bias)
    return [
        ("dense tiled, 3 splits (the last short)", dense.launch, dense.reference_linear, x320[40], dw,
         dict(TILED, SPLIT_K=3), None),
        ("dense tma-swap, 3 splits, three row blocks", dense.launch, dense.reference_linear, x320[40], dw,
         dict(SWAP, SPLIT_K=3), None),
        ("dense tma-swap fp32, 2 splits", dense.launch, dense.reference_linear, x32, dw32,
         dict(SWAP, BLOCK_M=32, BLOCK_K=32, SPLIT_K=2), None),
        ("fp8 tma-swap, 2 splits", fp8.launch, fp8.reference_linear, x[1], fw, dict(SWAP, BLOCK_K=128, SPLIT_K=2),
         None),
        ("int4 swap, 3 splits", int4.launch, int4.reference_linear, x[5], iws,
         dict(TILED, path="swap", BLOCK_M=16, BLOCK_K=32, SPLIT_K=3), None),
        ("int4 tiled, 2 splits", int4.launch, int4.reference_linear, x[40], iws, dict(TILED, SPLIT_K=2), None),
        ("int4 slices, 2 splits, two row blocks", int4.launch, int4.reference_linear, x[70], iw128,
         dict(SLICES, BLOCK_M=64, SPLIT_K=2), None),
        ("int4 join, 3 splits, K=300, act order", int4.launch, int4.reference_linear, x300, iw,
         dict(SLICES, path="join", BLOCK_M=64, SPLIT_K=3), None),
        ("dense tma-sk, 1 of 4 tiles left over", dense.launch, dense.reference_linear, x[40], dwk,
         dict(TMA, path="tma-sk"), 3),
        ("dense tma-sk, all tiles shared, 20 live rows", dense.launch, dense.reference_linear, x[20],
         dataclasses.replace(dwk, bias=None), dict(TMA, path="tma-sk"), 64),
        ("fp8 tma-sk, 2 of 6 tiles left over", fp8.launch, fp8.reference_linear, x[70], fw,
         dict(TMA, BLOCK_K=128, path="tma-sk"), 4),
    ]


def _spy_on_reductions(monkeypatch) -> list:
    """The reduction kernels (split-K's and stream-K's) launched from now on, run and recorded as
    KernelSpy records them."""
    calls = []
    for module, kern in ((common, "splitk_reduce_kernel"), (gemm, "streamk_reduce_kernel")):
        monkeypatch.setattr(module, kern, KernelSpy(calls, kern, real=getattr(module, kern)))
    return calls


@pytest.mark.parametrize("case", range(11))
def test_in_kernel_fixup_gives_the_reductions_bytes(case, monkeypatch):
    # The last split (or stream-K program) of each tile to finish adds the partials in the same
    # order as the reduction kernel would: the same bytes, not just close ones, with no reduction
    # kernel launched; and every tile counter is back at zero for the next launch.
    name, launch, reference, x, w, tile, programs = _fixup_cases()[case]
    if programs is not None:
        monkeypatch.setattr(gemm, "multiprocessors", lambda device: programs)
    launched = _spy_on_reductions(monkeypatch)
    monkeypatch.setattr(common, "_COUNTERS", {})
    fixed = run(launch, x, w, dict(tile, FIXUP=1))
    assert launched == [] and common._COUNTERS, f"{name}: the fixup did not run"
    assert_close(fixed, reference(x, w))
    assert torch.equal(fixed, run(launch, x, w, dict(tile, FIXUP=0))), name
    assert len(launched) == 1, f"{name}: without FIXUP the reduction kernel runs"
    assert torch.equal(fixed, run(launch, x, w, dict(tile, FIXUP=1))), name
    assert all(int(c.abs().sum()) == 0 for c in common._COUNTERS.values()), "a tile counter was left non-zero"


def test_tile_counters_are_per_stream_and_grow_zeroed():
    dev = torch.device(DEV)
    c = common.tile_counters(dev, 10)
    assert c.dtype == torch.int32 and c.numel() >= 10 and int(c.abs().sum()) == 0
    assert common.tile_counters(dev, 10) is c
    big = common.tile_counters(dev, 5000)
    assert big.numel() >= 5000 and int(big.abs().sum()) == 0
    if DEV == "cuda":   # another stream, another buffer: its launches may overlap this one's
        with torch.cuda.stream(torch.cuda.Stream()):
            assert common.tile_counters(dev, 10) is not big


@pytest.mark.filterwarnings("ignore:The CUDA Graph is empty")   # the capture launches no kernel
def test_outgrown_counters_are_kept_and_captures_get_their_own():
    # A buffer outgrown is kept alive (a graph captured with it still points at it); under CUDA
    # graph capture every launch takes zeroed counters of its own (a capture-pool slice, or its
    # own buffer), so graphs never share them.
    dev = torch.device(DEV)
    small = common.tile_counters(dev, 1)
    big = common.tile_counters(dev, 2 * small.numel())
    assert big is not small and any(r is small for r in common._RETIRED)
    if DEV == "cuda":
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            a, b = common.tile_counters(dev, 10), common.tile_counters(dev, 10)
        assert a is not b and a.data_ptr() != big.data_ptr()


def test_capture_pool_hands_each_zeroed_slice_to_one_captured_launch(monkeypatch):
    # The pool's bookkeeping, on whatever device (the capture itself needs a GPU: the GPU test
    # below): disjoint zeroed slices; a launch the pool cannot serve gets its own zeroed buffer;
    # a new pool once less than half is left (the old kept), at most CAPTURE_POOLS_MAX; and a
    # rewind to a mark of the current pool hands the same counters out again, one of an older
    # pool nothing.
    dev = torch.device("cpu")
    synced = []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(
        synchronize=lambda: synced.append(device)))
    monkeypatch.setattr(common, "_CAPTURE_POOLS", {})
    monkeypatch.setattr(common, "_RETIRED", [])
    monkeypatch.setattr(common, "CAPTURE_POOL_COUNTERS", 8)
    monkeypatch.setattr(common, "CAPTURE_POOLS_MAX", 2)
    assert common.capture_counters_mark() == {}
    assert common._captured_counters(dev, 3).numel() == 3      # no pool yet: its own buffer
    common._refill_capture_pool(dev)
    pool = common._CAPTURE_POOLS[dev][0]
    assert synced == [dev] and pool.numel() == 8
    mark = common.capture_counters_mark()
    a, b = common._captured_counters(dev, 3), common._captured_counters(dev, 3)
    assert (a.data_ptr(), b.data_ptr()) == (pool.data_ptr(), pool.data_ptr() + 12)
    assert not a.any() and not b.any()
    c = common._captured_counters(dev, 3)                      # 2 left: its own buffer
    assert c.numel() == 3 and not c.any() and c.untyped_storage().data_ptr() != pool.untyped_storage().data_ptr()
    common.rewind_capture_counters(mark)
    assert common._captured_counters(dev, 3).data_ptr() == pool.data_ptr()
    common._captured_counters(dev, 3)
    common._refill_capture_pool(dev)                           # 2 of 8 left: a second pool
    second = common._CAPTURE_POOLS[dev][0]
    assert second is not pool and common._RETIRED == [pool] and len(synced) == 2
    assert common._captured_counters(dev, 3).data_ptr() == second.data_ptr()
    common.rewind_capture_counters(mark)                       # a mark of the old pool: nothing
    assert common._CAPTURE_POOLS[dev][1] == 3
    common._captured_counters(dev, 5)
    common._refill_capture_pool(dev)                           # the second of at most two: kept
    assert common._CAPTURE_POOLS[dev][0] is second and common._captured_counters(dev, 1).data_ptr() != second.data_ptr()


@pytest.mark.skipif(DEV != "cuda", reason="CUDA graphs need a GPU")
def test_captured_fixup_launches_replay_with_their_own_counters(monkeypatch):
    # Three graphs of fixup launches (split-K and stream-K), replayed one after another and at
    # once on three streams: the eager bytes each time, their counters from the pool (no zeroing
    # node) and left at zero.
    cases = [c for c in _fixup_cases() if c[0].startswith(("dense tiled", "int4 join", "fp8 tma-sk"))]
    assert len(cases) == 3, [c[0] for c in _fixup_cases()]
    eager, graphs, outs = [], [], []
    for name, launch, reference, x, w, tile, programs in cases:
        if programs is not None:   # stream-K: fewer programs than tiles, so some are shared
            monkeypatch.setattr(gemm, "multiprocessors", lambda device, p=programs: p)
        tile = dict(tile, FIXUP=1)
        eager.append(launch(x, w, tile))           # also makes the capture pool
        torch.cuda.synchronize()
        start = common._CAPTURE_POOLS[x.device][1]
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            outs.append(launch(x, w, tile))
        assert common._CAPTURE_POOLS[x.device][1] > start, f"{name}: counters not from the pool"
        graphs.append(g)
    for _ in range(3):
        for g in graphs:
            g.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(o, e) for o, e in zip(outs, eager))
    for o in outs:
        o.fill_(float("nan"))
    streams = [torch.cuda.Stream() for _ in graphs]
    for s, g in zip(streams, graphs):
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            g.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(o, e) for o, e in zip(outs, eager))
    pool = common._CAPTURE_POOLS[cases[0][3].device]
    assert int(pool[0][:pool[1]].abs().sum()) == 0, "a captured launch left a counter non-zero"
    # The tuner's graph timer takes its graph's counters from the pool and hands them back once
    # the graph is gone.
    from vsr.autotune.tuner import cuda_graph_timer
    name, launch, reference, x, w, tile, programs = cases[0]
    used, seen = pool[1], []

    def call():
        launch(x, w, dict(tile, FIXUP=1))
        if torch.cuda.is_current_stream_capturing():
            seen.append(common._CAPTURE_POOLS[x.device][1])
    assert cuda_graph_timer(call, target_ms=0.1, reps=2) > 0
    assert seen and seen[0] > used, "the timer's captured launches did not take pool counters"
    assert common._CAPTURE_POOLS[x.device] is pool and pool[1] == used and int(pool[0].abs().sum()) == 0


def test_int4_gemv_refuses_the_fixup():
    # A tile field a path cannot honour is refused, not ignored.
    g = gen(142)
    w = int4_weight(g, 128, True, False, bias=False)
    x = torch.randn(1, K, generator=g).half().to(DEV)
    tile = {"path": "gemv", "BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 64, "SPLIT_K": 2, "num_warps": 4,
            "num_stages": 2, "FIXUP": 1}
    with pytest.raises(ValueError, match="no in-kernel fixup"):
        int4.launch(x, w, tile)
    assert_close(run(int4.launch, x, w, dict(tile, FIXUP=0)), int4.reference_linear(x, w))



@pytest.mark.parametrize("bucket", tuple(gemm_tiles.WIDE_SPLITS))
def test_every_wide_tile_is_in_the_tuners_pick_of_16(bucket):
    # caches/retune.sh tunes bf16 and fp8 with 16 candidates: the pick gives wide tiles a share per
    # BLOCK_M (gemm_tiles.pick_group), so none of the few the space keeps
    # goes untimed on the 27B-class shapes.
    for N, K in ((10240, 5120), (5120, 8192), (34816, 5120), (5120, 17408)):
        for t in (dense, fp8):
            space = t.search_space(Problem(N=N, K=K, bucket=bucket, act_dtype=torch.bfloat16, params=()))
            wide = [c for c in space if c.get("BLOCK_N2")]
            assert len(wide) == len(gemm_tiles.WIDE_SPLITS[bucket]), (t.__name__, N, K, bucket)
            pick = candidates(space, 16, t.TEMPLATE.pick_group)
            assert all(c in pick for c in wide), (t.__name__, N, K, bucket)
            # and bucket 256's stream-K tiles of 256 rows (gemm_tiles.pick_group: a group of their own)
            tall = [c for c in space if c["path"] == "tma-sk" and c["BLOCK_M"] == 256]
            assert len(tall) == (len(gemm_tiles.TALL_SK_256) if bucket == 256 else 0), (t.__name__, N, K, bucket)
            assert all(c in pick for c in tall), (t.__name__, N, K, bucket)


def test_launches_never_call_the_tile_spaces(monkeypatch):
    # gemm_tiles.py and int4_tiles.py are outside every source hash (template.TILE_CHOICE_MODULES):
    # they may only choose tiles. Each template's launch of a tile of every path of its spaces
    # (chosen first) must then run, and match its reference, with every function of both disabled.
    import types as _types
    from vsr.kernels import int4_tiles
    from vsr.kernels.template import TILE_CHOICE_MODULES
    assert TILE_CHOICE_MODULES == {gemm_tiles.__name__, int4_tiles.__name__}
    g = gen(77)
    cases = [(dense, dense.launch, dense.DenseWeight(torch.randn(N, K, generator=g).half(),
                                                     torch.randn(N, generator=g).half()).to(DEV), None),
             (fp8, fp8.launch, fp8_weight(g, torch.float16, True), FP8_GPU_TOL if DEV == "cuda" else None),
             (int4, int4.launch, int4_weight(g, 128, False, True, True), None),
             (nvfp4, nvfp4.launch_emulated, nvfp4_weight(g, True, True, torch.float16), None)]
    runs = []
    hopper = DEV == "cuda" and torch.cuda.get_device_capability() == (9, 0)
    for mod, launch, w, tol in cases:
        problem = nvfp4.problem if mod is nvfp4 else mod.problem
        space_of = nvfp4.search_space if mod is nvfp4 else mod.search_space
        for M in (1, 5, 40, 200):
            seen = set()
            for t in space_of(problem(w, bucket_for(M), torch.float16)):
                form = (t["path"], bool(t.get("BLOCK_N2")), bool(t.get("PERSISTENT")))
                if t["path"] == "wgmma" and not hopper:   # Hopper's only (the GPU test runs it there)
                    continue
                if form not in seen:
                    seen.add(form)
                    runs.append((mod, launch, w, tol, M, t))
    for mod in (gemm_tiles, int4_tiles):
        for name, f in vars(mod).items():
            if isinstance(f, _types.FunctionType) and f.__module__ == mod.__name__:
                monkeypatch.setattr(mod, name, lambda *a, _n=f"{mod.__name__}.{name}", **k: pytest.fail(f"a launch called {_n}"))
    for mod, launch, w, tol, M, t in runs:
        x = torch.randn(M, K, generator=g).half().to(DEV)
        assert_close(run(launch, x, w, t), mod.reference_linear(x, w), tol)
    assert len({(r[0].__name__, r[5]["path"]) for r in runs}) >= 12
