"""Packages written by compressed-tensors' own compressors, read back by our loader.

For each preset (FP8_DYNAMIC, W4A16, W4A16_ASYM, NVFP4, NVFP4A16) a tiny module
of Linear layers (odd N = 196 for the zero-point padding, bias on and off, an
ignored dense head) is quantized with the library: its scales come from the
library's own `calculate_qparams` / `generate_gparam`, its fake-quant forward
gives the expected outputs, its compressor writes the tensors and its
ModelCompressor writes config.json. Then:
(a) PackageLoader + kernels' dequantize() equals the library's decompressor
    bit for bit after casting to the library's output dtype (FORMATS.md pitfall 5);
(b) the kernels' reference_linear (through QLinear) matches the library's
    fake-quant forward on 3-D [B, S, K] inputs (pitfall 4).
"""
from __future__ import annotations

import json

import pytest
import torch

ct = pytest.importorskip("compressed_tensors", reason="compressed-tensors is the test reference: pip install -e '.[test]'")

from compressed_tensors.compressors import ModelCompressor  # noqa: E402
from compressed_tensors.compressors.base import BaseCompressor  # noqa: E402
from compressed_tensors.quantization import (  # noqa: E402
    QuantizationConfig,
    QuantizationStatus,
    apply_quantization_config,
    preset_name_to_scheme,
)
from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from vsr.kernels import dense, fp8, int4, nvfp4  # noqa: E402
from vsr.runtime.linear import QLinear  # noqa: E402
from vsr.runtime.loaders import PackageLoader  # noqa: E402
from vsr.runtime.quant_config import package_formats  # noqa: E402

DEQUANT = {"dense": dense.dequantize, "fp8": fp8.dequantize, "int4": int4.dequantize, "nvfp4": nvfp4.dequantize}
PRESETS = {"FP8_DYNAMIC": "fp8", "W4A16": "int4", "W4A16_ASYM": "int4", "NVFP4": "nvfp4", "NVFP4A16": "nvfp4"}
QUANTIZED = ("q", "o")  # "head" is in the ignore list and stays dense


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(256, 196, bias=True)   # odd N: zero points pad 196 -> 25 words
        self.o = torch.nn.Linear(256, 64, bias=False)
        self.head = torch.nn.Linear(64, 10, bias=True)


def _calibrate(mod: torch.nn.Module, x: torch.Tensor) -> None:
    """Weight (and NVFP4 input-global) qparams from the library's own functions, as its observers do."""
    scheme = mod.quantization_scheme
    a = scheme.weights
    W = mod.weight.data
    N, K = W.shape
    gscale = None
    if a.strategy == "channel":
        mn, mx = W.amin(1, keepdim=True), W.amax(1, keepdim=True)
    else:  # group / tensor_group
        Wg = W.reshape(N, K // a.group_size, a.group_size)
        mn, mx = Wg.amin(-1), Wg.amax(-1)
    if a.strategy == "tensor_group":
        gscale = generate_gparam(W.min(), W.max())
        mod.weight_global_scale.data.copy_(gscale)
    scale, zp = calculate_qparams(mn, mx, a, global_scale=gscale)
    mod.weight_scale.data.copy_(scale)
    if hasattr(mod, "weight_zero_point"):
        mod.weight_zero_point.data.copy_(zp)
    if scheme.input_activations is not None and hasattr(mod, "input_global_scale"):
        mod.input_global_scale.data.copy_(generate_gparam(x.min(), x.max()))
    mod.quantization_status = QuantizationStatus.FROZEN


def build_package(tmp, preset: str, dtype: torch.dtype, seed: int):
    """Write a package with the library; return (dir, inputs, expected outputs, library-dequantized W)."""
    torch.manual_seed(seed)
    net = Net().to(dtype)
    cfg = QuantizationConfig(config_groups={"group_0": preset_name_to_scheme(preset, ["Linear"])},
                             ignore=["head"], quantization_status=QuantizationStatus.INITIALIZED)
    apply_quantization_config(net, cfg, show_progress=False)
    xs, want = {}, {}
    for name in QUANTIZED:
        mod = getattr(net, name)
        # Per-token activation scales only show on 3-D inputs (FORMATS.md pitfall 4); vary the row scale.
        x = torch.randn(3, 5, 256, dtype=torch.float32) * torch.logspace(-2, 1, 5)[None, :, None]
        x = x.to(dtype)
        _calibrate(mod, x)
        with torch.no_grad():
            want[name] = mod(x)   # the library's fake-quant forward (status FROZEN)
        xs[name] = x
    comp = ModelCompressor.from_pretrained_model(net)
    comp.compress_model(net)
    state = {k: v.detach().clone().contiguous() for k, v in net.state_dict().items()}
    lib_w = {}
    for name in QUANTIZED:
        mod = getattr(net, name)
        local = {k.split(".", 1)[1]: v.clone() for k, v in state.items() if k.startswith(name + ".")}
        fmt = mod.quantization_scheme.format
        lib_w[name] = BaseCompressor.get_value_from_registry(fmt).decompress(local, mod.quantization_scheme)["weight"]
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps({"model_type": "test", "torch_dtype": str(dtype).removeprefix("torch.")}))
    comp.update_config(str(tmp))
    return tmp, xs, want, lib_w


# The library's forward runs F.linear in the model dtype, ours accumulates in fp32 and rounds once:
# bf16 outputs may differ by an ulp or two of the output (2^-8 relative); fp32 only in summation order.
TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2**-7, 2**-7)}


def rows_close(y: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Elementwise |y - ref| <= rtol·|ref| + atol·max|ref of the same row| (rows vary 1000x in scale)."""
    rtol, atol_rel = TOL[dtype]
    y, ref = y.float(), ref.float()
    return (y - ref).abs() <= rtol * ref.abs() + atol_rel * ref.abs().amax(-1, keepdim=True)


def _fp8_per_tensor(x: torch.Tensor, w) -> torch.Tensor:
    s = x.abs().amax() / fp8.FP8_MAX
    y = (fp8.e4m3_rne(x / s).float() @ w.weight.float().t()) * s.float() * w.weight_scale.float()
    return (y if w.bias is None else y + w.bias.float()).to(x.dtype)


def assert_close_rows(y, ref, dtype, what):
    ok = rows_close(y, ref, dtype)
    assert ok.all(), f"{what}: {int((~ok).sum())} of {ok.numel()} outputs out of tolerance"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("preset", list(PRESETS))
def test_library_package_matches_reference(tmp_path, preset, dtype):
    pkg, xs, want, lib_w = build_package(tmp_path, preset, dtype, seed=hash((preset, str(dtype))) % 1000)
    config = json.loads((pkg / "config.json").read_text())
    # The formats are known from config.json alone (the head is ignored, so dense too).
    assert package_formats(config) == {PRESETS[preset], "dense"}

    loader = PackageLoader(pkg, config)
    assert loader.check_linears(["q", "o", "head"]) == {"q": PRESETS[preset], "o": PRESETS[preset], "head": "dense"}
    for name in QUANTIZED:
        w = loader.linear(name)
        assert w.format == PRESETS[preset]
        assert (w.bias is not None) == (name == "q")
        # (a) bit-exact against the library's decompressor, after casting to its output dtype.
        ours = DEQUANT[w.format](w).to(lib_w[name].dtype)
        assert torch.equal(ours, lib_w[name]), (
            f"{preset} {name}: {(ours.float() - lib_w[name].float()).abs().max()} max abs diff vs the library")
        # (b) the reference forward against the library's fake-quant forward.
        y = QLinear(w, "reference")(xs[name])
        assert y.dtype == xs[name].dtype and y.shape == want[name].shape
        assert_close_rows(y, want[name], dtype, f"{preset} {name}")
        if w.format == "fp8":
            # Negative control: one per-tensor activation scale (the library's quirk for 2-D inputs)
            # must fail this check, or it could not tell per-token from per-tensor numerics.
            assert not rows_close(_fp8_per_tensor(xs[name], w), want[name], dtype).all()

    head = loader.linear("head")
    assert head.format == "dense" and head.weight.dtype == dtype and head.bias is not None
