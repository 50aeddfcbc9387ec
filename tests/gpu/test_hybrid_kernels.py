"""GPU: the Gated DeltaNet kernels against their references at Qwen3.5 27B-class shapes (16 key /
48 value heads of 128; conv over 2*16*128 + 48*128 = 10240 channels), bytes stable across calls
and batch composition, and the Qwen3.5 / ModernBERT models' Triton path against the reference."""
import pytest
import torch

from tinypkgs import tiny_modernbert, tiny_qwen3_5  # noqa: F401
from vsr.kernels import conv1d, delta_rule

pytestmark = pytest.mark.gpu


def _inputs(B, S, dtype=torch.bfloat16, Hk=16, Hv=48, D=128, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    mixed = torch.randn(B, S, 2 * Hk * D + Hv * D, generator=g, device="cuda").to(dtype)
    q = mixed[..., :Hk * D].unflatten(-1, (Hk, D))
    k = mixed[..., Hk * D:2 * Hk * D].unflatten(-1, (Hk, D))
    v = mixed[..., 2 * Hk * D:].unflatten(-1, (Hv, D))
    a = torch.randn(B, S, Hv, generator=g, device="cuda")
    gate = -torch.empty(Hv, device="cuda").uniform_(0.01, 16, generator=g) * torch.nn.functional.softplus(a + 1)
    beta = torch.rand(B, S, Hv, generator=g, device="cuda").to(dtype)
    return mixed, q, k, v, gate, beta


@pytest.mark.parametrize("B,S", [(1, 128), (1, 1024), (4, 200)])
def test_delta_rule_27b_shapes(B, S):
    _, q, k, v, g, beta = _inputs(B, S)
    lengths = torch.tensor([S] + [S // 2 + 3] * (B - 1), dtype=torch.int32, device="cuda")
    ref = delta_rule.chunk_gated_delta_rule_reference(q, k, v, g, beta, lengths)
    got = delta_rule.chunk_gated_delta_rule(q, k, v, g, beta, lengths,
                                            out=torch.full_like(ref, float("nan")))
    torch.testing.assert_close(got.float(), ref.float(), atol=2e-2 * float(ref.float().abs().max()), rtol=0)
    assert torch.equal(got, delta_rule.chunk_gated_delta_rule(q, k, v, g, beta, lengths))
    if B > 1:   # a request alone gives the bytes it gives in the batch
        L = int(lengths[1])
        alone = delta_rule.chunk_gated_delta_rule(q[1:2, :L], k[1:2, :L], v[1:2, :L], g[1:2, :L], beta[1:2, :L])
        assert torch.equal(alone[0], got[1, :L])


def test_delta_rule_fp32_is_tight():
    _, q, k, v, g, beta = _inputs(2, 300, torch.float32)
    ref = delta_rule.chunk_gated_delta_rule_reference(q, k, v, g, beta)
    torch.testing.assert_close(delta_rule.chunk_gated_delta_rule(q, k, v, g, beta), ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("S", [128, 1024])
def test_conv1d_27b_shapes(S):
    mixed, *_ = _inputs(2, S)
    w = (torch.randn(mixed.shape[-1], 4, device="cuda") * 0.5).to(torch.bfloat16)
    ref = conv1d.causal_conv1d_silu_reference(mixed, w)
    got = conv1d.causal_conv1d_silu(mixed, w, out=torch.full_like(ref, float("nan")))
    torch.testing.assert_close(got.float(), ref.float(), atol=1e-2 * float(ref.float().abs().max()), rtol=0)
    assert torch.equal(got, conv1d.causal_conv1d_silu(mixed, w))


@pytest.mark.parametrize("fixture", ["tiny_qwen3_5", "tiny_modernbert"])
def test_models_triton_path_matches_the_reference(fixture, request):
    from tinypkgs import TEST_TEXTS, Pkg
    from vsr.runtime.engine import load_engine

    path = request.getfixturevalue(fixture)
    gpu = load_engine(Pkg(path), device="cuda", dtype="bfloat16")
    ref = load_engine(Pkg(path), dtype="bfloat16")
    got, want = gpu.forward(TEST_TEXTS), ref.forward(TEST_TEXTS)
    torch.testing.assert_close(got, want, atol=3e-2, rtol=0)
    assert torch.equal(got, gpu.forward(TEST_TEXTS))
