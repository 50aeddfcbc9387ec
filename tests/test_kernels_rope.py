"""kernels/rope.py against its pure-torch references (Triton interpreter on the CPU)."""
import pytest
import torch

from test_kernels_norm import DEV, _poison, _ulp_close
from vsr.kernels import rope


def _cos_sin(P, R, theta=10000.0):
    """transformers' default rotary table in fp32: emb = cat(f, f), f = outer(t, inv_freq)."""
    inv = 1.0 / (theta ** (torch.arange(0, R, 2, dtype=torch.float32) / R))
    f = torch.outer(torch.arange(P, dtype=torch.float32), inv)
    emb = torch.cat((f, f), dim=-1)
    return emb.cos().to(DEV), emb.sin().to(DEV)


def _qkv(T, HQ, HKV, D, dtype, g):
    """q and k as column views of one fused qkv output [T, (HQ + 2 HKV) D]."""
    qkv = (torch.randn(T, (HQ + 2 * HKV) * D, generator=g) * 2).to(dtype).to(DEV)
    return qkv[:, :HQ * D], qkv[:, HQ * D:(HQ + HKV) * D]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("D,R,HQ,HKV", [(64, None, 4, 1), (128, None, 8, 1), (256, 64, 2, 2), (32, 16, 3, 3)])
@pytest.mark.parametrize("zero_centered", [False, True])
@pytest.mark.parametrize("exact", [True, False])
def test_qk_norm_rope(monkeypatch, dtype, D, R, HQ, HKV, zero_centered, exact):
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(D + HQ)
    S, B = 3, 2
    q, k = _qkv(B * S, HQ, HKV, D, dtype, g)
    qw = (torch.randn(D, generator=g) * 0.3 + 1).to(dtype).to(DEV)
    kw = (torch.randn(D, generator=g) * 0.3 + 1).to(dtype).to(DEV)
    cos, sin = _cos_sin(S, R or D)   # P = S: row t takes position t % S
    kwargs = dict(rotary_dim=R, zero_centered=zero_centered, exact=exact)
    qo, ko = rope.qk_norm_rope(q, k, qw, kw, cos, sin, 1e-6, **kwargs)
    qr, kr = rope.qk_norm_rope_reference(q, k, qw, kw, cos, sin, 1e-6, **kwargs)
    assert qo.shape == q.shape and ko.shape == k.shape and qo.is_contiguous()
    _ulp_close(qo, qr, dtype)
    _ulp_close(ko, kr, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("exact", [True, False])
def test_rope_with_positions(monkeypatch, dtype, exact):
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(4)
    D, T = 64, 5
    q, k = _qkv(T, 4, 2, D, dtype, g)
    cos, sin = _cos_sin(40, D)
    pos = torch.tensor([0, 7, 39, 3, 3], dtype=torch.int32, device=DEV)
    qo, ko = rope.rope(q, k, cos, sin, D, exact=exact, positions=pos)
    qr, kr = rope.rope_reference(q, k, cos, sin, D, exact=exact, positions=pos)
    _ulp_close(qo, qr, dtype)
    _ulp_close(ko, kr, dtype)
    # position 0 is the identity
    assert torch.equal(qo[0], q[0])


def test_matches_runtime_qwen3_rope():
    """The reference is the runtime's own transformers-equivalent path (norm, then q*cos + rot*sin in
    the dtype with cos/sin cast to it)."""
    from vsr.runtime.models import ops
    g = torch.Generator().manual_seed(8)
    D, S = 64, 4
    q, k = _qkv(S, 2, 1, D, torch.float16, g)
    w = (torch.randn(D, generator=g) + 1).to(torch.float16).to(DEV)
    cos, sin = _cos_sin(S, D)
    qr, _ = rope.qk_norm_rope_reference(q, k, w, w, cos, sin, 1e-6)
    qn, _ = ops.rms_norm(q.reshape(S, 2, D), w, 1e-6)
    expect = ops._rope_heads(qn, cos, sin, D).reshape(S, -1)
    assert torch.equal(qr, expect)
    qo, _ = rope.qk_norm_rope(q, k, w, w, cos, sin, 1e-6)
    _ulp_close(qo, expect, torch.float16)
