"""The activation side of the CPU reference: FP8 W8A8 and NVFP4 W4A4 quantize each call's activations.

`fp8_activation(x)` is fp8.quantize_activation(x) as (the codes' fp32 values, the scales) and
`Nvfp4Activation(input_global_scale)(x)` is e2m1_decode(codes) · s_x of nvfp4.quantize_activation
(x, input_global_scale): the same bytes (tests/test_act_quant.py checks them against the kernels'
references, and the roundings against the casts on every fp32 value of the binades where they
behave differently).

On fp32 activations (the CPU's dtype) the roundings are done in fp32 with no cast to a float8
type and no table of codes. Rounding v to e4m3 (|v| <= 448) or to e2m1 (|v| <= 6) is
round(v / p) · p for the grid step p at v, a power of two: e = 2^E, E the exponent of v clamped
to the format's range (e4m3: E >= -6, below which the steps are the subnormals' 2^-9; e2m1:
0 <= E <= 2, steps 1/2, 1, 2), is v's int32 bits masked to the exponent field and clamped; the
quotient v / p = 8v / e (e4m3) or 2v / e (e2m1) and the product back are exact, and torch.round
rounds half to even, as the casts and nvfp4.e2m1_encode do. Each call runs about ten torch ops,
most of them in place on the output and one int32 buffer. Other dtypes, and scales outside the
fp32 fast path's conditions (below), run the general path: the codes read through fp32 tables of
every e4m3 and e2m1 code.
"""
from __future__ import annotations

import math
import threading
from typing import Callable

import torch
import torch.nn.functional as F

from vsr.kernels import fp8, nvfp4

# Every e4m3 code's value and every e2m1 code's (sign in bit 3, -0.0 at code 8), in fp32: a
# gather from these gives the bytes of torch's float8 -> float conversion and of
# nvfp4.e2m1_decode in about 40% and 15% of their time (2,048 x 384 codes, 2 CPU cores).
E4M3_VALUES = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(fp8.FP8_DTYPE).float()
E2M1_VALUES = torch.cat([torch.tensor(nvfp4.E2M1_VALUES), -torch.tensor(nvfp4.E2M1_VALUES)]).float()

_EXPONENT = 0x7F800000        # an fp32's exponent field
_E4M3_MIN_E = 121 << 23       # 2^-6, e4m3's smallest normal
_ONE, _FOUR = 0x3F800000, 0x40800000
_NEG0 = torch.tensor(-0.0)    # -0.0 + y is y for every y (+0.0 + y turns -0.0 into +0.0)
_POS0 = torch.tensor(0.0)


class Workspace(threading.local):
    """Per-thread scratch memory for the activations' [M, K] tensors, kept from call to call.

    A fresh tensor of a few MB is new memory the OS maps on first touch, which at the down
    projection's [tokens, 1536] input costs more than the quantization's arithmetic.
    A tensor taken from a workspace is valid until the next take of its slot on this thread: the
    CPU reference consumes each activation (its products) before the next layer quantizes.
    `plan(key, build)` keeps per-shape views of the slots (and small tensors of their own) from
    call to call, the MAX_PLANS most recently used; a slot that grows drops them, so a plan never
    points at memory no longer taken."""

    # A CPU engine's batches take a few dozen [M, K] shapes (batches of 32 requests padded to the
    # longest); a service sees any number, so the plans (13 bytes per block of 16 values, beside
    # their views of the slots) are bounded.
    MAX_PLANS = 64

    def __init__(self):
        self.buffers: dict[int, torch.Tensor] = {}
        self.plans: dict = {}

    def take(self, slot: int, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        n = math.prod(shape) * dtype.itemsize
        buf = self.buffers.get(slot)
        if buf is None or buf.numel() < n:
            buf = self.buffers[slot] = torch.empty(n, dtype=torch.uint8)
            self.plans.clear()
        return buf[:n].view(dtype).view(shape)

    def plan(self, key, build: Callable[["Workspace"], object]):
        plan = self.plans.pop(key, None)
        if plan is None:
            plan = build(self)
            if len(self.plans) >= self.MAX_PLANS:
                del self.plans[next(iter(self.plans))]   # the least recently used
        self.plans[key] = plan
        return plan


def _lookup(table: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    return torch.index_select(table, 0, codes.reshape(-1).to(torch.int32)).view(codes.shape)


def e4m3_round_(q: torch.Tensor, work: torch.Tensor) -> torch.Tensor:
    """q (fp32, |q| <= 464 or NaN) replaced by its e4m3 value, fp8.e4m3_rne(q).float()'s bytes
    (448 beyond 448, as the clamp gives; the sign of a zero kept; NaN stays NaN); `work`: an int32
    tensor of q's shape, overwritten."""
    e = torch.bitwise_and(q.view(torch.int32), _EXPONENT, out=work).clamp_(min=_E4M3_MIN_E).view(torch.float32)
    torch.addcdiv(_NEG0, q, e, value=8.0, out=q).round_()          # 8q / 2^E in [8, 16], rounded
    return torch.addcmul(_NEG0, q, e, value=0.125, out=q)


def e2m1_round_(q: torch.Tensor, work: torch.Tensor, scale_bits: torch.Tensor) -> torch.Tensor:
    """q (fp32, |q| <= 6 or NaN) replaced by e2m1_decode(e2m1_encode(q)) · S, the reference's
    value of q's code in a block of scale S: a negative q that rounds to zero gives -0.0, q = -0.0
    gives +0.0 (the code's sign is q < 0). scale_bits: S's fp32 bits less 2^30, int32, broadcast
    to q (S a normal number, S · 4 finite); `work`: an int32 tensor of q's shape, overwritten."""
    e = torch.bitwise_and(q.view(torch.int32), _EXPONENT, out=work).clamp_(_ONE, _FOUR)
    torch.addcdiv(_POS0, q, e.view(torch.float32), value=2.0, out=q).round_()   # 2q / 2^E, +0.0 added
    return q.mul_(e.add_(scale_bits).view(torch.float32))                         # times 2^E · S / 2


def fp8_activation(x: torch.Tensor, workspace: Workspace | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8.quantize_activation's bytes as (the codes' fp32 values [M, K], the scales [M, 1] in x's
    dtype). fp32 x whose rows' scales are all normal numbers (no all-zero row, none whose max |x|
    is below about 2^-117, no NaN) is rounded in fp32 with no clamp: x / s is then within
    [-448, 448] up to one ulp, which rounds to +-448 as the clamp does. With a workspace, the fp32
    path's values are the workspace's slot 0 (valid until its next take)."""
    if x.dtype == torch.float32:
        if workspace is None:
            a, q = x.abs(), None
        else:
            a = torch.abs(x, out=workspace.take(1, x.shape, torch.float32))
            q = workspace.take(0, x.shape, torch.float32)
        s = a.amax(dim=-1, keepdim=True).div_(fp8.FP8_MAX)
        if float(s.min()) >= 2.0 ** -126:    # False for a NaN
            return e4m3_round_(torch.div(x, s, out=q), a.view(torch.int32)), s
    s = x.abs().amax(dim=-1, keepdim=True) / fp8.FP8_MAX
    s = torch.where(s == 0, torch.full_like(s, fp8.dtype_eps(x.dtype)), s)
    codes = torch.div(x, s).clamp_(-fp8.FP8_MAX, fp8.FP8_MAX).to(fp8.FP8_DTYPE)
    return _lookup(E4M3_VALUES, codes.view(torch.uint8)), s


def nvfp4_activation(x: torch.Tensor, input_global_scale: torch.Tensor) -> torch.Tensor:
    """e2m1_decode(codes) · s_x of nvfp4.quantize_activation(x) as fp32 [M, K], any dtype and
    global scale: the codes read through E2M1_VALUES, each block's scale broadcast over its 16
    columns."""
    codes, s = nvfp4.quantize_activation(x, input_global_scale)
    M, K = codes.shape
    v = _lookup(E2M1_VALUES, codes).view(M, K // nvfp4.BLOCK, nvfp4.BLOCK)
    return v.mul_(s.float()[..., None]).view(M, K)


class _Nvfp4Plan:
    """One [M, K]'s tensors for Nvfp4Activation: the quotient q over the workspace's slot 0 and its
    views, the rounding's int32 scratch over slot 1, and the blocks' codes, indices and table rows."""

    def __init__(self, ws: Workspace, M: int, K: int):
        nb = K // nvfp4.BLOCK
        self.nb = nb
        self.q = ws.take(0, (M, nb, nvfp4.BLOCK), torch.float32)
        self.q_rows = self.q.view(M, K)
        self.q_pool = self.q.view(M, 1, K)
        self.work = ws.take(1, (M, nb, nvfp4.BLOCK), torch.int32)
        self.codes = torch.empty(M * nb, dtype=fp8.FP8_DTYPE)
        self.index = torch.empty(M * nb, dtype=torch.int32)
        self.rows = torch.empty(M * nb, dtype=torch.int64)
        pair = self.rows.view(torch.int32).view(M, nb, 2)
        self.eff, self.mult = pair[..., :1].view(torch.float32), pair[..., 1:]


class Nvfp4Activation:
    """x -> e2m1_decode(codes) · s_x of nvfp4.quantize_activation(x, input_global_scale), fp32
    [M, K] (nvfp4_activation's bytes).

    For a finite, positive global scale gx, built once: per e4m3 code c of a block scale, the
    scale's divisor eff = fp32(S / gx) (S = c's value, 0.125 for a zero code, as the reference
    substitutes) and S's fp32 bits less 2^30 (the block's multiplier S · e / 2 is then the
    int32 sum of those bits and the bits of a power of two e in [1, 4]: exponents add, no
    rounding). A NaN code's row keeps eff NaN (a NaN block stays NaN) and adds nothing.
    Per call on fp32 x: the block amax (a max pool of |x|), its code as the reference computes
    it, the row of the table, q = clamp(x / eff, +-6), and q rounded to e2m1 as round(2q / e) ·
    (e · S / 2) with e = 2^clamp(E(q), 0, 2). +0.0 is added to 2q / e, so q = -0.0 gives +0.0 and a
    negative q that rounds to zero gives -0.0, as nvfp4.e2m1_encode's sign (q < 0) does.

    The clamp to +-6 changes nothing, and is skipped, when every block's v = amax / 6 · gx is
    within [2^-6, 448] and gx <= 2^119: each scale S is then a normal e4m3 number, S >= v ·
    (1 - 2^-4) (half a step of 3 mantissa bits), and S / gx a normal fp32, so |q| is at most
    6 / (1 - 2^-4) = 6.4 and a few ulps, below 7, and every |q| in (6, 7) rounds to 6 as the
    clamped 6 does (e = 4, round(q / 2) = 3). Zero blocks, subnormal or saturated scales, inf and
    NaN take the clamp.
    """

    def __init__(self, input_global_scale: torch.Tensor, workspace: Workspace | None = None):
        self.input_global_scale = input_global_scale
        self.workspace = workspace   # where the fp32 path's [M, K] tensors go (None: fresh ones)
        gx = input_global_scale.float().reshape(())
        self.gx = gx
        self.key = ("nvfp4", int(gx.view(torch.int32)))   # the activation depends on x and gx only
        self.table = None
        self.clamp_free_scales = False
        if torch.isfinite(gx) and gx > 0:
            S = torch.where(E4M3_VALUES == 0, torch.full_like(E4M3_VALUES, 0.125), E4M3_VALUES)
            eff = S / gx
            bits = S.view(torch.int32) - 0x40000000
            bits[torch.isnan(S)] = 0
            # [256] int64, each (eff's bits, S's bits less 2^30) as two int32 (a 1-D gather is the fast one)
            self.table = torch.stack([eff.view(torch.int32), bits], dim=1).contiguous().view(torch.int64).view(-1)
            self.clamp_free_scales = bool(gx <= 2.0 ** 119)

    def needs_clamp(self, v: torch.Tensor) -> bool:
        """Whether q must be clamped to +-6 for the blocks' v = amax / 6 · gx (the class's note)."""
        if not self.clamp_free_scales:
            return True
        lo, hi = torch.aminmax(v)
        return not (float(lo) >= 2.0 ** -6 and float(hi) <= fp8.FP8_MAX)   # a NaN fails both

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.table is None or x.dtype != torch.float32:
            return nvfp4_activation(x, self.input_global_scale)
        x = x.contiguous()
        M, K = x.shape
        ws = self.workspace or Workspace()
        p = ws.plan(("nvfp4", M, K), lambda w: _Nvfp4Plan(w, M, K))
        torch.abs(x, out=p.q_rows)
        v = F.max_pool1d(p.q_pool, nvfp4.BLOCK).div_(nvfp4.FP4_MAX).mul_(self.gx)   # amax (NaN kept) / 6 · gx
        clamp = self.needs_clamp(v)
        p.codes.copy_(v.clamp_(max=fp8.FP8_MAX).view(-1))                         # the e4m3 cast
        p.index.copy_(p.codes.view(torch.uint8))
        torch.index_select(self.table, 0, p.index, out=p.rows)
        q = torch.div(x.view(M, p.nb, nvfp4.BLOCK), p.eff, out=p.q)
        if clamp:
            q.clamp_(-nvfp4.FP4_MAX, nvfp4.FP4_MAX)
        return e2m1_round_(q, p.work, p.mult).view(M, K)
