"""GPU: the Gated DeltaNet kernels (delta rule, conv1d, gates, gated norm) and the gated attention
against their references at Qwen3.5 27B-class shapes (16 key / 48 value heads of 128; conv over
2*16*128 + 48*128 = 10240 channels; attention 24 query / 4 KV heads of 256), bytes stable across
calls and batch composition; the Qwen3.5 / ModernBERT models' Triton path against the reference;
and `vsr-tune PACKAGE` recording every product those forwards run."""
import pytest
import torch

from tinypkgs import LONG_TEXT, TEST_TEXTS, Pkg, tiny_modernbert, tiny_qwen3_5  # noqa: F401
from vsr.kernels import attention, conv1d, delta_rule, norm

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


@pytest.mark.parametrize("B,S", [(1, 128), (1, 1024), (4, 200)])
def test_mixer_27b_shapes_matches_its_reference(B, S):
    """deltanet_mixer on in_proj's output as the model slices it: the reference's values, the same
    bytes on a second call."""
    Hk, Hv, D = 16, 48, 128
    g = torch.Generator(device="cuda").manual_seed(5)
    C = 2 * Hk * D + Hv * D
    buf = torch.randn(B, S, C + Hv * D + 2 * Hv, generator=g, device="cuda").to(torch.bfloat16)
    x, ba = buf[..., :C], buf[..., C + Hv * D:]
    w = (torch.randn(C, 4, generator=g, device="cuda") * 0.5).to(torch.bfloat16)
    neg_a = -torch.empty(Hv, device="cuda").uniform_(0.01, 16, generator=g)
    dt = torch.randn(Hv, generator=g, device="cuda")
    lengths = torch.tensor([S] + [S // 2 + 3] * (B - 1), dtype=torch.int32, device="cuda")
    heads = (Hk, D, Hv, D)
    got = delta_rule.deltanet_mixer(x, w, ba, neg_a, dt, heads, lengths,
                                    out=torch.full((B, S, Hv, D), float("nan"), device="cuda", dtype=torch.bfloat16))
    ref = delta_rule.deltanet_mixer_reference(x, w, ba, neg_a, dt, heads, lengths)
    torch.testing.assert_close(got.float(), ref.float(), atol=2e-2 * float(ref.float().abs().max()), rtol=0)
    assert torch.equal(got, delta_rule.deltanet_mixer(x, w, ba, neg_a, dt, heads, lengths))


@pytest.mark.parametrize("S", [128, 1024])
def test_conv1d_27b_shapes(S):
    mixed, *_ = _inputs(2, S)
    w = (torch.randn(mixed.shape[-1], 4, device="cuda") * 0.5).to(torch.bfloat16)
    ref = conv1d.causal_conv1d_silu_reference(mixed, w)
    got = conv1d.causal_conv1d_silu(mixed, w, out=torch.full_like(ref, float("nan")))
    torch.testing.assert_close(got.float(), ref.float(), atol=1e-2 * float(ref.float().abs().max()), rtol=0)
    assert torch.equal(got, conv1d.causal_conv1d_silu(mixed, w))


def test_gates_and_gated_norm_27b_shapes():
    T, Hv, V = 4 * 512, 48, 128
    g = torch.Generator(device="cuda").manual_seed(3)
    wide = (torch.randn(T, 16384 + 2 * Hv, generator=g, device="cuda") * 4).to(torch.bfloat16)
    ba = wide[:, 16384:]
    neg_a = -torch.empty(Hv, device="cuda").uniform_(0.01, 16, generator=g)
    dt = torch.randn(Hv, generator=g, device="cuda")
    got, ref = delta_rule.deltanet_gates(ba, neg_a, dt), delta_rule.deltanet_gates_reference(ba, neg_a, dt)
    torch.testing.assert_close(got[0], ref[0], atol=0, rtol=2e-6)
    assert (got[1] != ref[1]).float().mean() < 1e-3 and (got[1].float() - ref[1].float()).abs().max() <= 2 ** -8
    o = torch.randn(T, Hv * V, generator=g, device="cuda").to(torch.bfloat16)
    z = wide[:, 10240:16384]   # in_proj_z's columns of the fused in_proj (qkv | z | b | a) output
    w = (torch.randn(V, generator=g, device="cuda") * 0.05 + 1).to(torch.bfloat16)
    for exact in (True, False):
        y = norm.gated_rms_norm(o, z, w, 1e-6, exact=exact)
        yr = norm.gated_rms_norm_reference(o, z, w, 1e-6, exact=exact)
        assert (y != yr).float().mean() < 1e-2
        assert (y.float() - yr.float()).abs().max() <= 2 ** -6 * yr.float().abs().max()
        assert torch.equal(y, norm.gated_rms_norm(o, z, w, 1e-6, exact=exact))
        assert torch.equal(norm.gated_rms_norm(o[5:9], z[5:9], w, 1e-6, exact=exact), y[5:9])


@pytest.mark.parametrize("B,S", [(1, 1024), (8, 200)])
def test_gated_attention_27b_shapes(B, S):
    """Qwen3.5's full attention: 24 query / 4 KV heads of 256, causal, o * sigmoid(gate) with the
    gate the second half of each q_proj head (a strided view)."""
    HQ, HKV, D = 24, 4, 256
    g = torch.Generator(device="cuda").manual_seed(5)
    qkv = torch.randn(B, S, 2 * HQ * D + 2 * HKV * D, generator=g, device="cuda").to(torch.bfloat16)
    qg = qkv[..., :2 * HQ * D].unflatten(-1, (HQ, 2 * D))
    q, gate = qg[..., :D].contiguous(), qg[..., D:]
    k = qkv[..., 2 * HQ * D:(2 * HQ + HKV) * D].unflatten(-1, (HKV, D))
    v = qkv[..., (2 * HQ + HKV) * D:].unflatten(-1, (HKV, D))
    lengths = torch.tensor([S - 7 * i for i in range(B)], dtype=torch.int32, device="cuda")
    o = attention.attention(q, k, v, lengths, causal=True, gate=gate)
    ref = attention.attention_reference(q, k, v, lengths, causal=True, gate=gate)
    assert (o.float() - ref.float()).abs().max() <= 2e-2
    assert torch.equal(o, attention.attention(q, k, v, lengths, causal=True, gate=gate))
    if B > 1:
        assert torch.equal(attention.attention(q[1:2], k[1:2], v[1:2], lengths[1:2], causal=True, gate=gate[1:2]),
                           o[1:2])


@pytest.mark.parametrize("fixture", ["tiny_qwen3_5", "tiny_modernbert"])
def test_models_triton_path_matches_the_reference(fixture, request):
    from vsr.runtime.engine import load_engine
    from vsr.runtime.models import ops

    path = request.getfixturevalue(fixture)
    texts = TEST_TEXTS + [LONG_TEXT]   # the long one crosses the delta rule's 64-token chunk
    gpu = load_engine(Pkg(path), device="cuda", dtype="bfloat16")
    assert gpu.model.ops is not ops.REFERENCE and gpu.model.ops.attention.__module__ == "vsr.kernels.attention"
    ref = load_engine(Pkg(path), dtype="bfloat16")
    got, want = gpu.forward(texts), ref.forward(texts)
    torch.testing.assert_close(got, want, atol=3e-2, rtol=0)
    assert torch.equal(got, gpu.forward(texts))


@pytest.mark.parametrize("fixture", ["tiny_qwen3_5", "tiny_modernbert"])
def test_a_tuned_package_runs_with_miss_policy_error(tmp_path, fixture, request):
    """vsr-tune PACKAGE records every product the forward runs (the fused in_proj_qkv|z, in_proj_b|a,
    q|k|v and gate|up of Qwen3.5): the engine then answers with --miss-policy error."""
    from click.testing import CliRunner

    from vsr.autotune.buckets import bucket_for
    from vsr.cli.tune import main as tune
    from vsr.runtime.engine import batch_shape, load_engine

    path = request.getfixturevalue(fixture)
    texts = TEST_TEXTS[:3]
    probe = load_engine(Pkg(path), device="cuda", cuda_graphs=False)
    n, s = batch_shape(len(texts), max(map(len, probe.tokenizer.encode_checked(texts))), probe.tokenizer.limit)
    cache = tmp_path / "fresh.db"
    # Buckets of the layers' rows (n * s) and of ModernBERT's head.dense on the pooled rows (n).
    res = CliRunner().invoke(tune, [str(path), "--buckets", f"{bucket_for(n)},{bucket_for(n * s)}",
                                    "--max-candidates", "1", "--autotune-cache", str(cache), "--json"])
    assert res.exit_code == 0, res.output
    e = load_engine(Pkg(path), device="cuda", autotune_cache=cache, miss_policy="error")
    assert e.forward(texts).shape == (3, 5)
