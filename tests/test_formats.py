"""The format registry: a format registered from its own module (tests/toy_format.py) reaches
QLinear's reference path, the template choice and vsr-tune's job list with no edit elsewhere."""
from __future__ import annotations

import pytest
import torch

from vsr.autotune import shapes, synth
from vsr.autotune.jobs import shape_jobs
from vsr.kernels import formats, registry
from vsr.runtime.linear import QLinear

import toy_format


@pytest.fixture
def toy():
    formats.register(toy_format.FORMAT)
    try:
        yield toy_format.FORMAT
    finally:
        formats.unregister("toy")


def test_builtin_formats_are_registered_with_their_templates():
    assert list(formats.FORMATS) == ["dense", "fp8", "int4", "nvfp4"]
    assert set(registry.TEMPLATES) == {t.name for f in formats.FORMATS.values() for t in f.templates}
    assert list(shapes.FORMATS) == ["bf16", "fp16", "fp32", "fp8", "int4-gptq", "int4-awq", "nvfp4", "nvfp4-emulated"]


def test_a_registered_format_reaches_qlinear_and_the_job_list(toy):
    g = torch.Generator().manual_seed(7)
    w = synth.random_weight("toy", 24, 64, {}, torch.float32, "cpu", seed=3)
    assert isinstance(w, toy_format.ToyWeight) and w.q.abs().sum() > 0
    x = torch.randn(5, 64, generator=g)
    y = QLinear(w, "reference")(x)
    assert torch.equal(y, toy_format.reference_linear(x, w))
    assert registry.template_for(w, torch.float32) is toy_format.TEMPLATE
    assert synth.weight_format("toy_w8a16") == "toy"
    jobs = shape_jobs("24x64,48x64", "toy-int8", "cpu", [1, 16], "fp32")
    assert [(j["label"], j["problem"].N, j["problem"].bucket) for j in jobs] == [
        ("24x64 toy-int8", 24, 1), ("24x64 toy-int8", 24, 16), ("48x64 toy-int8", 48, 1), ("48x64 toy-int8", 48, 16)]
    assert all(j["template"] is toy_format.TEMPLATE and j["problem"].params == (("bits", 8),) for j in jobs)
    assert all(isinstance(j["weight"], toy_format.ToyWeight) for j in jobs)


def test_unregistered_toy_is_unknown_everywhere():
    with pytest.raises(ValueError, match="unknown weight format 'toy'"):
        synth.random_weight("toy", 8, 8, {}, torch.float32)
    with pytest.raises(ValueError, match="format 'toy-int8' is not one of"):
        shape_jobs("8x8", "toy-int8", "cpu", [1])
    with pytest.raises(ValueError, match="QLinear: unknown weight format 'toy'"):
        QLinear(toy_format.ToyWeight(torch.zeros(2, 2, dtype=torch.int8), torch.tensor(1.0)))


def test_a_taken_name_is_refused(toy):
    import dataclasses
    with pytest.raises(ValueError, match="registered already"):
        formats.register(dataclasses.replace(toy_format.FORMAT))
    with pytest.raises(ValueError, match="record format 'bf16'"):
        formats.register(dataclasses.replace(toy_format.FORMAT, name="toy2", weight_class=type(
            "W", (), {"format": "toy2"}), templates=(), records=(formats.Record("bf16"),)))


@pytest.mark.parametrize("symmetric", [True, False])
def test_random_int4_weights_are_quantized_gaussians(symmetric):
    """The tuner's and the benchmarks' random int4 weight holds a package's codes (Gaussian weights
    quantized per group, GPTQ's absmax or AWQ's min-max), not uniform ones: the tensor cores' power,
    and so a forward's time at 1,024 rows, follows the values (builtin_formats.int4_random)."""
    from vsr.kernels import int4
    from vsr.kernels.builtin_formats import RANDOM_WEIGHT_STD
    w = synth.random_weight("int4", 64, 1000, {"group": 128, "symmetric": symmetric}, torch.bfloat16, "cpu", seed=5)
    u = int4.unpack_int4(w.packed, 1000)
    assert u.shape == (64, 1000) and w.scale.shape == (64, 8)
    z = torch.full_like(w.scale, 8, dtype=torch.int32) if symmetric else w.zero_point
    centred = u - z.repeat_interleave(128, dim=1)[:, :1000]
    # a group's absmax (about 2.6 standard deviations) is 7.5 codes, so a standard deviation is about
    # 2.9 codes: some 3/4 of the codes lie within 3 of the zero point, where uniform codes put 7/16
    assert (centred.abs() <= 3).float().mean() > 0.65
    full = u[:, :896].reshape(64, 7, 128)   # the seven whole groups of each row
    if symmetric:   # each group's largest |w| reaches the end of the range
        assert ((full - 8).abs().amax(-1) >= 7).all()
    else:   # each group's min and max: codes 0 and 15; the zero points near the middle
        assert (full.amin(-1) == 0).all() and (full.amax(-1) == 15).all()
        assert (w.zero_point - 7.5).abs().float().mean() < 1.5
    deq = centred.float() * w.scale.float().repeat_interleave(128, dim=1)[:, :1000]
    assert abs(deq.std().item() / RANDOM_WEIGHT_STD - 1) < 0.1


def test_random_nvfp4_weights_are_quantized_gaussians():
    """The random NVFP4 weight is Gaussian weights quantized as llm-compressor quantizes them (every
    block's largest |w| on code ±6, its scale e4m3(gs · amax / 6)), with a fixed global scale that fused
    parts share (builtin_formats.nvfp4_random)."""
    from vsr.kernels import nvfp4
    from vsr.kernels.builtin_formats import RANDOM_WEIGHT_STD
    a, b = (synth.random_weight("nvfp4", 64, 1024, {"act": "e2m1-block16-dynamic"}, torch.bfloat16, "cpu", seed=s)
            for s in (5, 6))
    assert torch.equal(a.global_scale, b.global_scale) and not torch.equal(a.packed, b.packed)
    mag = (nvfp4.unpack_fp4(a.packed) & 7).reshape(64, 64, 16)
    assert (mag.amax(-1) == 7).all()   # code 7 is 6.0: each block's amax reaches the end of the range
    # uniform codes put 1/8 on each magnitude; a Gaussian block's values crowd below its amax
    assert (mag <= 4).float().mean() > 0.55
    deq = nvfp4.dequantize(a)
    assert abs(deq.std().item() / RANDOM_WEIGHT_STD - 1) < 0.1
