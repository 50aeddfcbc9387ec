"""kernels/activation.py against its pure-torch references (Triton interpreter on the CPU)."""
import pytest
import torch

from test_kernels_norm import DEV, _poison, _strided, _ulp_close
from vsr.kernels import activation, fp8

CASES = [(name, kw, exact) for name, kw in [("silu_mul", {}), ("gelu_mul", {"approximate": "none"}),
                                            ("gelu_mul", {"approximate": "tanh"})] for exact in (True, False)]
CASES += [("gelu", {"approximate": "none"}, None), ("gelu", {"approximate": "tanh"}, None)]   # one rounding


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("name,kw,exact", CASES)
@pytest.mark.parametrize("C", [192, 4200])   # one program a row; several column programs
def test_activation(monkeypatch, dtype, name, kw, exact, C):
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(C)
    x = (_strided(3, C, dtype, g) * 3).to(DEV)
    if name != "gelu":
        kw = dict(kw, exact=exact)
    y = getattr(activation, name)(x, **kw)
    yr = getattr(activation, name + "_reference")(x, **kw)
    assert y.shape == yr.shape and y.dtype == dtype
    _ulp_close(y, yr, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("C", [192, 4200, 34816 // 16])
def test_silu_mul_of_interleaved_columns(monkeypatch, dtype, exact, C):
    """interleaved=True (gate j in column 2j, up j in 2j + 1): the bytes of the gate-first form of
    the same columns, and its reference's; with the fp8 codes too."""
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(C + exact)
    x = (_strided(3, C, dtype, g) * 3).to(DEV)
    y = activation.silu_mul(x, exact=exact, interleaved=True)
    gate_first = torch.cat([x[:, 0::2], x[:, 1::2]], dim=1).contiguous()
    assert torch.equal(y, activation.silu_mul(gate_first, exact=exact))
    _ulp_close(y, activation.silu_mul_reference(x, exact=exact, interleaved=True), dtype)
    yq, xq, xs = activation.silu_mul(x, exact=exact, interleaved=True, quant_fp8=True)
    _, wq, ws = activation.silu_mul(gate_first, exact=exact, quant_fp8=True)
    assert torch.equal(yq, y) and torch.equal(xq.view(torch.uint8), wq.view(torch.uint8)) and torch.equal(xs, ws)


def test_exact_and_approximate_differ():
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(32, 256, generator=g) * 3).to(torch.float16).to(DEV)
    ye, ya = activation.silu_mul(x), activation.silu_mul(x, exact=False)
    assert not torch.equal(ye, ya)
    assert (ye != activation.silu_mul_reference(x)).float().mean() < 0.01
    assert (ya != activation.silu_mul_reference(x, exact=False)).float().mean() < 0.01


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("name", ["silu_mul", "gelu", "gelu_mul"])
def test_fused_fp8_quantization_is_quantize_activation(monkeypatch, dtype, name):
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(9)
    x = (_strided(5, 640, dtype, g) * 2).to(DEV)   # 320 output columns of a gated form: 256 + 64
    x[1] = 0
    y, xq, xs = getattr(activation, name)(x, quant_fp8=True)
    yr = getattr(activation, name + "_reference")(x, quant_fp8=True)[0]
    q, qs = fp8.quantize_activation(y)
    assert torch.equal(xq.view(torch.uint8), q.view(torch.uint8)) and torch.equal(xs, qs.reshape(-1))
    assert xs[1] == fp8.dtype_eps(dtype)
    _ulp_close(y, yr, dtype)


def test_bad_arguments():
    x = torch.randn(2, 6).to(DEV)
    with pytest.raises(ValueError):
        activation.gelu(x, approximate="erf")
    with pytest.raises(AssertionError):
        activation.silu_mul(torch.randn(2, 5).to(DEV))


@pytest.mark.parametrize("name", ["silu_mul", "gelu", "gelu_mul"])
def test_codes_alone_leave_the_output_unwritten(monkeypatch, name):
    # keep_output=False (a caller that reads only the codes): the same codes and scales, no output
    # tensor, the input untouched; the reference twin answers alike. Without quant_fp8 there would be nothing to return.
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(11)
    x = (_strided(5, 640, torch.float16, g) * 2).to(DEV)
    _, xq, xs = getattr(activation, name)(x, quant_fp8=True)
    x0 = x.clone()
    y, xq2, xs2 = getattr(activation, name)(x, quant_fp8=True, keep_output=False)
    assert torch.equal(x, x0), "nothing is written in place of the output"
    assert y is None and torch.equal(xq.view(torch.uint8), xq2.view(torch.uint8)) and torch.equal(xs, xs2)
    # (the reference twin against itself: on a GPU torch's gelu and the kernel's may round an
    # element one unit apart, and its code with it; test_activation holds them within that)
    _, qk, sk = getattr(activation, name + "_reference")(x, quant_fp8=True)
    yr, qr, sr = getattr(activation, name + "_reference")(x, quant_fp8=True, keep_output=False)
    assert yr is None and torch.equal(qr.view(torch.uint8), qk.view(torch.uint8)) and torch.equal(sr, sk)
    # kernel against reference: each dequantized code within one e4m3 step (an eighth of its binade,
    # or the smallest subnormal step times the scale near zero)
    got = xq2.float().cpu() * xs2.float().cpu()[:, None]
    want = qr.float().cpu() * sr.float().cpu()[:, None]
    torch.testing.assert_close(got, want, rtol=0.13, atol=2.0 ** -9 * float(sr.float().max()))
    with pytest.raises(ValueError, match="keep_output"):
        getattr(activation, name)(x, keep_output=False)
