"""The forward's Triton kernels (norm, rope, activation, attention, head) at the shapes of the
27B-class decoder (hidden 5120, 64/8 heads of 128, MLP 17408) and of MiniLM (hidden 384, 12
heads of 32, MLP 1536), bf16, against their pure-torch references (GPU only): within the
tolerance of their roundings, the fused FP8 codes equal to fp8.quantize_activation's bits, the
same bytes on a second call. Each test prints the kernel's time beside its reference's (run with
-s to read them; not asserted).
"""
from __future__ import annotations

import pytest
import torch

from vsr.kernels import activation, attention, fp8, head, norm, rope

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16
DEV = "cuda"
# bf16's relative step: exact kernels differ from the references only where the order of an fp32
# sum (or a last fp32 bit of exp, erf, rsqrt) moves a value across a rounding midpoint; after two
# roundings (n, then w · n; silu(g), then its product with up) that is up to two steps.
ONE_ULP = 2 ** -7
ATTN_TOL = 2e-2   # bf16 probabilities in P · V against the fp32 reference


def _ms(fn, iters=20):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def _timing(name, fn, ref):
    print(f"\n{name}: triton {_ms(fn) * 1e3:8.1f} us, torch reference {_ms(ref) * 1e3:8.1f} us")


def _close_within_roundings(a, b, scale=None):
    """Within two roundings of b, or of `scale` where the output is a difference of rounded terms
    (RoPE's x1*cos - x2*sin): a one-step difference in a term then shows relative to the term."""
    a, b = a.float(), b.float()
    ref = b.abs() if scale is None else torch.maximum(b.abs(), torch.full_like(b, scale))
    assert torch.all((a - b).abs() <= ref * 2 * ONE_ULP + 1e-5), (a - b).abs().max()
    assert (a != b).float().mean() < 0.03   # a rounding left out or added moves far more


def _same_twice(fn):
    a, b = fn(), fn()
    for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
        if x is not None:
            assert torch.equal(x.view(torch.uint8) if x.dtype == fp8.FP8_DTYPE else x,
                               y.view(torch.uint8) if y.dtype == fp8.FP8_DTYPE else y)
    return a


def _rand(*shape, scale=1.0, seed=0):
    g = torch.Generator(DEV).manual_seed(seed)
    return (torch.randn(*shape, generator=g, device=DEV) * scale).to(BF16)


@pytest.mark.parametrize("T", [128, 2048])
@pytest.mark.parametrize("zero_centered", [False, True])
def test_rms_norm_27b(T, zero_centered):
    x, r = _rand(T, 5120, seed=1), _rand(T, 5120, scale=4, seed=2)
    w = _rand(5120, scale=0.2, seed=3) + 1
    y, s, xq, xs = _same_twice(lambda: norm.rms_norm(x, w, 1e-6, residual=r, zero_centered=zero_centered,
                                                     quant_fp8=True))
    yr, sr = norm.rms_norm_reference(x, w, 1e-6, residual=r, zero_centered=zero_centered)
    _close_within_roundings(y, yr)
    assert torch.equal(s, sr)
    q, qs = fp8.quantize_activation(y)
    assert torch.equal(xq.view(torch.uint8), q.view(torch.uint8)) and torch.equal(xs, qs.reshape(-1))
    ya, _ = norm.rms_norm(x, w, 1e-6, residual=r, zero_centered=zero_centered, exact=False)
    _close_within_roundings(ya, norm.rms_norm_reference(x, w, 1e-6, residual=r, zero_centered=zero_centered,
                                                    exact=False)[0])
    _timing(f"rms_norm T={T} zc={zero_centered}", lambda: norm.rms_norm(x, w, 1e-6, residual=r),
            lambda: norm.rms_norm_reference(x, w, 1e-6, residual=r))


@pytest.mark.parametrize("T", [128, 2048])
def test_layer_norm_minilm(T):
    x, r = _rand(T, 384, seed=4), _rand(T, 384, seed=5)
    w, b = _rand(384, scale=0.2, seed=6) + 1, _rand(384, seed=7)
    y, s, xq, xs = _same_twice(lambda: norm.layer_norm(x, w, b, 1e-12, residual=r, quant_fp8=True))
    yr, sr = norm.layer_norm_reference(x, w, b, 1e-12, residual=r)
    _close_within_roundings(y, yr)
    assert torch.equal(s, sr)
    q, qs = fp8.quantize_activation(y)
    assert torch.equal(xq.view(torch.uint8), q.view(torch.uint8)) and torch.equal(xs, qs.reshape(-1))
    _timing(f"layer_norm T={T}", lambda: norm.layer_norm(x, w, b, 1e-12, residual=r),
            lambda: norm.layer_norm_reference(x, w, b, 1e-12, residual=r))


@pytest.mark.parametrize("T", [128, 2048])
@pytest.mark.parametrize("D,HQ,HKV,R", [(128, 64, 8, None), (256, 16, 2, 64)])
def test_qk_norm_rope_27b(T, D, HQ, HKV, R):
    qkv = _rand(T, (HQ + 2 * HKV) * D, scale=2, seed=8)
    q, k = qkv[:, :HQ * D], qkv[:, HQ * D:(HQ + HKV) * D]
    qw, kw = _rand(D, scale=0.2, seed=9) + 1, _rand(D, scale=0.2, seed=10) + 1
    Rd = R or D
    inv = 1.0 / (1e6 ** (torch.arange(0, Rd, 2, dtype=torch.float32, device=DEV) / Rd))
    f = torch.outer(torch.arange(T, dtype=torch.float32, device=DEV), inv)
    cos, sin = torch.cat((f, f), -1).cos(), torch.cat((f, f), -1).sin()
    qo, ko = _same_twice(lambda: rope.qk_norm_rope(q, k, qw, kw, cos, sin, 1e-6, rotary_dim=R))
    qr, kr = rope.qk_norm_rope_reference(q, k, qw, kw, cos, sin, 1e-6, rotary_dim=R)
    _close_within_roundings(qo, qr, scale=float(qr.abs().max()))
    _close_within_roundings(ko, kr, scale=float(kr.abs().max()))
    _timing(f"qk_norm_rope T={T} D={D}", lambda: rope.qk_norm_rope(q, k, qw, kw, cos, sin, 1e-6, rotary_dim=R),
            lambda: rope.qk_norm_rope_reference(q, k, qw, kw, cos, sin, 1e-6, rotary_dim=R))


@pytest.mark.parametrize("T", [128, 2048])
@pytest.mark.parametrize("name,I", [("silu_mul", 17408), ("gelu_mul", 17408), ("gelu", 1536)])
def test_activation(T, name, I):
    x = _rand(T, I if name == "gelu" else 2 * I, scale=3, seed=11)
    fn, ref = getattr(activation, name), getattr(activation, name + "_reference")
    y, xq, xs = _same_twice(lambda: fn(x, quant_fp8=True))
    _close_within_roundings(y, ref(x))
    q, qs = fp8.quantize_activation(y)
    assert torch.equal(xq.view(torch.uint8), q.view(torch.uint8)) and torch.equal(xs, qs.reshape(-1))
    assert torch.equal(fn(x), y)
    _timing(f"{name} T={T} I={I}", lambda: fn(x), lambda: ref(x))


def _attention_case(B, S, HQ, HKV, D, lengths, seed):
    qkv = _rand(B, S, HQ + 2 * HKV, D, seed=seed)
    return (qkv[:, :, :HQ], qkv[:, :, HQ:HQ + HKV], qkv[:, :, HQ + HKV:],
            torch.tensor(lengths, dtype=torch.int32, device=DEV))


@pytest.mark.parametrize("B,S,lengths", [(1, 128, [128]), (16, 128, [128, 1, 77] + [128 - 3 * i for i in range(13)]),
                                         (1, 1024, [1000]), (1, 2048, [2048])])
def test_attention_27b_causal(B, S, lengths):
    q, k, v, n = _attention_case(B, S, 64, 8, 128, lengths, 12)
    o = _same_twice(lambda: attention.attention(q, k, v, n, causal=True))
    ref = attention.attention_reference(q, k, v, n, causal=True)
    assert (o.float() - ref.float()).abs().max() <= ATTN_TOL
    _timing(f"attention 27B B={B} S={S}", lambda: attention.attention(q, k, v, n, causal=True),
            lambda: attention.attention_reference(q, k, v, n, causal=True))


@pytest.mark.parametrize("D,HQ,HKV,window", [(32, 12, 12, None), (64, 12, 12, 128), (256, 16, 4, None)])
def test_attention_encoder_and_head_dims(D, HQ, HKV, window):
    q, k, v, n = _attention_case(8, 512, HQ, HKV, D, [512, 300, 17, 1, 512, 256, 255, 129], 13)
    o = _same_twice(lambda: attention.attention(q, k, v, n, causal=False, window=window))
    ref = attention.attention_reference(q, k, v, n, causal=False, window=window)
    assert (o.float() - ref.float()).abs().max() <= ATTN_TOL
    o1 = attention.attention(q[2:3], k[2:3], v[2:3], n[2:3], causal=False, window=window)
    assert torch.equal(o1, o[2:3])   # independent of the rest of the batch
    _timing(f"attention D={D} window={window}", lambda: attention.attention(q, k, v, n, causal=False, window=window),
            lambda: attention.attention_reference(q, k, v, n, causal=False, window=window))


def test_last_token_score_27b():
    h = _rand(16 * 128, 5120, seed=14)
    w = _rand(4, 5120, seed=15).float()
    n = torch.tensor([128 - 5 * i for i in range(16)], dtype=torch.int32, device=DEV)
    y = _same_twice(lambda: head.last_token_score(h, n, w))
    torch.testing.assert_close(y, head.last_token_score_reference(h, n, w), rtol=1e-5, atol=1e-3)
    _timing("last_token_score", lambda: head.last_token_score(h, n, w),
            lambda: head.last_token_score_reference(h, n, w))
