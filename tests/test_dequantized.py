"""The CPU's dequantize-once reference (runtime/dequantized.py) gives the per-call reference's bytes.

Every format and variant (bf16 dense, FP8 W8A8, int4 GPTQ/AWQ with and without act order and a
bias, NVFP4A16 and NVFP4 W4A4) on random weights and fresh random activations in fp32, bf16 and
fp16; a QLinear on the CPU uses the prepared path and gives the same bytes as reference_linear.
The built-in packages' answers through an engine, prepared and per call, are compared in
test_builtin_packages_prepared_equal_per_call (the packages on this machine; skipped where absent).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from vsr.autotune.synth import random_weight
from vsr.kernels import dense, fp8, int4, nvfp4
from vsr.runtime.dequantized import prepare_reference
from vsr.runtime.linear import QLinear

REFERENCE = {"dense": dense, "fp8": fp8, "int4": int4, "nvfp4": nvfp4}
N, K = 37, 256
CASES = [
    ("dense", {"wdtype": "bfloat16"}),
    ("dense", {"wdtype": "float16"}),
    ("fp8", {}),
    ("int4", {"group": 128, "symmetric": True}),
    ("int4", {"group": 64, "symmetric": False}),
    ("int4", {"group": 128, "symmetric": True, "act_order": True}),
    ("nvfp4", {"act": "none"}),
    ("nvfp4", {"act": "e2m1-block16-dynamic"}),
]


def _with_bias(w, seed):
    b = torch.randn(w.N, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    return dataclasses.replace(w, bias=b)


@pytest.mark.parametrize("fmt,params", CASES, ids=[f"{f}-{'-'.join(map(str, p.values()))}" for f, p in CASES])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("act", [torch.float32, torch.bfloat16, torch.float16])
def test_prepared_gives_reference_bytes(fmt, params, bias, act):
    w = random_weight(fmt, N, K, params, torch.bfloat16, seed=3)
    if bias:
        w = _with_bias(w, 4)
    prepared = prepare_reference(w)
    assert prepared is not None
    for seed, rows in ((5, 1), (6, 7), (7, 40)):
        x = (torch.randn(rows, K, generator=torch.Generator().manual_seed(seed)) * 3).to(act)
        ref = REFERENCE[fmt].reference_linear(x, w)
        y = prepared(x)
        assert y.dtype == ref.dtype and y.shape == ref.shape
        assert not torch.isnan(ref).any()
        assert torch.equal(y.contiguous().view(torch.uint8), ref.contiguous().view(torch.uint8)), (
            f"{fmt} {params}: bytes differ at {rows} rows")


def test_fp32_dense_needs_no_copy():
    w = random_weight("dense", N, K, {"wdtype": "float32"}, torch.float32)
    assert prepare_reference(w) is None


@pytest.mark.parametrize("fmt,params", [CASES[3], CASES[7], CASES[2]])
def test_qlinear_on_cpu_uses_the_prepared_path(fmt, params, monkeypatch):
    w = random_weight(fmt, N, K, params, torch.bfloat16, seed=8)
    q = QLinear(w)
    assert q._prepared is not None
    x = torch.randn(2, 3, K, generator=torch.Generator().manual_seed(9))
    y = q(x)
    # the per-call reference, on the same input
    assert torch.equal(y.reshape(-1, N), REFERENCE[fmt].reference_linear(x.reshape(-1, K), w))
    # forward does not rebuild the weight: the format's dequantize is never called
    monkeypatch.setattr(REFERENCE[fmt], "dequantize", lambda *_: pytest.fail("dequantized per call"))
    if fmt == "int4":
        monkeypatch.setattr(int4, "unpack_int4", lambda *_: pytest.fail("unpacked per call"))
    if fmt == "nvfp4":
        monkeypatch.setattr(nvfp4, "unpack_fp4", lambda *_: pytest.fail("unpacked per call"))
    assert torch.equal(q(x), y)
    # a new weight is prepared again
    w2 = random_weight(fmt, N, K, params, torch.bfloat16, seed=10)
    monkeypatch.undo()
    q.weight = w2
    assert torch.equal(q(x).reshape(-1, N), REFERENCE[fmt].reference_linear(x.reshape(-1, K), w2))


def test_triton_mode_prepares_nothing():
    w = random_weight("int4", N, K, {"group": 128}, torch.bfloat16)
    assert QLinear(w, "triton", tiles=object())._prepared is None


BUILTINS = ["vsr/intent-minilm-FP8", "vsr/intent-minilm-W4A16-GPTQ", "vsr/intent-minilm-W4A16-AWQ",
            "vsr/intent-minilm-NVFP4", "vsr/intent-minilm-NVFP4-AWQ"]


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_packages_prepared_equal_per_call(name):
    """A built-in quantized package's probabilities, weights dequantized once, equal the per-call
    reference's byte for byte (on this machine's built packages; building one takes minutes)."""
    from vsr.runtime import builtin
    from vsr.runtime.engine import load_engine
    from vsr.runtime.package import open_package

    if not builtin.package_dir(name).is_dir():
        pytest.skip(f"{name} is not built on this machine (vsr-run {name} --emulate --text hi builds it)")
    engine = load_engine(open_package(name, device="cpu", emulate=True), device="cpu", emulate=True)
    texts = ["turn on the kitchen lights", "what is the weather like tomorrow in Paris",
             "set a timer for ten minutes", "lock the front door", "add milk to my shopping list"] * 7
    prepared = engine.forward(texts)
    linears = [m for m in engine.model.modules() if isinstance(m, QLinear)]
    assert sum(q._prepared is not None for q in linears) >= 24   # every product (6 layers x q|k|v, o, in, out)
    for q in linears:
        q.__dict__["_prepared"] = None   # back to the per-call reference
    assert torch.equal(prepared, engine.forward(texts))


def test_parts_over_one_input_quantize_it_once(monkeypatch):
    """NVFP4 W4A4 parts kept apart by their weight global scales but sharing an input global
    scale (the built-in NVFP4 packages' q|k|v): a Projection quantizes its input once, and each
    part's output is still its reference_linear's; parts with other input scales quantize apart."""
    from vsr.runtime import act_quant
    from vsr.runtime.models.common import Projection

    base = random_weight("nvfp4", N, K, {"act": "e2m1-block16-dynamic"}, torch.bfloat16, seed=11)
    parts = [dataclasses.replace(_with_bias(base, 12 + i), global_scale=base.global_scale * (1 + i),
                                 packed=torch.roll(base.packed, i, dims=0)) for i in range(3)]
    x = torch.randn(2, 5, K, generator=torch.Generator().manual_seed(13)) * 3
    calls = []
    real = act_quant.Nvfp4Activation.__call__
    monkeypatch.setattr(act_quant.Nvfp4Activation, "__call__", lambda self, a: calls.append(a.shape) or real(self, a))
    for igs, quantizations in ((None, 1), ([1.0, 2.0, 1.0], 3)):
        ws = parts if igs is None else [dataclasses.replace(p, input_global_scale=p.input_global_scale * g)
                                        for p, g in zip(parts, igs)]
        calls.clear()
        y = Projection([QLinear(w) for w in ws], [N] * 3, False)(x)
        assert len(calls) == quantizations
        want = torch.cat([nvfp4.reference_linear(x.reshape(-1, K), w) for w in ws], dim=-1)
        assert torch.equal(y.reshape(-1, 3 * N).view(torch.int32), want.view(torch.int32))


def test_nvfp4_parts_stack_into_one_product_with_their_bytes():
    """Parts kept apart by their weight global scales run on the CPU as one product over the
    stacked weight, each column times its part's alpha: the bytes of each part's reference_linear,
    a part without a bias beside parts with one included (-0.0 outputs stay -0.0); the parts'
    weights are views of the stacked one; a part given a new weight ends the stack."""
    from vsr.runtime.models.common import Projection

    base = random_weight("nvfp4", N, K, {"act": "e2m1-block16-dynamic"}, torch.bfloat16, seed=21)
    parts = [dataclasses.replace(base if i == 1 else _with_bias(base, 22 + i), global_scale=base.global_scale * (1 + i),
                                 packed=torch.roll(base.packed, i, dims=0)) for i in range(3)]
    proj = Projection([QLinear(w) for w in parts], [N] * 3, False)
    assert proj.stacked is not None and proj.stacked.valid()
    stacked_w = proj.stacked.stacked.dense
    assert all(q._prepared.dense.untyped_storage().data_ptr() == stacked_w.untyped_storage().data_ptr()
               for q in proj.parts)
    for seed, rows in ((23, 1), (24, 9), (25, 33)):
        x = torch.randn(rows, K, generator=torch.Generator().manual_seed(seed)) * 3
        x[0, :16] = 0.0    # a zero block: its outputs' signs come from the products alone
        y = proj(x)
        want = torch.cat([nvfp4.reference_linear(x, w) for w in parts], dim=-1)
        assert torch.equal(y.view(torch.int32), want.view(torch.int32))
        assert torch.equal(y.view(torch.int32), torch.cat([q(x) for q in proj.parts], -1).view(torch.int32))
    proj.parts[0].weight = parts[2]
    assert not proj.stacked.valid()
    x = torch.randn(4, K, generator=torch.Generator().manual_seed(26))
    want = torch.cat([nvfp4.reference_linear(x, w) for w in (parts[2], parts[1], parts[2])], dim=-1)
    assert torch.equal(proj(x).view(torch.int32), want.view(torch.int32))


def test_a_projection_warns_only_when_its_parts_run_apart():
    """Builder.projection warns that parts which cannot share a weight run as several products,
    except where the CPU reference stacks them into one (NVFP4 W4A4 parts over one input scale)."""
    import types
    import warnings

    from vsr.runtime.models.common import Builder

    base = random_weight("nvfp4", N, K, {"act": "e2m1-block16-dynamic"}, torch.bfloat16, seed=31)
    names = ["q", "k", "v"]
    for igs, warned in (((1.0, 1.0, 1.0), False), ((1.0, 2.0, 1.0), True)):
        parts = {n: dataclasses.replace(base, global_scale=base.global_scale * (1 + i),
                                        input_global_scale=base.input_global_scale * g)
                 for i, (n, g) in enumerate(zip(names, igs))}
        b = Builder(types.SimpleNamespace(linear=parts.__getitem__), QLinear, torch.float32, "cpu", False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            proj = b.projection("qkv", names)
        assert not proj.fused and (proj.stacked is None) == warned
        assert [("run as 3 products" in str(w.message)) for w in caught] == ([True] if warned else [])
