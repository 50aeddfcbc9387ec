"""kernels/attention.py against its pure-torch reference (Triton interpreter on the CPU)."""
import pytest
import torch

from test_kernels_norm import DEV, _poison
from vsr.kernels import attention

TOL = {torch.float16: 2e-3, torch.float32: 2e-5}


def _qkv(B, S, HQ, HKV, D, dtype, g):
    """q, k, v as strided head views of one fused qkv output [B, S, (HQ + 2 HKV) D]."""
    qkv = torch.randn(B, S, HQ + 2 * HKV, D, generator=g).to(dtype).to(DEV)
    return qkv[:, :, :HQ], qkv[:, :, HQ:HQ + HKV], qkv[:, :, HQ + HKV:]


def _check(q, k, v, lengths, **kw):
    o = attention.attention(q, k, v, lengths, **kw)
    ref = attention.attention_reference(q, k, v, lengths, **kw)
    assert o.shape == q.shape and o.is_contiguous() and o.dtype == q.dtype
    torch.testing.assert_close(o.float(), ref.float(), rtol=TOL[q.dtype], atol=TOL[q.dtype])
    return o


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("HQ,HKV", [(2, 2), (4, 1), (8, 1)])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_gqa_and_padding(monkeypatch, dtype, HQ, HKV, causal):
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(HQ * 10 + HKV)
    S = 70   # two key blocks, the second ragged
    q, k, v = _qkv(3, S, HQ, HKV, 32, dtype, g)
    lengths = torch.tensor([S, 41, 1], dtype=torch.int32, device=DEV)
    o = _check(q, k, v, lengths, causal=causal)
    assert torch.all(o[1, 41:] == 0) and torch.all(o[2, 1:] == 0)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_with_and_without_the_unmasked_loop(monkeypatch, causal):
    """Long sequences run the key blocks every query of a block may see in a loop without the mask
    (SKIP_MASK), short ones one masked loop: both forms against the reference, on the same inputs."""
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(31)
    S = 200   # four key blocks: whole blocks before the diagonal and past the shorter length
    q, k, v = _qkv(2, S, 4, 2, 32, torch.float16, g)
    lengths = torch.tensor([S, 150], dtype=torch.int32, device=DEV)
    outs = []
    for skip_from in (1, S + 1):
        monkeypatch.setattr(attention, "SKIP_MASK_FROM", skip_from)
        outs.append(_check(q, k, v, lengths, causal=causal))
    torch.testing.assert_close(outs[0].float(), outs[1].float(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_head_dims(monkeypatch, D, causal):
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(D)
    q, k, v = _qkv(2, 20, 4, 2, D, torch.float16, g)
    _check(q, k, v, torch.tensor([20, 13], dtype=torch.int32, device=DEV), causal=causal, scale=0.1)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_window(monkeypatch, causal):
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(11)
    S = 140  # three key blocks; a window of +-16 skips blocks on either side
    q, k, v = _qkv(2, S, 2, 1, 32, torch.float16, g)
    lengths = torch.tensor([S, 100], dtype=torch.int32, device=DEV)
    _check(q, k, v, lengths, causal=causal, window=32)


def test_attention_is_batch_independent():
    g = torch.Generator().manual_seed(12)
    q, k, v = _qkv(3, 24, 4, 1, 32, torch.float16, g)
    lengths = torch.tensor([24, 9, 17], dtype=torch.int32, device=DEV)
    o = attention.attention(q, k, v, lengths, causal=True)
    o1 = attention.attention(q[1:2], k[1:2], v[1:2], lengths[1:2], causal=True)
    assert torch.equal(o[1:2], o1)


def test_attention_rejects_head_dim():
    q = torch.randn(1, 4, 2, 48).to(DEV)
    with pytest.raises(ValueError):
        attention.attention(q, q, q, torch.tensor([4], dtype=torch.int32, device=DEV), causal=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("D", [32, 256])   # 256: Qwen3.5's full-attention heads
def test_attention_gate(monkeypatch, dtype, D):
    """Qwen3.5's gated output o * sigmoid(gate), the gate a strided head view (q_proj's gate half)."""
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(21 + D)
    B, S, HQ, HKV = 2, 70, 4, 2
    q, k, v = _qkv(B, S, HQ, HKV, D, dtype, g)
    gate = (torch.randn(B, S, HQ, 2 * D, generator=g) * 3).to(dtype).to(DEV)[..., D:]
    lengths = torch.tensor([S, 9], dtype=torch.int32, device=DEV)
    o = _check(q, k, v, lengths, causal=True, gate=gate)
    plain = attention.attention_reference(q, k, v, lengths, causal=True)
    assert torch.equal(attention.attention_reference(q, k, v, lengths, causal=True, gate=gate),
                       plain * torch.sigmoid(gate))
    assert torch.all(o[1, 9:] == 0) and (o - plain).abs().max() > 0.1


def _cos_sin(P, R):
    inv = 1.0 / (10000.0 ** (torch.arange(0, R, 2, dtype=torch.float32) / R))
    emb = torch.outer(torch.arange(P, dtype=torch.float32), inv).repeat(1, 2)
    return emb.cos().to(DEV), emb.sin().to(DEV)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("D,R,HQ,HKV,zero_centered,gated", [(64, None, 4, 1, False, False), (32, 16, 2, 2, True, True),
                                                             (256, 64, 2, 1, True, True)])
@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("per_token", [False, True])
def test_norm_rope_attention(monkeypatch, dtype, D, R, HQ, HKV, zero_centered, gated, exact, per_token):
    """q's norm and RoPE inside the attention kernel (Qwen3; Qwen3.5's partial, zero-centred form with
    its gate) against qk_norm_rope's reference then attention's, q a strided head view; cos and sin per
    position (P = S) or per token (P = B * S)."""
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(D + HQ + exact)
    B, S = 2, 70
    qkv = (torch.randn(B, S, 2 * HQ + 2 * HKV, D, generator=g) * 2).to(dtype).to(DEV)
    q, gate = qkv[:, :, :HQ], qkv[:, :, HQ:2 * HQ]
    k, v = qkv[:, :, 2 * HQ:2 * HQ + HKV], qkv[:, :, 2 * HQ + HKV:]
    qw = (torch.randn(D, generator=g) * 0.3 + 1).to(dtype).to(DEV)
    kw = (torch.randn(D, generator=g) * 0.3 + 1).to(dtype).to(DEV)
    cos, sin = _cos_sin(S, R or D)
    if per_token:   # and, exact, in q's dtype, as the models pass them (common.rope_cos_sin)
        cos, sin = cos.repeat(B, 1), sin.repeat(B, 1)
        if exact:
            cos, sin = cos.to(dtype), sin.to(dtype)
    lengths = torch.tensor([S, 23], dtype=torch.int32, device=DEV)
    kw_ = dict(rotary_dim=R, zero_centered=zero_centered, exact=exact, causal=True, scale=D ** -0.5,
               gate=gate if gated else None)
    o = attention.norm_rope_attention(q, k, v, lengths, qw, kw, cos, sin, 1e-6, **kw_)
    ref = attention.norm_rope_attention_reference(q, k, v, lengths, qw, kw, cos, sin, 1e-6, **kw_)
    assert o.shape == q.shape and o.is_contiguous() and torch.all(o[1, 23:] == 0)
    torch.testing.assert_close(o.float(), ref.float(), rtol=TOL[dtype] * 2, atol=TOL[dtype] * 2)
    # the norm and the rotation matter: attention on the raw q and k is far from it
    raw = attention.attention_reference(q, k, v, lengths, causal=True, scale=D ** -0.5, gate=kw_["gate"])
    assert (ref.float() - raw.float()).abs().max() > 0.05


def test_norm_rope_attention_matches_the_unfused_kernels(monkeypatch):
    """The fused path against the rope kernel on q and k followed by attention: the same within one
    rounding of q (only q's sum of squares is reduced in another order); k_norm_rope gives the rope
    kernel's k bytes."""
    _poison(monkeypatch)
    from vsr.kernels import rope
    g = torch.Generator().manual_seed(5)
    B, S, HQ, HKV, D = 2, 40, 4, 2, 64
    qkv = (torch.randn(B, S, HQ + 2 * HKV, D, generator=g) * 2).to(torch.float16).to(DEV)
    q, k, v = qkv[:, :, :HQ], qkv[:, :, HQ:HQ + HKV], qkv[:, :, HQ + HKV:]
    w = (torch.randn(D, generator=g) * 0.3 + 1).to(torch.float16).to(DEV)
    cos, sin = _cos_sin(S, D)
    lengths = torch.tensor([S, 17], dtype=torch.int32, device=DEV)
    qn, kn = rope.qk_norm_rope(q.reshape(B * S, -1), k.reshape(B * S, -1), w, w, cos, sin, 1e-6)
    two = attention.attention(qn.view(B, S, HQ, D), kn.view(B, S, HKV, D), v, lengths, causal=True)
    one = attention.norm_rope_attention(q, k, v, lengths, w, w, cos, sin, 1e-6, causal=True)
    torch.testing.assert_close(one.float(), two.float(), rtol=2e-3, atol=2e-3)
    assert torch.equal(rope.k_norm_rope(k.reshape(B * S, -1), w, cos, sin, 1e-6), kn)
    # where q cannot be normalised in the kernel (ROCm), norm_rope_attention runs the two kernels
    monkeypatch.setattr(attention, "query_rope_in_kernel", lambda device: False)
    assert torch.equal(attention.norm_rope_attention(q, k, v, lengths, w, w, cos, sin, 1e-6, causal=True), two)


def test_query_rope_in_kernel_on_nvidia_and_the_interpreter_only(monkeypatch):
    from vsr.kernels import common
    assert attention.query_rope_in_kernel(torch.device("cpu"))
    for nvidia in (True, False):
        feats = common.DeviceFeatures(nvidia=nvidia, capability=(9, 0), pdl=False, hardware_e4m3=False)
        monkeypatch.setattr(common, "device_features", lambda device, f=feats: f)
        assert attention.query_rope_in_kernel(torch.device("cuda")) == nvidia
