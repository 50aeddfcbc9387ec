"""The dense template (bf16/fp16/fp32 weights) against its pure-torch reference, every path, on small
shapes; the conventions (interpreter, shapes, NaN-poisoned outputs) are tests/kernel_cases.py's.
"""
from __future__ import annotations

import pytest
import torch

from vsr.autotune.buckets import bucket_for
from vsr.kernels import common, dense, fp8, gemm, int4
from kernel_cases import (
    DEV, K, N, ROWS, TILED, gen, assert_close, run, TMA, SWAP, fp8_weight, int4_weight, KernelSpy,
)


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
