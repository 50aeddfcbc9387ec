"""The product kernels of the dense and fp8 templates, which differ only in their operands' dtype
and the epilogue's scales: pointer-load tiles and split-K; TMA tiles, one per program, persistent
or stream-K; the transposed TMA product for few rows; the one-row GEMV; and their launchers.

Stream-K: one program per multiprocessor walks whole waves of tiles, and the K steps of the tiles
left over for a last, partial wave are shared out evenly; their partial tiles go to a workspace
slot per (program, tile it touches: at most two) and are added in program order.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from vsr.kernels import common


@triton.jit
def _dot(a, b, acc, F32: tl.constexpr):
    """acc + a·b in fp32. fp32 operands multiply at the precision F32 names (common.f32_precision:
    "tf32x3" on NVIDIA GPUs, "ieee" elsewhere); "" for 16- and 8-bit operands, which are exact."""
    if F32 != "":
        return tl.dot(a, b, acc, input_precision=F32)
    else:
        return tl.dot(a, b, acc)

@triton.jit
def tiled_gemm_kernel(a_ptr, b_ptr, y_ptr, ws_ptr, cnt_ptr, bias_ptr, rs_ptr, cs_ptr, M, N, K, stride_am, stride_bn, stride_ym,
                      K_SPLIT, HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr,
                      F32: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr, WAIT: tl.constexpr,
                      FIXUP: tl.constexpr, GLU: tl.constexpr = False):
    """y = epilogue(A · Bᵀ) with pointer loads, A [M, K] and B [N, K] K-contiguous in one dtype: the
    "tiled" (SPLIT_K = 1) and "splitk" paths."""
    common.wait_for_producer(WAIT)
    pid_k, offs_m, offs_n, rm, rn = common.tile_setup(M, N, BLOCK_M, BLOCK_N, GROUP_M)
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
        acc = _dot(a, b, acc, F32)
    common.store_or_stash(acc, y_ptr, ws_ptr, cnt_ptr, pid_k, offs_m, offs_n, M, N, stride_ym,
                   bias_ptr, rs_ptr, cs_ptr, bias_ptr, SPLIT_K, HAS_BIAS, HAS_RS, HAS_CS, False, FIXUP, GLU)

@triton.jit
def _tma_k_loop(a_desc, b_desc, off_m, off_n, k_lo, k_hi, F32: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWAP: tl.constexpr, GLU: tl.constexpr = False):
    """Σ over k in [k_lo, k_hi) of the TMA-fetched tiles' products in fp32: A·Bᵀ [BM, BN], or with
    SWAP B·Aᵀ [BN, BM]. GLU: b_desc is the interleaved gate|up weight seen as [2, N / 2, K] (gate
    rows, then up rows), and each step's copy [2, BN / 2, BK] takes the gate rows of pairs
    off_n / 2 ... then their up rows, so acc's first BN / 2 columns are gates, the rest ups
    (_store_glu_blocks)."""
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        a = a_desc.load([off_m, k0])
        if GLU:
            b = b_desc.load([0, off_n // 2, k0]).reshape(BLOCK_N, BLOCK_K)
        else:
            b = b_desc.load([off_n, k0])
        if SWAP:
            acc = _dot(b, a.T, acc, F32)
        else:
            acc = _dot(a, b.T, acc, F32)
    return acc

@triton.jit
def _tma_tile(a_desc, b_desc, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, pid_m, pid_n, M, N, K, stride_ym,
              HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr, HAS_ALPHA: tl.constexpr,
              F32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              GLU: tl.constexpr = False):
    acc = _tma_k_loop(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, 0, K, F32, BLOCK_M, BLOCK_N, BLOCK_K, False,
                      GLU)
    if GLU:
        _store_glu_blocks(acc, pid_m * BLOCK_M + tl.arange(0, BLOCK_M), pid_n * BLOCK_N, y_ptr, bias_ptr, rs_ptr,
                          cs_ptr, alpha_ptr, M, N, stride_ym, HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA)
    else:
        common.store_tile(acc, pid_m * BLOCK_M + tl.arange(0, BLOCK_M), pid_n * BLOCK_N + tl.arange(0, BLOCK_N),
                          y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, M, N, stride_ym, HAS_BIAS, HAS_RS, HAS_CS,
                          HAS_ALPHA)

@triton.jit
def _store_glu_blocks(acc, offs_m, off_n, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, M, N, stride_ym,
                      HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr, HAS_ALPHA: tl.constexpr):
    """store_tile's GLU for a tile of weight rows off_n ... summed as _tma_k_loop's GLU fetches them:
    acc's first half of columns the gates of pairs off_n / 2 ..., its second half their ups. The
    halves are taken apart by a reshape, which moves no data: in the MMA's layout a thread holds
    column c and column c + BN / 2 alike."""
    BM: tl.constexpr = acc.shape[0]
    BN: tl.constexpr = acc.shape[1]
    gate, up = tl.split(tl.permute(tl.reshape(acc, (BM, 2, BN // 2)), (0, 2, 1)))
    common.store_glu_tile(gate, up, offs_m, off_n // 2 + tl.arange(0, BN // 2), y_ptr, bias_ptr, rs_ptr, cs_ptr,
                          alpha_ptr, M, N, stride_ym, HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA)

@triton.jit
def _tma_wide_tile(a_desc, b_desc, b2_desc, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, pid_m, pid_n, M, N, K,
                   stride_ym, HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr,
                   HAS_ALPHA: tl.constexpr, F32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_N2: tl.constexpr, BLOCK_K: tl.constexpr, GLU: tl.constexpr = False):
    """One output tile BLOCK_N + BLOCK_N2 weight rows wide (160 = 128 + 32, 80 = 64 + 16: widths that
    Triton's power-of-two blocks cannot take), as two products sharing each step's activation tile.
    The width makes a layer's tiles about one wave of the machine, as cuBLAS's 168-, 80- and
    176-wide tiles at M = 256 do, where power-of-two tiles make 2.4 or 1.2 waves.
    GLU: the BLOCK_N part is fetched as _tma_k_loop's GLU fetches (b_desc the [2, N / 2, K] view);
    the BLOCK_N2 part, from the plain weight, splits its columns into pairs (store_tile)."""
    off_m = pid_m * BLOCK_M
    off_n = pid_n * (BLOCK_N + BLOCK_N2)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N2), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = a_desc.load([off_m, k0])
        if GLU:
            b = b_desc.load([0, off_n // 2, k0]).reshape(BLOCK_N, BLOCK_K)
        else:
            b = b_desc.load([off_n, k0])
        b2 = b2_desc.load([off_n + BLOCK_N, k0])
        acc = _dot(a, b.T, acc, F32)
        acc2 = _dot(a, b2.T, acc2, F32)
    offs_m = off_m + tl.arange(0, BLOCK_M)
    if GLU:
        _store_glu_blocks(acc, offs_m, off_n, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, M, N, stride_ym, HAS_BIAS,
                          HAS_RS, HAS_CS, HAS_ALPHA)
    else:
        common.store_tile(acc, offs_m, off_n + tl.arange(0, BLOCK_N), y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, M,
                          N, stride_ym, HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA)
    common.store_tile(acc2, offs_m, off_n + BLOCK_N + tl.arange(0, BLOCK_N2), y_ptr, bias_ptr, rs_ptr, cs_ptr,
                      alpha_ptr, M, N, stride_ym, HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA, GLU)

@triton.jit
def _tma_tiles(a_desc, b_desc, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, first, end, M, N, K, stride_ym, NUM_PROGRAMS,
               HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr, HAS_ALPHA: tl.constexpr,
               F32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               GROUP_M: tl.constexpr, GLU: tl.constexpr = False):
    """The persistent walk: output tiles first, first + NUM_PROGRAMS, ... below `end`, in the swizzled
    order, each whole."""
    for t in tl.range(first, end, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = common.swizzle(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        _tma_tile(a_desc, b_desc, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, pid_m, pid_n, M, N, K, stride_ym,
                  HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA, F32, BLOCK_M, BLOCK_N, BLOCK_K, GLU)

@triton.jit
def tma_gemm_kernel(a_desc, b_desc, b2_desc, b_ptr, stride_bn, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, M, N, K,
                    stride_ym, NUM_PROGRAMS, HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr,
                    HAS_ALPHA: tl.constexpr, F32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_N2: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, PERSISTENT: tl.constexpr,
                    WAIT: tl.constexpr, PREFETCH: tl.constexpr, LINE_COLS: tl.constexpr, GLU: tl.constexpr = False):
    """y = epilogue(A · Bᵀ) with both operands fetched by the tensor-memory accelerator (TMA)
    through host-built descriptors: A [M, K], B [N, K], both K-contiguous. The copy engine
    zero-fills reads past an edge, so the main loop has no masks.
    PERSISTENT: NUM_PROGRAMS programs (one per multiprocessor) walk the output tiles in the
    swizzled order, so one tile's epilogue overlaps the next tile's loads (Triton's
    persistent-matmul tutorial); each tile is still computed whole by one program, so the output
    does not depend on NUM_PROGRAMS.
    PREFETCH (with WAIT, one tile per program): prefetch_weight_rows before the wait.
    BLOCK_N2 > 0 (one tile per program): tiles BLOCK_N + BLOCK_N2 weight rows wide, b2_desc the
    weight's descriptor of BLOCK_N2-row blocks.
    GLU (interleaved gate and up rows): b_desc is the weight's [2, N / 2, K] view (_tma_k_loop)."""
    tl.static_assert(not (PERSISTENT and BLOCK_N2 > 0), "wide tiles (BLOCK_N2) are one tile per program")
    if PERSISTENT:
        common.wait_for_producer(WAIT)
        num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
        _tma_tiles(a_desc, b_desc, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, tl.program_id(0), num_tiles, M, N, K,
                   stride_ym, NUM_PROGRAMS, HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA, F32, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                   GLU)
    else:
        pid_m, pid_n = common.swizzle(tl.program_id(0), M, N, BLOCK_M, BLOCK_N + BLOCK_N2, GROUP_M)
        if PREFETCH > 0:
            off_n = pid_n * (BLOCK_N + BLOCK_N2)
            common.prefetch_weight_rows(b_ptr, stride_bn, off_n, 0, N, K, BLOCK_N, PREFETCH, LINE_COLS)
            if BLOCK_N2 > 0:
                common.prefetch_weight_rows(b_ptr, stride_bn, off_n + BLOCK_N, 0, N, K, BLOCK_N2, PREFETCH, LINE_COLS)
        common.wait_for_producer(WAIT)
        if BLOCK_N2 > 0:
            _tma_wide_tile(a_desc, b_desc, b2_desc, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, pid_m, pid_n, M, N,
                           K, stride_ym, HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA, F32, BLOCK_M, BLOCK_N, BLOCK_N2,
                           BLOCK_K, GLU)
        else:
            _tma_tile(a_desc, b_desc, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, pid_m, pid_n, M, N, K, stride_ym,
                      HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA, F32, BLOCK_M, BLOCK_N, BLOCK_K, GLU)

@triton.jit
def _streamk_plan(M, N, K, NUM_PROGRAMS, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """(tiles in whole waves, K steps per tile, units), a unit being one (leftover tile, K step)."""
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    sk_tiles = num_tiles % NUM_PROGRAMS
    iters = tl.cdiv(K, BLOCK_K)
    return num_tiles - sk_tiles, iters, sk_tiles * iters

@triton.jit
def _streamk_run(p, units, NUM_PROGRAMS):
    """Program p's run of units, [lo, hi): the runs split the units evenly, in order (some may be empty)."""
    return p * units // NUM_PROGRAMS, (p + 1) * units // NUM_PROGRAMS

@triton.jit
def _streamk_slot(p, u_lo):
    """Program p's workspace slot pair, numbering only the programs whose runs are not empty: p when
    every run holds a unit, else u_lo (each run then holds at most one). The workspace takes
    min(programs, units) pairs."""
    return tl.minimum(p, u_lo)

@triton.jit
def _streamk_overlap(u_lo, u_hi, s, iters):
    return tl.maximum(u_lo, s * iters), tl.minimum(u_hi, (s + 1) * iters)

@triton.jit
def _streamk_tile_programs(s, units, iters, NUM_PROGRAMS):
    """[first, last]: the programs whose runs may hold units of leftover tile s."""
    first = ((s * iters + 1) * NUM_PROGRAMS - 1) // units
    last = ((s + 1) * iters * NUM_PROGRAMS - 1) // units
    return first, last

@triton.jit
def _streamk_part(ws_ptr, p, s, offs, live, units, iters, NUM_PROGRAMS, SLOT: tl.constexpr):
    """Program p's fp32 part of stream-K tile s at offs, or zeros where p's run holds none of its units."""
    u_lo, u_hi = _streamk_run(p, units, NUM_PROGRAMS)
    lo, hi = _streamk_overlap(u_lo, u_hi, s, iters)
    j = s - u_lo // iters
    return tl.load(ws_ptr + (_streamk_slot(p, u_lo) * 2 + j).to(tl.int64) * SLOT + offs,
                   mask=tl.where(lo < hi, live, False), other=0.0, cache_modifier=".cg")   # (`live & held`: the
    # interpreter, Triton 3.9, refuses a mask of a tensor and a scalar so joined)

@triton.jit
def _streamk_rows(ws_ptr, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, s, r0, M, N, stride_ym, NUM_PROGRAMS,
                  dp_tiles, iters, units, HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr,
                  HAS_ALPHA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
                  ROWS: tl.constexpr, GLU: tl.constexpr = False):
    """Rows r0 .. r0 + ROWS of stream-K tile s into y: epilogue(Σ partials) over the programs that
    shared the tile, in program order, read from L2 (`.cg`)."""
    first, last = _streamk_tile_programs(s, units, iters, NUM_PROGRAMS)
    pid_m, pid_n = common.swizzle(dp_tiles + s, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = r0 + tl.arange(0, ROWS)
    offs = rows[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    live = rows[:, None] < M - pid_m * BLOCK_M   # the rows the product stashed
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    # Four sharers' parts are loaded before any is added, so their L2 round trips overlap; they are
    # still added in program order (a part of a program whose run misses the tile loads as 0).
    for p in range(first, last + 1, 4):
        part0 = _streamk_part(ws_ptr, p, s, offs, live, units, iters, NUM_PROGRAMS, BLOCK_M * BLOCK_N)
        part1 = _streamk_part(ws_ptr, p + 1, s, offs, live, units, iters, NUM_PROGRAMS, BLOCK_M * BLOCK_N)
        part2 = _streamk_part(ws_ptr, p + 2, s, offs, live, units, iters, NUM_PROGRAMS, BLOCK_M * BLOCK_N)
        part3 = _streamk_part(ws_ptr, p + 3, s, offs, live, units, iters, NUM_PROGRAMS, BLOCK_M * BLOCK_N)
        acc += part0
        acc += part1
        acc += part2
        acc += part3
    offs_m = pid_m * BLOCK_M + rows
    if GLU:   # the product's parts hold _tma_k_loop's GLU columns
        _store_glu_blocks(acc, offs_m, pid_n * BLOCK_N, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, M, N, stride_ym,
                          HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA)
    else:
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        common.store_tile(acc, offs_m, offs_n, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, M, N, stride_ym,
                          HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA)

@triton.jit
def _streamk_sharers(s, units, iters, NUM_PROGRAMS):
    """How many programs hold units of leftover tile s."""
    first, last = _streamk_tile_programs(s, units, iters, NUM_PROGRAMS)
    return tl.where(units < NUM_PROGRAMS, iters, last - first + 1)

@triton.jit
def tma_streamk_kernel(a_desc, b_desc, y_ptr, ws_ptr, cnt_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, M, N, K,
                       stride_ym, NUM_PROGRAMS, HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr,
                       HAS_ALPHA: tl.constexpr, F32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, WAIT: tl.constexpr, FIXUP: tl.constexpr,
                       ROWS: tl.constexpr, GLU: tl.constexpr = False):
    """The TMA tile, stream-K ("tma-sk"): NUM_PROGRAMS programs (one per multiprocessor) walk the
    tiles that fill whole waves as the persistent kernel does; the num_tiles % NUM_PROGRAMS leftover
    tiles, which would leave most multiprocessors idle for a last partial wave, are cut into their
    K steps, shared out evenly in contiguous runs. A run touches at most two tiles; its fp32
    partial sums go to the workspace, and each tile's partials are added in program order: with
    FIXUP by the tile's last program to finish, ROWS rows at a time, else by streamk_reduce_kernel.
    The output depends on (M, N, K, tile, NUM_PROGRAMS) only, FIXUP or not.
    (At M = 1024 on o and down, 128x256 tiles make 160 tiles: one wave of 132 and 28 left over,
    which a plain grid runs as a second wave on 28 multiprocessors.)"""
    common.wait_for_producer(WAIT)
    pid = tl.program_id(0)
    dp_tiles, iters, units = _streamk_plan(M, N, K, NUM_PROGRAMS, BLOCK_M, BLOCK_N, BLOCK_K)
    _tma_tiles(a_desc, b_desc, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, pid, dp_tiles, M, N, K, stride_ym,
               NUM_PROGRAMS, HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA, F32, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, GLU)
    u_lo, u_hi = _streamk_run(pid, units, NUM_PROGRAMS)
    slot = _streamk_slot(pid, u_lo)
    rows = tl.arange(0, BLOCK_M)[:, None]
    offs = rows * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    for j in range(2):
        s = u_lo // iters + j
        lo, hi = _streamk_overlap(u_lo, u_hi, s, iters)
        if lo < hi:
            pid_m, pid_n = common.swizzle(dp_tiles + s, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            acc = _tma_k_loop(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, (lo - s * iters) * BLOCK_K,
                              (hi - s * iters) * BLOCK_K, F32, BLOCK_M, BLOCK_N, BLOCK_K, False, GLU)
            tl.store(ws_ptr + (slot * 2 + j).to(tl.int64) * (BLOCK_M * BLOCK_N) + offs, acc,
                     mask=rows < M - pid_m * BLOCK_M)
            if FIXUP:
                if common.last_to_finish(cnt_ptr + s, _streamk_sharers(s, units, iters, NUM_PROGRAMS)):
                    for r0 in range(0, tl.minimum(BLOCK_M, M - pid_m * BLOCK_M), ROWS):
                        _streamk_rows(ws_ptr, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, s, r0, M, N, stride_ym,
                                      NUM_PROGRAMS, dp_tiles, iters, units, HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA,
                                      BLOCK_M, BLOCK_N, GROUP_M, ROWS, GLU)

@triton.jit
def streamk_reduce_kernel(ws_ptr, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, M, N, K, stride_ym, NUM_PROGRAMS,
                          HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr,
                          HAS_ALPHA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, ROWS: tl.constexpr, GLU: tl.constexpr = False):
    """y for the stream-K tiles of tma_streamk_kernel without FIXUP (grid: leftover tiles x row blocks)."""
    dp_tiles, iters, units = _streamk_plan(M, N, K, NUM_PROGRAMS, BLOCK_M, BLOCK_N, BLOCK_K)
    _streamk_rows(ws_ptr, y_ptr, bias_ptr, rs_ptr, cs_ptr, alpha_ptr, tl.program_id(0), tl.program_id(1) * ROWS,
                  M, N, stride_ym, NUM_PROGRAMS, dp_tiles, iters, units, HAS_BIAS, HAS_RS, HAS_CS, HAS_ALPHA,
                  BLOCK_M, BLOCK_N, GROUP_M, ROWS, GLU)

@triton.jit
def tma_swap_kernel(a_desc, b_desc, b_ptr, stride_bn, y_ptr, ws_ptr, cnt_ptr, bias_ptr, rs_ptr, cs_ptr, M, N, K, stride_ym,
                    K_SPLIT, HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr,
                    F32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr, WAIT: tl.constexpr, PREFETCH: tl.constexpr,
                    LINE_COLS: tl.constexpr, FIXUP: tl.constexpr, GLU: tl.constexpr = False):
    """Few rows ("tma-swap"): the product taken transposed, acc[BN, BM] = B_tile · A_tileᵀ, both
    fetched by TMA. The weight tile fills the MMA's 64-row side and the few rows of x its narrow
    side (16 or 32 columns) instead of padding x's rows up to 64, and the copy engine streams the
    weight through a deep pipeline: the memory-bound regime of M <= 32.
    Split-K as the pointer path; K_SPLIT is a whole number of BLOCK_K.
    PREFETCH (with WAIT): prefetch_weight_rows before the wait."""
    pid_m, pid_n = common.swizzle(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    k_lo = pid_k * K_SPLIT
    if PREFETCH > 0:
        common.prefetch_weight_rows(b_ptr, stride_bn, pid_n * BLOCK_N, k_lo, N, K, BLOCK_N, PREFETCH, LINE_COLS)
    common.wait_for_producer(WAIT)
    k_hi = tl.minimum(k_lo + K_SPLIT, K)
    acc = _tma_k_loop(a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, k_lo, k_hi, F32, BLOCK_M, BLOCK_N, BLOCK_K,
                      True)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    common.store_or_stash(tl.trans(acc), y_ptr, ws_ptr, cnt_ptr, pid_k, offs_m, offs_n, M, N, stride_ym,
                   bias_ptr, rs_ptr, cs_ptr, bias_ptr, SPLIT_K, HAS_BIAS, HAS_RS, HAS_CS, False, FIXUP, GLU)

@triton.jit
def gemv_kernel(x_ptr, w_ptr, y_ptr, rs_ptr, cs_ptr, bias_ptr, N, K, stride_wn,
                HAS_BIAS: tl.constexpr, HAS_RS: tl.constexpr, HAS_CS: tl.constexpr, EVEN_K: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, WAIT: tl.constexpr, GLU: tl.constexpr = False):
    """One row on the CUDA cores: y[n] = epilogue(Σ_k x[k]·w[n, k]), operands widened to fp32 (exact
    products, fp32 sums), W [N, K] K-contiguous in any dtype. At M = 1 it needs no second,
    reducing launch, where a split-K tensor-core tile does."""
    common.wait_for_producer(WAIT)
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
    if not GLU:
        yv = common.epilogue(yv, zero, offs_n, 1, N, bias_ptr, rs_ptr, cs_ptr, bias_ptr, HAS_BIAS, HAS_RS, HAS_CS,
                             False)
        tl.store(y_ptr + offs_n[None, :], yv.to(y_ptr.dtype.element_ty), mask=offs_n[None, :] < N)
    else:
        common.store_tile(yv, zero, offs_n, y_ptr, bias_ptr, rs_ptr, cs_ptr, bias_ptr, 1, N, 0, HAS_BIAS, HAS_RS,
                          HAS_CS, False, GLU)

def launch_gemv(x, w, y, tile: dict, bias=None, rs=None, cs=None, wait: bool = False, glu: bool = False) -> None:
    """y[1, N] = epilogue(x[1, K] · wᵀ) through gemv_kernel; x contiguous. `wait`: see launch_tma;
    `glu`: see launch_tma."""
    assert x.shape[0] == 1, f"the gemv path takes one row, got M={x.shape[0]}"
    N, K = w.shape
    bn, bk = tile["BLOCK_N"], tile["BLOCK_K"]
    d = y
    gemv_kernel[(common.cdiv(N, bn),)](x, w, y, d if rs is None else rs, d if cs is None else cs,
                                d if bias is None else bias, N, K, w.stride(0),
                                HAS_BIAS=bias is not None, HAS_RS=rs is not None, HAS_CS=cs is not None,
                                EVEN_K=K % bk == 0, BLOCK_N=bn, BLOCK_K=bk, WAIT=wait, **common.pdl_option(wait),
                                GLU=glu, num_warps=tile["num_warps"], num_stages=tile["num_stages"])

def weight_descriptor(owner, t: torch.Tensor, block: list[int], build=None):
    """The TMA descriptor of a weight operand, built once per (weight object, tensor, block, builder)
    and kept on the object: a descriptor costs host time on every build. `build(t, block)` makes it
    for a kernel that takes another kind (a Gluon kernel's, with its shared layout); Triton's
    TensorDescriptor.from_tensor by default."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    cache = owner.__dict__.setdefault("_tma_descriptors", {})
    key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), tuple(block), build)
    d = cache.get(key)
    if d is None:
        assert t.stride(-1) == 1 and all((st * t.element_size()) % 16 == 0 for st in t.stride()[:-1]) \
            and t.data_ptr() % 16 == 0, "the weight operand of a TMA tile must be K-contiguous and 16-byte aligned"
        d = cache[key] = (build or TensorDescriptor.from_tensor)(t, list(block))
    return d

def launch_tma(a, b, y, tile: dict, bias=None, rs=None, cs=None, alpha=None, owner=None, wait: bool = False,
               prefetch: int = 0, glu: bool = False) -> None:
    """y = epilogue(a · bᵀ) through tma_gemm_kernel ("tma"), tma_swap_kernel ("tma-swap") or
    tma_streamk_kernel ("tma-sk"). a [M, K] and b [N, K] K-contiguous with 16-byte aligned bases and
    row strides; a misaligned view of `a` is copied once, so the path never depends on where the
    caller's tensor starts. `owner` keeps b's descriptor between calls. `wait` (where
    pdl_supported): launched as a programmatic dependent of the kernel that made `a`.
    `prefetch` (with `wait`; "tma-swap" and one-tile-per-program "tma"): 128-byte lines of each
    weight row asked of the L2 before the wait. `glu`: b's
    rows are gate and up rows interleaved, and y [M, N / 2] takes silu(gate) · up: "tma" and "tma-sk"
    read b as [2, N / 2, K] (_tma_k_loop's GLU), "tma-swap" splits its columns into pairs
    (common.store_tile)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    M, K = a.shape
    N = b.shape[0]
    if not tma_aligned(K, a.element_size(), b.element_size()):
        raise ValueError(f"tile {tile} uses TMA, which needs K·bytes % 16 == 0; K={K} does not allow it")
    if M == 0:   # nothing to compute, and a TMA descriptor of an empty x would be refused
        return
    line = dict(PREFETCH=prefetch if wait else 0, LINE_COLS=max(1, 128 // b.element_size()))
    a = tma_rows(a)
    bm, bn, bk, bn2 = tile["BLOCK_M"], tile["BLOCK_N"], tile["BLOCK_K"], tile.get("BLOCK_N2", 0)
    owner = owner if owner is not None else _Transient()
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
    glu_view = glu and tile.get("path") != "tma-swap"   # the [2, N / 2, K] view _tma_k_loop's GLU reads
    if glu_view and bn % 2:
        raise ValueError(f"a SwiGLU product's TMA tile needs an even BLOCK_N: {tile}")
    b_desc = weight_descriptor(owner, b.view(N // 2, 2, K).permute(1, 0, 2), [2, bn // 2, bk]) if glu_view \
        else weight_descriptor(owner, b, [bn, bk])
    d = y
    if tile.get("path") == "tma-swap":
        k_split, split = common.split_plan(K, tile)
        ws = common.workspace(split, y, N)
        programs = common.cdiv(M, bm) * common.cdiv(N, bn)
        fixup = common.split_fixup(tile, split)
        tma_swap_kernel[(programs, split)](
            a_desc, b_desc, b, b.stride(0), y, ws, common.fixup_counters(fixup, y.device, programs, ws),
            d if bias is None else bias, d if rs is None else rs, d if cs is None else cs,
            M, N, K, y.stride(0), k_split, HAS_BIAS=bias is not None, HAS_RS=rs is not None, HAS_CS=cs is not None,
            F32=common.f32_precision(a), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split,
            GROUP_M=tile.get("GROUP_M", 8), WAIT=wait, **line, FIXUP=fixup, **common.pdl_option(wait),
            GLU=glu, num_warps=tile["num_warps"], num_stages=tile["num_stages"])
        if split > 1 and not fixup:
            common.reduce_splits(ws, y, split, M, N, bias, rs, cs, None, glu)
        return
    tiles = common.cdiv(M, bm) * common.cdiv(N, bn + bn2)   # (bn2 is 0 but for a wide "tma" tile)
    flags = dict(HAS_BIAS=bias is not None, HAS_RS=rs is not None, HAS_CS=cs is not None,
                 HAS_ALPHA=alpha is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=tile.get("GROUP_M", 8))
    scales = (d if bias is None else bias, d if rs is None else rs, d if cs is None else cs,
              d if alpha is None else alpha)
    if tile.get("path") == "tma-sk":
        # One program per multiprocessor (two or three per multiprocessor do not help on the H200).
        programs = multiprocessors(a.device)
        sk_tiles = tiles % programs
        # Two slots (the tiles a run touches) for each program whose run holds units (_streamk_slot);
        # one fp32 element, unused, when every tile lies in a whole wave (fp32 as the workspace is, so
        # that case compiles no second form of the kernel).
        units = sk_tiles * common.cdiv(K, bk)
        ws = torch.empty(max(1, min(programs, units) * 2 * bm * bn), dtype=torch.float32, device=y.device)
        fixup = bool(units) and bool(tile.get("FIXUP", 0))
        rows = min(bm, STREAMK_REDUCE_ROWS)
        tma_streamk_kernel[(programs,)](a_desc, b_desc, y, ws, common.fixup_counters(fixup, y.device, sk_tiles, ws),
                                        *scales, M, N, K, y.stride(0), programs, F32=common.f32_precision(a),
                                        **flags, WAIT=wait, FIXUP=fixup, ROWS=rows, GLU=glu,
                                        **common.pdl_option(wait), num_warps=tile["num_warps"], num_stages=tile["num_stages"])
        if units and not fixup:
            streamk_reduce_kernel[(sk_tiles, common.cdiv(min(M, bm), rows))](
                ws, y, *scales, M, N, K, y.stride(0), programs, **flags, ROWS=rows, GLU=glu,
                num_warps=4)
        return
    persistent = bool(tile.get("PERSISTENT", 0))
    programs = min(tiles, multiprocessors(a.device)) if persistent else tiles
    b2_desc = weight_descriptor(owner, b, [bn2, bk]) if bn2 else b_desc
    tma_gemm_kernel[(programs,)](a_desc, b_desc, b2_desc, b, b.stride(0), y, *scales, M, N, K, y.stride(0),
                                 programs if persistent else 0, F32=common.f32_precision(a), **flags, BLOCK_N2=bn2,
                                 PERSISTENT=persistent, WAIT=wait, **line, **common.pdl_option(wait),
                                 GLU=glu, num_warps=tile["num_warps"], num_stages=tile["num_stages"])

@functools.cache
def multiprocessors(device: torch.device) -> int:
    """Streaming multiprocessors of `device` (a persistent grid's size); 4 on the CPU (interpreter)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4

# The paths launch_tma runs: one output tile per program (or persistent), the transposed product
# for few rows, and stream-K.
TMA_PATHS = ("tma", "tma-swap", "tma-sk")

# Rows of a stream-K tile that one program of streamk_reduce_kernel adds up (x BLOCK_N fp32).
STREAMK_REDUCE_ROWS = 16


class _Transient:
    """An owner for a one-call weight (int4's transient dense copy): its descriptor dies with it."""

def launch_tiled(a, b, y, tile: dict, bias=None, rs=None, cs=None, wait: bool = False, glu: bool = False) -> None:
    """y = epilogue(a · bᵀ) through tiled_gemm_kernel, split-K with the fixed-order reduction where
    the tile splits. a [M, K] and b [N, K] K-contiguous, one dtype. `wait`, `glu`: see launch_tma."""
    M, K = a.shape
    N = b.shape[0]
    k_split, split = common.split_plan(K, tile)
    ws = common.workspace(split, y, N)
    d = y
    bm, bn, bk = tile["BLOCK_M"], tile["BLOCK_N"], tile["BLOCK_K"]
    grid = (common.cdiv(M, bm) * common.cdiv(N, bn), split)
    fixup = common.split_fixup(tile, split)
    tiled_gemm_kernel[grid](a, b, y, ws, common.fixup_counters(fixup, y.device, grid[0], ws), d if bias is None else bias, d if rs is None else rs,
                            d if cs is None else cs, M, N, K, a.stride(0), b.stride(0), y.stride(0), k_split,
                            HAS_BIAS=bias is not None, HAS_RS=rs is not None, HAS_CS=cs is not None,
                            F32=common.f32_precision(a), EVEN_K=K % bk == 0,
                            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split, GROUP_M=tile.get("GROUP_M", 8),
                            WAIT=wait, FIXUP=fixup, **common.pdl_option(wait), GLU=glu,
                            num_warps=tile["num_warps"], num_stages=tile["num_stages"])
    if split > 1 and not fixup:
        common.reduce_splits(ws, y, split, M, N, bias, rs, cs, None, glu)


# 128-byte lines of each weight row a product launched as a programmatic dependent asks of the L2
# before it waits (launch_tma's `prefetch`; 16-32 lines cost time on the wide layers).
PDL_PREFETCH_LINES = 4


def tma_aligned(K: int, *elem_bytes: float) -> bool:
    """A TMA descriptor needs 16-byte row strides: K·(element size) % 16 == 0 for every operand."""
    return all((K * b) % 16 == 0 for b in elem_bytes)


def tma_rows(a: torch.Tensor) -> torch.Tensor:
    """a, or a contiguous copy of it where its base, row stride or column stride does not suit a TMA
    descriptor (16-byte aligned base and rows, unit column stride), so a path never depends on where
    the caller's tensor starts."""
    if a.stride(1) != 1 or (a.stride(0) * a.element_size()) % 16 or a.data_ptr() % 16:
        return a.clone(memory_format=torch.contiguous_format)
    return a
