"""The gated delta rule and the causal conv1d (Gated DeltaNet): Triton kernels (interpreter on the CPU)
against their pure-torch references, and the references against transformers' own forms."""
import pytest
import torch

from vsr.kernels import conv1d, delta_rule


def _inputs(B, S, Hk, Hv, K, V, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, S, Hk, K, generator=g).to(dtype)
    k = torch.randn(B, S, Hk, K, generator=g).to(dtype)
    v = torch.randn(B, S, Hv, V, generator=g).to(dtype)
    # Decays as the model makes them: -exp(A_log) * softplus(a + dt_bias), some near 0, some strong.
    gate = -torch.rand(B, S, Hv, generator=g) * torch.tensor([0.02, 0.3, 1.0, 3.0])[torch.arange(Hv) % 4]
    beta = torch.rand(B, S, Hv, generator=g).to(dtype)
    return q, k, v, gate, beta


def _poisoned(*shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype)


def test_reference_is_transformers_chunked_form_and_the_recurrence():
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    q, k, v, g, beta = _inputs(2, 70, 2, 4, 32, 16)
    ours = delta_rule.chunk_gated_delta_rule_reference(q, k, v, g, beta)
    qq, kk = (x.repeat_interleave(2, dim=2) for x in (q, k))
    theirs, _ = hf.torch_chunk_gated_delta_rule(qq, kk, v, g, beta, use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)
    rec = delta_rule.recurrent_gated_delta_rule_reference(q, k, v, g, beta)
    torch.testing.assert_close(ours, rec, atol=2e-6, rtol=1e-5)
    assert ours.abs().max() > 0.1


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.float16, 2e-3)])
def test_triton_matches_the_reference(dtype, tol):
    # 70 tokens: a full chunk and a partial one; K 32 < V 48 (two value blocks of 32, the last partial).
    q, k, v, g, beta = _inputs(2, 70, 2, 4, 32, 48, dtype)
    ref = delta_rule.chunk_gated_delta_rule_reference(q, k, v, g, beta)
    out = _poisoned(2, 70, 4, 48, dtype=dtype)
    got = delta_rule.chunk_gated_delta_rule(q, k, v, g, beta, block_v=32, out=out)
    assert got.dtype == dtype and not got.isnan().any()
    torch.testing.assert_close(got.float(), ref.float(), atol=tol * float(ref.abs().max()), rtol=0)


def test_correlated_keys_strong_writes_and_weak_decay():
    """The triangular solve's hard case: keys close to one direction, beta near 1, decay near 0
    (T = (I + N)^-1 far from I), two chunks; against the chunked reference and the recurrence."""
    g = torch.Generator().manual_seed(3)
    B, S, H, K, V = 1, 128, 2, 32, 16
    k = torch.randn(1, 1, H, K, generator=g) + 0.3 * torch.randn(B, S, H, K, generator=g)
    q, v = torch.randn(B, S, H, K, generator=g), torch.randn(B, S, H, V, generator=g)
    gate, beta = -torch.rand(B, S, H, generator=g) * 0.01, 0.9 + 0.1 * torch.rand(B, S, H, generator=g)
    ref = delta_rule.chunk_gated_delta_rule_reference(q, k, v, gate, beta)
    torch.testing.assert_close(ref, delta_rule.recurrent_gated_delta_rule_reference(q, k, v, gate, beta),
                               atol=2e-6, rtol=0)
    got = delta_rule.chunk_gated_delta_rule(q, k, v, gate, beta, out=_poisoned(B, S, H, V, dtype=torch.float32))
    torch.testing.assert_close(got, ref, atol=2e-5 * float(ref.abs().max()), rtol=0)


def test_strided_views_of_the_conv_output():
    """q, k, v as column slices of one [B, S, 2*Hk*K + Hv*V] tensor, as the model passes them."""
    B, S, Hk, Hv, K, V = 1, 20, 1, 2, 16, 16
    mixed = torch.randn(B, S, 2 * Hk * K + Hv * V)
    q = mixed[..., :Hk * K].unflatten(-1, (Hk, K))
    k = mixed[..., Hk * K:2 * Hk * K].unflatten(-1, (Hk, K))
    v = mixed[..., 2 * Hk * K:].unflatten(-1, (Hv, V))
    g, beta = -torch.rand(B, S, Hv), torch.rand(B, S, Hv)
    ref = delta_rule.chunk_gated_delta_rule_reference(q.contiguous(), k.contiguous(), v.contiguous(), g, beta)
    torch.testing.assert_close(delta_rule.chunk_gated_delta_rule(q, k, v, g, beta), ref, atol=2e-6, rtol=0)


def test_right_padding_and_batch_composition_leave_a_request_bytes_alone():
    q, k, v, g, beta = _inputs(3, 80, 1, 2, 16, 16)
    lengths = torch.tensor([80, 37, 64])
    got = delta_rule.chunk_gated_delta_rule(q, k, v, g, beta, lengths)
    ref = delta_rule.chunk_gated_delta_rule_reference(q, k, v, g, beta, lengths)
    torch.testing.assert_close(got, ref, atol=2e-6, rtol=0)
    assert torch.equal(got[1, 37:], torch.zeros_like(got[1, 37:]))   # rows past the length are zeros
    # The padding's content does not matter, and neither do the other requests or the padded width.
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[1, 37:] = 1e3
    again = delta_rule.chunk_gated_delta_rule(q2, k2, v2, g, beta, lengths)
    alone = delta_rule.chunk_gated_delta_rule(q[1:2, :37], k[1:2, :37], v[1:2, :37], g[1:2, :37], beta[1:2, :37])
    assert torch.equal(again, got)
    assert torch.equal(alone[0], got[1, :37])
    # Causal: the unpadded forward gives a real token the same output as the padded one.
    full = delta_rule.chunk_gated_delta_rule_reference(q, k, v, g, beta)
    torch.testing.assert_close(got[1, :37], full[1, :37], atol=2e-6, rtol=0)


def test_same_bytes_on_every_call():
    args = _inputs(2, 65, 2, 2, 16, 32)
    a = delta_rule.chunk_gated_delta_rule(*args)
    assert torch.equal(a, delta_rule.chunk_gated_delta_rule(*args))


def test_shapes_are_checked():
    q, k, v, g, beta = _inputs(1, 8, 2, 3, 16, 16)
    with pytest.raises(ValueError, match="not a multiple"):
        delta_rule.chunk_gated_delta_rule(q, k, v, g, beta)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_conv1d_matches_transformers(dtype):
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    B, S, C = 2, 45, 200
    x = torch.randn(B, S, C + 8).to(dtype)[..., 8:]     # a column slice: row stride C + 8
    w = (torch.randn(C, 4) * 0.5).to(dtype)
    ref = conv1d.causal_conv1d_silu_reference(x, w)
    theirs = hf.causal_conv1d_fn(x.transpose(1, 2), w, activation="silu").transpose(1, 2)
    torch.testing.assert_close(ref, theirs, atol=0, rtol=0)
    got = conv1d.causal_conv1d_silu(x, w, out=_poisoned(B, S, C, dtype=dtype))
    tol = 1e-6 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(got.float(), ref.float(), atol=tol * float(ref.abs().max()), rtol=0)
    assert torch.equal(got, conv1d.causal_conv1d_silu(x, w))
    # A request's rows do not depend on its batch or on what follows it.
    assert torch.equal(conv1d.causal_conv1d_silu(x[1:, :20], w)[0], got[1, :20])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gates_match_transformers(dtype):
    """beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias) (fp32) from the fused b | a output,
    a column slice (row-strided) as the model passes it; softplus's linear branch past 20 included."""
    g = torch.Generator().manual_seed(7)
    T, H = 33, 6
    wide = (torch.randn(T, 2 * H + 5, generator=g) * 8).to(dtype)
    ba = wide[:, 3:3 + 2 * H]
    a_log, dt_bias = torch.randn(H, generator=g), torch.randn(H, generator=g) * 4
    neg_a = -a_log.exp()
    b, a = ba[:, :H].contiguous(), ba[:, H:].contiguous()   # transformers' own in_proj_b / in_proj_a outputs
    want_g = -a_log.float().exp() * torch.nn.functional.softplus(a.float() + dt_bias)
    ref_g, ref_beta = delta_rule.deltanet_gates_reference(ba, neg_a, dt_bias)
    assert torch.equal(ref_g, want_g) and torch.equal(ref_beta, b.sigmoid())
    assert (a.float() + dt_bias > 20).any() and (a.float() + dt_bias < -10).any()
    got_g, got_beta = delta_rule.deltanet_gates(ba, neg_a, dt_bias)
    assert got_g.dtype == torch.float32 and got_beta.dtype == dtype and got_g.is_contiguous()
    torch.testing.assert_close(got_g, ref_g, atol=0, rtol=1e-6)
    tol = 1e-6 if dtype == torch.float32 else 1e-3
    torch.testing.assert_close(got_beta.float(), ref_beta.float(), atol=0, rtol=tol)


def test_scan_stages_two_only_where_its_programs_fit_one_a_multiprocessor(monkeypatch):
    """Two pipeline stages for a scan over 16-bit workspaces of at most one program a multiprocessor on
    a GPU with a Hopper's shared memory a program; one otherwise, and on the CPU."""
    from vsr.kernels import common, gemm

    cuda = torch.device("cuda", 0)
    smem = {"bytes": 227 * 1024}
    monkeypatch.setattr(common, "device_features", lambda d: common.DeviceFeatures(
        True, (9, 0), True, True, shared_memory=smem["bytes"]))
    monkeypatch.setattr(gemm, "multiprocessors", lambda d: 132)
    f16, f32 = torch.float16, torch.float32
    assert delta_rule.scan_stages(96, cuda, f16) == 2 and delta_rule.scan_stages(132, cuda, f16) == 2
    assert delta_rule.scan_stages(192, cuda, f16) == delta_rule.SCAN_STAGES == 1
    assert delta_rule.scan_stages(96, cuda, f32) == 1   # fp32 tiles: two stages do not fit
    smem["bytes"] = 99 * 1024   # an Ada or consumer Blackwell GPU
    assert delta_rule.scan_stages(96, cuda, f16) == 1
    assert delta_rule.scan_stages(96, torch.device("cpu"), f16) == 1


@pytest.mark.parametrize("dtype,ws", [(torch.float16, torch.float16), (torch.bfloat16, torch.float16),
                                      (torch.float32, torch.float32)])
def test_the_scan_operands_workspace_dtype(monkeypatch, dtype, ws):
    """w, q's decayed terms, the decayed keys and q k^T go through fp16 workspaces for 16-bit inputs
    (TF32 operands keep the same 10-bit mantissa), fp32 ones for fp32; u is fp32 either way."""
    seen = {}
    ut = delta_rule._ut_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*a, **kw):
                seen.update(w=a[6].dtype, u=a[7].dtype, qg=a[8].dtype, kt=a[9].dtype, attn=a[10].dtype)
                return ut[grid](*a, **kw)
            return launch

    monkeypatch.setattr(delta_rule, "_ut_kernel", Spy())
    args = _inputs(1, 20, 1, 2, 16, 16, dtype if dtype != torch.bfloat16 else torch.float32)
    if dtype == torch.bfloat16:   # (the interpreter's bf16 products are wrong: only the dtypes are checked)
        args = tuple(x.to(dtype) if x.dtype == torch.float32 and i != 3 else x for i, x in enumerate(args))
    delta_rule.chunk_gated_delta_rule(*args)
    assert seen == dict(w=ws, u=torch.float32, qg=ws, kt=ws, attn=ws)


def test_the_per_chunk_kernel_split_gives_the_same_bytes(monkeypatch):
    """_ut_kernel's two programs a chunk (UT_PARTS) change which program computes what, not how:
    the bytes of one program a chunk."""
    args = _inputs(2, 70, 2, 4, 32, 48)
    assert delta_rule.UT_PARTS == 2
    split = delta_rule.chunk_gated_delta_rule(*args, block_v=32, out=_poisoned(2, 70, 4, 48, dtype=torch.float32))
    monkeypatch.setattr(delta_rule, "UT_PARTS", 1)
    assert torch.equal(split, delta_rule.chunk_gated_delta_rule(*args, block_v=32))
    ref = delta_rule.chunk_gated_delta_rule_reference(*args)
    torch.testing.assert_close(split, ref, atol=2e-6 * float(ref.abs().max()), rtol=0)
    monkeypatch.setattr(delta_rule, "UT_PARTS", 3)
    with pytest.raises(ValueError, match="UT_PARTS"):
        delta_rule.chunk_gated_delta_rule(*args)


def _mixer_inputs(B, S, heads, dtype, seed=0, W=4):
    """in_proj's output as the model slices it: x = q | k | v (before the convolution) and ba = b | a,
    row-strided column slices of one wider product output; the conv weights and gate parameters."""
    Hk, K, Hv, V = heads
    g = torch.Generator().manual_seed(seed)
    C = 2 * Hk * K + Hv * V
    out = torch.randn(B, S, C + Hv * V + 2 * Hv + 3, generator=g).to(dtype)   # q | k | v | z | b | a | 3 more
    x, ba = out[..., :C], out[..., C + Hv * V:C + Hv * V + 2 * Hv]
    conv_w = (torch.randn(C, W, generator=g) * 0.5).to(dtype)
    neg_a = -torch.rand(Hv, generator=g).exp()
    dt_bias = torch.randn(Hv, generator=g)
    return x, conv_w, ba, neg_a, dt_bias


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.float16, 2e-3)])
def test_mixer_matches_its_reference(dtype, tol):
    """deltanet_mixer (the conv, gates and rule kernels in turn) against the reference: conv1d, gates, chunked rule; a full chunk and a partial one,
    right padding."""
    heads = (2, 32, 4, 48)
    x, conv_w, ba, neg_a, dt = _mixer_inputs(2, 70, heads, dtype)
    lengths = torch.tensor([70, 41])
    ref = delta_rule.deltanet_mixer_reference(x, conv_w, ba, neg_a, dt, heads, lengths)
    got = delta_rule.deltanet_mixer(x, conv_w, ba, neg_a, dt, heads, lengths, block_v=32,
                                    out=_poisoned(2, 70, 4, 48, dtype=dtype))
    assert got.dtype == dtype and not got.isnan().any() and ref.abs().max() > 0.1
    torch.testing.assert_close(got.float(), ref.float(), atol=tol * float(ref.abs().max()), rtol=0)
    assert torch.equal(got[1, 41:], torch.zeros_like(got[1, 41:]))


@pytest.mark.parametrize("parts", [1, 2])
def test_mixer_bytes_do_not_depend_on_batch_or_padding(monkeypatch, parts):
    """A request's bytes from deltanet_mixer (either per-chunk split) do not depend on the batch it
    shares or on the padding after it, and its padded rows are zeros."""
    monkeypatch.setattr(delta_rule, "UT_PARTS", parts)
    heads = (2, 16, 6, 32)
    x, conv_w, ba, neg_a, dt = _mixer_inputs(3, 80, heads, torch.float32, seed=1)
    lengths = torch.tensor([80, 37, 64])
    got = delta_rule.deltanet_mixer(x, conv_w, ba, neg_a, dt, heads, lengths)
    assert torch.equal(got[1, 37:], torch.zeros_like(got[1, 37:]))
    x2, ba2 = x.clone(), ba.clone()
    x2[1, 37:], ba2[1, 37:] = 1e3, -1e3
    assert torch.equal(delta_rule.deltanet_mixer(x2, conv_w, ba2, neg_a, dt, heads, lengths), got)
    alone = delta_rule.deltanet_mixer(x[1:2, :37], conv_w, ba[1:2, :37], neg_a, dt, heads)
    assert torch.equal(alone[0], got[1, :37])


def test_mixer_shapes_are_checked():
    heads = (2, 16, 4, 16)
    x, conv_w, ba, neg_a, dt = _mixer_inputs(1, 8, heads, torch.float32)
    with pytest.raises(ValueError, match="x must be"):
        delta_rule.deltanet_mixer(x[..., 1:], conv_w, ba, neg_a, dt, heads)
    with pytest.raises(ValueError, match="ba must be"):
        delta_rule.deltanet_mixer(x, conv_w, ba[..., 1:], neg_a, dt, heads)
    with pytest.raises(ValueError, match="neg_a"):
        delta_rule.deltanet_mixer(x, conv_w, ba, neg_a.double(), dt, heads)
    with pytest.raises(ValueError, match="not a multiple"):   # 1 value head of 64 for 2 key heads of 16
        delta_rule.deltanet_mixer(x, conv_w, ba[..., :2], neg_a[:1], dt[:1], (2, 16, 1, 64))
