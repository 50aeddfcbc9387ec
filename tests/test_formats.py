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
