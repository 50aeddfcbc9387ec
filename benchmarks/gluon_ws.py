"""Study (not shipped): how much of cuBLAS's lead at M = 256-1024 warp specialisation buys on Hopper.

    python benchmarks/gluon_ws.py [--shapes qkv,o,gate_up,down] [--ms 256,512,1024] [--out FILE]

Where vsr's bf16 products trail cuBLAS (M = 256: 0.74-0.80x on o, gate_up and down, run 22),
cuBLAS runs warp-specialised kernels: per program one warpgroup issues the TMA loads and two
compute, on a ring of shared-memory stages guarded by mbarriers (run 21's peer_kernels JSON: three
warpgroups, 5-8 stages). Plain Triton does not give that form on sm_90 (Triton 3.9's
`tl.range(warp_specialize=True)` compiles to the same PTX as without; NOTES run 22 item 5).
Gluon, Triton's explicit-layout dialect, does: `gl.warp_specialize` with a one-warp loader
partition and the default partition computing with `warpgroup_mma`. This file is that kernel
(bf16, y = a · bᵀ, no epilogue beyond the cast) in two forms, one output tile per program
(ws_gemm) and stream-K (ws_sk_gemm: equal shares of all (tile, K step) iterations, the split
tiles' parts added in program order by a second kernel), timed beside cuBLAS and vsr's shipped
tile on the 27B-class shapes, every output checked against torch first (NaN-filled outputs and
workspace, so an element never written fails).

It is a measurement, not a template: it runs only on sm_90 with Gluon (run on the H200's Triton
3.6, compiled here with 3.9; the TMA load's name changed from `async_copy_global_to_shared` to
`async_load` in between).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, \
    warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common_bench import SHAPES, code_commit, shipped_tile, weight_copies  # noqa: E402
from variants import cublas_baseline, timed_case  # noqa: E402

from vsr.autotune.buckets import bucket_for  # noqa: E402
from vsr.autotune.store import write_atomic  # noqa: E402
from vsr.kernels import registry  # noqa: E402

# Triton 3.6 names the TMA load async_copy_global_to_shared; 3.9 async_load (the old name raises).
# (An alias, not a constexpr branch: Triton 3.6's dependency hash resolves every attribute in the
# source, a pruned branch's too.)
_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared


@gluon.jit
def _loader(a_desc, b_desc, a_s, b_s, ready, empty, off_m, off_n, k_tiles, STAGES: gl.constexpr):
    """The worker partition (one warp): stage s takes K step i once the consumers released its
    previous use (a fresh barrier passes a wait on parity 1)."""
    BK: gl.constexpr = a_desc.block_type.shape[1]
    for i in range(k_tiles):
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
        _tma_load(a_desc, [off_m, i * BK], ready.index(s), a_s.index(s))
        _tma_load(b_desc, [off_n, i * BK], ready.index(s), b_s.index(s))


@gluon.jit
def _mma(a_s, b_s, ready, empty, k_tiles, y_ptr, M, N, stride_ym, off_m, off_n, STAGES: gl.constexpr,
         BM: gl.constexpr, BN: gl.constexpr, LAYOUT: gl.constexpr):
    """The default partition (num_warps warps): wgmma on each stage as it lands, one group in flight;
    a stage is released once the wgmma that read it has completed; then the store (here, not after
    the partitions: Triton 3.6 fails on a default partition that returns a tensor)."""
    acc = gl.zeros((BM, BN), dtype=gl.float32, layout=LAYOUT)
    for i in range(k_tiles):
        s = i % STAGES
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        acc = warpgroup_mma(a_s.index(s), b_s.index(s).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), pred=i > 0)   # step i-1's wgmma is done
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    rm = off_m + gl.arange(0, BM, layout=gl.SliceLayout(1, LAYOUT))
    rn = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, LAYOUT))
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    gl.store(y_ptr + rm[:, None].to(gl.int64) * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


def _instr_n(bm: int, bn: int, warps: int) -> int:
    """The widest wgmma n (a multiple of 8 dividing BN) that the warps' tiling allows."""
    n_reps = triton.cdiv(warps, triton.cdiv(bm, 16))
    n = 256
    while n > max(bn // n_reps, 8) or bn % n:
        n -= 8
    return n


@gluon.jit
def _ring(a_desc, b_desc, STAGES: gl.constexpr):
    """The stages of x and weight tiles and their barriers: `ready` (the loads landed) and
    `empty` (the wgmma that read the stage completed), one arrival each."""
    a_s = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_s = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    fence_async_shared()
    return a_s, b_s, ready, empty


@gluon.jit
def ws_gemm_kernel(a_desc, b_desc, y_ptr, M, N, K, stride_ym, STAGES: gl.constexpr, LOADER_REGS: gl.constexpr,
                   INSTR_N: gl.constexpr, num_warps: gl.constexpr):
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, INSTR_N, 16])
    pid = gl.program_id(0)
    n_m = gl.cdiv(M, BM)
    off_m = (pid % n_m) * BM
    off_n = (pid // n_m) * BN
    a_s, b_s, ready, empty = _ring(a_desc, b_desc, STAGES)
    k_tiles = gl.cdiv(K, BK)
    gl.warp_specialize([(_mma, (a_s, b_s, ready, empty, k_tiles, y_ptr, M, N, stride_ym, off_m, off_n, STAGES, BM, BN,
                                layout)),
                        (_loader, (a_desc, b_desc, a_s, b_s, ready, empty, off_m, off_n, k_tiles, STAGES))],
                       [1], [LOADER_REGS])


def ws_gemm(x: torch.Tensor, w: torch.Tensor, cfg: dict, y: torch.Tensor | None = None) -> torch.Tensor:
    """y = x · wᵀ (bf16) on ws_gemm_kernel with cfg's BM, BN, BK, stages, warps (the consumers')."""
    M, K = x.shape
    N = w.shape[0]
    y = torch.empty((M, N), dtype=x.dtype, device=x.device) if y is None else y
    bm, bn, bk = cfg["BM"], cfg["BN"], cfg["BK"]
    a_desc = TensorDescriptor.from_tensor(x, [bm, bk], gl.NVMMASharedLayout.get_default_for([bm, bk], gl.bfloat16))
    b_desc = TensorDescriptor.from_tensor(w, [bn, bk], gl.NVMMASharedLayout.get_default_for([bn, bk], gl.bfloat16))
    grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
    ws_gemm_kernel[grid](a_desc, b_desc, y, M, N, K, y.stride(0), STAGES=cfg["stages"],
                         LOADER_REGS=cfg.get("loader_regs", 40), INSTR_N=_instr_n(bm, bn, cfg["warps"]),
                         num_warps=cfg["warps"])
    return y


@gluon.jit
def _sk_loader(a_desc, b_desc, a_s, b_s, ready, empty, start, end, k_tiles, n_m, STAGES: gl.constexpr):
    """Stream-K loader: the program's share [start, end) of all (tile, K step) iterations, in order,
    walked a tile segment at a time like the consumer (one division per segment; dividing per step
    instead timed the same, run 22)."""
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    g = start
    while g < end:
        t = g // k_tiles
        ka = g % k_tiles
        kb = gl.minimum(k_tiles, ka + (end - g))
        off_m = (t % n_m) * BM
        off_n = (t // n_m) * BN
        for k in range(ka, kb):
            i = g - start + (k - ka)
            s = i % STAGES
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            _tma_load(a_desc, [off_m, k * BK], ready.index(s), a_s.index(s))
            _tma_load(b_desc, [off_n, k * BK], ready.index(s), b_s.index(s))
        g += kb - ka


@gluon.jit
def _sk_mma(a_s, b_s, ready, empty, start, end, k_tiles, n_m, y_ptr, ws_ptr, M, N, stride_ym, STAGES: gl.constexpr,
            BM: gl.constexpr, BN: gl.constexpr, LAYOUT: gl.constexpr):
    """Stream-K consumer: one accumulator per tile segment of the share; a whole tile is stored to y,
    a part of one (the share's first or last segment) as fp32 to the program's workspace slot 0 or 1."""
    rm0 = gl.arange(0, BM, layout=gl.SliceLayout(1, LAYOUT))
    rn0 = gl.arange(0, BN, layout=gl.SliceLayout(0, LAYOUT))
    pid = gl.program_id(0)
    g = start
    while g < end:
        t = g // k_tiles
        ka = g % k_tiles
        kb = gl.minimum(k_tiles, ka + (end - g))
        acc = gl.zeros((BM, BN), dtype=gl.float32, layout=LAYOUT)
        for k in range(ka, kb):
            i = g - start + (k - ka)
            s = i % STAGES
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            acc = warpgroup_mma(a_s.index(s), b_s.index(s).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            mbarrier.arrive(empty.index((i + STAGES - 1) % STAGES), pred=i > 0)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        if (ka == 0) & (kb == k_tiles):
            rm = (t % n_m) * BM + rm0
            rn = (t // n_m) * BN + rn0
            mask = (rm[:, None] < M) & (rn[None, :] < N)
            gl.store(y_ptr + rm[:, None].to(gl.int64) * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
                     mask=mask)
        else:
            slot = (pid * 2 + (g != start).to(gl.int32)).to(gl.int64)
            gl.store(ws_ptr + (slot * BM + rm0[:, None]) * BN + rn0[None, :], acc)
        g += kb - ka


@gluon.jit
def ws_sk_gemm_kernel(a_desc, b_desc, y_ptr, ws_ptr, M, N, K, stride_ym, per, STAGES: gl.constexpr,
                      LOADER_REGS: gl.constexpr, INSTR_N: gl.constexpr, num_warps: gl.constexpr):
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                     instr_shape=[16, INSTR_N, 16])
    n_m = gl.cdiv(M, BM)
    k_tiles = gl.cdiv(K, BK)
    total = n_m * gl.cdiv(N, BN) * k_tiles
    start = gl.program_id(0) * per
    end = gl.minimum(start + per, total)
    a_s, b_s, ready, empty = _ring(a_desc, b_desc, STAGES)
    gl.warp_specialize([(_sk_mma, (a_s, b_s, ready, empty, start, end, k_tiles, n_m, y_ptr, ws_ptr, M, N, stride_ym,
                                   STAGES, BM, BN, layout)),
                        (_sk_loader, (a_desc, b_desc, a_s, b_s, ready, empty, start, end, k_tiles, n_m, STAGES))],
                       [1], [LOADER_REGS])


@triton.jit
def sk_reduce_kernel(ws_ptr, y_ptr, M, N, stride_ym, k_tiles, per, BM: tl.constexpr, BN: tl.constexpr):
    """Tile t's parts, added in program order (deterministic): program p's slot 0 when t is where
    p's share starts, else its slot 1. Tiles that one program did whole are skipped (stored)."""
    t = tl.program_id(0)
    n_m = tl.cdiv(M, BM)
    first = (t * k_tiles) // per
    last = ((t + 1) * k_tiles - 1) // per
    if first != last:   # (first * per <= t * k_tiles always: one share holds the tile whole)
        rm0 = tl.arange(0, BM)
        rn0 = tl.arange(0, BN)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for p in range(first, last + 1):
            slot = (p * 2 + ((p * per) // k_tiles != t).to(tl.int32)).to(tl.int64)
            acc += tl.load(ws_ptr + (slot * BM + rm0[:, None]) * BN + rn0[None, :])
        rm = (t % n_m) * BM + rm0
        rn = (t // n_m) * BN + rn0
        tl.store(y_ptr + rm[:, None].to(tl.int64) * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))


def ws_sk_gemm(x: torch.Tensor, w: torch.Tensor, cfg: dict, y: torch.Tensor | None = None,
               programs: int | None = None, poison: bool = False) -> torch.Tensor:
    """y = x · wᵀ (bf16): ws_sk_gemm_kernel over `programs` (default: the multiprocessors) equal
    shares of the (tile, K step) iterations, then sk_reduce_kernel for the tiles split between
    shares. `poison` fills the workspace with NaN first (the check; a slot never written then
    fails instead of reading an earlier call's parts)."""
    M, K = x.shape
    N = w.shape[0]
    y = torch.empty((M, N), dtype=x.dtype, device=x.device) if y is None else y
    bm, bn, bk = cfg["BM"], cfg["BN"], cfg["BK"]
    k_tiles = triton.cdiv(K, bk)
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    p = programs or torch.cuda.get_device_properties(x.device).multi_processor_count
    per = triton.cdiv(tiles * k_tiles, p)
    p = triton.cdiv(tiles * k_tiles, per)
    ws = torch.empty((p * 2 * bm * bn,), dtype=torch.float32, device=x.device)
    if poison:
        ws.fill_(float("nan"))
    a_desc = TensorDescriptor.from_tensor(x, [bm, bk], gl.NVMMASharedLayout.get_default_for([bm, bk], gl.bfloat16))
    b_desc = TensorDescriptor.from_tensor(w, [bn, bk], gl.NVMMASharedLayout.get_default_for([bn, bk], gl.bfloat16))
    ws_sk_gemm_kernel[(p,)](a_desc, b_desc, y, ws, M, N, K, y.stride(0), per, STAGES=cfg["stages"],
                            LOADER_REGS=cfg.get("loader_regs", 40), INSTR_N=_instr_n(bm, bn, cfg["warps"]),
                            num_warps=cfg["warps"])
    sk_reduce_kernel[(tiles,)](ws, y, M, N, y.stride(0), k_tiles, per, BM=bm, BN=bn, num_warps=8)
    return y


def compile_sm90(cfg: dict, stream_k: bool = False):
    """ws_gemm_kernel (or ws_sk_gemm_kernel) compiled for sm_90 without a GPU (the CPU tests
    inspect its PTX)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    bm, bn, bk = cfg["BM"], cfg["BN"], cfg["BK"]
    lay_a = gl.NVMMASharedLayout.get_default_for([bm, bk], gl.bfloat16)
    lay_b = gl.NVMMASharedLayout.get_default_for([bn, bk], gl.bfloat16)
    sig = dict(a_desc=f"tensordesc<bf16[{bm}, {bk}],{lay_a!r}>", b_desc=f"tensordesc<bf16[{bn}, {bk}],{lay_b!r}>",
               y_ptr="*bf16", **(dict(ws_ptr="*fp32") if stream_k else {}), M="i32", N="i32", K="i32",
               stride_ym="i32", **(dict(per="i32") if stream_k else {}))
    n = len(sig)
    sig.update(STAGES="constexpr", LOADER_REGS="constexpr", INSTR_N="constexpr", num_warps="constexpr")
    consts = {(n,): cfg["stages"], (n + 1,): cfg.get("loader_regs", 40), (n + 2,): _instr_n(bm, bn, cfg["warps"]),
              (n + 3,): cfg["warps"]}
    fn = ws_sk_gemm_kernel if stream_k else ws_gemm_kernel
    return triton.compile(GluonASTSource(fn, sig, consts), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": cfg["warps"]})


# (BM, BN, BK, stages, consumer warps): cuBLAS's 128-row tiles on two computing warpgroups, and
# vsr's shipped 64 x 128 form on one.
CONFIGS = [dict(BM=bm, BN=bn, BK=bk, stages=st, warps=w) for bm, bn, bk, st, w in (
    (128, 128, 64, 4, 8), (128, 128, 64, 6, 8), (128, 128, 64, 7, 8), (128, 128, 128, 3, 8),
    (128, 64, 64, 8, 8), (128, 256, 64, 3, 8), (128, 256, 64, 4, 8),
    (64, 128, 64, 4, 4), (64, 128, 64, 6, 4), (64, 256, 64, 4, 4))]


DEV = "cuda"   # (the CPU test of the harness runs it on fakes of the kernels)
# The stream-K form's tiles (same fields).
# 256-row tiles: a weight tile's K steps are walked once for all 256 rows (with 128-row tiles at
# M=256 the two row tiles of one weight tile sit in different shares, at different K steps, and
# the weight is read twice: the first run's 128-row stream-K tiles lost everywhere).
SK_CONFIGS = [dict(BM=bm, BN=bn, BK=bk, stages=st, warps=w) for bm, bn, bk, st, w in (
    (128, 128, 64, 6, 8), (256, 128, 64, 4, 8), (256, 64, 64, 5, 8), (256, 128, 64, 3, 8))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="qkv,o,gate_up,down")
    ap.add_argument("--ms", default="256,512,1024")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    dev = torch.device(DEV)
    rows, t0 = [], time.time()
    out = Path(a.out) if a.out else None
    t = registry.TEMPLATES["dense"]

    def log(r: dict) -> None:
        print(f"{r['shape']:8} {r['M']:5} {r['variant']:32} {r.get('ms', float('nan')) * 1e3:8.1f} us "
              f"{r.get('ratio_vs_cublas', 1.0 if 'ok' not in r else 0):5.2f}x  "
              f"{'ok' if r.get('ok', True) else r.get('error', 'WRONG')[-120:]}", flush=True)

    def ws_case(c: dict, stream_k: bool) -> tuple:
        # The checked call (into a NaN-filled out) also poisons the stream-K workspace; timed ones do not.
        launch = ((lambda x, w, tile, out=None: ws_sk_gemm(x, w.weight, tile, out, poison=out is not None))
                  if stream_k else (lambda x, w, tile, out=None: ws_gemm(x, w.weight, tile, out)))
        return f"ws{'-sk' if stream_k else ''} {c['BM']}x{c['BN']}x{c['BK']} s{c['stages']} w{c['warps']}+1", c, launch

    for sh in a.shapes.split(","):
        N, K = SHAPES[sh]
        weights = weight_copies("bf16", N, K, dev)   # bf16 DenseWeights, copies past the L2
        gen = torch.Generator(device=dev).manual_seed(0)
        for M in map(int, a.ms.split(",")):
            x = torch.randn((M, K), device=dev, dtype=torch.bfloat16, generator=gen)
            base = cublas_baseline(rows, log, x, weights, shape=sh, M=M)
            ref = t.reference(x, weights[0])
            tile = shipped_tile(t, t.problem(weights[0], bucket_for(M), x.dtype), dev)
            cases = [("vsr shipped", tile, t.launch)] + [ws_case(c, False) for c in CONFIGS] + \
                [ws_case(c, True) for c in SK_CONFIGS]
            for name, cfg, launch in cases:
                rows.append(timed_case(dict(shape=sh, M=M, variant=name, tile=cfg), launch, x, cfg, weights, ref, base))
                log(rows[-1])
            if out:
                write_atomic(out, json.dumps(dict(benchmark="gluon-ws", commit=code_commit(),
                                                  device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type,
                                                  triton=triton.__version__,
                                                  torch=torch.__version__, seconds=time.time() - t0, rows=rows),
                                             indent=1))
    return 0 if all(r.get("ok", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
