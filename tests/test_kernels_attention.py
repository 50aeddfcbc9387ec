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
    (SKIP_MASK), short ones one masked loop; the programs launch query blocks first or heads first
    (HEADS_FIRST_FROM): every form against the reference, on the same inputs, and the launch order never
    changes a byte."""
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(31)
    S = 200   # four key blocks: whole blocks before the diagonal and past the shorter length
    q, k, v = _qkv(2, S, 4, 2, 32, torch.float16, g)
    lengths = torch.tensor([S, 150], dtype=torch.int32, device=DEV)
    outs = {}
    for skip_from in (1, S + 1):
        for heads_first in (False, True):
            monkeypatch.setattr(attention, "SKIP_MASK_FROM", skip_from)
            monkeypatch.setattr(attention, "HEADS_FIRST_FROM", 1 if heads_first else S + 1)
            outs[skip_from, heads_first] = _check(q, k, v, lengths, causal=causal)
    torch.testing.assert_close(outs[1, False].float(), outs[S + 1, False].float(), rtol=1e-3, atol=1e-3)
    for skip_from in (1, S + 1):
        assert torch.equal(outs[skip_from, False], outs[skip_from, True])


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_head_dims(monkeypatch, D, causal):
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(D)
    q, k, v = _qkv(2, 20, 4, 2, D, torch.float16, g)
    _check(q, k, v, torch.tensor([20, 13], dtype=torch.int32, device=DEV), causal=causal, scale=0.1)


def test_attention_query_block_by_length():
    """128 queries a program (8 warps) at head size 128 from BLOCK_M_128_FROM tokens, 64 (4 warps)
    below; at head size 64 from 257 tokens; never at 256."""
    assert attention._config(128, 1024)[:3] == (64, 64, 4) and attention._config(128, 2048)[0] == 64
    assert attention._config(128, attention.BLOCK_M_128_FROM)[:3] == (128, 64, 8)
    assert attention._config(64, 1024)[0] == 128 and attention._config(64, 256)[0] == 64
    assert attention._config(256, 8192)[0] == 64


@pytest.mark.parametrize("causal", [True, False])
def test_attention_short_prompts_at_head_size_128(monkeypatch, causal):
    """Below SKIP_MASK_FROM, head size 128 walks 32 keys a step: several key blocks a query block,
    padding inside one."""
    _poison(monkeypatch)
    assert attention._config(128, 100)[1] == 32 and attention._config(128, attention.SKIP_MASK_FROM)[1] == 64
    g = torch.Generator().manual_seed(5)
    q, k, v = _qkv(2, 100, 4, 2, 128, torch.float16, g)
    _check(q, k, v, torch.tensor([100, 61], dtype=torch.int32, device=DEV), causal=causal)


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
