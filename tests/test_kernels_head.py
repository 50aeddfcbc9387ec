"""kernels/head.py against its pure-torch reference (Triton interpreter on the CPU)."""
import pytest
import torch

from test_kernels_norm import DEV, _poison
from vsr.kernels import head


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("L,K", [(3, 384), (40, 1000)])
@pytest.mark.parametrize("bias", [False, True])
def test_last_token_score(monkeypatch, dtype, L, K, bias):
    _poison(monkeypatch)
    g = torch.Generator().manual_seed(L + K)
    B, S = 3, 5
    h = torch.randn(B * S, K, generator=g).to(dtype).to(DEV)
    w = torch.randn(L, K, generator=g).to(DEV)
    b = torch.randn(L, generator=g).to(DEV) if bias else None
    lengths = torch.tensor([5, 1, 3], dtype=torch.int32, device=DEV)
    y = head.last_token_score(h, lengths, w, b)
    ref = head.last_token_score_reference(h, lengths, w, b)
    assert y.dtype == torch.float32 and y.shape == (B, L)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-4)
    # the gathered row matters: another row's logits differ
    assert not torch.allclose(y[1], head.last_token_score_reference(h, lengths + 1, w, b)[1])
    assert torch.equal(head.last_token_score(h.view(B, S, K), lengths, w, b), y)
