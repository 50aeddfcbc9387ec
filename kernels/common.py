"""Pieces every format's Triton template shares: the split-K reduction, the epilogue,
the program-id swizzle, the tile search spaces and the launch bookkeeping.

Determinism: split-K partial sums go to an fp32 workspace [SPLIT, M, N] and a second,
tiny kernel adds them in the order s = 0, 1, ..., SPLIT-1. Nothing uses atomics.
"""
from __future__ import annotations

import hashlib
import inspect
import sys
from dataclasses import dataclass
from types import ModuleType

import triton
import triton.language as tl

from vsr.kernels.template import Template

# Shared memory a block may opt into on sm_90 (H100/H200): 227 KiB. Candidates whose
# pipelined operand tiles need more are pruned from the search space.
SMEM_LIMIT = 232448


@triton.jit
def swizzle(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Map a 1-D program id to (pid_m, pid_n) in groups of GROUP_M row blocks, so that
    programs running at the same time share weight tiles in L2."""
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * grid_n
    group_id = pid // width
    first_m = group_id * GROUP_M
    group_size = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % group_size
    pid_n = (pid % width) // group_size
    return pid_m, pid_n


@triton.jit
def epilogue(acc, offs_m, offs_n, M, N, bias_ptr, rs_ptr, cs_ptr, alpha_ptr,
             HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr, HAS_ALPHA: tl.constexpr):
    """acc (fp32) · row scale[m] · column scale[n] · alpha + bias[n], in that order (the
    references' order, so the rounding matches theirs)."""
    if HAS_RS:
        rs = tl.load(rs_ptr + offs_m, mask=offs_m < M, other=0.0).to(tl.float32)
        acc = acc * rs[:, None]
    if HAS_CS:
        cs = tl.load(cs_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
        acc = acc * cs[None, :]
    if HAS_ALPHA:
        acc = acc * tl.load(alpha_ptr).to(tl.float32)
    if HAS_BIAS:
        b = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
        acc = acc + b[None, :]
    return acc


@triton.jit
def store_or_stash(acc, y_ptr, ws_ptr, pid_k, offs_m, offs_n, M, N, stride_ym,
                   bias_ptr, rs_ptr, cs_ptr, alpha_ptr,
                   SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr,
                   HAS_CS: tl.constexpr, HAS_ALPHA: tl.constexpr):
    """One split: apply the epilogue and write y. Several: write the fp32 partial sum."""
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT_K == 1:
        acc = epilogue(acc, offs_m, offs_n, M, N, bias_ptr, rs_ptr, cs_ptr, alpha_ptr,
                       HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA)
        ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
        tl.store(ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        base = pid_k.to(tl.int64) * M * N
        ptrs = ws_ptr + base + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        tl.store(ptrs, acc, mask=mask)


@triton.jit
def splitk_reduce_kernel(ws_ptr, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, M, N, stride_ym,
                         SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr,
                         HAS_CS: tl.constexpr, HAS_ALPHA: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """y = epilogue(Σ_s ws[s]) with s in a fixed order: the deterministic split-K reduction."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    idx = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    acc = tl.load(ws_ptr + idx, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        # (M may arrive as a plain int: Triton specialises arguments equal to 1.)
        acc += tl.load(ws_ptr + tl.full((), s, tl.int64) * M * N + idx, mask=mask, other=0.0)
    acc = epilogue(acc, offs_m, offs_n, M, N, bias_ptr, rs_ptr, cs_ptr, alpha_ptr,
                   HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA)
    tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=mask)


def split_plan(K: int, tile: dict) -> tuple[int, int]:
    """(K columns per split, number of splits actually launched). Each split's range is a
    whole number of BLOCK_K tiles, so tiles never straddle a quantization group."""
    bk = tile["BLOCK_K"]
    split = max(1, int(tile.get("SPLIT_K", 1)))
    k_split = triton.cdiv(triton.cdiv(K, split), bk) * bk
    return k_split, triton.cdiv(K, k_split)


def reduce_splits(ws, y, split, M, N, bias, rs, cs, alpha):
    """Launch the fixed-order reduction over `split` partial sums into y."""
    dummy = ws
    grid = (triton.cdiv(M, 16), triton.cdiv(N, 128))
    splitk_reduce_kernel[grid](
        ws, y, bias if bias is not None else dummy, rs if rs is not None else dummy,
        cs if cs is not None else dummy, alpha if alpha is not None else dummy,
        M, N, y.stride(0), SPLIT_K=split, HAS_BIAS=bias is not None, HAS_RS=rs is not None,
        HAS_CS=cs is not None, HAS_ALPHA=alpha is not None, BLOCK_M=16, BLOCK_N=128, num_warps=4)


def _split_for(bucket: int, N: int, K: int, bm: int, bn: int, bk: int, max_split: int, sms: int = 132,
               waves: int = 2) -> int:
    """Split K until the grid holds `waves` programs per multiprocessor (deterministic in the shape).
    Small-M calls are memory-bound: more programs keep more loads in flight."""
    programs = triton.cdiv(N, bn) * triton.cdiv(bucket, bm)
    split = 1
    while programs * split < waves * sms and split < max_split and K // (split * 2) >= 2 * bk:
        split *= 2
    return split


def tile(path, bm, bn, bk, split, warps, stages, group_m=8) -> dict:
    return {"path": path, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split,
            "GROUP_M": group_m, "num_warps": warps, "num_stages": stages}


def default_gemm_tile(bucket: int, N: int, K: int, a_bytes: float, b_bytes: float) -> dict:
    """The deterministic tile of a row bucket: split-K over 16-row tiles for small buckets,
    square-ish tiles for large ones. Depends only on (bucket, N, K, operand sizes)."""
    wide = a_bytes <= 2 and b_bytes <= 2
    if bucket <= 16:
        bk = 128 if wide else 64
        return tile("splitk", 16, 64, bk, _split_for(bucket, N, K, 16, 64, bk, 16, waves=8), 4, 4)
    if bucket <= 128:
        # H200 (run 4): at M=64 the split-K tile 64x128x64/4 took 0.12 ms on qkv in bf16, while
        # the tiled 64x128x64 tile did M=256 in 0.063 ms: mid buckets take the tiled form.
        bm = 32 if bucket == 32 else 64
        bk = 128 if a_bytes <= 1 else 64 if a_bytes <= 2 else 32   # fp32 operands: half the K step
        return tile("tiled", bm, 128, bk, 1, 4, 3)
    bk = 64 if wide else 32
    bm = 64 if bucket == 256 else 128
    return tile("tiled", bm, 128 if bucket == 256 else 256 if a_bytes <= 1 else 128, bk, 1,
                4 if bm == 64 else 8, 3)


def smem_bytes(t: dict, a_bytes: float, b_bytes: float) -> int:
    return int(t["num_stages"] * (t["BLOCK_M"] * t["BLOCK_K"] * a_bytes + t["BLOCK_K"] * t["BLOCK_N"] * b_bytes))


def gemm_space(bucket: int, N: int, K: int, a_bytes: float, b_bytes: float, default: dict,
               bk_choices=None) -> list[dict]:
    """Candidate tiles for a row bucket, `default` first, pruned by shared memory."""
    bks = bk_choices or (64, 128, 256)
    cands = [default]
    if bucket <= 16:
        for bn in (32, 64, 128):
            for bk in bks:
                for split in (1, 2, 4, 8, 16):
                    if K // split < bk:
                        continue
                    cands.append(tile("splitk", 16, bn, bk, split, 4, 4))
    elif bucket <= 128:
        for bm in (16, 32, 64):
            if bm > bucket:
                continue
            for bn in (64, 128):
                for bk in bks[:2]:
                    for split in (1, 2, 4):
                        if K // split < bk:
                            continue
                        cands.append(tile("splitk", bm, bn, bk, split, 4, 4))
    else:
        for bm in (64, 128):
            for bn in (128, 256):
                for bk in bks[:2]:
                    for warps in (4, 8):
                        for stages in (3, 4):
                            cands.append(tile("tiled", bm, bn, bk, 1, warps, stages))
    out, seen = [], set()
    for c in cands:
        key = tuple(sorted(c.items()))
        if key in seen or smem_bytes(c, a_bytes, b_bytes) > SMEM_LIMIT:
            continue
        if c is not default and bk_choices is not None and c["BLOCK_K"] not in bk_choices:
            continue
        seen.add(key)
        out.append(c)
    if not out or out[0] != default:
        raise AssertionError(f"the default tile {default} does not fit the search space's limits")
    return out


def check_tile(t: dict) -> None:
    """A tile from a cache file is data: refuse one missing a field, naming it."""
    for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K", "num_warps", "num_stages"):
        if k not in t:
            raise ValueError(f"tile {t} lacks {k}")


# e4m3 conversions written out in integer arithmetic: the Triton interpreter's own
# fp32 -> float8e4nv cast rounds wrongly (seen with Triton 3.9: -126.3 -> -64, and ties
# not to even), and these give the same bits as torch's cast on every backend.

@triton.jit
def e4m3_encode(v):
    """fp32 (already clamped to ±448, no NaN) -> e4m3fn code (uint8), round to nearest even."""
    bits = v.to(tl.uint32, bitcast=True)
    sign = (bits >> 31) & 1
    a = tl.abs(v)
    abits = a.to(tl.uint32, bitcast=True)
    # Normal range (a >= 2^-6): keep 3 mantissa bits, round half to even via the carry trick.
    lsb = (abits >> 20) & 1
    r = abits + 0x7FFFF + lsb
    e = (r >> 23).to(tl.int32) - 127 + 7
    code_n = (e << 3) | ((r >> 20) & 7).to(tl.int32)
    # Subnormal range: multiples of 2^-9, rounded half to even (8 becomes the first normal).
    t = a * 512.0
    fl = tl.floor(t)
    frac = t - fl
    fli = fl.to(tl.int32)
    up = (frac > 0.5) | ((frac == 0.5) & ((fli & 1) == 1))
    code_s = fli + up.to(tl.int32)
    code = tl.where(a >= 0.015625, code_n, code_s)
    return (code | (sign.to(tl.int32) << 7)).to(tl.uint8)


@triton.jit
def e4m3_decode(code):
    """e4m3fn code (any int type) -> fp32 value, exact."""
    c = code.to(tl.int32) & 0xFF
    e = (c >> 3) & 15
    m = c & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    sub = m.to(tl.float32) * 0.001953125
    mag = tl.where(e == 0, sub, normal)
    return tl.where((c & 0x80) != 0, -mag, mag)


@dataclass(frozen=True)
class KernelTemplate(Template):
    """A Template whose source hash also covers the modules its kernels call into (this one,
    and e.g. dense for int4's dequant path): a change there must not reuse tiles recorded for
    the old code, since the cache promises the same kernel source for the same key."""

    deps: tuple[ModuleType, ...] = ()

    @property
    def source_hash(self) -> str:
        h = hashlib.sha256(inspect.getsource(self.module).encode())
        for m in (sys.modules[__name__],) + tuple(self.deps):
            h.update(inspect.getsource(m).encode())
        return h.hexdigest()[:16]
