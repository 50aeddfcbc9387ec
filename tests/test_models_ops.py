"""The forward's non-product operations (runtime/models/ops.py): the CPU path imports no kernel
module, and the kernels' `*_reference` twins give the reference set's bytes (the CPU answers)."""
import os
import subprocess
import sys

import pytest
import torch

from tinypkgs import tiny_modernbert, tiny_qwen3, tiny_qwen3_5  # noqa: F401
from vsr.runtime.models import ops

KERNEL_MODULES = ("vsr.kernels.norm", "vsr.kernels.rope", "vsr.kernels.activation", "vsr.kernels.attention",
                  "vsr.kernels.head", "vsr.kernels.conv1d", "vsr.kernels.delta_rule")


@pytest.mark.parametrize("fixture", ["tiny_qwen3", "tiny_qwen3_5", "tiny_modernbert"])
def test_the_cpu_forward_imports_no_forward_kernel_module(fixture, request):
    path = request.getfixturevalue(fixture)
    code = ("import sys; sys.path.insert(0, 'tests'); from tinypkgs import Pkg; "
            "from vsr.runtime.engine import load_engine; "
            f"e = load_engine(Pkg({str(path)!r})); e.forward(['turn on the lights']); "
            f"print(sorted(m for m in {KERNEL_MODULES!r} if m in sys.modules))")
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"


def _inputs(dtype, T=6, H=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return lambda *shape: torch.randn(*shape, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_twins_give_the_reference_bytes(dtype):
    twins = ops.kernel_twins()
    r = _inputs(dtype)
    B, S, Hq, Hkv, D = 2, 5, 4, 2, 32
    T = B * S
    x, res, w = r(T, 128), r(T, 128), r(128)
    for name in ("rms_norm", "layer_norm"):
        args = (x, w, r(128), 1e-6) if name == "layer_norm" else (x, w, 1e-6)
        for residual in (None, res):
            got = getattr(twins, name)(*args, residual=residual)
            want = getattr(ops.REFERENCE, name)(*args, residual=residual)
            assert torch.equal(got[0], want[0]) and (want[1] is None) == (got[1] is None), name
            assert want[1] is None or torch.equal(got[1], want[1]), name
    qkv = r(T, (Hq + 2 * Hkv) * D)
    q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], dim=1)
    pos = torch.arange(S, dtype=torch.float32)[:, None] * torch.arange(D, dtype=torch.float32)[None] / D
    cos, sin = pos.cos().repeat(B, 1), pos.sin().repeat(B, 1)
    qw, kw = r(D), r(D)
    for a, b in zip(twins.qk_norm_rope(q, k, qw, kw, cos, sin, 1e-6), ops.REFERENCE.qk_norm_rope(q, k, qw, kw, cos, sin, 1e-6)):
        assert torch.equal(a, b)
    gu = r(T, 2 * 96)
    assert torch.equal(twins.silu_mul(gu), ops.REFERENCE.silu_mul(gu))
    for approx in ("none", "tanh"):
        assert torch.equal(twins.gelu(gu, approx), ops.REFERENCE.gelu(gu, approx))
    lengths = torch.tensor([S, 3], dtype=torch.int32)
    h, sw = r(T, 128), torch.randn(3, 128)
    assert torch.equal(twins.last_token_score(h, lengths, sw), ops.REFERENCE.last_token_score(h, lengths, sw))
    for approx in ("none", "tanh"):
        assert torch.equal(twins.gelu_mul(gu, approx), ops.REFERENCE.gelu_mul(gu, approx))
    # Qwen3.5's gated norm (z a column slice of a fused product's output), ModernBERT's RoPE (cos and
    # sin in the activation dtype); the Gated DeltaNet's mixer is one pure-torch module.
    z, gw = r(T, 200)[:, 8:136], r(32)
    assert torch.equal(twins.gated_rms_norm(x, z, gw, 1e-6), ops.REFERENCE.gated_rms_norm(x, z, gw, 1e-6))
    for a, b in zip(twins.rope(q, k, cos.to(dtype), sin.to(dtype), D), ops.REFERENCE.rope(q, k, cos.to(dtype),
                                                                                         sin.to(dtype), D)):
        assert torch.equal(a, b)
    assert twins.deltanet_mixer is ops.REFERENCE.deltanet_mixer   # one pure-torch module
    if dtype == torch.float32:   # the twin's attention runs fp32 whatever q's dtype; the reference's in q's
        qv, kv, vv = q.reshape(B, S, Hq, D), k.reshape(B, S, Hkv, D), v.reshape(B, S, Hkv, D)
        gate = r(B, S, Hq, 2 * D)[..., D:]
        for kw in ({"causal": True}, {"causal": False}, {"causal": False, "window": 4}, {"causal": True, "gate": gate}):
            got = twins.attention(qv, kv, vv, lengths, **kw)
            want = ops.REFERENCE.attention(qv, kv, vv, lengths, **kw)
            for b in range(B):   # the rows past a request's length are padding, free in either
                torch.testing.assert_close(got[b, :lengths[b]], want[b, :lengths[b]], atol=1e-6, rtol=1e-5)


def test_reference_rms_norm_is_transformers_qwen3_rmsnorm():
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    m = Qwen3RMSNorm(64, eps=1e-6).to(torch.bfloat16)
    with torch.no_grad():
        m.weight.copy_(torch.randn(64))
    x, res = torch.randn(5, 64).to(torch.bfloat16), torch.randn(5, 64).to(torch.bfloat16)
    y, s = ops.REFERENCE.rms_norm(x, m.weight.detach(), 1e-6, residual=res)
    assert torch.equal(s, x + res) and torch.equal(y, m(x + res).detach())


def test_reference_window_is_transformers_modernbert_local_attention():
    """window=local_attention keeps keys within |i - j| <= local_attention // 2: transformers'
    ModernBERT sliding layers (sliding_window = local_attention // 2, distance <= sliding_window)."""
    from transformers.masking_utils import sliding_window_bidirectional_overlay

    g = torch.Generator().manual_seed(4)
    B, S, H, D, local = 1, 12, 2, 16, 6
    q, k, v = (torch.randn(B, S, H, D, generator=g) for _ in range(3))
    lengths = torch.tensor([S], dtype=torch.int32)
    inside = sliding_window_bidirectional_overlay(local // 2)
    allow = torch.tensor([[bool(inside(0, 0, i, j)) for j in range(S)] for i in range(S)])
    want = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                            attn_mask=allow).transpose(1, 2)
    got = ops.REFERENCE.attention(q, k, v, lengths, causal=False, window=local)
    assert torch.equal(got, want)
    assert not torch.equal(got, ops.REFERENCE.attention(q, k, v, lengths, causal=False))


class _CodesProjection:
    """An FP8 projection of the approximate set as the model code sees one: it takes the codes of
    the op before it (takes_fp8_codes) and records what product_fp8 got."""
    takes_fp8_codes = True

    def __init__(self):
        self.got = []

    def product_fp8(self, xq, xs, dtype):
        self.got.append((xq, xs, dtype))
        return torch.zeros(xq.shape[0], 3, dtype=dtype)


@pytest.mark.parametrize("layer", [False, True])
def test_the_approximate_fp8_path_hands_the_codes_and_skips_unread_outputs(layer):
    # normed_product and activated_product in the approximate set on the Triton kernels (the
    # interpreter here): the projection gets the norm's / activation's own e4m3 codes and scales,
    # which equal fp8.quantize_activation of the output; the norm's y only when the caller keeps it.
    from vsr.kernels import activation, fp8, norm
    from vsr.runtime.models.common import activated_product, normed_product
    t = ops.triton_ops()
    r = _inputs(torch.float16, seed=3)
    x, res, w = r(6, 64), r(6, 64), r(64) + 1
    for keep in (True, False):
        p = _CodesProjection()
        out, y, s = normed_product(t, p, x, w, 1e-5, residual=res, bias=None, layer=layer, exact=False,
                                   keep_output=keep)
        ref = (norm.layer_norm(x, w, None, 1e-5, residual=res, exact=False) if layer
               else norm.rms_norm(x, w, 1e-5, residual=res, exact=False))
        assert (y is None) != keep and torch.equal(s, ref[1]) and out.shape == (6, 3)
        q, qs = fp8.quantize_activation(ref[0])
        (xq, xs, dtype), = p.got
        assert dtype == torch.float16 and torch.equal(xq.view(torch.uint8), q.view(torch.uint8))
        assert torch.equal(xs, qs.reshape(-1))
    p = _CodesProjection()
    gu = r(6, 128)
    activated_product(t, p, gu, "silu_mul", exact=False)
    q, qs = fp8.quantize_activation(activation.silu_mul(gu))   # (the activation rounds exactly in both sets)
    (xq, xs, dtype), = p.got
    assert torch.equal(xq.view(torch.uint8), q.view(torch.uint8)) and torch.equal(xs, qs.reshape(-1))
