"""Fused projections (runtime/fuse.py): the fused weight's reference product is the parts' reference
products side by side, bit for bit (every format's reference math is per output column), and parts
that cannot share a product are refused (None), never fused wrongly."""
import pytest
import torch

from vsr.autotune import synth
from vsr.kernels import dense, fp8, int4, nvfp4
from vsr.runtime import fuse

REFERENCE = {"dense": dense, "fp8": fp8, "int4": int4, "nvfp4": nvfp4}
FORMATS = {
    "dense-fp32": ("dense", {"wdtype": "float32"}, torch.float32),
    "dense-bf16": ("dense", {"wdtype": "bfloat16"}, torch.float32),
    "fp8": ("fp8", {}, torch.float32),
    "int4-gptq": ("int4", {"group": 32, "symmetric": True}, torch.float32),
    "int4-awq": ("int4", {"group": 32, "symmetric": False}, torch.float16),
    "nvfp4": ("nvfp4", {"act": "e2m1-block16-dynamic"}, torch.float32),
    "nvfp4a16": ("nvfp4", {"act": "none"}, torch.float32),
}
# q, k, v of a grouped-query layer (Nq > Nk = Nv), K = 64 (two int4 groups of 32).
SHAPES = (96, 32, 32)
K = 64


def _parts(fmt, params, act, seed=0):
    return [synth.random_weight(fmt, n, K, params, act, "cpu", seed=seed + i) for i, n in enumerate(SHAPES)]


def _product(x, w):
    return REFERENCE[w.format].reference_linear(x, w)


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("rows", [1, 7])
def test_fused_product_is_the_parts_side_by_side(name, rows):
    fmt, params, act = FORMATS[name]
    parts = _parts(fmt, params, act)
    fused = fuse.fuse(parts)
    assert fused is not None and fused.format == fmt and fused.N == sum(SHAPES) and fused.K == K
    x = synth.random_activations(rows, K, act, "cpu", seed=5)
    want = torch.cat([_product(x, p) for p in parts], dim=1)
    got = _product(x, fused)
    assert torch.equal(got, want)
    assert [t.shape[1] for t in got.split(fuse.split_sizes(parts), dim=1)] == list(SHAPES)


def test_fused_biases_and_a_missing_bias():
    parts = _parts("dense", {"wdtype": "float32"}, torch.float32)
    parts[0].bias = torch.randn(SHAPES[0])
    parts[2].bias = torch.randn(SHAPES[2])
    fused = fuse.fuse(parts)
    x = torch.randn(3, K)
    assert torch.equal(_product(x, fused), torch.cat([_product(x, p) for p in parts], dim=1))
    assert torch.equal(fused.bias[SHAPES[0]:SHAPES[0] + SHAPES[1]], torch.zeros(SHAPES[1]))


def test_int4_act_order_fuses_only_with_one_permutation():
    params = {"group": 32, "symmetric": False, "act_order": True}
    parts = _parts("int4", params, torch.float32)
    assert len({tuple(p.act_perm.tolist()) for p in parts}) == 3   # synth gives each part its own
    assert fuse.fuse(parts) is None
    assert "act-order" in fuse.why_not(parts)
    perm = parts[0].act_perm
    for p in parts[1:]:
        p.act_perm = perm.clone()
    fused = fuse.fuse(parts)
    assert fused is not None and torch.equal(fused.act_perm, perm)
    x = torch.randn(4, K)
    assert torch.equal(_product(x, fused), torch.cat([_product(x, p) for p in parts], dim=1))
    parts[1].act_perm = None   # one part without act order beside two with
    assert fuse.fuse(parts) is None


def test_int4_group_sizes_must_match():
    parts = _parts("int4", {"group": 32, "symmetric": True}, torch.float32)
    parts[1] = synth.random_weight("int4", SHAPES[1], K, {"group": 64, "symmetric": True}, torch.float32, "cpu")
    assert fuse.fuse(parts) is None


@pytest.mark.parametrize("which", ["weight_global_scale", "input_global_scale"])
def test_nvfp4_fuses_only_with_equal_global_scales(which):
    parts = _parts("nvfp4", {"act": "e2m1-block16-dynamic"}, torch.float32)
    if which == "weight_global_scale":
        parts[2].global_scale = parts[2].global_scale * 2
    else:
        parts[2].input_global_scale = parts[2].input_global_scale * 2
    assert fuse.fuse(parts) is None
    assert "global scales" in fuse.why_not(parts)


def test_mixed_formats_and_k_are_refused():
    a = synth.random_weight("dense", 8, K, {"wdtype": "float32"}, torch.float32, "cpu")
    b = synth.random_weight("fp8", 8, K, {}, torch.float32, "cpu")
    assert fuse.fuse([a, b]) is None
    c = synth.random_weight("dense", 8, 2 * K, {"wdtype": "float32"}, torch.float32, "cpu")
    with pytest.raises(ValueError, match="share K"):
        fuse.fuse([a, c])
    with pytest.raises(ValueError, match="at least two"):
        fuse.fuse([a])


def test_concat_covers_every_weight_format():
    assert set(fuse.CONCAT) == set(REFERENCE)


def test_fuse_runs_fuses_each_longest_run():
    """fuse_runs: all parts in one run where they fuse; else the longest run that fuses from each
    part on, a part that fuses with none of its successors alone. Each fused run's product is its
    parts' products side by side."""
    fp = [synth.random_weight("fp8", n, K, {}, torch.float32, "cpu", seed=i) for i, n in enumerate((24, 8))]
    de = [synth.random_weight("dense", n, K, {"wdtype": "float32"}, torch.float32, "cpu", seed=5 + i)
          for i, n in enumerate((4, 4, 8))]
    runs = fuse.fuse_runs(fp + de[:2])
    assert [(i, j) for i, j, _ in runs] == [(0, 2), (2, 4)] and all(w is not None for *_, w in runs)
    x = torch.randn(3, K)
    for i, j, w in runs:
        assert torch.equal(_product(x, w), torch.cat([_product(x, p) for p in (fp + de)[i:j]], dim=1))
    assert [(i, j, w is None) for i, j, w in fuse.fuse_runs([de[0], fp[0], de[1], de[2]])] == [
        (0, 1, True), (1, 2, True), (2, 4, False)]
    assert [(i, j) for i, j, _ in fuse.fuse_runs(de)] == [(0, 3)]
    names = ["m.l.in_proj_qkv", "m.l.in_proj_z", "m.l.in_proj_b", "m.l.in_proj_a"]
    assert fuse.run_label("m.l.in_proj", names, 2, 4) == "m.l.in_proj_b|in_proj_a"
    assert fuse.run_label("m.l.in_proj", names, 0, 4) == "m.l.in_proj"
    assert fuse.run_label("m.l.in_proj", names, 1, 2) == "m.l.in_proj_z"


def test_projection_splits_only_at_a_product_boundary():
    """Projection.split(at): the products of parts [0, at) and [at, n) as two Projections (each
    fused where it is one product of several parts), None where a product spans part `at`."""
    from vsr.runtime.linear import QLinear
    from vsr.runtime.models.common import Projection

    ws = [synth.random_weight("dense", n, 16, {"wdtype": "float32"}, torch.float32, "cpu", seed=i)
          for i, n in enumerate((6, 4, 3, 3))]
    qkvz, ba = fuse.fuse(ws[:2]), fuse.fuse(ws[2:])
    proj = Projection([QLinear(qkvz), QLinear(ba)], [6, 4, 3, 3], False, [2, 2])
    head, tail = proj.split(2)
    assert head.fused and tail.fused and head.sizes == [6, 4] and tail.sizes == [3, 3]
    x = torch.randn(5, 16)
    assert torch.equal(torch.cat([head(x), tail(x)], -1), proj(x))
    assert proj.split(1) is None and proj.split(3) is None
    assert Projection([QLinear(fuse.fuse(ws))], [6, 4, 3, 3], True).split(2) is None
    singles = Projection([QLinear(w) for w in ws], [6, 4, 3, 3], False)
    head, tail = singles.split(1)
    assert not head.fused and head.runs == [1] and tail.runs == [1, 1, 1]
    with pytest.raises(ValueError, match="do not cover"):
        Projection([QLinear(qkvz), QLinear(ba)], [6, 4, 3, 3], False, [2, 1])
