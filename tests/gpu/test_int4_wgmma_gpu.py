"""GPU (Hopper): int4's wgmma path (kernels/int4_wgmma.py, through int4.launch) against the
rounded-weight reference, x · round(W_q)ᵀ in fp32 (the kernel's numerics up to the order of the
sum), on NaN-poisoned outputs, with partial tiles on every side, K splits, zero points, a bias and
both half-precision dtypes, in both forms (the unpacking warpgroup's, and RS: the MMA warps
unpacking into their register operand), RS tiles with a tail launched apart; the same bytes on a
second call; the RS form's in-kernel fixup against the reduction kernel, and AWQ's scale-and-zero-point
words against the two gathers, byte for byte; a SwiGLU
QLinear on a wgmma tile (the plain product, then the activation kernel) and the RS form's SwiGLU
epilogue (the same bytes); and every wgmma tile of
the search space at the 27B-class shapes against the format's reference."""
import pytest
import torch

from vsr.autotune.synth import random_weight
from vsr.kernels import int4

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                 reason="the wgmma path runs on Hopper (sm_90) only")]


def _weight(N, K, sym, dtype, group=128, bias=False, seed=0):
    w = random_weight("int4", N, K, {"bits": 4, "group": group, "symmetric": sym, "act_order": False}, dtype, "cuda",
                      seed)
    if bias:
        g = torch.Generator(device="cuda").manual_seed(seed + 1)
        w.bias = (torch.randn(N, generator=g, device="cuda") * 0.1).to(dtype)
    return w


def _rounded_reference(x, w):
    y = x.float() @ int4.dequantize(w).to(x.dtype).float().t()
    return y + w.bias.float() if w.bias is not None else y


def _tile(bm, bn, bk, split, warps, stages, **rs):
    return dict(path="wgmma", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, GROUP_M=8, num_warps=warps,
                num_stages=stages, **rs)


@pytest.mark.parametrize("M,N,K,sym,dtype,bias,tile", [
    (128, 1024, 2048, True, torch.bfloat16, False, _tile(128, 128, 64, 1, 4, 4)),
    (37, 1000, 2048, False, torch.bfloat16, True, _tile(64, 128, 64, 4, 4, 4)),       # partial rows / columns
    (300, 777, 1056, True, torch.float16, True, _tile(128, 128, 64, 1, 4, 3)),        # K tail inside a step
    (129, 2304, 5120, False, torch.float16, False, _tile(128, 128, 64, 3, 4, 4)),      # split with a short last
    (16, 512, 4096, True, torch.bfloat16, True, _tile(16, 128, 64, 2, 4, 5)),
    (300, 1000, 2048, False, torch.bfloat16, True, _tile(256, 64, 64, 2, 4, 4)),     # m64n256 MMAs, partial
    # The RS form: the MMA warps unpack into their register operand (16 weight rows a warp)
    (128, 1024, 2048, True, torch.bfloat16, False, _tile(128, 128, 64, 1, 8, 4, RS=1)),
    (37, 1000, 2048, False, torch.bfloat16, True, _tile(64, 128, 128, 4, 8, 3, RS=1)),
    (300, 777, 1056, True, torch.float16, True, _tile(128, 64, 64, 1, 4, 3, RS=1, OCC=2)),
    (129, 2304, 5120, False, torch.float16, False, _tile(128, 128, 64, 3, 8, 4, RS=1)),
    (16, 512, 4096, True, torch.bfloat16, True, _tile(16, 64, 64, 2, 4, 5, RS=1)),
    (300, 1000, 2048, False, torch.bfloat16, True, _tile(256, 64, 64, 2, 4, 4, RS=1)),
    # two MMA partitions, each half the weight rows (the second partition's rows partly past N)
    (128, 1024, 2048, True, torch.bfloat16, False, _tile(128, 128, 64, 1, 4, 4, RS=1, PARTS=2)),
    (37, 1000, 2048, False, torch.float16, True, _tile(64, 128, 64, 3, 4, 4, RS=1, PARTS=2)),
    (300, 1100, 2048, False, torch.bfloat16, True, _tile(256, 128, 64, 2, 4, 3, RS=1, PARTS=2)),
    # 128 weight rows a partition: two m64 MMAs a step on one x tile (the last block's second partly past N)
    (300, 1100, 2048, False, torch.float16, True, _tile(128, 256, 64, 2, 4, 4, RS=1, PARTS=2)),
    (128, 2304, 5120, True, torch.bfloat16, False, _tile(128, 256, 64, 1, 4, 4, RS=1, PARTS=2)),
    # BLOCK_K 128: a group a step
    (128, 2304, 5120, False, torch.bfloat16, True, _tile(128, 256, 128, 3, 4, 3, RS=1, PARTS=2)),
    (300, 1000, 2048, True, torch.float16, False, _tile(128, 128, 128, 2, 4, 3, RS=1, PARTS=2)),
    (37, 777, 2048, False, torch.bfloat16, True, _tile(128, 64, 128, 1, 4, 2, RS=1, OCC=2)),
    # whole K with the last blocks of weight rows launched apart, K split (TAIL_TILES, TAIL_SPLIT)
    (128, 2200, 2048, False, torch.bfloat16, True, _tile(128, 128, 64, 1, 4, 4, RS=1, PARTS=2, TAIL_TILES=3,
                                                         TAIL_SPLIT=4)),
    (37, 1000, 2048, True, torch.float16, False, _tile(64, 64, 64, 1, 4, 4, RS=1, OCC=2, TAIL_TILES=2,
                                                       TAIL_SPLIT=8)),
])
def test_wgmma_path_against_the_rounded_reference(M, N, K, sym, dtype, bias, tile):
    w = _weight(N, K, sym, dtype, bias=bias)
    x = torch.randn(M, K, device="cuda").to(dtype)
    y = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
    int4.launch(x, w, tile, out=y)
    ref = _rounded_reference(x, w)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y.float(), ref, rtol=1e-2, atol=2e-3 * float(ref.abs().max()))
    assert torch.equal(y, int4.launch(x, w, tile))


@pytest.mark.parametrize("M,N,K,sym,dtype,bias,tile", [
    (128, 1024, 2048, True, torch.bfloat16, False, _tile(128, 128, 64, 2, 8, 4, RS=1)),
    (37, 1000, 2048, False, torch.bfloat16, True, _tile(64, 128, 64, 3, 4, 4, RS=1, PARTS=2)),
    (300, 777, 1056, True, torch.float16, True, _tile(128, 64, 64, 2, 4, 3, RS=1, OCC=2)),
    (300, 1100, 5120, False, torch.bfloat16, True, _tile(256, 128, 64, 4, 4, 3, RS=1, PARTS=2)),
    # the last block's second partition wholly past N (960 >= 900), three blocks of x rows
    (300, 900, 2048, True, torch.bfloat16, True, _tile(128, 128, 64, 2, 4, 4, RS=1, PARTS=2)),
    (128, 2304, 5120, False, torch.bfloat16, True, _tile(128, 256, 64, 3, 4, 4, RS=1, PARTS=2)),
    (128, 5120, 8192, True, torch.bfloat16, False, _tile(128, 128, 128, 3, 4, 3, RS=1, PARTS=2)),
])
def test_rs_in_kernel_fixup_gives_the_reduction_kernels_bytes(M, N, K, sym, dtype, bias, tile):
    # FIXUP: the last split of each block adds the partials in the kernel, in the reduction
    # kernel's order, so the bytes are those of the tile without it, every output written (NaN
    # poison), on every call (the counters reset) and in every replay of a CUDA graph.
    w = _weight(N, K, sym, dtype, bias=bias, seed=9)
    x = torch.randn(M, K, device="cuda").to(dtype)
    want = int4.launch(x, w, tile)
    y = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
    int4.launch(x, w, dict(tile, FIXUP=1), out=y)
    assert torch.equal(y, want)
    for _ in range(3):
        assert torch.equal(int4.launch(x, w, dict(tile, FIXUP=1)), want)
    g, out = torch.cuda.CUDAGraph(), torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
    int4.launch(x, w, dict(tile, FIXUP=1), out=out)
    with torch.cuda.graph(g):
        int4.launch(x, w, dict(tile, FIXUP=1), out=out)
    for _ in range(2):
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tile", [_tile(128, 128, 64, 3, 4, 4, RS=1, PARTS=2), _tile(64, 64, 64, 1, 4, 4, RS=1, OCC=2)])
def test_rs_scale_and_zero_point_words_give_the_two_gathers_bytes(dtype, tile, monkeypatch):
    # AWQ on the RS form reads one word a (row, group), the scale's bits and the zero point
    # (int4_wgmma.rs_scales); the kernel's other branch gathers the scale and the zero point apart.
    # Both give the same bytes, and the words are made once (not again on a second call).
    from vsr.kernels import int4_wgmma
    w = _weight(1100, 2048, False, dtype, bias=True, seed=11)
    x = torch.randn(130, 2048, device="cuda").to(dtype)
    y = torch.full((130, 1100), float("nan"), device="cuda", dtype=dtype)
    int4.launch(x, w, tile, out=y)
    words = int4_wgmma.rs_scales(w, dtype)
    assert words.dtype == torch.int32 and int4_wgmma.rs_scales(w, dtype) is words
    monkeypatch.setattr(int4_wgmma, "rs_scales", lambda w, dt: w.scale)
    assert torch.equal(y, int4.launch(x, w, tile))
    ref = _rounded_reference(x, w)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y.float(), ref, rtol=1e-2, atol=2e-3 * float(ref.abs().max()))


@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("rs", [{}, {"RS": 1}, {"RS": 1, "PARTS": 2}])
def test_wgmma_path_with_fp32_scales_unpacks_in_fp32(sym, rs):
    # Scales not in x's dtype take the fp32 conversion instead of the packed pairs: the same bytes.
    w = _weight(384, 1024, sym, torch.bfloat16)
    x = torch.randn(64, 1024, device="cuda").bfloat16()
    tile = _tile(64, 128, 64, 2, 8 if rs == {"RS": 1} else 4, 3, **rs)
    y = int4.launch(x, w, tile)
    w.scale = w.scale.float()
    assert torch.equal(int4.launch(x, w, tile), y)


@pytest.mark.parametrize("split", [1, 2])
def test_swiglu_qlinear_on_a_wgmma_tile_is_the_product_then_the_activation(split):
    # The unpacking warpgroup's form has no SwiGLU epilogue (int4.glu_in_epilogue): a glu QLinear on its tile runs
    # the plain product over the interleaved rows, then silu_mul over the interleaved columns, the
    # bytes of silu_mul over the product's columns put in gate|up order.
    import types
    from vsr.kernels import activation
    from vsr.runtime.linear import QLinear
    w = _weight(1024, 2048, False, torch.bfloat16, bias=True, seed=5)   # rows read as interleaved pairs
    x = torch.randn(200, 2048, device="cuda").bfloat16()
    tile = _tile(128, 128, 64, split, 4, 4)
    assert not int4.glu_in_epilogue(tile)
    y = int4.launch(x, w, tile)
    got = QLinear(w, "triton", tiles=types.SimpleNamespace(tile=lambda template, problem: tile), glu=True)(x)
    assert torch.equal(got, activation.silu_mul(torch.cat([y[:, 0::2], y[:, 1::2]], 1)))


@pytest.mark.parametrize("M,N,K,sym,dtype,bias,tile", [
    (300, 1100, 2048, False, torch.bfloat16, True, _tile(256, 128, 128, 1, 4, 3, RS=1, PARTS=2)),   # past M and N
    (1024, 2048, 2048, True, torch.bfloat16, False, _tile(256, 128, 64, 1, 4, 4, RS=1, PARTS=2)),
    (129, 1040, 1056, True, torch.float16, True, _tile(128, 256, 128, 1, 4, 3, RS=1, PARTS=2)),    # K tail
    (37, 1000, 2048, False, torch.float16, True, _tile(64, 128, 64, 1, 8, 4, RS=1)),
    (200, 1000, 2048, True, torch.bfloat16, True, _tile(128, 64, 64, 1, 4, 4, RS=1, OCC=2)),
    (128, 2048, 2048, False, torch.bfloat16, True, _tile(128, 256, 128, 3, 4, 3, RS=1, PARTS=2)),   # the reduction's
    (128, 2560, 2048, True, torch.bfloat16, True,
     _tile(128, 256, 128, 1, 4, 3, RS=1, PARTS=2, TAIL_TILES=3, TAIL_SPLIT=8)),                   # a tail apart
])
def test_rs_swiglu_epilogue_gives_the_plain_product_then_the_activation_bytes(M, N, K, sym, dtype, bias, tile):
    # An RS tile's SwiGLU over interleaved gate|up rows (int4_wgmma._store_glu: each gate row and its
    # up row in one thread's registers by the pair order of the words' loads; split tiles through the
    # reduction; a tail's two launches each over their own pairs): the bytes of the plain product on the
    # same tile followed by the activation kernel over its interleaved columns, on a NaN-poisoned output.
    from vsr.kernels import activation
    assert int4.glu_in_epilogue(tile)
    w = _weight(N, K, sym, dtype, bias=bias, seed=9)
    x = torch.randn(M, K, device="cuda").to(dtype)
    want = activation.silu_mul(int4.launch(x, w, tile), interleaved=True)
    out = torch.full((M, N // 2), float("nan"), device="cuda", dtype=dtype)
    got = int4.launch(x, w, tile, out=out, glu=True)
    assert got.data_ptr() == out.data_ptr() and torch.equal(got, want), (got - want).abs().max()
    assert torch.equal(int4.launch(x, w, tile, glu=True), got)


_SHAPES_27B = ((10240, 5120), (5120, 17408))   # q|k|v and down
_BUCKETS = (128, 256, 512, 1024, 2048)


def _wgmma_tiles(w, bucket):
    t = int4.TEMPLATE
    return [c for c in t.search_space(t.problem(w, bucket, torch.bfloat16)) if c["path"] == "wgmma"]


@pytest.fixture(scope="module")
def every_tile_compiled():
    """The 27B-class weights, with the space's wgmma kernels for them (about 130) compiled in parallel
    processes into this process's Triton cache dir (kernel_compile, as `vsr-tune compile` does), so the
    test launches them compiled: one after another they take longer to compile than a GPU call allows."""
    import os

    from triton import knobs

    from vsr.autotune.kernel_compile import compile_into
    weights = {(N, K, sym): _weight(N, K, sym, torch.bfloat16) for (N, K) in _SHAPES_27B for sym in (True, False)}
    jobs = [{"template": int4.TEMPLATE.name, "N": N, "K": K, "bucket": b, "act": "bfloat16",
             "params": dict(w.params()), "tile": tile}
            for (N, K, _), w in weights.items() for b in _BUCKETS for tile in _wgmma_tiles(w, b)]
    compile_into(knobs.cache.dir, jobs, workers=max(1, min(16, (os.cpu_count() or 2) - 1)))
    return weights


@pytest.mark.parametrize("bucket", _BUCKETS)
def test_every_wgmma_tile_of_the_space_at_27b_shapes(bucket, every_tile_compiled):
    t = int4.TEMPLATE
    for (N, K, sym), w in every_tile_compiled.items():
        x = torch.randn(bucket - 3, K, device="cuda").bfloat16()
        ref = _rounded_reference(x, w)
        tiles = _wgmma_tiles(w, bucket)
        assert tiles, bucket
        for tile in tiles:
            y = t.launch(x, w, tile)
            torch.testing.assert_close(y.float(), ref, rtol=1e-2, atol=2e-3 * float(ref.abs().max()),
                                       msg=lambda m, tile=tile: f"{tile}: {m}")
            assert torch.equal(y, t.launch(x, w, tile)), tile
