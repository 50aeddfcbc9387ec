"""The int4 W4A16 template (GPTQ and AWQ, act-order, groups) against its pure-torch reference, every
path and the tiles of its space; conventions: tests/kernel_cases.py.
"""
from __future__ import annotations

import dataclasses
import types

import pytest
import torch
import triton
import triton.language as tl

from vsr.autotune.buckets import bucket_for
from vsr.autotune.tuner import same_bytes
from vsr.kernels import common, gemm, gemm_tiles, int4, registry
from vsr.kernels.template import Problem
from kernel_cases import DEV, K, N, TOL, ROWS, TILED, gen, assert_close, run, SLICES, BF16_ON_GPU, int4_weight


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
