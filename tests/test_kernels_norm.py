"""kernels/norm.py against its pure-torch references (Triton interpreter on the CPU)."""
import pytest
import torch

from vsr.kernels import fp8, norm

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float16: 1e-3, torch.float32: 1e-5}


def _ulp_close(a, b, dtype):
    """Within one rounding of the dtype (the fp32 sums' order may move a value across a midpoint)."""
    torch.testing.assert_close(a.float(), b.float(), rtol=TOL[dtype] * 2, atol=TOL[dtype] * 2)


def _poison(monkeypatch):
    """torch.empty inside norm.py hands out NaN-filled tensors, so an unwritten element fails."""
    real = torch.empty

    def empty(*a, **k):
        t = real(*a, **k)
        if t.dtype.is_floating_point and t.dtype.itemsize > 1:
            t.fill_(float("nan"))
        elif t.dtype == fp8.FP8_DTYPE:
            t.view(torch.uint8).fill_(0x7F)
        return t
    monkeypatch.setattr(norm.torch, "empty", empty)


def _strided(T, N, dtype, g):
    """[T, N] as a column slice of a wider tensor (a fused product's output)."""
    wide = torch.randn(T, N + 24, generator=g, dtype=torch.float32).to(dtype)
    return wide[:, 8:8 + N]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("N", [64, 384, 320])   # one block; 256 + 128; 256 + 64
@pytest.mark.parametrize("res", [False, True])
@pytest.mark.parametrize("zero_centered", [False, True])
@pytest.mark.parametrize("exact", [True, False])
def test_rms_norm(monkeypatch, dtype, N, res, zero_centered, exact):
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(N + 7 * res)
    x = _strided(5, N, dtype, g).to(DEV)
    r = (torch.randn(5, N, generator=g) * 3).to(dtype).to(DEV) if res else None
    w = (torch.randn(N, generator=g) * 0.5 + 1).to(dtype).to(DEV)
    kw = dict(residual=r, zero_centered=zero_centered, exact=exact)
    y, s = norm.rms_norm(x, w, 1e-6, **kw)
    yr, sr = norm.rms_norm_reference(x, w, 1e-6, **kw)
    _ulp_close(y, yr, dtype)
    if res:
        assert torch.equal(s, sr)
    else:
        assert s is None and sr is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("N", [384, 128])
@pytest.mark.parametrize("res", [False, True])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("exact", [True, False])
def test_layer_norm(monkeypatch, dtype, N, res, bias, exact):
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(N + 3 * res + bias)
    x = (_strided(4, N, dtype, g) + 0.7).to(DEV)
    r = torch.randn(4, N, generator=g).to(dtype).to(DEV) if res else None
    w = (torch.randn(N, generator=g) * 0.5 + 1).to(dtype).to(DEV)
    b = torch.randn(N, generator=g).to(dtype).to(DEV) if bias else None
    y, s = norm.layer_norm(x, w, b, 1e-12, residual=r, exact=exact)
    yr, sr = norm.layer_norm_reference(x, w, b, 1e-12, residual=r, exact=exact)
    _ulp_close(y, yr, dtype)
    assert (s is None) == (not res) and (not res or torch.equal(s, sr))


def test_exact_rms_rounds_twice():
    """The exact form rounds n before the weight (Qwen3RMSNorm); the approximate form does not:
    on enough rows the two differ, and each matches its own reference."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 128, generator=g).to(torch.float16).to(DEV)
    w = (torch.randn(128, generator=g) * 3).to(torch.float16).to(DEV)
    ye, _ = norm.rms_norm(x, w, 1e-6)
    ya, _ = norm.rms_norm(x, w, 1e-6, exact=False)
    assert not torch.equal(ye, ya)
    assert (ye != norm.rms_norm_reference(x, w, 1e-6)[0]).float().mean() < 0.01
    assert (ya != norm.rms_norm_reference(x, w, 1e-6, exact=False)[0]).float().mean() < 0.01


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("layer", [False, True])
def test_fused_fp8_quantization_is_quantize_activation(monkeypatch, dtype, layer):
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(5 + layer)
    N = 320
    x = _strided(6, N, dtype, g).to(DEV)
    x[2] = 0   # an all-zero row: the eps scale
    r = torch.randn(6, N, generator=g).to(dtype).to(DEV)
    r[2] = 0
    w = (torch.randn(N, generator=g) + 1).to(dtype).to(DEV)
    if layer:
        y, s, xq, xs = norm.layer_norm(x, w, None, 1e-5, residual=r, quant_fp8=True)
        ref = norm.layer_norm_reference(x, w, None, 1e-5, residual=r, quant_fp8=True)
    else:
        y, s, xq, xs = norm.rms_norm(x, w, 1e-6, residual=r, quant_fp8=True)
        ref = norm.rms_norm_reference(x, w, 1e-6, residual=r, quant_fp8=True)
    q, qs = fp8.quantize_activation(y)
    assert xq.dtype == fp8.FP8_DTYPE and xs.shape == (6,) and xs.dtype == dtype
    assert torch.equal(xq.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(xs, qs.reshape(-1))
    _ulp_close(y, ref[0], dtype)
    assert torch.equal(s, ref[1])


def test_empty_and_batch_independence():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(7, 256, generator=g).to(torch.float16).to(DEV)
    w = torch.randn(256, generator=g).to(torch.float16).to(DEV)
    y0, _ = norm.rms_norm(x[:0], w, 1e-6)
    assert y0.shape == (0, 256)
    y_all, _ = norm.rms_norm(x, w, 1e-6)
    y_one, _ = norm.rms_norm(x[3:4], w, 1e-6)
    assert torch.equal(y_all[3:4], y_one)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("H,D", [(4, 32), (20, 64), (3, 48)])   # one head block; two (16 + 4); D not a power of 2
@pytest.mark.parametrize("exact", [True, False])
def test_gated_rms_norm(monkeypatch, dtype, H, D, exact):
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(H * D)
    x = (torch.randn(6, H * D, generator=g) * 2).to(dtype).to(DEV)
    z = _strided(6, H * D, dtype, g).to(DEV)   # a column slice of a fused product's output
    assert z.stride(0) > z.shape[1]
    w = (torch.randn(D, generator=g) * 0.5 + 1).to(dtype).to(DEV)
    y = norm.gated_rms_norm(x, z, w, 1e-6, exact=exact)
    yr = norm.gated_rms_norm_reference(x, z, w, 1e-6, exact=exact)
    assert y.shape == x.shape and y.dtype == dtype and y.is_contiguous() and not y.isnan().any()
    _ulp_close(y, yr, dtype)


def test_gated_rms_norm_reference_is_transformers():
    """The reference is Qwen3_5RMSNormGated per head, bf16 weights and activations included."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNormGated

    g = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.bfloat16):
        m = Qwen3_5RMSNormGated(32, eps=1e-6).to(dtype)
        with torch.no_grad():
            m.weight.copy_(torch.randn(32, generator=g) * 0.3 + 1)
        x, z = (torch.randn(5, 4 * 32, generator=g) * 2).to(dtype), torch.randn(5, 4 * 32, generator=g).to(dtype)
        want = m(x.reshape(-1, 32), z.reshape(-1, 32)).detach().reshape(5, -1)
        assert torch.equal(norm.gated_rms_norm_reference(x, z, m.weight.detach(), 1e-6), want)
    # The exact and approximate forms differ (the exact rounds n and w * n): both are really computed.
    assert not torch.equal(norm.gated_rms_norm_reference(x, z, m.weight.detach(), 1e-6),
                           norm.gated_rms_norm_reference(x, z, m.weight.detach(), 1e-6, exact=False))


@pytest.mark.parametrize("layer", [False, True])
def test_codes_alone_leave_the_norm_unwritten(monkeypatch, layer):
    # keep_output=False with quant_fp8: the same sum, codes and scales, y None (not written).
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(12 + layer)
    N = 320
    x = _strided(6, N, torch.float16, g).to(DEV)
    r = torch.randn(6, N, generator=g).half().to(DEV)
    w = (torch.randn(N, generator=g) + 1).half().to(DEV)
    f = (lambda **k: norm.layer_norm(x, w, None, 1e-5, residual=r, quant_fp8=True, **k)) if layer else \
        (lambda **k: norm.rms_norm(x, w, 1e-6, residual=r, quant_fp8=True, **k))
    _, s, xq, xs = f()
    x0, r0 = x.clone(), r.clone()
    y2, s2, xq2, xs2 = f(keep_output=False)
    assert torch.equal(x, x0) and torch.equal(r, r0), "nothing is written in place of y"
    assert y2 is None and torch.equal(s, s2) and torch.equal(xs, xs2)
    assert torch.equal(xq.view(torch.uint8), xq2.view(torch.uint8))
    ref = (norm.layer_norm_reference(x, w, None, 1e-5, residual=r, quant_fp8=True, keep_output=False) if layer
           else norm.rms_norm_reference(x, w, 1e-6, residual=r, quant_fp8=True, keep_output=False))
    assert ref[0] is None and len(ref) == 4
    with pytest.raises(ValueError, match="keep_output"):
        norm.rms_norm(x, w, 1e-6, keep_output=False)
