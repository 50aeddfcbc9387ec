"""Pieces every format's Triton template shares: the split-K reduction, the epilogue,
the program-id swizzle, the tile search spaces and the launch bookkeeping; and the product
kernels of the dense and fp8 templates (pointer-load tiles and split-K; TMA tiles, one per
program, persistent or stream-K; the transposed TMA product for few rows; the one-row GEMV),
which differ only in their operands' dtype and the scales of the epilogue.

Determinism: split-K partial sums go to an fp32 workspace [SPLIT, M, N] and are added in the
order s = 0, 1, ..., SPLIT-1; stream-K's partial tiles go to a workspace slot per (program with
units, tile it touches: at most two) and are added in program order. The adding is done by a
second, tiny kernel (splitk_reduce_kernel, streamk_reduce_kernel), or with the tile field FIXUP
by the tile's last program to finish, in the same order (last_to_finish: the one atomic, an
arrival count on an int32 counter; no value is ever added atomically).
"""
from __future__ import annotations

import functools
import sys
import threading
from dataclasses import dataclass
from types import ModuleType

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from vsr.kernels.template import Template

# Shared memory a block may opt into on sm_90 (H100/H200): 227 KiB. Candidates whose
# pipelined operand tiles need more are pruned from the search space.
SMEM_LIMIT = 232448


@triton.jit
def wait_for_producer(WAIT: tl.constexpr):
    """WAIT (launched with programmatic dependent launch, `launch_pdl`, sm_90+): this grid may
    start while the kernel before it on the stream, fp8's activation prologue, still runs, so
    it waits here, before reading any memory, until that grid has finished and its writes are
    visible. What it gains is the launch gap and the programs' setup, run in the shadow of the
    producer. A compile-time switch: no instruction without it."""
    if WAIT:
        gdc_wait()


@triton.jit
def prefetch_weight_rows(w_ptr, stride_wn, off_n, k_lo, N, K, BLOCK_N: tl.constexpr, LINES: tl.constexpr,
                         LINE_COLS: tl.constexpr):
    """Ask the L2 for the first LINES 128-byte lines (LINE_COLS columns each) of the program's
    BLOCK_N weight rows from column k_lo (`prefetch.global.L2`: no registers filled, nothing
    waited for). Issued before wait_for_producer, it starts the weight's stream from DRAM
    while the producer still runs, so the first TMA loads after the wait hit the L2. Rows and
    columns past the edge are clamped onto it (a prefetch takes no mask)."""
    rows = tl.minimum(off_n + tl.arange(0, BLOCK_N), N - 1).to(tl.int64)
    cols = tl.minimum(k_lo + tl.arange(0, LINES) * LINE_COLS, K - 1)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l",
                              [w_ptr + rows[:, None] * stride_wn + cols[None, :]],
                              dtype=tl.int32, is_pure=False, pack=1)


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
def tile_setup(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """The output tile of a pointer-load program (grid: swizzled tiles x K splits): (pid_k, offs_m,
    offs_n, rm, rn). Rows/columns past the edge read a valid row (modulo) instead of masking:
    their results are never stored, and the loads stay unmasked and vectorised."""
    pid_m, pid_n = swizzle(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return tl.program_id(1), offs_m, offs_n, (offs_m % M).to(tl.int64), (offs_n % N).to(tl.int64)


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
def store_or_stash(acc, y_ptr, ws_ptr, cnt_ptr, pid_k, offs_m, offs_n, M, N, stride_ym,
                   bias_ptr, rs_ptr, cs_ptr, alpha_ptr,
                   SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr,
                   HAS_CS: tl.constexpr, HAS_ALPHA: tl.constexpr, FIXUP: tl.constexpr):
    """One split: apply the epilogue and write y. Several: write the fp32 partial sum to the
    workspace [SPLIT_K, M, N]; with FIXUP the tile's last split to finish adds them up here
    (last_to_finish), without it splitk_reduce_kernel does, launched after this grid."""
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT_K == 1:
        acc = epilogue(acc, offs_m, offs_n, M, N, bias_ptr, rs_ptr, cs_ptr, alpha_ptr,
                       HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA)
        ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
        tl.store(ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        idx = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        tl.store(ws_ptr + pid_k.to(tl.int64) * M * N + idx, acc, mask=mask)
        if FIXUP:
            if last_to_finish(cnt_ptr + tl.program_id(0), SPLIT_K):
                acc = epilogue(split_sum(ws_ptr, idx, mask, M, N, SPLIT_K), offs_m, offs_n, M, N, bias_ptr,
                               rs_ptr, cs_ptr, alpha_ptr, HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA)
                tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :],
                         acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def split_sum(ws_ptr, idx, mask, M, N, SPLIT_K: tl.constexpr):
    """Σ_s ws[s, idx] for s = 0, 1, ..., SPLIT_K-1 in that order (the split-K workspace [SPLIT_K, M, N]),
    read from L2 (`.cg`: see last_to_finish): the one sum both forms of the reduction take, so they
    give the same bytes."""
    acc = tl.load(ws_ptr + idx, mask=mask, other=0.0, cache_modifier=".cg")
    for s in tl.static_range(1, SPLIT_K):
        # (M may arrive as a plain int: Triton specialises arguments equal to 1.)
        acc += tl.load(ws_ptr + tl.full((), s, tl.int64) * M * N + idx, mask=mask, other=0.0, cache_modifier=".cg")
    return acc


@triton.jit
def last_to_finish(cnt_ptr, programs):
    """The in-kernel fixup's ticket: True for the last of the `programs` programs sharing an output
    tile to get here, after every one has stored its partial sum; that program then adds the
    partials up, in a fixed order, so the bytes do not depend on which one it is. The counter
    (tile_counters) counts arrivals only, never values, and the last resets it to 0 for the next
    launch. The barrier orders all of this program's threads' stores before the release of the
    acq_rel increment, whose acquire makes the others' partials visible to the last (the reads
    that follow go to L2, `.cg`). (H200 run 18: against the reduction launched after the grid.)"""
    tl.debug_barrier()
    ticket = tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu")
    last = ticket == programs - 1
    if last:
        tl.atomic_xchg(cnt_ptr, 0, sem="relaxed", scope="gpu")
        # Every thread's reads after the acquire, whatever Triton does to share the ticket.
        tl.debug_barrier()
    return last


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
    acc = epilogue(split_sum(ws_ptr, idx, mask, M, N, SPLIT_K), offs_m, offs_n, M, N, bias_ptr, rs_ptr, cs_ptr,
                   alpha_ptr, HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA)
    tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def tiled_gemm_kernel(a_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr, bias_ptr, rs_ptr, cs_ptr, M, N, K, stride_am, stride_bn, stride_ym,
                      K_SPLIT, HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr,
                      IEEE: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr, WAIT: tl.constexpr,
                      FIXUP: tl.constexpr):
    """y = epilogue(A · Bᵀ) with pointer loads, A [M, K] and B [N, K] K-contiguous in one dtype
    (bf16/fp16/fp32 for the dense template, e4m3 for fp8's): the tiled path (SPLIT_K = 1) and the
    split-K path (partial sums to the workspace) of both templates."""
    wait_for_producer(WAIT)
    pid_k, offs_m, offs_n, rm, rn = tile_setup(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    k_lo = pid_k * K_SPLIT
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + rm[:, None] * stride_am + offs_k[None, :]
        b_ptrs = b_ptr + rn[None, :] * stride_bn + offs_k[:, None]
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_hi, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_hi, other=0.0)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    store_or_stash(acc, y_ptr, ws_ptr, cnt_ptr, pid_k, offs_m, offs_n, M, N, stride_ym,
                   bias_ptr, rs_ptr, cs_ptr, bias_ptr, SPLIT_K, HAS_BIAS, HAS_RS, HAS_CS, False, FIXUP)


@triton.jit
def _tma_k_loop(a_desc, b_desc, off_m, off_n, k_lo, k_hi, IEEE: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWAP: tl.constexpr):
    """Σ over k in [k_lo, k_hi) of the TMA-fetched tiles' products, in fp32: A·Bᵀ [BM, BN], or with
    SWAP the transposed B·Aᵀ [BN, BM] (tma_swap_kernel: the weight tile on the MMA's wide side)."""
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        a = a_desc.load([off_m, k0])
        b = b_desc.load([off_n, k0])
        if SWAP:
            lhs, rhs = b, a.T
        else:
            lhs, rhs = a, b.T
        if IEEE:
            acc = tl.dot(lhs, rhs, acc, input_precision="ieee")
        else:
            acc = tl.dot(lhs, rhs, acc)
    return acc


@triton.jit
def _tma_tile(a_desc, b_desc, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, pid_m, pid_n, M, N, K, stride_ym,
              HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr, HAS_ALPHA: tl.constexpr,
              IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One output tile of tma_gemm_kernel: the K loop, the epilogue and the store."""
    acc = _tma_k_loop(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, 0, K, IEEE, BLOCK_M, BLOCK_N, BLOCK_K, False)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = epilogue(acc, offs_m, offs_n, M, N, bias_ptr, rs_ptr, cs_ptr, alpha_ptr,
                   HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _tma_tiles(a_desc, b_desc, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, first, end, M, N, K, stride_ym, NUM_PROGRAMS,
               HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr, HAS_ALPHA: tl.constexpr,
               IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               GROUP_M: tl.constexpr):
    """The persistent walk: output tiles first, first + NUM_PROGRAMS, ... below `end`, in the swizzled
    order, each whole (_tma_tile): tma_gemm_kernel's PERSISTENT form, and tma_streamk_kernel's
    whole waves."""
    for t in tl.range(first, end, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = swizzle(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        _tma_tile(a_desc, b_desc, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, pid_m, pid_n, M, N, K, stride_ym,
                  HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA, IEEE, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def tma_gemm_kernel(a_desc, b_desc, b_ptr, stride_bn, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, M, N, K, stride_ym,
                    NUM_PROGRAMS, HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr,
                    HAS_ALPHA: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, PERSISTENT: tl.constexpr, WAIT: tl.constexpr,
                    PREFETCH: tl.constexpr, LINE_COLS: tl.constexpr):
    """y = epilogue(A · Bᵀ) with both operands fetched by the tensor-memory accelerator (TMA)
    through host-built descriptors: A [M, K], B [N, K], both K-contiguous. The copy engine
    zero-fills reads past an edge, so no masks in the main loop. (H200, run 5: 0.69x -> 0.98x
    cuBLAS at M=64 on qkv, 0.80x -> 0.96x at M=4096, against the same tiles' pointer loads.)
    PERSISTENT: NUM_PROGRAMS programs (one per multiprocessor) walk the output tiles in the
    swizzled order, so one tile's epilogue overlaps the next tile's loads (Triton's
    persistent-matmul tutorial). H200, run 9 (variants.py): bf16 at M=4096 0.88x -> 1.05x
    cuBLAS on the same 128x256x64 tile; slower at M=256. Each tile is still computed whole by
    one program, in the same order: the output does not depend on NUM_PROGRAMS.
    PREFETCH (with WAIT, one tile per program): prefetch_weight_rows before the wait."""
    if PERSISTENT:
        wait_for_producer(WAIT)
        num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
        _tma_tiles(a_desc, b_desc, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, tl.program_id(0), num_tiles, M, N, K,
                   stride_ym, NUM_PROGRAMS, HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA, IEEE, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    else:
        pid_m, pid_n = swizzle(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        if PREFETCH > 0:
            prefetch_weight_rows(b_ptr, stride_bn, pid_n * BLOCK_N, 0, N, K, BLOCK_N, PREFETCH, LINE_COLS)
        wait_for_producer(WAIT)
        _tma_tile(a_desc, b_desc, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, pid_m, pid_n, M, N, K, stride_ym,
                  HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA, IEEE, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def _streamk_plan(M, N, K, NUM_PROGRAMS, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """A stream-K launch's division of the work: (tiles in whole waves, K steps per tile, units), a
    unit being one (leftover tile, K step) pair; the num_tiles % NUM_PROGRAMS leftover tiles follow
    the whole waves' in the swizzled order."""
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    sk_tiles = num_tiles % NUM_PROGRAMS
    iters = tl.cdiv(K, BLOCK_K)
    return num_tiles - sk_tiles, iters, sk_tiles * iters


@triton.jit
def _streamk_run(p, units, NUM_PROGRAMS):
    """Program p's run of units, [lo, hi): the P = NUM_PROGRAMS runs split the units evenly, in
    order; a run may be empty (fewer units than programs)."""
    return p * units // NUM_PROGRAMS, (p + 1) * units // NUM_PROGRAMS


@triton.jit
def _streamk_slot(p, u_lo):
    """Program p's workspace slot pair (its run starting at unit u_lo), numbering only the programs
    whose runs are not empty: p itself when every run holds a unit (units >= programs), else u_lo
    (each run then holds at most one unit, and the non-empty runs start at distinct units 0, 1, ...: u_lo
    <= p). So the workspace takes min(programs, units) pairs (launch_tma)."""
    return tl.minimum(p, u_lo)


@triton.jit
def _streamk_overlap(u_lo, u_hi, s, iters):
    """[lo, hi): the units of the run [u_lo, u_hi) that lie in leftover tile s (empty when lo >= hi)."""
    return tl.maximum(u_lo, s * iters), tl.minimum(u_hi, (s + 1) * iters)


@triton.jit
def _streamk_tile_programs(s, units, iters, NUM_PROGRAMS):
    """[first, last]: the programs whose runs (_streamk_run) may hold units of leftover tile s.
    The program holding unit u is the last p whose run starts at or before u; programs between
    first and last may hold none."""
    first = ((s * iters + 1) * NUM_PROGRAMS - 1) // units
    last = ((s + 1) * iters * NUM_PROGRAMS - 1) // units
    return first, last


@triton.jit
def _streamk_rows(ws_ptr, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, s, r0, M, N, stride_ym, NUM_PROGRAMS,
                  dp_tiles, iters, units, HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr,
                  HAS_ALPHA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
                  ROWS: tl.constexpr):
    """Rows r0 .. r0 + ROWS of stream-K tile s into y: epilogue(Σ partials) over the programs that
    shared the tile, in program order (the workspace read from L2, `.cg`: see last_to_finish)."""
    first, last = _streamk_tile_programs(s, units, iters, NUM_PROGRAMS)
    pid_m, pid_n = swizzle(dp_tiles + s, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = r0 + tl.arange(0, ROWS)
    offs = rows[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    live = rows[:, None] < M - pid_m * BLOCK_M   # the rows the product stashed
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for p in range(first, last + 1):
        u_lo, u_hi = _streamk_run(p, units, NUM_PROGRAMS)
        lo, hi = _streamk_overlap(u_lo, u_hi, s, iters)
        if lo < hi:   # p's run covers part of tile s
            j = s - u_lo // iters
            acc += tl.load(ws_ptr + (_streamk_slot(p, u_lo) * 2 + j).to(tl.int64) * (BLOCK_M * BLOCK_N) + offs,
                           mask=live, other=0.0, cache_modifier=".cg")
    offs_m = pid_m * BLOCK_M + rows
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    store_or_stash(acc, y_ptr, ws_ptr, ws_ptr, s, offs_m, offs_n, M, N, stride_ym, bias_ptr, rs_ptr, cs_ptr,
                   alpha_ptr, 1, HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA, False)


@triton.jit
def _streamk_sharers(s, units, iters, NUM_PROGRAMS):
    """How many programs hold units of leftover tile s: one per unit when there are fewer units
    than programs (each run holds at most one); else every run is non-empty and contiguous, so
    each program from the tile's first to its last holds some."""
    first, last = _streamk_tile_programs(s, units, iters, NUM_PROGRAMS)
    return tl.where(units < NUM_PROGRAMS, iters, last - first + 1)


@triton.jit
def tma_streamk_kernel(a_desc, b_desc, y_ptr, ws_ptr, cnt_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, M, N, K,
                       stride_ym, NUM_PROGRAMS, HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr,
                       HAS_ALPHA: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, WAIT: tl.constexpr, RELEASE: tl.constexpr,
                       FIXUP: tl.constexpr, ROWS: tl.constexpr):
    """The TMA tile, stream-K ("tma-sk"): NUM_PROGRAMS programs (one per multiprocessor) first
    walk whole tiles as the persistent kernel does, as many as fill whole waves; the
    num_tiles % NUM_PROGRAMS leftover tiles, which would leave most multiprocessors idle for a last partial
    wave, are cut into their K steps and the steps shared out evenly, each program taking a
    contiguous run. Fewer leftover tiles than programs means a run touches at most two tiles;
    its fp32 partial sums (the tile's rows below M) go to the workspace, slot (_streamk_slot, 0 or 1),
    and each tile's partials are added in program order: with FIXUP here, by the last of the tile's
    programs to finish (last_to_finish), ROWS rows at a time; without, by streamk_reduce_kernel,
    launched after this grid. So the output depends on (M, N, K, tile, NUM_PROGRAMS) only: the same
    device and tile give the same bytes, FIXUP or not.
    (At M=1024 on o and down, 128x256 tiles, the default there, make 160 tiles: one whole wave of
    132 and 28 left over, which a plain grid would run as a second wave on 28 multiprocessors.
    With few rows it lost: H200 run 17, variants.py --study swap-sk at commit 0fa8b14, the
    transposed product of tma_swap_kernel walked stream-K so that all 132 multiprocessors stream
    the 80 weight tiles of qkv, o and down: 3-30% slower than the shipped tiles at M = 1, 16 and
    64; at M = 32 it beat run 16's 32-row tiles on 4 of 8 points, which were the tiles at fault.)
    RELEASE: the reduction, launched as this grid's programmatic dependent, may start now (it
    waits for this grid's end before reading the workspace)."""
    wait_for_producer(WAIT)
    if RELEASE:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    dp_tiles, iters, units = _streamk_plan(M, N, K, NUM_PROGRAMS, BLOCK_M, BLOCK_N, BLOCK_K)
    _tma_tiles(a_desc, b_desc, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, pid, dp_tiles, M, N, K, stride_ym,
               NUM_PROGRAMS, HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA, IEEE, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    u_lo, u_hi = _streamk_run(pid, units, NUM_PROGRAMS)
    slot = _streamk_slot(pid, u_lo)
    rows = tl.arange(0, BLOCK_M)[:, None]
    offs = rows * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    for j in range(2):
        s = u_lo // iters + j
        lo, hi = _streamk_overlap(u_lo, u_hi, s, iters)
        if lo < hi:
            pid_m, pid_n = swizzle(dp_tiles + s, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            acc = _tma_k_loop(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, (lo - s * iters) * BLOCK_K,
                              (hi - s * iters) * BLOCK_K, IEEE, BLOCK_M, BLOCK_N, BLOCK_K, False)
            tl.store(ws_ptr + (slot * 2 + j).to(tl.int64) * (BLOCK_M * BLOCK_N) + offs, acc,
                     mask=rows < M - pid_m * BLOCK_M)
            if FIXUP:
                if last_to_finish(cnt_ptr + s, _streamk_sharers(s, units, iters, NUM_PROGRAMS)):
                    for r0 in range(0, tl.minimum(BLOCK_M, M - pid_m * BLOCK_M), ROWS):
                        _streamk_rows(ws_ptr, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, s, r0, M, N, stride_ym,
                                      NUM_PROGRAMS, dp_tiles, iters, units, HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA,
                                      BLOCK_M, BLOCK_N, GROUP_M, ROWS)


@triton.jit
def streamk_reduce_kernel(ws_ptr, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, M, N, K, stride_ym, NUM_PROGRAMS,
                          HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr,
                          HAS_ALPHA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, ROWS: tl.constexpr, WAIT: tl.constexpr):
    """y for the stream-K tiles of tma_streamk_kernel without FIXUP (grid: leftover tiles x
    cdiv(rows below M, ROWS)): _streamk_rows. WAIT: launched as the product's programmatic
    dependent (wait_for_producer)."""
    wait_for_producer(WAIT)
    dp_tiles, iters, units = _streamk_plan(M, N, K, NUM_PROGRAMS, BLOCK_M, BLOCK_N, BLOCK_K)
    _streamk_rows(ws_ptr, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, tl.program_id(0), tl.program_id(1) * ROWS,
                  M, N, stride_ym, NUM_PROGRAMS, dp_tiles, iters, units, HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA,
                  BLOCK_M, BLOCK_N, GROUP_M, ROWS)


@triton.jit
def tma_swap_kernel(a_desc, b_desc, b_ptr, stride_bn, y_ptr, ws_ptr, cnt_ptr, bias_ptr, rs_ptr, cs_ptr, M, N, K, stride_ym,
                    K_SPLIT, HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr,
                    IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr, WAIT: tl.constexpr, PREFETCH: tl.constexpr,
                    LINE_COLS: tl.constexpr, FIXUP: tl.constexpr):
    """Few rows ("tma-swap"): the product taken transposed, acc[BN, BM] = B_tile · A_tileᵀ, both
    fetched by TMA. The weight tile fills the MMA's 64-row side and the few rows of x its narrow
    side (16 columns, or 32 at bucket 32), instead of padding x's rows up to 64; the copy engine
    streams the weight through a deep pipeline with no address arithmetic (the memory-bound
    regime of M <= 32: the tuner's pick on every 27B-class key at buckets 1-32 in run 17; at
    M=64 the plain TMA tile was faster, run 10).
    Split-K as the pointer path: each split writes its fp32 partial sum, reduced in a fixed
    order; K_SPLIT is a whole number of BLOCK_K, so no tile reads into the next split.
    PREFETCH (with WAIT): prefetch_weight_rows before the wait."""
    pid_m, pid_n = swizzle(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    k_lo = pid_k * K_SPLIT
    if PREFETCH > 0:
        prefetch_weight_rows(b_ptr, stride_bn, pid_n * BLOCK_N, k_lo, N, K, BLOCK_N, PREFETCH, LINE_COLS)
    wait_for_producer(WAIT)
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    acc = _tma_k_loop(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, k_lo, k_hi, IEEE, BLOCK_M, BLOCK_N, BLOCK_K,
                      True)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    store_or_stash(tl.trans(acc), y_ptr, ws_ptr, cnt_ptr, pid_k, offs_m, offs_n, M, N, stride_ym,
                   bias_ptr, rs_ptr, cs_ptr, bias_ptr, SPLIT_K, HAS_BIAS, HAS_RS, HAS_CS, False, FIXUP)


@triton.jit
def gemv_kernel(x_ptr, w_ptr, y_ptr, rs_ptr, cs_ptr, bias_ptr, N, K, stride_wn,
                HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr, EVEN_K: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WAIT: tl.constexpr):
    """One row on the CUDA cores: y[n] = epilogue(Σ_k x[k]·w[n, k]), operands widened to fp32 (exact
    products, fp32 sums), W [N, K] K-contiguous in any dtype (bf16/fp16/fp32 for the dense template,
    e4m3 for fp8's, with its row and column scales). (H200, run 5, fp8: 1.19-1.62x cuBLAS at M=1
    against 1.02-1.47x for the split-K tensor-core tile, which also needs a second, reducing launch.)"""
    wait_for_producer(WAIT)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rn = (offs_n % N).to(tl.int64)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:
            wv = tl.load(w_ptr + rn[:, None] * stride_wn + offs_k[None, :])
            xv = tl.load(x_ptr + offs_k)
        else:
            wv = tl.load(w_ptr + rn[:, None] * stride_wn + offs_k[None, :], mask=offs_k[None, :] < K, other=0.0)
            xv = tl.load(x_ptr + offs_k, mask=offs_k < K, other=0.0)
        acc += wv.to(tl.float32) * xv.to(tl.float32)[None, :]
    yv = tl.sum(acc, axis=1)[None, :]
    zero = tl.zeros((1,), dtype=tl.int32)
    yv = epilogue(yv, zero, offs_n, 1, N, bias_ptr, rs_ptr, cs_ptr, bias_ptr, HAS_BIAS, HAS_RS, HAS_CS, False)
    tl.store(y_ptr + offs_n[None, :], yv.to(y_ptr.dtype.element_ty), mask=offs_n[None, :] < N)


def launch_gemv(x, w, y, tile: dict, bias=None, rs=None, cs=None, wait: bool = False) -> None:
    """y[1, N] = epilogue(x[1, K] · wᵀ) through gemv_kernel; x contiguous. `wait`: see launch_tma."""
    assert x.shape[0] == 1, f"the gemv path takes one row, got M={x.shape[0]}"
    N, K = w.shape
    bn, bk = tile["BLOCK_N"], tile["BLOCK_K"]
    d = y
    gemv_kernel[(cdiv(N, bn),)](x, w, y, d if rs is None else rs, d if cs is None else cs,
                                d if bias is None else bias, N, K, w.stride(0),
                                HAS_BIAS=bias is not None, HAS_RS=rs is not None, HAS_CS=cs is not None,
                                EVEN_K=K % bk == 0, BLOCK_N=bn, BLOCK_K=bk, WAIT=wait, launch_pdl=wait,
                                num_warps=tile["num_warps"], num_stages=tile["num_stages"])


def gemv_tiles(K: int, elem_bytes: float) -> list[dict]:
    """GEMV candidates around fp8's run-5 winner (8 rows x 512 bytes of each per step, 4 warps,
    3 stages), the same bytes per step for wider weights; the first is the default."""
    kmax = max(32, next_pow2(K))
    out = []
    for bn, nbytes, warps, stages in ((8, 512, 4, 3), (8, 512, 4, 1), (4, 1024, 4, 3), (8, 1024, 4, 3),
                                      (16, 512, 4, 3), (16, 256, 4, 3), (8, 512, 8, 3)):
        t = tile("gemv", 1, bn, min(max(32, int(nbytes / elem_bytes)), kmax), 1, warps, stages)
        if t not in out:
            out.append(t)
    return out


# Host-side integer helpers. triton.cdiv and triton.next_power_of_2 are constexpr functions
# from Triton 3.5 on, a few microseconds of wrapper per host call (seen in the H200 profile
# of the launch path, run 7): the launchers use these instead.
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def tma_aligned(K: int, *elem_bytes: float) -> bool:
    """A TMA descriptor needs 16-byte row strides: K·(element size) % 16 == 0 for every operand."""
    return all((K * b) % 16 == 0 for b in elem_bytes)


def weight_descriptor(owner, t: torch.Tensor, block: list[int]):
    """The TMA descriptor of a weight operand, built once per (weight object, block) and kept on
    the object (the weight outlives its calls; a descriptor costs host time on every build)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    cache = owner.__dict__.setdefault("_tma_descriptors", {})
    key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), tuple(block))
    d = cache.get(key)
    if d is None:
        assert t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0, \
            "the weight operand of a TMA tile must be K-contiguous and 16-byte aligned"
        d = cache[key] = TensorDescriptor.from_tensor(t, list(block))
    return d


def launch_tma(a, b, y, tile: dict, bias=None, rs=None, cs=None, alpha=None, owner=None, wait: bool = False,
               prefetch: int = 0) -> None:
    """y = epilogue(a · bᵀ) through tma_gemm_kernel (path "tma", one tile per program or
    persistent), tma_swap_kernel ("tma-swap") or tma_streamk_kernel ("tma-sk"). a [M, K] and b [N, K] must be K-contiguous with
    16-byte aligned bases and row strides; a misaligned view of `a` is copied once (a fresh tensor
    is aligned), so the tile's path never depends on where the caller's tensor happens to start.
    `owner` (the weight object b belongs to) keeps b's descriptor between calls. `wait` (only
    where pdl_supported): the product is launched as a programmatic dependent of the kernel
    before it, which made `a` (wait_for_producer). The split-K reduction launches as usual; the
    stream-K one too (as the product's programmatic dependent, where the device has it, only if
    STREAMK_REDUCE_PDL: off since run 18);
    a tile with FIXUP launches neither, its product adding the partials itself (last_to_finish).
    `prefetch` (with `wait`; "tma-swap" and one-tile-per-program "tma"): 128-byte lines of each
    of a program's weight rows asked of the L2 before the wait (prefetch_weight_rows)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    M, K = a.shape
    N = b.shape[0]
    if not tma_aligned(K, a.element_size(), b.element_size()):
        raise ValueError(f"tile {tile} uses TMA, which needs K·bytes % 16 == 0; K={K} does not allow it")
    if M == 0:   # nothing to compute, and a TMA descriptor of an empty x would be refused
        return
    line = dict(PREFETCH=prefetch if wait else 0, LINE_COLS=max(1, 128 // b.element_size()))
    if a.stride(1) != 1 or (a.stride(0) * a.element_size()) % 16 or a.data_ptr() % 16:
        a = a.clone(memory_format=torch.contiguous_format)
    bm, bn, bk = tile["BLOCK_M"], tile["BLOCK_N"], tile["BLOCK_K"]
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
    b_desc = weight_descriptor(owner if owner is not None else _Transient(), b, [bn, bk])
    d = y
    if tile.get("path") == "tma-swap":
        k_split, split = split_plan(K, tile)
        ws = workspace(split, y)
        programs = cdiv(M, bm) * cdiv(N, bn)
        fixup = split_fixup(tile, split)
        tma_swap_kernel[(programs, split)](
            a_desc, b_desc, b, b.stride(0), y, ws, fixup_counters(fixup, y.device, programs, ws),
            d if bias is None else bias, d if rs is None else rs, d if cs is None else cs,
            M, N, K, y.stride(0), k_split, HAS_BIAS=bias is not None, HAS_RS=rs is not None, HAS_CS=cs is not None,
            IEEE=a.dtype == torch.float32, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split,
            GROUP_M=tile.get("GROUP_M", 8), WAIT=wait, **line, FIXUP=fixup, launch_pdl=wait,
            num_warps=tile["num_warps"], num_stages=tile["num_stages"])
        if split > 1 and not fixup:
            reduce_splits(ws, y, split, M, N, bias, rs, cs, None)
        return
    tiles = cdiv(M, bm) * cdiv(N, bn)
    flags = dict(HAS_BIAS=bias is not None, HAS_RS=rs is not None, HAS_CS=cs is not None,
                 HAS_ALPHA=alpha is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=tile.get("GROUP_M", 8))
    scales = (d if bias is None else bias, d if rs is None else rs, d if cs is None else cs,
              d if alpha is None else alpha)
    if tile.get("path") == "tma-sk":
        # One program per multiprocessor (H200 run 14, the streamk-occupancy study of commit 533c776:
        # two or three, for 64-row tiles of one warpgroup, did not help).
        programs = multiprocessors(a.device)
        sk_tiles = tiles % programs
        # Two slots (the tiles a run touches) for each program whose run holds units (_streamk_slot);
        # one fp32 element, unused, when every tile lies in a whole wave (fp32 as the workspace is, so
        # that case compiles no second form of the kernel).
        units = sk_tiles * cdiv(K, bk)
        ws = torch.empty(max(1, min(programs, units) * 2 * bm * bn), dtype=torch.float32, device=y.device)
        fixup = bool(units) and bool(tile.get("FIXUP", 0))
        release = bool(units) and not fixup and STREAMK_REDUCE_PDL and device_features(a.device).pdl
        rows = min(bm, STREAMK_REDUCE_ROWS)
        tma_streamk_kernel[(programs,)](a_desc, b_desc, y, ws, fixup_counters(fixup, y.device, sk_tiles, ws),
                                        *scales, M, N, K, y.stride(0), programs, IEEE=a.dtype == torch.float32,
                                        **flags, WAIT=wait, RELEASE=release, FIXUP=fixup, ROWS=rows,
                                        launch_pdl=wait, num_warps=tile["num_warps"], num_stages=tile["num_stages"])
        if units and not fixup:
            streamk_reduce_kernel[(sk_tiles, cdiv(min(M, bm), rows))](
                ws, y, *scales, M, N, K, y.stride(0), programs, **flags, ROWS=rows, WAIT=release,
                launch_pdl=release, num_warps=4)
        return
    persistent = bool(tile.get("PERSISTENT", 0))
    programs = min(tiles, multiprocessors(a.device)) if persistent else tiles
    tma_gemm_kernel[(programs,)](a_desc, b_desc, b, b.stride(0), y, *scales, M, N, K, y.stride(0),
                                 programs if persistent else 0, IEEE=a.dtype == torch.float32, **flags,
                                 PERSISTENT=persistent, WAIT=wait, **line, launch_pdl=wait, num_warps=tile["num_warps"], num_stages=tile["num_stages"])


@functools.cache
def multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of `device` (a persistent grid's size); 4 on the CPU (interpreter)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


# The paths launch_tma runs: one output tile per program (or persistent), the transposed product
# for few rows, and stream-K.
TMA_PATHS = ("tma", "tma-swap", "tma-sk")

# Rows of a stream-K tile that one program of streamk_reduce_kernel adds up (x BLOCK_N fp32).
STREAMK_REDUCE_ROWS = 16
# The stream-K reduction launched as the product's programmatic dependent where the device has
# it (sm_90+): its launch and setup overlap the product's end. (H200 run 17, the swap-sk study,
# on its retired few-row stream-K tiles at M = 1-64: the same tile with the reduction launched
# as usual took -0.5 to +1.1 us more, +0.6 us at the median of 32 points. On the shipped "tma-sk"
# tiles of M = 512-2048 (variants.py --study sk-reduce-pdl, run 17 item 8) no consistent effect:
# median +0.06%, single points -7% to +10% either way within one run, as large-M noise goes.
# Run 18, three samples of the same study: slower as a dependent on 14 of the 15 shipped keys,
# median +2.4%. So off.)
STREAMK_REDUCE_PDL = False


class _Transient:
    """An owner for a one-call weight (int4's transient dense copy): its descriptor dies with it."""


def launch_tiled(a, b, y, tile: dict, bias=None, rs=None, cs=None, wait: bool = False) -> None:
    """y = epilogue(a · bᵀ) through tiled_gemm_kernel (SPLIT_K = 1) or its split-K form and the
    fixed-order reduction (a second kernel, or with FIXUP the product's own, last_to_finish).
    a [M, K] and b [N, K] K-contiguous, one dtype. `wait`: see launch_tma."""
    M, K = a.shape
    N = b.shape[0]
    k_split, split = split_plan(K, tile)
    ws = workspace(split, y)
    d = y
    bm, bn, bk = tile["BLOCK_M"], tile["BLOCK_N"], tile["BLOCK_K"]
    grid = (cdiv(M, bm) * cdiv(N, bn), split)
    fixup = split_fixup(tile, split)
    tiled_gemm_kernel[grid](a, b, y, ws, fixup_counters(fixup, y.device, grid[0], ws), d if bias is None else bias, d if rs is None else rs,
                            d if cs is None else cs, M, N, K, a.stride(0), b.stride(0), y.stride(0), k_split,
                            HAS_BIAS=bias is not None, HAS_RS=rs is not None, HAS_CS=cs is not None,
                            IEEE=a.dtype == torch.float32, EVEN_K=K % bk == 0,
                            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, GROUP_M=tile.get("GROUP_M", 8),
                            WAIT=wait, FIXUP=fixup, launch_pdl=wait, num_warps=tile["num_warps"],
                            num_stages=tile["num_stages"])
    if split > 1 and not fixup:
        reduce_splits(ws, y, split, M, N, bias, rs, cs, None)


# The activation dtypes every template's launcher takes (fp32 multiplies in IEEE precision, never tf32).
ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_activation(x: torch.Tensor, K: int, device: torch.device, kernel: str) -> torch.Tensor:
    """The launchers' checks on x (2-D, K columns, one of ACT_DTYPES, the weight's device),
    returned with unit column stride."""
    assert x.dim() == 2 and x.shape[1] == K, f"x must be [M, K={K}], got {tuple(x.shape)}"
    assert x.dtype in ACT_DTYPES, \
        f"{kernel} kernel takes {'/'.join(str(d)[6:] for d in ACT_DTYPES)} activations, got {x.dtype}"
    assert x.device == device, f"x on {x.device}, weight on {device}"
    return x if x.stride(1) == 1 else x.contiguous()


class MatrixWeight:
    """The N / K of a weight stored whole as `weight` [N, K] (the dense and fp8 formats, whose
    products run on this module's kernels): a mixin for their dataclasses, adding no fields.
    (int4's and nvfp4's weights derive their shapes otherwise: K a field, or packed halves.)"""

    @property
    def N(self) -> int:
        return self.weight.shape[0]

    @property
    def K(self) -> int:
        return self.weight.shape[1]


def output(x: torch.Tensor, N: int, out: torch.Tensor | None) -> torch.Tensor:
    """y [M, N] in x's dtype: `out` when given (checked), else a new tensor."""
    y = out if out is not None else torch.empty((x.shape[0], N), dtype=x.dtype, device=x.device)
    assert y.shape == (x.shape[0], N) and y.dtype == x.dtype and y.stride(1) == 1, "out must be [M, N] in x's dtype"
    return y


def workspace(split: int, y: torch.Tensor) -> torch.Tensor:
    """The fp32 partial sums [split, M, N] of a split-K launch (y itself, unused, for one split)."""
    return torch.empty((split,) + tuple(y.shape), dtype=torch.float32, device=y.device) if split > 1 else y


@dataclass(frozen=True)
class DeviceFeatures:
    """What the launchers ask of a device, read once per device (device_features). On a CPU
    device (the interpreter) everything is False and capability None; the interpreter on a CUDA
    device (TRITON_INTERPRET=1 on a GPU machine) is not supported: it has neither griddepcontrol
    nor inline PTX."""

    nvidia: bool                          # a CUDA device of NVIDIA's (not ROCm): inline PTX applies
    capability: tuple[int, int] | None    # compute capability of a CUDA device
    pdl: bool            # programmatic dependent launch (griddepcontrol: a grid starting before the
                         # one it depends on has ended): NVIDIA sm_90+
    hardware_e4m3: bool  # fp32 -> e4m3 converted in hardware, to nearest even as torch's cast: NVIDIA sm_89+


def device_features(device: torch.device) -> DeviceFeatures:
    """The DeviceFeatures of `device`, built once per device (an index-less "cuda" is the current
    device, as torch reads it, resolved before the memo)."""
    if device.type == "cuda" and device.index is None:
        device = torch.device(device.type, torch.cuda.current_device())
    return _device_features(device)


@functools.cache
def _device_features(device: torch.device) -> DeviceFeatures:
    cap = tuple(torch.cuda.get_device_capability(device)) if device.type == "cuda" else None
    nv = device.type == "cuda" and torch.version.hip is None
    return DeviceFeatures(nvidia=nv, capability=cap, pdl=nv and cap >= (9, 0), hardware_e4m3=nv and cap >= (8, 9))


def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch (DeviceFeatures.pdl): NVIDIA sm_90 and newer."""
    return device_features(device).pdl


def split_plan(K: int, tile: dict) -> tuple[int, int]:
    """(K columns per split, number of splits actually launched). Each split's range is a
    whole number of BLOCK_K tiles, so tiles never straddle a quantization group."""
    bk = tile["BLOCK_K"]
    split = max(1, int(tile.get("SPLIT_K", 1)))
    k_split = cdiv(cdiv(K, split), bk) * bk
    return k_split, cdiv(K, k_split)


def split_fixup(tile: dict, split: int) -> bool:
    """Whether a launch of `split` (> 1) K splits adds its partial sums in the product kernel, by
    each output tile's last split to finish (tile field FIXUP, last_to_finish), rather than in
    splitk_reduce_kernel launched after it."""
    return split > 1 and bool(tile.get("FIXUP", 0))


# tile_counters' buffers, by (device, stream), and the smaller ones they replaced (kept: a CUDA
# graph captured while one was current still uses it).
_COUNTERS: dict = {}
_RETIRED: list = []
# Counters for launches captured in CUDA graphs, by device: [a buffer zeroed outside any capture,
# the index of its first counter not yet handed out, how many buffers the device has had]. Each
# slice goes to one captured launch, so graphs never share counters with each other nor with eager
# launches, and a graph holds no zeroing node (H200 run 19, variants.py --study capture-counters:
# a zeroing node per captured launch cost 0.9-2.0 us). A slice is never handed out again
# (rewind_capture_counters aside), so the buffers only grow: CAPTURE_POOL_COUNTERS int32s each,
# at most CAPTURE_POOLS_MAX of them per device (64 MiB), after which a captured launch zeroes
# its own counters in the graph.
_CAPTURE_POOLS: dict = {}
CAPTURE_POOL_COUNTERS = 1 << 20
CAPTURE_POOLS_MAX = 16
# One lock for all of the above: launches may come from several threads (the tuner warms its
# candidates up in a thread pool), and a buffer made twice at once would lose one to the other.
_COUNTERS_LOCK = threading.Lock()


def tile_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """int32 arrival counters for `tiles` output tiles of an in-kernel fixup (last_to_finish).
    Eager: one buffer per (device, current stream), zeroed when made and left at zero by every
    launch, whose last arrival on each tile resets its counter; one stream's launches never
    overlap (a programmatic dependent waits for the grid before it, wait_for_producer, before
    touching memory), and another stream has its own. A buffer outgrown is kept, never freed, so
    a graph captured with it stays valid. While a CUDA graph is being captured: counters for this
    launch alone (_captured_counters), so that no two graphs, nor a graph and eager launches,
    share counters, however they are replayed."""
    device = _indexed(device)
    with _COUNTERS_LOCK:
        if device.type == "cuda":
            if torch.cuda.is_current_stream_capturing():
                return _captured_counters(device, tiles)
            _refill_capture_pool(device)
            key = (device, torch.cuda.current_stream(device).cuda_stream)
        else:
            key = (device, 0)
        c = _COUNTERS.get(key)
        if c is None or c.numel() < tiles:
            if c is not None:
                _RETIRED.append(c)
            c = _COUNTERS[key] = torch.zeros(max(1024, next_pow2(tiles)), dtype=torch.int32, device=device)
        return c


def _indexed(device: torch.device) -> torch.device:
    """A CUDA device with its index (the current one's where it has none): the counters' dict key."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _captured_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """A captured launch's counters (under _COUNTERS_LOCK): the next `tiles` of the device's capture
    pool, zeroed before the capture; where the pool lacks them (none made yet: no eager fixup
    launch on the device before; or used up), a buffer zeroed in the graph."""
    pool = _CAPTURE_POOLS.get(device)
    if pool is not None and pool[1] + tiles <= pool[0].numel():
        start = pool[1]
        pool[1] = start + tiles
        return pool[0][start:start + tiles]
    return torch.zeros(tiles, dtype=torch.int32, device=device)


def _refill_capture_pool(device: torch.device) -> None:
    """Outside a capture (a capture cannot zero memory except as a node of its graph), under
    _COUNTERS_LOCK: a new zeroed pool for the device when it has none or less than half of one
    left, up to CAPTURE_POOLS_MAX; the old one kept, since graphs captured with it use it still."""
    pool = _CAPTURE_POOLS.get(device)
    if pool is not None and (pool[0].numel() - pool[1] >= CAPTURE_POOL_COUNTERS // 2 or pool[2] >= CAPTURE_POOLS_MAX):
        return
    buf = torch.zeros(CAPTURE_POOL_COUNTERS, dtype=torch.int32, device=device)
    # Zero before any graph that takes a slice can run, whichever stream replays it.
    torch.cuda.current_stream(device).synchronize()
    if pool is not None:
        _RETIRED.append(pool[0])
    _CAPTURE_POOLS[device] = [buf, 0, 1 if pool is None else pool[2] + 1]


def capture_counters_mark() -> dict:
    """Where every device's capture pool stands (rewind_capture_counters)."""
    with _COUNTERS_LOCK:
        return {d: (pool[0].data_ptr(), pool[1]) for d, pool in _CAPTURE_POOLS.items()}


def rewind_capture_counters(mark: dict) -> None:
    """Hand the counters given to captured launches since `mark` (capture_counters_mark) out again,
    on every device whose pool is the one marked. Only for a caller that has destroyed every graph
    captured since the mark, after their last replay finished (each replay left its counters at
    zero), or whose capture failed (nothing captured runs): the autotune's graph timer, which
    captures, times and destroys one graph at a time, so a long sweep does not use up the pools."""
    with _COUNTERS_LOCK:
        for d, (ptr, index) in mark.items():
            pool = _CAPTURE_POOLS.get(d)
            if pool is not None and pool[0].data_ptr() == ptr and pool[1] >= index:
                pool[1] = index


def fixup_counters(fixup: bool, device: torch.device, tiles: int, unused: torch.Tensor) -> torch.Tensor:
    """The counters argument of a product kernel: tile_counters with FIXUP, else `unused` (any
    tensor: the kernel never reads it)."""
    return tile_counters(device, tiles) if fixup else unused


def reduce_splits(ws, y, split, M, N, bias, rs, cs, alpha):
    """Launch the fixed-order reduction over `split` partial sums into y."""
    dummy = ws
    grid = (cdiv(M, 16), cdiv(N, 128))
    splitk_reduce_kernel[grid](
        ws, y, bias if bias is not None else dummy, rs if rs is not None else dummy,
        cs if cs is not None else dummy, alpha if alpha is not None else dummy,
        M, N, y.stride(0), SPLIT_K=split, HAS_BIAS=bias is not None, HAS_RS=rs is not None,
        HAS_CS=cs is not None, HAS_ALPHA=alpha is not None, BLOCK_M=16, BLOCK_N=128, num_warps=4)


def _split_for(bucket: int, N: int, K: int, bm: int, bn: int, bk: int, max_split: int, sms: int = 132,
               waves: int = 2) -> int:
    """Split K until the grid holds `waves` programs per multiprocessor (deterministic in the shape).
    Small-M calls are memory-bound: more programs keep more loads in flight."""
    programs = cdiv(N, bn) * cdiv(bucket, bm)
    split = 1
    while programs * split < waves * sms and split < max_split and K // (split * 2) >= 2 * bk:
        split *= 2
    return split


def tile(path, bm, bn, bk, split, warps, stages, group_m=8) -> dict:
    return {"path": path, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split,
            "GROUP_M": group_m, "num_warps": warps, "num_stages": stages}


def swap_tile(bk: int, bn: int, stages: int, split: int = 1, bm: int = 16) -> dict:
    """A "tma-swap" tile: bm rows of x (16 up to bucket 16, 32 at bucket 32) against bn weight rows,
    bk columns per step."""
    return tile("tma-swap", bm, bn, bk, split, 4, stages)


def swap_space(K: int, b_bytes: float, bm: int = 16) -> list[dict]:
    """tma-swap candidates for buckets <= 32 (bm rows of x): one split with deep pipelines first
    (run 10's winners), then 2-way splits (the longest layers). gemm_space drops those too deep for
    shared memory (32 rows of x take more of it)."""
    out = []
    for kbytes, bn, stages in ((256, 128, 6), (256, 64, 8), (256, 128, 4), (512, 128, 3), (256, 64, 6),
                               (512, 64, 4), (128, 128, 8), (512, 64, 6)):
        out.append(swap_tile(int(kbytes / b_bytes), bn, stages, bm=bm))
    for kbytes, bn, stages in ((256, 128, 6), (256, 64, 8)):
        bk = int(kbytes / b_bytes)
        if K // 2 >= 4 * bk:
            out.append(swap_tile(bk, bn, stages, split=2, bm=bm))
    return out


# Row buckets from which TMA tiles are also tried in their persistent form (run 9: a loss at
# M=256, mixed at 1024, a gain at 4096).
PERSISTENT_FROM = 1024
# Row buckets from which TMA tiles are also tried stream-K (run 14: at M=256 it won only on
# gate_up, 0.72x -> 0.81x; from M=512 on most shapes).
STREAMK_FROM = 256


def default_gemm_tile(bucket: int, N: int, K: int, a_bytes: float, b_bytes: float, tma: bool = True) -> dict:
    """The deterministic tile of a row bucket: for buckets <= 16 the transposed TMA product
    (16- and 8-bit operands; split-K over 16-row tiles where TMA is not allowed or for fp32),
    TMA tiles from bucket 32 where the row strides allow (pointer-load tiles where not),
    stream-K for buckets 512-2048, persistent from bucket 4096. Depends only on (bucket, N, K,
    operand sizes). Tiles for buckets 64-256 are the H200 run-5 winners, bucket 32's TMA tile bucket 64's
    (run 17), those of 512-2048 run 14's (benchmarks/NOTES.md); fp8 operands take twice the K step."""
    wide = a_bytes <= 2 and b_bytes <= 2
    swap = tma and tma_aligned(K, a_bytes, b_bytes) and a_bytes <= 2
    if bucket <= 16 and swap:
        # H200, run 10 (variants.py small-m): the transposed TMA product, one split, 6 stages of
        # 256 bytes of K, took fp8 at M=16 from 1.07-1.52x cuBLAS to 1.31-1.63x and bf16 from
        # 0.80-0.96x to 1.00-1.04x on the four 27B shapes; splitting K only lost (the reduction's
        # launch, and each split's pipeline filling anew).
        return swap_tile(int(256 / b_bytes), 128, 6)
    if bucket == 32 and swap:
        # H200, run 17: after bucket 32's space took the transposed product on 32 rows, the tuner
        # picked it on every 27B-class fp8 and dense key, 64 weight rows and 8 stages on most.
        return swap_tile(int(256 / b_bytes), 64, 8, bm=32)
    if bucket <= 16:
        bk = 128 if wide else 64
        return tile("splitk", 16, 64, bk, _split_for(bucket, N, K, 16, 64, bk, 16, waves=8), 4, 4)
    kx = 2 if a_bytes <= 1 else 1 if a_bytes <= 2 else 0.5   # fp32 operands: half the K step
    if not (tma and tma_aligned(K, a_bytes, b_bytes)):
        bm = 32 if bucket == 32 else 64 if bucket <= 256 else 128
        return tile("tiled", bm, 128, int(64 * kx), 1, 4 if bm <= 64 else 8, 3)
    if bucket <= 128:
        # Few row blocks: narrow the columns until the grid has about half a wave of programs. 64
        # rows at bucket 32 too: the H200 cache of run 16, whose bucket-32 space held only 32-row
        # tiles, took longer at bucket 32 than at bucket 64 on 11 keys with bf16 x (fp8 down 43.0 us against
        # 29.7 for twice the rows, on 64x64 TMA tiles): a 32-row tile wastes its multiprocessor
        # on this memory-bound product, and the TMA copy zero-fills the rows past M for free.
        bm = 64
        bn = 128 if cdiv(N, 128) >= 66 else 64
        return tile("tma", bm, bn, int(128 * kx), 1, 4, 4 if bn == 128 else 6)
    if bucket <= 256:
        return tile("tma", 64, 128, int(64 * kx), 1, 4, 4)
    if bucket <= 2048:
        # Stream-K over 128-row tiles (H200, run 14, variants.py --study streamk): bf16 geomean
        # over the four 27B shapes at M=512 0.67x -> 0.80x cuBLAS (128x128x64, 4 stages, as here;
        # 128x128x128 at 3 stages the same), M=1024 0.84x -> 0.90x and M=2048 0.89x -> 0.92x
        # (128x256x64, 4 stages) against the plain 64x128 / 128x128 tiles.
        return tile("tma-sk", 128, 128 if bucket <= 512 else 256, int(64 * kx), 1, 8, 4)
    # The largest buckets walk their tiles persistently (H200, run 9: bf16 M=4096 0.88x -> 1.05x).
    return dict(tile("tma", 128, 256, int(64 * kx), 1, 8, 4 if kx <= 1 else 3), PERSISTENT=1)


def smem_bytes(t: dict, a_bytes: float, b_bytes: float) -> int:
    return int(t["num_stages"] * (t["BLOCK_M"] * t["BLOCK_K"] * a_bytes + t["BLOCK_K"] * t["BLOCK_N"] * b_bytes))


def gemm_space(bucket: int, N: int, K: int, a_bytes: float, b_bytes: float, default: dict,
               bk_choices=None, tma: bool = True) -> list[dict]:
    """Candidate tiles for a row bucket, `default` first, pruned by shared memory. Buckets >= 32
    take tiled candidates in both forms, TMA descriptors (where the row strides allow, and `tma`)
    and pointer loads."""
    bks = bk_choices or (64, 128, 256)
    cands = [default]
    if bucket <= 16:
        if tma and tma_aligned(K, a_bytes, b_bytes):
            cands += swap_space(K, b_bytes)
        for bn in (32, 64, 128):
            for bk in bks:
                for split in (1, 2, 4, 8, 16):
                    if K // split < bk:
                        continue
                    cands.append(tile("splitk", 16, bn, bk, split, 4, 4))
    else:
        paths = ("tma", "tiled") if tma and tma_aligned(K, a_bytes, b_bytes) else ("tiled",)
        if bucket <= 128:
            shapes = [(bm, bn, bk, 4, st) for bm in (32, 64) for bn in (64, 128) for bk in bks[-2:] for st in (4, 6)]
            if bucket == 32 and "tma" in paths and a_bytes <= 2:
                # The transposed product on 32 rows of x (buckets <= 16 take it on 16).
                cands += swap_space(K, b_bytes, bm=32)[:6]
        else:
            shapes = [(bm, bn, bk, w, st) for bm in (64, 128) for bn in (128, 256) for bk in bks[:2]
                      for w in (4, 8) for st in (3, 4) if not (bm == 128 and bn == 256 and w == 4)]
        for path in paths:
            for bm, bn, bk, w, st in shapes:
                cands.append(tile(path, bm, bn, bk, 1, w, st))
        # The large TMA tiles (128 rows, 8 warps): the ones whose stream-K and persistent forms
        # are tried (run 14: the 64-row stream-K ones lost everywhere; run 10: persistence paid there).
        large = [(bm, bn, bk, w, st) for bm, bn, bk, w, st in shapes if bm == 128 and w == 8]
        if bucket >= STREAMK_FROM and "tma" in paths:
            cands += [tile("tma-sk", bm, bn, bk, 1, w, st) for bm, bn, bk, w, st in large]
        if bucket >= PERSISTENT_FROM and "tma" in paths:
            # The persistent forms, and the default's other form second (a short sweep's strided
            # pick always sees it).
            other = dict(default, PERSISTENT=0 if default.get("PERSISTENT") else 1)
            if default["path"] == "tma":
                cands.insert(1, {k: v for k, v in other.items() if v or k != "PERSISTENT"})
            cands += [dict(tile("tma", bm, bn, bk, 1, w, st), PERSISTENT=1) for bm, bn, bk, w, st in large]
        if bucket <= 128:  # split-K over tensor-core tiles stays a candidate for mid buckets
            for bm in (16, 32, 64):
                if bm <= bucket:
                    for split in (2, 4):
                        if K // split >= bks[0]:
                            cands.append(tile("splitk", bm, 128, bks[0], split, 4, 4))
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


@triton.jit
def abs_bits(v):
    """|v| as the int32 bits of its fp32 value: ordered as the values are, inf above every finite
    value and NaN above inf, so an integer max is the amax, NaN where one is held (as torch's
    amax; a float max would drop it): fp8's row and nvfp4's block scales."""
    return v.to(tl.float32).to(tl.int32, bitcast=True) & 0x7FFFFFFF


@triton.jit
def clamp_keep_nan(v, bound):
    """v clamped to [-bound, bound] as torch.clamp does: a NaN stays NaN (fp8's and nvfp4's
    prologues, whose NaN rows and blocks must stay NaN as in the references)."""
    return tl.minimum(tl.maximum(v, -bound, propagate_nan=tl.PropagateNan.ALL), bound,
                      propagate_nan=tl.PropagateNan.ALL)


# e4m3 conversions written out in integer arithmetic: the Triton interpreter's own
# fp32 -> float8e4nv cast rounds wrongly (seen with Triton 3.9: -126.3 -> -64, and ties
# not to even), and these give the same bits as torch's cast on every backend.

@triton.jit
def e4m3_encode(v):
    """fp32 (already clamped to ±448) -> e4m3fn code (uint8), round to nearest even, as torch's
    cast; a NaN -> 0x7F, torch's code for a NaN (which for a negative NaN sets the sign bit too:
    the callers' NaN rows are compared sign-blind, a NaN's sign differing between CPU and GPU)."""
    nan = v != v
    v = tl.where(nan, 0.0, v)
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
    return tl.where(nan, 0x7F, code | (sign.to(tl.int32) << 7)).to(tl.uint8)


@triton.jit
def e4m3_decode(code):
    """e4m3fn code (any int type) -> fp32 value, exact, as torch's cast: the NaN codes 0x7F
    and 0xFF give NaN."""
    c = code.to(tl.int32) & 0xFF
    e = (c >> 3) & 15
    m = c & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    sub = m.to(tl.float32) * 0.001953125
    mag = tl.where(e == 0, sub, normal)
    mag = tl.where((c & 0x7F) == 0x7F, float("nan"), mag)
    return tl.where((c & 0x80) != 0, -mag, mag)


@dataclass(frozen=True)
class KernelTemplate(Template):
    """A Template whose source hash also covers the modules its kernels call into (this one,
    and e.g. dense for int4's dequant path): a change there must not reuse tiles recorded for
    the old code, since the cache promises the same kernel source for the same key."""

    deps: tuple[ModuleType, ...] = ()

    @property
    def modules(self) -> tuple[ModuleType, ...]:
        """The modules the source hash covers, each once, in order: the template's, this one, deps."""
        return tuple(dict.fromkeys((self.module, sys.modules[__name__]) + tuple(self.deps)))
