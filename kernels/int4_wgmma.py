"""int4 W4A16 on Hopper's asynchronous tensor-core MMA, written in Gluon: path "wgmma".

acc[BN, BM] = Σ_k W_q[n, k] · x[m, k], W_q = ((u - zu) · s) rounded once to x's dtype (the
frag and SCALE_W join numerics: int4._int4_dequant_kernel's fp32 product, one cast). Each K step:

1. the packed words and x's tile of step i + STAGES - 1 are copied into a STAGES-deep ring of
   shared memory (cp.async), so global latency hides behind STAGES - 1 steps;
2. step i's words are read into registers, unpacked into W_q, and stored into one of two shared
   buffers (the one step i - 2's MMA read; it has retired);
3. the warpgroup MMA of W_q (shared) by x's tile (shared, transposed view) is issued
   asynchronously, and the program waits only for step i - 1's, so step i + 1's unpacking runs
   while step i's MMA does.

Both MMA operands are in shared memory: nothing a pending MMA reads lives in a register that the
next step's unpacking could overwrite (the hazard kernels/wgmma_hazard.py finds in the frag
kernel's register operand, docs/kernels.md). The programs are (weight-row block, x-row block) x
K splits; several splits leave fp32 partials for common.reduce_splits.

Hopper (sm_90) only; Gluon is Triton's explicit-layout dialect, so its layouts are named here.
"""
from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

# Names that moved: the CTA-wide barrier (thread_barrier before Triton 3.9, barrier from it) and the
# cp.async copy into shared memory (async_copy_global_to_shared before 3.9, async_load from it).
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared


@gluon.jit
def _copy_step(q_ring, x_ring, q_ptr, x_ptr, rn, rm, kw0, offs_w, offs_k, K8, stride_x8, stage):
    """Step kw0's packed words [BN, W8] and x's tile [BM, BK] into ring slot `stage` (zeros past K).
    x's row stride and K arrive as multiples of 8 (K8 * 8, stride_x8 * 8) so the compiler sees the
    16-byte alignment cp.async needs whatever their values."""
    w_cols = kw0 + offs_w
    _async_load(q_ring.index(stage), q_ptr + rn[:, None] * K8 + w_cols[None, :], mask=w_cols[None, :] < K8)
    k_cols = kw0 * 8 + offs_k
    _async_load(x_ring.index(stage), x_ptr + rm[:, None] * (stride_x8 * 8) + k_cols[None, :],
                mask=k_cols[None, :] < K8 * 8)
    async_copy.commit_group()


@gluon.jit
def int4_wgmma_kernel(x_ptr, q_ptr, sc_ptr, zp_ptr, y_ptr, ws_ptr, bias_ptr, M, N, K8, KG, stride_x8,
                      stride_ym, KW_SPLIT, GROUP: gl.constexpr, HAS_ZP: gl.constexpr, HAS_BIAS: gl.constexpr,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                      SPLIT_K: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    NW: gl.constexpr = gl.num_warps()
    W8: gl.constexpr = BLOCK_K // 8
    # Words: [BN, W8, 8] with a thread's 8 nibbles (one word, 8 consecutive k) in its registers, so
    # the unpacked tile reaches shared memory as 16-byte rows.
    unpack3: gl.constexpr = gl.BlockedLayout([1, 1, 8], [32 // W8, W8, 1], [NW, 1, 1], [2, 1, 0])
    words2: gl.constexpr = gl.SliceLayout(2, unpack3)
    rows1: gl.constexpr = gl.SliceLayout(1, words2)
    # x's tile [BM, BK]: 8 consecutive columns (16 bytes) a thread.
    xload: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BLOCK_K // 8), BLOCK_K // 8], [NW, 1], [1, 0])
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1],
                                                    instr_shape=[16, BLOCK_M, 16])
    dt: gl.constexpr = x_ptr.dtype.element_ty
    w_sh: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_K], dt)
    x_sh: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], dt)
    q_sh: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])

    # Tile order: GROUP_M blocks of x's rows per weight-row block sweep (common.swizzle's).
    pid = gl.program_id(0)
    pid_k = gl.program_id(1)
    num_m = gl.cdiv(M, BLOCK_M)
    num_n = gl.cdiv(N, BLOCK_N)
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    gm = gl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % gm
    pid_n = (pid % width) // gm
    kw_lo = pid_k * KW_SPLIT
    kw_hi = gl.minimum(kw_lo + KW_SPLIT, K8)
    steps = gl.cdiv(kw_hi - kw_lo, W8)

    offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=rows1)
    rn = gl.minimum(offs_n, N - 1).to(gl.int64)              # rows past N read row N - 1; never stored
    offs_w = gl.arange(0, W8, layout=gl.SliceLayout(0, words2))
    offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, xload))
    rm = gl.minimum(offs_m, M - 1).to(gl.int64)
    offs_k = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, xload))
    shifts = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(0, unpack3))) * 4

    q_ring = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N, W8], q_sh)
    x_ring = gl.allocate_shared_memory(dt, [STAGES, BLOCK_M, BLOCK_K], x_sh)
    w_buf = gl.allocate_shared_memory(dt, [2, BLOCK_N, BLOCK_K], w_sh)

    for j in gl.static_range(STAGES - 1):
        if j < steps:
            _copy_step(q_ring, x_ring, q_ptr, x_ptr, rn, rm, kw_lo + j * W8, offs_w, offs_k, K8, stride_x8, j)
        else:
            async_copy.commit_group()

    # A step's scales (and zero points) are loaded one step ahead: a load's latency in the step
    # that uses it would stand between the copy's wait and the unpacking.
    s_nxt = gl.load(sc_ptr + rn * KG + (kw_lo * 8) // GROUP)
    if HAS_ZP:
        z_nxt = gl.load(zp_ptr + rn * KG + (kw_lo * 8) // GROUP)
    else:
        z_nxt = s_nxt
    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, acc_l)
    for i in range(steps):
        stage = i % STAGES
        s = s_nxt.to(gl.float32)
        if HAS_ZP:
            zf = z_nxt.to(gl.float32)
        else:
            zf = gl.full([BLOCK_N], 8.0, gl.float32, rows1)
        g_nxt = gl.minimum(((kw_lo + (i + 1) * W8) * 8) // GROUP, KG - 1)
        s_nxt = gl.load(sc_ptr + rn * KG + g_nxt)
        if HAS_ZP:
            z_nxt = gl.load(zp_ptr + rn * KG + g_nxt)
        async_copy.wait_group(STAGES - 2)
        _barrier()
        words = q_ring.index(stage).load(words2)
        u = (gl.expand_dims(words, 2) >> gl.expand_dims(gl.expand_dims(shifts, 0), 0)) & 0xF
        # (u - zu) exactly, through the mantissa of 2^23, then one rounding of its product by s.
        uf = (u | 0x4B000000).to(gl.float32, bitcast=True) - 8388608.0
        wq = ((uf - gl.expand_dims(gl.expand_dims(zf, 1), 2)) * gl.expand_dims(gl.expand_dims(s, 1), 2)).to(dt)
        w_buf.index(i % 2).store(gl.reshape(wq, [BLOCK_N, BLOCK_K]))
        fence_async_shared()
        _barrier()
        acc = warpgroup_mma(w_buf.index(i % 2), x_ring.index(stage).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
        nxt = i + STAGES - 1
        if nxt < steps:
            _copy_step(q_ring, x_ring, q_ptr, x_ptr, rn, rm, kw_lo + nxt * W8, offs_w, offs_k, K8, stride_x8,
                       nxt % STAGES)
        else:
            async_copy.commit_group()
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    async_copy.wait_group(0)

    out_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, acc_l))
    out_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, acc_l))
    mask = (out_n[:, None] < N) & (out_m[None, :] < M)
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += gl.expand_dims(gl.load(bias_ptr + out_n, mask=out_n < N, other=0.0).to(gl.float32), 1)
        gl.store(y_ptr + out_m[None, :].to(gl.int64) * stride_ym + out_n[:, None], acc.to(dt), mask=mask)
    else:
        gl.store(ws_ptr + pid_k.to(gl.int64) * M * N + out_m[None, :].to(gl.int64) * N + out_n[:, None], acc,
                 mask=mask)


def launch(x, w, zp, bias, y, ws, tile: dict, k_split: int, split: int) -> None:
    """y (one split) or ws's [split, M, N] fp32 partials = x · W_qᵀ (+ bias with one split) through
    int4_wgmma_kernel; x [M, K] bf16/fp16 with 16-byte aligned rows (cp.async copies 16 bytes), w an
    int4.Int4Weight whose BLOCK_K divides its group, zp and bias its tensors or any placeholder where
    it has none (int4.launch's). The caller adds the splits (common.reduce_splits)."""
    M, K = x.shape
    N = w.N
    bm, bn, bk = tile["BLOCK_M"], tile["BLOCK_N"], tile["BLOCK_K"]
    int4_wgmma_kernel[(triton.cdiv(M, bm) * triton.cdiv(N, bn), split)](
        x, w.packed, w.scale, zp, y, ws, bias, M, N, w.packed.stride(0), w.scale.stride(0), x.stride(0) // 8,
        y.stride(0), k_split // 8, GROUP=w.group_size, HAS_ZP=w.zero_point is not None,
        HAS_BIAS=w.bias is not None and split == 1, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=split,
        STAGES=tile["num_stages"], GROUP_M=tile.get("GROUP_M", 8), num_warps=tile["num_warps"])
