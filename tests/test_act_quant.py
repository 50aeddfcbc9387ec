"""The CPU reference's activation quantization (runtime/act_quant.py) gives the kernels' references' bytes.

fp8_activation against fp8.quantize_activation (the codes' fp32 values and the scales) and
Nvfp4Activation against e2m1_decode(codes) · s of nvfp4.quantize_activation, on fresh random
activations of many magnitudes and on rows and blocks made to hit the edges: zeros and -0.0,
subnormal values, all-zero and near-zero blocks (subnormal e4m3 scales), saturating blocks
(scales clamped to 448), values on the e4m3 and e2m1 rounding ties, +-inf and NaN; in fp32 (the
rounding in fp32) and bf16/fp16 (the table path), for several global scales. The two roundings
themselves are compared with the casts/encoders on every fp32 value's high 16 bits with low bits
at and around a tie, on random bit patterns, and (slow) on every fp32 value of the binades in
which they behave differently.
"""
from __future__ import annotations

import pytest
import torch

from vsr.kernels import fp8, nvfp4
from vsr.runtime import act_quant as aq

GLOBAL_SCALES = (424.3098, 1.0, 3.0e5, 1.0e-3)
S_ONE = torch.tensor([0x3F800000 - 0x40000000], dtype=torch.int32)   # e2m1_round_'s scale bits for S = 1


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal bytes, except that a NaN matches any NaN (the payload of a NaN is not kept)."""
    nan = torch.isnan(want)
    return (got.dtype == want.dtype and got.shape == want.shape and torch.equal(torch.isnan(got), nan)
            and torch.equal(got.float()[~nan].view(torch.int32), want.float()[~nan].view(torch.int32)))


def _fp8_reference(x):
    xq, s = fp8.quantize_activation(x)
    return xq.float(), s


def _nvfp4_reference(x, gx):
    codes, s = nvfp4.quantize_activation(x, gx)
    return nvfp4.e2m1_decode(codes) * s.float().repeat_interleave(nvfp4.BLOCK, dim=1)


def _patterns(seed: int) -> torch.Tensor:
    """fp32 values: every high half of the bits with low halves at and around a tie (0x8000) and at
    the ends, then random bit patterns."""
    hi = torch.arange(1 << 16, dtype=torch.int64)[:, None] << 16
    lo = torch.tensor([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=torch.int64)[None, :]
    rand = torch.randint(-(1 << 31), 1 << 31, (1 << 20,), generator=torch.Generator().manual_seed(seed),
                         dtype=torch.int64)
    return torch.cat([(hi | lo).reshape(-1), rand]).to(torch.int32).view(torch.float32)


def _e4m3_check(q: torch.Tensor) -> None:
    q = q[(q.abs() <= 464) | torch.isnan(q)]
    got = aq.e4m3_round_(q.clone(), torch.empty_like(q, dtype=torch.int32))
    assert _same(got, fp8.e4m3_rne(q).float())


def _e2m1_check(q: torch.Tensor) -> None:
    q = q.clamp(-nvfp4.FP4_MAX, nvfp4.FP4_MAX)
    got = aq.e2m1_round_(q.clone(), torch.empty_like(q, dtype=torch.int32), S_ONE)
    want = aq._lookup(aq.E2M1_VALUES, nvfp4.e2m1_encode(q))
    # A NaN q occurs only in a NaN block, whose scale is NaN: there the reference's value, 0 · NaN, is NaN.
    assert _same(got, torch.where(torch.isnan(q), torch.full_like(want, float("nan")), want))


def test_code_tables_give_the_conversions_bytes():
    """Every e4m3 code through E4M3_VALUES is torch's float8 -> fp32 conversion (NaN and -0.0
    included, compared as bits); every e2m1 code through E2M1_VALUES is nvfp4.e2m1_decode's."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    want = codes.view(fp8.FP8_DTYPE).float()
    assert torch.equal(aq._lookup(aq.E4M3_VALUES, codes).view(torch.int32), want.view(torch.int32))
    nib = torch.arange(16, dtype=torch.uint8).repeat(3, 1)
    assert torch.equal(aq._lookup(aq.E2M1_VALUES, nib).view(torch.int32), nvfp4.e2m1_decode(nib).view(torch.int32))


def test_e4m3_rounding_is_the_cast():
    _e4m3_check(_patterns(1))


def test_e2m1_rounding_is_the_encoder():
    _e2m1_check(_patterns(2))


def test_e2m1_rounding_applies_the_block_scale():
    """The scale bits make the product exact: r · S for every e2m1 value r and every e4m3 scale S
    (-0.0 is q = -0.0, whose code is +0)."""
    r = aq.E2M1_VALUES.repeat(256)
    S = aq.E4M3_VALUES.repeat_interleave(16)
    keep = torch.isfinite(S) & (S > 0)
    r, S = r[keep], S[keep]
    got = aq.e2m1_round_(r.clone(), torch.empty_like(r, dtype=torch.int32), S.view(torch.int32) - 0x40000000)
    assert torch.equal(got.view(torch.int32), ((r + 0.0) * S).view(torch.int32))


@pytest.mark.slow
def test_roundings_on_every_value_of_the_binades_that_differ():
    """Every fp32 value (both signs) of the fp32 subnormals and of each binade whose grid or clamp
    differs: e4m3 2^-12 .. 2^-5 (zero, the subnormal steps, the first normal one), 2^0, 2^7, 2^8
    (448 and the clamp); e2m1 2^-3 .. 2^3 (zero, steps 1/2, 1, 2, the clamp at 6)."""
    mant = torch.arange(1 << 23, dtype=torch.int32)
    def binade(E):
        b = mant + ((E + 127) << 23) if E > -127 else mant
        return torch.cat([b, b | torch.tensor(-(1 << 31), dtype=torch.int32)]).view(torch.float32)
    for E in (-127, -12, -11, -10, -9, -8, -7, -6, -5, 0, 7, 8):
        _e4m3_check(binade(E))
    for E in (-127, -3, -2, -1, 0, 1, 2, 3):
        _e2m1_check(binade(E))


def _activations(K: int, seed: int) -> torch.Tensor:
    """Random rows of magnitudes from 2^-10 to 2^10 with blocks at the edges (rows 0-8), random
    rows (9-19) and rows of e4m3 ties (20-): every midpoint between e4m3 values, both signs, in
    rows whose max is 448, so that their scale is 1."""
    g = torch.Generator().manual_seed(seed)
    mids = (aq.E4M3_VALUES[:126] + aq.E4M3_VALUES[1:127]) / 2
    mids = torch.cat([mids, -mids])
    tie_rows = -(-mids.numel() // (K - 1))
    x = torch.randn(20 + tie_rows, K, generator=g) * torch.exp2(torch.randint(-10, 11, (20 + tie_rows, 1), generator=g).float())
    x[0, :16] = 0.0
    x[1, 16:32] = -0.0
    x[1, 40:43] = -0.0
    x[2, :16] = torch.randn(16, generator=g) * 1e-40             # subnormal values
    x[3, :16] = torch.randn(16, generator=g) * 1e-6              # a near-zero block: a subnormal e4m3 scale
    x[4, :16] = torch.randn(16, generator=g) * 1e4               # a saturating block: the scale clamps at 448
    x[5, 3] = -1e-30
    # e2m1 ties in blocks whose scale is 1 for gx = 1 (amax 6): the thresholds and their neighbours
    t = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    x[6, :7], x[6, 7:14], x[6, 14], x[6, 15] = t, torch.nextafter(t, torch.zeros(7)), 6.0, -0.25
    x[7, :7], x[7, 7:14], x[7, 14], x[7, 15] = -t, torch.nextafter(t, torch.full((7,), 8.0)), -6.0, 0.0
    ties = torch.zeros(tie_rows * (K - 1))
    ties[:mids.numel()] = mids
    x[20:, :K - 1] = ties.view(tie_rows, K - 1)
    x[20:, K - 1] = 448.0
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("K", [64, 384])
@pytest.mark.parametrize("workspace", [False, True])
def test_fp8_activation_is_the_reference(dtype, K, workspace):
    ws = aq.Workspace() if workspace else None
    x = _activations(K, K).to(dtype)
    got, s = aq.fp8_activation(x, ws)
    want, s_want = _fp8_reference(x)
    assert _same(got, want) and _same(s, s_want)
    for row in (x[9:20], x[20:]):                  # rows the fp32 rounding takes
        got, s = aq.fp8_activation(row, ws)
        want, s_want = _fp8_reference(row)
        assert _same(got, want) and _same(s, s_want)


def test_workspace_memory_is_reused_and_per_thread():
    import threading

    ws = aq.Workspace()
    big, small = _activations(384, 1), _activations(64, 2)
    a, _ = aq.fp8_activation(big, ws)
    ptr = a.data_ptr()
    b, _ = aq.fp8_activation(small, ws)            # a smaller call takes the same memory
    assert b.data_ptr() == ptr and _same(b, _fp8_reference(small)[0])
    act = aq.Nvfp4Activation(torch.tensor([GLOBAL_SCALES[0]]), ws)
    assert _same(act(big), _nvfp4_reference(big, torch.tensor([GLOBAL_SCALES[0]])))
    other = []
    t = threading.Thread(target=lambda: other.append(aq.fp8_activation(big, ws)[0].data_ptr()))
    t.start()
    t.join()
    assert other[0] != ptr


@pytest.mark.parametrize("edge", ["zero", "tiny", "inf", "nan"])
def test_fp8_activation_edge_rows(edge):
    """An all-zero row (the eps scale), a row of magnitudes ~2^-130 (a subnormal scale: the clamp
    matters), a row with inf (its finite values give zeros, inf/inf a NaN) and a NaN row."""
    x = _activations(64, 5)[9:12].clone()          # rows the fp32 rounding takes, then an edge in row 1
    x[1] = {"zero": torch.zeros(64), "tiny": torch.randn(64) * 2.0 ** -130,
            "inf": torch.where(torch.arange(64) == 3, float("inf"), x[1]),
            "nan": torch.where(torch.arange(64) == 3, float("nan"), x[1])}[edge]
    got, s = aq.fp8_activation(x)
    want, s_want = _fp8_reference(x)
    assert _same(got, want) and _same(s, s_want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gx", GLOBAL_SCALES)
@pytest.mark.parametrize("workspace", [False, True])
def test_nvfp4_activation_is_the_reference(dtype, gx, workspace):
    gs = torch.tensor([gx])
    act = aq.Nvfp4Activation(gs, aq.Workspace() if workspace else None)
    for K, seed in ((64, 1), (384, 2)):
        x = _activations(K, seed).to(dtype)
        x[10, 5] = float("inf")
        x[11, 20] = float("nan")
        assert _same(act(x), _nvfp4_reference(x, gs))


def test_nvfp4_activation_scales_outside_the_fast_path():
    """A zero, negative, infinite or NaN global scale runs the table path, with the same bytes."""
    x = _activations(64, 3)
    for gx in (0.0, -2.0, float("inf"), float("nan")):
        gs = torch.tensor([gx])
        act = aq.Nvfp4Activation(gs)
        assert act.table is None
        assert _same(act(x), _nvfp4_reference(x, gs))


def _clamp_free_rows(gx: float, seed: int) -> torch.Tensor:
    """[64, 384] rows whose every block has v = amax / 6 · gx within [2^-6, 448]: random blocks,
    and blocks whose amax puts v just below each e4m3 value's upper tie, so that the scale rounds
    down and the largest |x / eff| is up to 6 · 17/16 (q above 6 without the clamp)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 384, generator=g)
    blocks = x.view(64, 24, 16)
    normal = aq.E4M3_VALUES[8:126]                       # 2^-6 .. 416, whose next value is finite
    upper_tie = (normal + aq.E4M3_VALUES[9:127]) / 2
    v = torch.cat([torch.nextafter(upper_tie, torch.zeros(1)), normal,
                   torch.exp2(torch.empty(64 * 24 - 2 * normal.numel()).uniform_(-6, 8.8, generator=g))])
    v = v[torch.randperm(v.numel(), generator=g)].view(64, 24)
    amax = v * 6.0 / gx
    blocks.mul_(amax[..., None] / blocks.abs().amax(-1, keepdim=True))
    return x


@pytest.mark.parametrize("gx", GLOBAL_SCALES)
def test_nvfp4_activation_without_the_clamp(gx):
    """Blocks whose scales are all normal and unsaturated skip the clamp to +-6 and give the
    reference's bytes, with q above 6 where a scale rounds down."""
    gs = torch.tensor([gx])
    x = _clamp_free_rows(gx, seed=7)
    act = aq.Nvfp4Activation(gs, aq.Workspace())
    v = x.view(64, 24, 16).abs().amax(-1) / nvfp4.FP4_MAX * gs
    assert not act.needs_clamp(v)
    s = fp8.e4m3_rne(v).float()
    assert (x.view(64, 24, 16).abs() * gs / s[..., None]).max() > 6.2   # unclamped q beyond 6
    assert _same(act(x), _nvfp4_reference(x, gs))
    assert _same(act(-x), _nvfp4_reference(-x, gs))


@pytest.mark.parametrize("edge", ["zero", "subnormal", "saturated", "inf", "nan", "huge_gx"])
def test_nvfp4_activation_takes_the_clamp(edge):
    """One block outside the clamp-free condition (a zero block, a subnormal or saturated scale,
    inf, NaN) or a global scale above 2^119 clamps, with the reference's bytes."""
    gx = 2.0 ** 120 if edge == "huge_gx" else 424.3098
    gs = torch.tensor([gx])
    x = _clamp_free_rows(1.0 if edge == "huge_gx" else gx, seed=8)
    if edge == "huge_gx":
        x *= 2.0 ** -124
    block = x[5, 32:48]
    g = torch.Generator().manual_seed(9)
    if edge == "zero":
        block.zero_()
    elif edge == "subnormal":                          # v between 2^-10 and 2^-6: a subnormal e4m3 scale
        block.copy_(torch.randn(16, generator=g) * (3 * 2.0 ** -9 / gx))
    elif edge == "saturated":
        block.copy_(torch.randn(16, generator=g) * (6 * 2000.0 / gx))
    elif edge == "inf":
        block[3] = float("inf")
    elif edge == "nan":
        block[3] = float("nan")
    act = aq.Nvfp4Activation(gs, aq.Workspace())
    v = x.view(64, 24, 16).abs().amax(-1) / nvfp4.FP4_MAX * gs
    assert act.needs_clamp(v)
    assert _same(act(x), _nvfp4_reference(x, gs))


def test_workspace_plans_are_bounded_and_follow_their_slots():
    """At most MAX_PLANS shapes keep their plans (the least recently used goes first), and a slot
    that grows drops every plan: a later call at an old shape still gives the reference's bytes."""
    ws = aq.Workspace()
    gs = torch.tensor([GLOBAL_SCALES[0]])
    act = aq.Nvfp4Activation(gs, ws)
    x = torch.cat([_activations(64, seed) for seed in (4, 5, 6)])   # 72 rows: more shapes than plans
    act(x)
    first = ws.plans[("nvfp4",) + tuple(x.shape)]
    for m in range(1, aq.Workspace.MAX_PLANS + 1):
        act(x[:m])
        act(x)                                       # kept: used again after each other shape
    assert len(ws.plans) == aq.Workspace.MAX_PLANS
    assert ws.plans[("nvfp4",) + tuple(x.shape)] is first
    assert ("nvfp4", 1, 64) not in ws.plans           # the least recently used went
    big = torch.cat([x] * 4)
    assert _same(act(big), _nvfp4_reference(big, gs))  # slot 0 grows: the old plans go
    assert list(ws.plans) == [("nvfp4",) + tuple(big.shape)]
    assert _same(act(x), _nvfp4_reference(x, gs))
