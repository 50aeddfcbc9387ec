"""SwiGLU in the product's epilogue (kernels/common.store_tile's GLU, runtime/fuse.fuse's interleave):
a gate|up weight with its rows interleaved gives, in one product, the bytes of the plain product
followed by the activation kernel (activation.silu_mul), on every path of the dense, fp8 and int4
templates (fp8 also from activations it did not quantize itself: QLinear.product_fp8); QLinear's
reference path gives torch's F.silu(gate) * up; the decoder routers run their MLP through it on
the Triton path and match the reference forward.

Under the Triton interpreter (no GPU) activations are fp16 and fp32 (its bf16 tl.dot is wrong), and
its tl.dot (numpy's matmul) may sum an output element in another order by its place in the tile,
so there the two forms agree within a few units in the last place of the largest output; on a GPU,
byte for byte. Outputs are pre-filled with NaN so an unwritten element fails. The Builder gives the
epilogue where fuse.SWIGLU_IN_PRODUCT is on (the default, for fuse.GLU_FORMATS): the tests of
models and of the Builder turn it on as well, and one checks the default."""
from __future__ import annotations

import types

import pytest
import torch

from tinypkgs import TEST_TEXTS, tiny_qwen3, tiny_qwen3_5  # noqa: F401
from vsr.kernels import activation, dense, fp8, gemm, int4
from vsr.runtime import fuse
from vsr.runtime.linear import QLinear, glu_reference
from vsr.runtime.loaders import PackageLoader
from vsr.runtime.models import build_model
from vsr.runtime.models.common import Builder
from vsr.runtime.package import open_package

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# The models' dtype, where the kernels really run (the interpreter's bf16 tl.dot is wrong).
BF16_ON_GPU = pytest.param(torch.bfloat16, marks=pytest.mark.skipif(DEV != "cuda", reason="bf16 runs on the GPU"))
HALF, K = 40, 256   # 80 interleaved rows: the last 32-row block of a 32-wide tile lies half past N
TILE = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": 1, "GROUP_M": 2, "num_warps": 4, "num_stages": 2}
DENSE_TILES = {
    "tiled": dict(TILE, path="tiled"),
    "splitk": dict(TILE, path="splitk", SPLIT_K=2),
    "splitk-fixup": dict(TILE, path="splitk", SPLIT_K=3, FIXUP=1),
    "tma": dict(TILE, path="tma"),
    "tma-wide": dict(TILE, path="tma", BLOCK_N=32, BLOCK_N2=16),
    "tma-persistent": dict(TILE, path="tma", PERSISTENT=1),
    "tma-swap": dict(TILE, path="tma-swap", SPLIT_K=2),
    "tma-sk": dict(TILE, path="tma-sk"),
    "tma-sk-fixup": dict(TILE, path="tma-sk", FIXUP=1),
}
INT4_TILES = {   # (the forms tests/test_kernels_int4.py runs on the GPU; groups of 128)
    "splitk": dict(TILE, path="splitk", SPLIT_K=2),
    "swap": dict(TILE, path="swap"),
    "slices": dict(TILE, path="slices", BLOCK_K=128),
    "join": dict(TILE, path="join", BLOCK_K=128),
    "join-scale-w": dict(TILE, path="join", BLOCK_K=128, SCALE_W=1, SPLIT_K=2, FIXUP=1),
    "frag": dict(TILE, path="frag", BLOCK_K=128),
    "dequant-tma": dict(TILE, path="dequant-tma"),
}


def gen(seed):
    return torch.Generator().manual_seed(seed)


def assert_same(y, want, what):
    """Byte for byte on a GPU; within 8 units in the last place of max|want| under the interpreter
    (up to 3 seen in fp32)."""
    if DEV == "cuda":
        assert torch.equal(y, want), what
    else:
        ulp = torch.finfo(y.dtype).eps
        torch.testing.assert_close(y, want, rtol=0, atol=8 * ulp * float(want.abs().max()), msg=str(what))


def plain_then_activation(launch, x, w, tile):
    """The two-kernel form: the plain product of the gate|up weight, then activation.silu_mul."""
    return activation.silu_mul(launch(x, w, tile))


def halves(w):
    """A gate|up weight's gate and up parts (its first and last HALF rows)."""
    def rows(lo, hi):
        cut = lambda t: None if t is None else t[lo:hi]  # noqa: E731
        if w.format == "dense":
            return dense.DenseWeight(cut(w.weight), cut(w.bias))
        if w.format == "fp8":
            return fp8.Fp8Weight(cut(w.weight), cut(w.weight_scale), cut(w.bias))
        return int4.Int4Weight(cut(w.packed), cut(w.scale), w.K, w.group_size, cut(w.zero_point), w.act_perm,
                               cut(w.bias))
    return [rows(0, HALF), rows(HALF, 2 * HALF)]


def interleaved(w):
    """The gate|up weight fused with its rows interleaved, as the runtime loads it for SwiGLU."""
    return fuse.fuse(halves(w), interleave=True)


def glu(launch, x, w, tile):
    out = torch.full((x.shape[0], w.N // 2), float("nan"), dtype=x.dtype, device=x.device)
    y = launch(x, interleaved(w), tile, out=out, glu=True)
    assert y.data_ptr() == out.data_ptr() and not torch.isnan(y).any(), "an output was left unwritten"
    return y


def dense_weight(g, dtype, bias):
    return dense.DenseWeight(torch.randn(2 * HALF, K, generator=g).to(dtype),
                             torch.randn(2 * HALF, generator=g).to(dtype) if bias else None).to(DEV)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, BF16_ON_GPU])
@pytest.mark.parametrize("name", sorted(DENSE_TILES))
def test_dense_glu_product_is_the_product_then_the_activation(name, dtype, monkeypatch):
    monkeypatch.setattr(gemm, "multiprocessors", lambda device: 3)   # stream-K: tiles left over on 3
    g = gen(len(name))
    w = dense_weight(g, dtype, bias=name != "tiled")
    tile = dict(DENSE_TILES[name], BLOCK_K=32 if dtype == torch.float32 else 64)
    for M in (5, 40):   # one row block; 40: three 16-row blocks, the last part past M
        x = torch.randn(M, K, generator=g).to(dtype).to(DEV)
        y = glu(dense.launch, x, w, tile)
        assert_same(y, plain_then_activation(dense.launch, x, w, tile), (name, M))
        want = glu_reference(dense.reference_linear(x, interleaved(w)))
        tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}[dtype]
        torch.testing.assert_close(y, want, rtol=tol, atol=tol * float(want.abs().max()))


@pytest.mark.parametrize("name", ["tma", "tma-wide", "tma-sk"])
def test_dense_glu_tma_product_with_k_past_its_last_step(name, monkeypatch):
    # The TMA paths read the interleaved weight as [2, N / 2, K] by 3-D copies: with K = 200 and 64
    # columns a step, the last step's copy runs past K, which it fills with zeros as a 2-D one does.
    monkeypatch.setattr(gemm, "multiprocessors", lambda device: 3)
    g = gen(60 + len(name))
    k = 200
    w = dense.DenseWeight(torch.randn(2 * HALF, k, generator=g).half(),
                          torch.randn(2 * HALF, generator=g).half()).to(DEV)
    x = torch.randn(40, k, generator=g).half().to(DEV)
    tile = DENSE_TILES[name]
    y = glu(dense.launch, x, w, tile)
    assert_same(y, plain_then_activation(dense.launch, x, w, tile), name)


@pytest.mark.parametrize("block_n", [4, 8])
def test_dense_glu_gemv(block_n):
    g = gen(7)
    w = dense_weight(g, torch.float16, bias=True)
    x = torch.randn(1, K, generator=g).half().to(DEV)
    tile = {"path": "gemv", "BLOCK_M": 1, "BLOCK_N": block_n, "BLOCK_K": 64, "SPLIT_K": 1, "GROUP_M": 8,
            "num_warps": 4, "num_stages": 3}
    assert_same(glu(dense.launch, x, w, tile), plain_then_activation(dense.launch, x, w, tile), block_n)


FP8_TILES = {name: DENSE_TILES[name] for name in ("tiled", "splitk", "splitk-fixup", "tma", "tma-swap", "tma-sk")}


def fp8_weight(g, dtype):
    w = torch.randn(2 * HALF, K, generator=g).to(fp8.FP8_DTYPE)
    scale = (torch.rand(2 * HALF, generator=g) * 0.02 + 1e-3).to(dtype)
    return fp8.Fp8Weight(w, scale, torch.randn(2 * HALF, generator=g).to(dtype)).to(DEV)


@pytest.mark.parametrize("dtype", [torch.float16, BF16_ON_GPU])
@pytest.mark.parametrize("name", sorted(FP8_TILES))
def test_fp8_glu_product_is_the_product_then_the_activation(name, dtype, monkeypatch):
    # The scales and the bias first, then SwiGLU of each pair (store_tile's order); the product's own
    # prologue quantizes x, as for the down projection that then reads the activation as it is.
    monkeypatch.setattr(gemm, "multiprocessors", lambda device: 3)
    g = gen(30 + len(name))
    w = fp8_weight(g, dtype)
    tile = dict(FP8_TILES[name], BLOCK_K=64)
    for M in (5, 40):
        x = torch.randn(M, K, generator=g).to(dtype).to(DEV)
        y = glu(fp8.launch, x, w, tile)
        assert_same(y, plain_then_activation(fp8.launch, x, w, tile), (name, M))
        want = glu_reference(fp8.reference_linear(x, interleaved(w)))
        tol = 2e-3 if dtype == torch.float16 else 1.6e-2
        torch.testing.assert_close(y, want, rtol=tol, atol=tol * float(want.abs().max()))


def test_fp8_glu_product_of_codes_quantized_elsewhere():
    # The approximate set's gate|up product of codes a norm quantized (QLinear.product_fp8): the
    # bytes of fp8.launch's, whose prologue makes the same codes.
    g = gen(31)
    w = interleaved(fp8_weight(g, torch.float16))
    x = torch.randn(20, K, generator=g).half().to(DEV)
    tiles = types.SimpleNamespace(tile=lambda template, problem: FP8_TILES["tma"])
    q = QLinear(w, "triton", tiles=tiles, glu=True)
    xq, xs = fp8.quantize_activation_triton(x)
    y = q.product_fp8(xq, xs, x.dtype)
    assert y.shape == (20, HALF)
    assert_same(y, fp8.launch(x, w, FP8_TILES["tma"], glu=True), "codes")


def test_fp8_glu_gemv():
    g = gen(32)
    w = fp8_weight(g, torch.float16)
    x = torch.randn(1, K, generator=g).half().to(DEV)
    tile = {"path": "gemv", "BLOCK_M": 1, "BLOCK_N": 8, "BLOCK_K": 64, "SPLIT_K": 1, "GROUP_M": 8,
            "num_warps": 4, "num_stages": 3}
    assert_same(glu(fp8.launch, x, w, tile), plain_then_activation(fp8.launch, x, w, tile), "gemv")


def int4_weight(g, symmetric, act_order, group=128, dtype=torch.float16):
    u = torch.randint(0, 16, (2 * HALF, K), generator=g, dtype=torch.int32)
    scale = (torch.rand(2 * HALF, K // group, generator=g) * 0.05 + 1e-3).to(dtype)
    zp = None if symmetric else torch.randint(0, 16, (2 * HALF, K // group), generator=g, dtype=torch.int32)
    perm = torch.randperm(K, generator=g) if act_order else None
    bias = torch.randn(2 * HALF, generator=g).to(dtype)
    return int4.Int4Weight(int4.pack_int4(u), scale, K, group, zp, perm, bias).to(DEV)


@pytest.mark.parametrize("dtype", [torch.float16, BF16_ON_GPU])
@pytest.mark.parametrize("name", sorted(INT4_TILES))
@pytest.mark.parametrize("symmetric,act_order", [(True, False), (False, True)])
def test_int4_glu_product_is_the_product_then_the_activation(name, symmetric, act_order, dtype):
    g = gen(50 + len(name))
    w = int4_weight(g, symmetric, act_order, dtype=dtype)
    x = torch.randn(20, K, generator=g).to(dtype).to(DEV)
    tile = INT4_TILES[name]
    y = glu(int4.launch, x, w, tile)
    assert_same(y, plain_then_activation(int4.launch, x, w, tile), name)
    want = glu_reference(int4.reference_linear(x, interleaved(w)))
    tol = 2e-3 if dtype == torch.float16 else 1.6e-2
    torch.testing.assert_close(y, want, rtol=tol, atol=tol * float(want.abs().max()))


@pytest.mark.parametrize("split", [1, 2])
def test_int4_glu_gemv(split):
    g = gen(60 + split)
    w = int4_weight(g, False, False)
    x = torch.randn(1, K, generator=g).half().to(DEV)
    tile = {"path": "gemv", "BLOCK_M": 1, "BLOCK_N": 8, "BLOCK_K": 64, "SPLIT_K": split, "GROUP_M": 8,
            "num_warps": 4, "num_stages": 3}
    assert_same(glu(int4.launch, x, w, tile), plain_then_activation(int4.launch, x, w, tile), split)


def test_int4_takes_swiglu_in_the_product_on_its_large_m_and_rs_tiles_only():
    assert int4.TEMPLATE.glu_in_epilogue is int4.glu_in_epilogue
    for path in ("dequant", "dequant-tma", "dequant-sk"):
        assert int4.glu_in_epilogue(dict(TILE, path=path)), path
    for path in ("gemv", "splitk", "swap", "slices", "join", "frag", "wgmma"):
        assert not int4.glu_in_epilogue(dict(TILE, path=path)), path
    # the wgmma path's RS tiles, whole-K, split (the reduction's) or with a tail, but not with FIXUP
    rs = dict(TILE, path="wgmma", RS=1, PARTS=2)
    assert int4.glu_in_epilogue(rs) and int4.glu_in_epilogue(dict(rs, SPLIT_K=3))
    assert int4.glu_in_epilogue(dict(rs, TAIL_TILES=4, TAIL_SPLIT=8))
    assert not int4.glu_in_epilogue(dict(rs, SPLIT_K=3, FIXUP=1))
    assert dense.TEMPLATE.glu_in_epilogue(dict(TILE, path="tiled")) and fp8.TEMPLATE.glu_in_epilogue(TILE)


@pytest.mark.parametrize("name", ["frag", "join", "dequant-tma"])
def test_int4_qlinear_with_swiglu_gives_the_same_bytes_on_either_route(name, monkeypatch):
    """An int4 QLinear over interleaved gate|up rows (glu) runs SwiGLU in the product on a large-M
    tile and, on a tile that unpacks in the kernel, the plain product then the activation kernel
    over the interleaved columns: either way the bytes of the plain product of the gate|up weight
    (rows side by side) followed by the activation kernel."""
    calls = []
    silu_mul = activation.silu_mul
    monkeypatch.setattr(activation, "silu_mul", lambda y, **kw: calls.append(kw) or silu_mul(y, **kw))
    g = gen(80 + len(name))
    w = int4_weight(g, False, False)
    x = torch.randn(20, K, generator=g).half().to(DEV)
    tile = INT4_TILES[name]
    q = QLinear(interleaved(w), "triton", tiles=types.SimpleNamespace(tile=lambda template, problem: tile), glu=True)
    y = q(x)
    assert calls == ([] if int4.glu_in_epilogue(tile) else [{"interleaved": True}]), name
    calls.clear()
    assert_same(y, plain_then_activation(int4.launch, x, w, tile), name)


def test_interleaved_fuse_puts_each_gate_row_beside_its_up_row():
    g = gen(3)
    w = dense_weight(g, torch.float32, bias=True)
    assert torch.equal(fuse.fuse(halves(w)).weight, w.weight)   # side by side: the gate|up weight itself
    inter = interleaved(w)
    assert torch.equal(inter.weight[0::2], w.weight[:HALF]) and torch.equal(inter.weight[1::2], w.weight[HALF:])
    assert torch.equal(inter.bias[0::2], w.bias[:HALF]) and torch.equal(inter.bias[1::2], w.bias[HALF:])
    q = int4_weight(g, False, True)
    qi = interleaved(q)
    for t in ("packed", "scale", "zero_point", "bias"):
        a, b = getattr(q, t), getattr(qi, t)
        assert torch.equal(b[0::2], a[:HALF]) and torch.equal(b[1::2], a[HALF:]), t
    assert torch.equal(qi.act_perm, q.act_perm)   # a permutation of K: the same for every row
    # and back: side_by_side lays the rows out as the plain fuse does (the peers' and twins' copy)
    for a in (w, q, fp8_weight(g, torch.float16)):
        back, plain = fuse.side_by_side(interleaved(a)), fuse.fuse(halves(a))
        for t in ("weight", "weight_scale", "packed", "scale", "zero_point", "bias"):
            if getattr(plain, t, None) is not None:
                assert torch.equal(getattr(back, t), getattr(plain, t)), (a.format, t)
    with pytest.raises(ValueError, match="as many rows each"):
        fuse.fuse([dense.DenseWeight(torch.randn(5, K)), dense.DenseWeight(torch.randn(4, K))], interleave=True)


def test_glu_takes_an_even_number_of_rows():
    with pytest.raises(ValueError, match="even number of interleaved"):
        dense.launch(torch.randn(2, K).half(), dense.DenseWeight(torch.randn(5, K).half()), DENSE_TILES["tiled"],
                     glu=True)
    with pytest.raises(ValueError, match="even N"):
        QLinear(dense.DenseWeight(torch.randn(5, K)), glu=True)


def test_qlinear_glu_reference_and_triton_paths_agree():
    g = gen(9)
    w = interleaved(dense_weight(g, torch.float32, bias=True))
    x = torch.randn(3, 7, K, generator=g).to(DEV)
    tiles = types.SimpleNamespace(tile=lambda template, problem: template.default_tile(problem))
    ref, tri = QLinear(w, "reference", glu=True), QLinear(w, "triton", tiles=tiles, glu=True)
    assert ref.out_features == tri.out_features == HALF
    want = torch.nn.functional.silu(x @ w.weight[0::2].t() + w.bias[0::2]) * (x @ w.weight[1::2].t() + w.bias[1::2])
    scale = float(want.abs().max())
    torch.testing.assert_close(ref(x), want, rtol=0, atol=1e-5 * scale)
    torch.testing.assert_close(tri(x), ref(x), rtol=0, atol=1e-5 * scale)


def _triton_model(path, dtype, exact=True):
    """The package's router with Triton QLinears (default tiles) and reference ops, on this device
    (an FP8 package's device check passed as emulated on the CPU, where the interpreter runs them)."""
    pkg = open_package(str(path), device=DEV, allow_unverified=True, emulate=DEV != "cuda")
    tiles = types.SimpleNamespace(tile=lambda template, problem: template.default_tile(problem))
    loader = PackageLoader(pkg.path, pkg.config)
    try:
        b = Builder(loader, lambda w: QLinear(w, "triton", tiles=tiles), dtype, DEV, True, kernels="triton",
                    exact=exact)
        model = build_model(pkg.config, b).eval()
    finally:
        loader.close()
    return model, b


@pytest.fixture
def swiglu_in_product(monkeypatch):
    monkeypatch.setattr(fuse, "SWIGLU_IN_PRODUCT", True)


@pytest.mark.parametrize("fixture", ["tiny_qwen3", "tiny_qwen3_5"])
def test_decoder_mlps_run_swiglu_in_the_product_and_match_the_reference(fixture, request, swiglu_in_product):
    """Every gate|up product of a Qwen3 or Qwen3.5 router on the Triton path applies SwiGLU itself
    (its QLinear glu, the Projection activated) and the forward matches the same weights'
    reference forward (the MLP through the activation op on gate|up side by side)."""
    from vsr.runtime.models import ops

    path = request.getfixturevalue(fixture)
    model, b = _triton_model(path, torch.float32)
    gate_ups = [lab for lab in b.linears if lab.endswith("gate_up_proj")]
    assert gate_ups and all(b.linears[lab].glu for lab in gate_ups)
    assert not any(m.glu for lab, m in b.linears.items() if lab not in gate_ups)
    model.ops = ops.REFERENCE
    ids = torch.randint(1, int(model.embed.shape[0]), (2, 9), generator=gen(4)).to(DEV)
    mask = torch.ones_like(ids)
    lengths = torch.tensor([9, 6], dtype=torch.int32, device=DEV)
    with torch.no_grad():
        got = model.encode(ids, mask, lengths)
        for mod in b.linears.values():   # the same weights on the reference path
            mod.mode = "reference"
        want = model.encode(ids, mask, lengths)
    real = torch.arange(9, device=DEV)[None, :] < lengths[:, None]
    torch.testing.assert_close(got[real], want[real], rtol=0, atol=1e-4 * float(want.abs().max()))


@pytest.mark.parametrize("exact", [True, False])
def test_an_fp8_forward_is_the_same_with_swiglu_in_the_product(tiny_qwen3, exact, monkeypatch, swiglu_in_product):
    """An FP8 router (llm-compressor's FP8_DYNAMIC) on the Triton path, with the Triton ops, gives
    the same bytes with SwiGLU in its gate|up product (the down projection quantizing the activation
    in its prologue) as with the activation kernel that quantizes for the down projection: in the
    exact set and in the approximate one (the norms' codes feeding the products)."""
    from tinypkgs import compressed
    from vsr.runtime.models import ops

    path = compressed(tiny_qwen3, "FP8_DYNAMIC")
    dtype = torch.bfloat16 if DEV == "cuda" else torch.float16
    ids = torch.randint(1, 50, (2, 9), generator=gen(12)).to(DEV)
    lengths = torch.tensor([9, 6], dtype=torch.int32, device=DEV)
    outs = []
    for formats in (fuse.GLU_FORMATS, tuple(f for f in fuse.GLU_FORMATS if f != "fp8")):
        monkeypatch.setattr(fuse, "GLU_FORMATS", formats)
        model, b = _triton_model(path, dtype, exact=exact)
        assert any(m.glu for m in b.linears.values()) == ("fp8" in formats)
        assert all(m.weight.format == "fp8" for lab, m in b.linears.items() if "mlp" in lab)
        model.ops = ops.triton_ops()
        with torch.no_grad():
            outs.append(model.encode(ids, torch.ones_like(ids), lengths))
    real = torch.arange(9, device=DEV)[None, :] < lengths[:, None]
    assert torch.equal(outs[0][real], outs[1][real])


@pytest.mark.parametrize("fmt,params,kernels,glu", [
    ("dense", {}, "triton", True),
    ("int4", {"bits": 4, "group": 32, "symmetric": False, "act_order": False}, "triton", True),
    ("fp8", {}, "triton", True),
    ("nvfp4", {}, "triton", False),     # its activation kernel also quantizes for the down product
    ("dense", {}, "reference", False),  # the reference path runs the activation op
])
def test_builder_gives_swiglu_products_only_to_glu_formats_on_the_triton_path(fmt, params, kernels, glu,
                                                                              swiglu_in_product):
    from vsr.autotune import synth

    parts = {n: synth.random_weight(fmt, 24, 64, params, torch.bfloat16, "cpu", seed=i)
             for i, n in enumerate(("gate", "up"))}
    loader = types.SimpleNamespace(linear=lambda name: parts[name])
    tiles = types.SimpleNamespace(tile=lambda template, problem: template.default_tile(problem))
    b = Builder(loader, lambda w: QLinear(w, kernels, tiles=tiles if kernels == "triton" else None),
                torch.bfloat16, "cpu", False, kernels=kernels)
    proj = b.projection("mlp.gate_up_proj", ["gate", "up"], "silu_mul")
    assert proj.fused and b.linears["mlp.gate_up_proj"].glu is glu
    assert proj.activated == ("silu_mul" if glu else None)
    assert b.linears["mlp.gate_up_proj"].out_features == (24 if glu else 48)
    qkv = b.projection("self_attn.qkv_proj", ["gate", "up"])   # no activation asked: never interleaved
    assert not qkv.parts[0].glu and qkv.activated is None


def test_the_builder_gives_dense_fp8_and_int4_gate_up_products_swiglu_by_default():
    """fuse.SWIGLU_IN_PRODUCT is on: a dense, FP8 or int4 gate|up on the Triton path is fused with its
    rows interleaved and its QLinear applies SwiGLU (Projection.activated); an nvfp4 one is the plain
    fused product, its rows in gate|up order, and the model applies the activation after it."""
    from vsr.autotune import synth

    assert fuse.SWIGLU_IN_PRODUCT is True and fuse.GLU_FORMATS == ("dense", "fp8", "int4")
    int4_spec = {"bits": 4, "group": 32, "symmetric": True, "act_order": False}
    for fmt, spec, glu in (("dense", {}, True), ("fp8", {}, True), ("int4", int4_spec, True), ("nvfp4", {}, False)):
        parts = {n: synth.random_weight(fmt, 24, 64, spec, torch.bfloat16, "cpu", seed=i)
                 for i, n in enumerate(("gate", "up"))}
        tiles = types.SimpleNamespace(tile=lambda template, problem: template.default_tile(problem))
        b = Builder(types.SimpleNamespace(linear=lambda name: parts[name]),
                    lambda w: QLinear(w, "triton", tiles=tiles), torch.bfloat16, "cpu", False, kernels="triton")
        proj = b.projection("mlp.gate_up_proj", ["gate", "up"], "silu_mul")
        q = b.linears["mlp.gate_up_proj"]
        assert proj.fused and q.glu is glu, fmt
        assert proj.activated == ("silu_mul" if glu else None) and q.out_features == (24 if glu else 48), fmt
        rows = (lambda t: torch.stack([t[:24], t[24:]], 1).flatten(0, 1)) if glu else (lambda t: t)
        field = "packed" if fmt in ("int4", "nvfp4") else "weight"
        want = torch.cat([getattr(parts["gate"], field), getattr(parts["up"], field)])
        got = getattr(q.weight, field)
        assert torch.equal(got.view(torch.uint8) if got.dtype == torch.float8_e4m3fn else got,
                           rows(want).view(torch.uint8) if want.dtype == torch.float8_e4m3fn else rows(want)), fmt
