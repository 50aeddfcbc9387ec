"""int4 W4A16 on Hopper's asynchronous tensor-core MMA, warp-specialised, in Gluon: path "wgmma".

acc[BN, BM] = Σ_k W_q[n, k] · x[m, k], W_q = ((u - zu) · s) rounded once to x's dtype (the
frag and SCALE_W join numerics: int4._int4_dequant_kernel's fp32 product, one cast).

Three partitions of each program run side by side, handing tiles over in shared memory guarded by
mbarriers (Triton's Gluon tutorial 08, warp specialisation; the form of Machete and Marlin):

- the loader (one warp) copies each K step's x tile [BM, BK] and packed words [BN, BK / 8] into a
  STAGES-deep ring by TMA (zeros past M, N and K);
- the unpackers (a warpgroup) read a step's words, unpack them (the scales and zero points
  loaded one step ahead) and store W_q into one of two shared buffers;
- the MMA warpgroup(s) multiply W_q (shared) by x's tile (shared, transposed view) with one MMA
  kept in flight, releasing a step's ring slot and W_q buffer once the MMA that read them retired.

So unpacking, copying and the MMAs overlap inside a program instead of alternating. Neither MMA
operand is in registers (the hazard kernels/wgmma_hazard.py finds in the frag kernel's register
operand cannot arise). The programs are (weight-row block, x-row block) x K splits; several splits
leave fp32 partials for common.reduce_splits.

Hopper (sm_90) only; Gluon is Triton's explicit-layout dialect, so its layouts are named here.
"""
from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, \
    warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from vsr.kernels import common, gemm

# The TMA load is async_copy_global_to_shared before Triton 3.9 and async_load from it (an alias:
# Triton 3.6's dependency hash resolves every attribute named in the source, a pruned branch's too).
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared

_GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}
# Warps of the unpacking partition (eight were within 4% of four on every 27B-class key at 16-256
# rows on an H100: benchmarks/results/ab-nvidia-h100-2026-12-06.json, "int4_wgmma_ws"), and the
# registers a thread of each worker partition keeps.
UNPACK_WARPS = 4
_LOADER_REGS = 24
_UNPACK_REGS = 160


@gluon.jit
def _load_partition(x_desc, q_desc, sc_ptr, zp_ptr, x_s, q_s, w_s, in_ready, in_empty, w_ready, w_empty, off_n,
                    off_m, kw_lo, steps, N, KG, GROUP):
    """Step i's x tile and words into ring slot i % STAGES once both readers released its last use."""
    STAGES: gl.constexpr = x_s.type.shape[0]
    W8: gl.constexpr = q_desc.block_type.shape[1]
    for i in range(steps):
        slot = i % STAGES
        mbarrier.wait(in_empty.index(slot), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(in_ready.index(slot), x_desc.block_type.nbytes + q_desc.block_type.nbytes)
        kw = kw_lo + i * W8
        _tma_load(x_desc, [off_m, kw * 8], in_ready.index(slot), x_s.index(slot))
        _tma_load(q_desc, [off_n, kw], in_ready.index(slot), q_s.index(slot))


@gluon.jit
def _unpack_symmetric(x_desc, q_desc, sc_ptr, zp_ptr, x_s, q_s, w_s, in_ready, in_empty, w_ready, w_empty, off_n,
                      off_m, kw_lo, steps, N, KG, GROUP):
    _unpack_steps(q_desc, sc_ptr, zp_ptr, x_s, q_s, w_s, in_ready, in_empty, w_ready, w_empty, off_n, kw_lo, steps,
                  N, KG, GROUP, False)


@gluon.jit
def _unpack_zero_points(x_desc, q_desc, sc_ptr, zp_ptr, x_s, q_s, w_s, in_ready, in_empty, w_ready, w_empty, off_n,
                        off_m, kw_lo, steps, N, KG, GROUP):
    _unpack_steps(q_desc, sc_ptr, zp_ptr, x_s, q_s, w_s, in_ready, in_empty, w_ready, w_empty, off_n, kw_lo, steps,
                  N, KG, GROUP, True)


@gluon.jit
def _pair_bf16(t, zz, ss):
    """(u_lo - zu)·s and (u_hi - zu)·s, each rounded once to bf16, of t holding u_lo in bits 0-3 and
    u_hi in bits 16-19: common.INT4_PAIR_PTX_BF16, int4._frag_pair_bf16's conversion. NVIDIA PTX."""
    return gl.inline_asm_elementwise(common.INT4_PAIR_PTX_BF16, "=h,=h,r,r,r", [t, zz, ss],
                                     dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=1)


@gluon.jit
def _pair_f16(t, zz, ss):
    """_pair_bf16 for fp16 (1024 + u in the f16x2 mantissas): common.INT4_PAIR_PTX_F16."""
    return gl.inline_asm_elementwise(common.INT4_PAIR_PTX_F16, "=h,=h,r,r,r", [t, zz, ss],
                                     dtype=(gl.float16, gl.float16), is_pure=True, pack=1)


@gluon.jit
def _unpack_steps(q_desc, sc_ptr, zp_ptr, x_s, q_s, w_s, in_ready, in_empty, w_ready, w_empty, off_n, kw_lo, steps,
                  N, KG, GROUP, HAS_ZP: gl.constexpr):
    """The unpacking partition (its two entries above: a worker partition's arguments are not
    constants): step i's words -> W_q in buffer i % 2, (u - zu)·s rounded once to x's dtype. With
    scales in x's dtype, by packed pairs (_pair_bf16 / _pair_f16: byte l of a word holds k = 2l and
    2l + 1, spread to bits 0-3 and 16-19 by one multiply); else in fp32, (u - zu) exactly through
    the mantissa of 2^23, times the fp32 scale, then one cast."""
    STAGES: gl.constexpr = x_s.type.shape[0]
    BN: gl.constexpr = q_desc.block_type.shape[0]
    W8: gl.constexpr = q_desc.block_type.shape[1]
    NW: gl.constexpr = gl.num_warps()
    PAIRS: gl.constexpr = sc_ptr.dtype.element_ty == w_s.dtype
    F16: gl.constexpr = w_s.dtype == gl.float16
    # Words: [BN, W8, 4 bytes] (pairs) or [BN, W8, 8 nibbles] with a thread's word in its
    # registers, so W_q reaches shared memory as 16-byte rows.
    unpack3: gl.constexpr = gl.BlockedLayout([1, 1, 4 if PAIRS else 8], [32 // W8, W8, 1], [NW, 1, 1], [2, 1, 0])
    words2: gl.constexpr = gl.SliceLayout(2, unpack3)
    rows1: gl.constexpr = gl.SliceLayout(1, words2)
    rn = gl.minimum(off_n + gl.arange(0, BN, layout=rows1), N - 1).to(gl.int64)   # rows past N: never stored
    sub = gl.arange(0, 4 if PAIRS else 8, layout=gl.SliceLayout(0, gl.SliceLayout(0, unpack3)))
    shifts = gl.expand_dims(gl.expand_dims(sub * (8 if PAIRS else 4), 0), 0).to(gl.uint32)
    s_nxt = gl.load(sc_ptr + rn * KG + (kw_lo * 8) // GROUP)
    if HAS_ZP:
        z_nxt = gl.load(zp_ptr + rn * KG + (kw_lo * 8) // GROUP)
    else:
        z_nxt = gl.full([BN], 8, gl.int32, rows1)
    for i in range(steps):
        slot = i % STAGES
        j = i % 2
        s_cur = s_nxt
        z_cur = z_nxt
        g_nxt = gl.minimum(((kw_lo + (i + 1) * W8) * 8) // GROUP, KG - 1)
        s_nxt = gl.load(sc_ptr + rn * KG + g_nxt)
        if HAS_ZP:
            z_nxt = gl.load(zp_ptr + rn * KG + g_nxt)
        mbarrier.wait(in_ready.index(slot), (i // STAGES) & 1)
        words = q_s.index(slot).load(words2)
        fence_async_shared()   # the read is ordered before the loader's next TMA write of the slot
        mbarrier.arrive(in_empty.index(slot))
        w32 = gl.expand_dims(words.to(gl.uint32, bitcast=True), 2)
        if PAIRS:
            t = (((w32 >> shifts) & 0xFF) * 0x1001).to(gl.int32, bitcast=True)
            # the zero point's and the scale's 16-bit patterns, each twice in an int32
            zz, ss = _pair_operands(gl.expand_dims(gl.expand_dims(s_cur, 1), 2),
                                    gl.expand_dims(gl.expand_dims(z_cur, 1), 2), F16)
            if F16:
                lo, hi = _pair_f16(t, zz, ss)
            else:
                lo, hi = _pair_bf16(t, zz, ss)
            wq = gl.join(lo, hi)
        else:
            u = ((w32 >> shifts) & 0xF).to(gl.int32, bitcast=True)
            uf = (u | 0x4B000000).to(gl.float32, bitcast=True) - 8388608.0
            zf = gl.expand_dims(gl.expand_dims(z_cur.to(gl.float32), 1), 2)
            sf = gl.expand_dims(gl.expand_dims(s_cur.to(gl.float32), 1), 2)
            wq = ((uf - zf) * sf).to(w_s.dtype)
        mbarrier.wait(w_empty.index(j), ((i // 2) & 1) ^ 1)
        w_s.index(j).store(gl.reshape(wq, [BN, W8 * 8]))
        fence_async_shared()   # the store is ordered before the MMA's read (the async proxy)
        mbarrier.arrive(w_ready.index(j))


@gluon.jit
def _mma_partition(x_s, w_s, in_ready, in_empty, w_ready, w_empty, steps, y_ptr, ws_ptr, bias_ptr, M, N,
                   stride_ym, off_m, off_n, pid_k, HAS_BIAS: gl.constexpr, SPLIT_K: gl.constexpr,
                   LAYOUT: gl.constexpr):
    """acc += W_q(i) · x(i)ᵀ with one MMA in flight; once step i - 1's MMA retired, its ring slot
    and W_q buffer are released. Then y (one split) or the split's fp32 partials."""
    STAGES: gl.constexpr = x_s.type.shape[0]
    BM: gl.constexpr = x_s.type.shape[1]
    BN: gl.constexpr = w_s.type.shape[1]
    acc = gl.zeros([BN, BM], gl.float32, LAYOUT)
    for i in range(steps):
        slot = i % STAGES
        j = i % 2
        mbarrier.wait(in_ready.index(slot), (i // STAGES) & 1)
        mbarrier.wait(w_ready.index(j), (i // 2) & 1)
        acc = warpgroup_mma(w_s.index(j), x_s.index(slot).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
        mbarrier.arrive(in_empty.index((i + STAGES - 1) % STAGES), pred=i > 0)
        mbarrier.arrive(w_empty.index((i + 1) % 2), pred=i > 0)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    _store_acc(acc, y_ptr, ws_ptr, bias_ptr, M, N, stride_ym, off_m, off_n, pid_k, HAS_BIAS, SPLIT_K)


@gluon.jit
def int4_wgmma_kernel(x_desc, q_desc, sc_ptr, zp_ptr, y_ptr, ws_ptr, bias_ptr, M, N, K8, KG, stride_ym, KW_SPLIT,
                      GROUP: gl.constexpr, HAS_ZP: gl.constexpr, HAS_BIAS: gl.constexpr, SPLIT_K: gl.constexpr,
                      STAGES: gl.constexpr, GROUP_M: gl.constexpr, UNPACK_WARPS: gl.constexpr,
                      LOADER_REGS: gl.constexpr, UNPACK_REGS: gl.constexpr):
    BM: gl.constexpr = x_desc.block_type.shape[0]
    BK: gl.constexpr = x_desc.block_type.shape[1]
    BN: gl.constexpr = q_desc.block_type.shape[0]
    W8: gl.constexpr = q_desc.block_type.shape[1]
    NW: gl.constexpr = gl.num_warps()
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BM, 16])

    off_m, off_n, pid_k, kw_lo, steps = _program_tile(M, N, K8, KW_SPLIT, BM, BN, W8, GROUP_M)

    x_s = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BM, BK], x_desc.layout)
    q_s = gl.allocate_shared_memory(gl.int32, [STAGES, BN, W8], q_desc.layout)
    w_s = gl.allocate_shared_memory(x_desc.dtype, [2, BN, BK],
                                    gl.NVMMASharedLayout.get_default_for([BN, BK], x_desc.dtype))
    in_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    in_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    w_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    w_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(in_ready.index(s), count=1)
        mbarrier.init(in_empty.index(s), count=2)   # released by the unpackers (words) and the MMA (x)
    for j in gl.static_range(2):
        mbarrier.init(w_ready.index(j), count=1)
        mbarrier.init(w_empty.index(j), count=1)
    fence_async_shared()

    worker_args = (x_desc, q_desc, sc_ptr, zp_ptr, x_s, q_s, w_s, in_ready, in_empty, w_ready, w_empty, off_n, off_m,
                   kw_lo, steps, N, KG, GROUP)
    # Two calls rather than a chosen function: Gluon takes a partition's function only as written.
    if HAS_ZP:
        gl.warp_specialize([(_mma_partition, (x_s, w_s, in_ready, in_empty, w_ready, w_empty, steps, y_ptr, ws_ptr,
                                              bias_ptr, M, N, stride_ym, off_m, off_n, pid_k, HAS_BIAS, SPLIT_K,
                                              acc_l)),
                            (_load_partition, worker_args), (_unpack_zero_points, worker_args)],
                           [1, UNPACK_WARPS], [LOADER_REGS, UNPACK_REGS])
    else:
        gl.warp_specialize([(_mma_partition, (x_s, w_s, in_ready, in_empty, w_ready, w_empty, steps, y_ptr, ws_ptr,
                                              bias_ptr, M, N, stride_ym, off_m, off_n, pid_k, HAS_BIAS, SPLIT_K,
                                              acc_l)),
                            (_load_partition, worker_args), (_unpack_symmetric, worker_args)],
                           [1, UNPACK_WARPS], [LOADER_REGS, UNPACK_REGS])


def max_registers(mma_warps: int, unpack_warps: int, programs: int = 1) -> int:
    """Registers a thread at launch: the register file (64K) shared by `programs` programs' MMA
    warps, unpacking warps and loader's warpgroup (register budgets are a warpgroup's), a multiple
    of 8."""
    return min(256, 65536 // (32 * (mma_warps + unpack_warps + 4) * programs)) // 8 * 8


def partition_registers(regs: int, mma_warps: int, loader_regs: int) -> int:
    """Registers a thread of each MMA warpgroup once the loader's warpgroup keeps `loader_regs` of the
    `regs` every warpgroup starts with (the MMA partitions share the rest evenly), a multiple of 8."""
    groups = mma_warps // 4
    return min(256, (regs * (groups + 1) - loader_regs) // groups) // 8 * 8


def words_descriptor(t, block: list[int]) -> TensorDescriptor:
    """A Gluon TMA descriptor of packed int4 words (gemm.weight_descriptor's `build`, which keeps it
    on the weight)."""
    return TensorDescriptor.from_tensor(t, block, gl.NVMMASharedLayout.get_default_for(block, gl.int32))


def launch(x, w, zp, bias, y, ws, tile: dict, k_split: int, split: int, cnt=None, glu=False) -> None:
    """y (one split; glu: SwiGLU of interleaved gate and up rows, an RS tile's) or ws's [split, M, N] fp32
    partials = x · W_qᵀ (+ bias with one split) through int4_wgmma_kernel, or int4_rs_kernel for a tile with RS
    (OCC: its programs a multiprocessor; PARTS: its MMA partitions); x [M, K] bf16/fp16 and w.packed with 16-byte
    aligned rows (TMA), w an int4.Int4Weight whose BLOCK_K divides its group, zp and bias its tensors or placeholders
    (int4.launch's). The caller adds the splits (common.reduce_splits) unless cnt (FIXUP counters) has the kernel."""
    M, K = x.shape
    N = w.N
    bm, bn, bk = tile["BLOCK_M"], tile["BLOCK_N"], tile["BLOCK_K"]
    dt = _GL_DTYPES[x.dtype]
    x_desc = TensorDescriptor.from_tensor(x, [bm, bk], gl.NVMMASharedLayout.get_default_for([bm, bk], dt))
    q_desc = gemm.weight_descriptor(w, w.packed, [bn, bk // 8], words_descriptor)
    nw = tile["num_warps"]
    if tile.get("RS"):
        parts = tile.get("PARTS", 1)
        if parts not in (1, 2) or glu and split > 1:
            raise ValueError(f"an RS tile runs its MMA warps as one partition or two (PARTS), GLU unsplit: {tile}")
        words, nbytes = rs_layouts(bn // parts, bk, nw, glu)
        regs, sc = max_registers(nw * parts, 0, tile.get("OCC", 1)), rs_scales(w, x.dtype)
        int4_rs_kernel[(triton.cdiv(M, bm) * triton.cdiv(N, bn), split)](
            x_desc, q_desc, sc, zp, y, ws, bias, ws if cnt is None else cnt, M, N, w.packed.shape[1],
            sc.stride(0), y.stride(0), k_split // 8, GROUP=w.group_size, HAS_ZP=w.zero_point is not None and sc is w.scale,
            HAS_BIAS=w.bias is not None and (split == 1 or cnt is not None), SPLIT_K=split, FIXUP=cnt is not None,
            STAGES=tile["num_stages"], GROUP_M=tile.get("GROUP_M", 8), LOADER_REGS=_LOADER_REGS, WORDS=words,
            BYTES=nbytes, PARTS=parts, MMA_REGS=partition_registers(regs, nw * parts, _LOADER_REGS) if parts > 1 else 0,
            GLU=glu, num_warps=nw, maxnreg=regs)
        return
    int4_wgmma_kernel[(triton.cdiv(M, bm) * triton.cdiv(N, bn), split)](
        x_desc, q_desc, w.scale, zp, y, ws, bias, M, N, w.packed.shape[1], w.scale.stride(0), y.stride(0),
        k_split // 8, GROUP=w.group_size, HAS_ZP=w.zero_point is not None, HAS_BIAS=w.bias is not None and split == 1,
        SPLIT_K=split, STAGES=tile["num_stages"], GROUP_M=tile.get("GROUP_M", 8), UNPACK_WARPS=UNPACK_WARPS,
        LOADER_REGS=_LOADER_REGS, UNPACK_REGS=_UNPACK_REGS, num_warps=nw, maxnreg=max_registers(nw, UNPACK_WARPS))


# Form "RS" (a tile's RS field): the MMA warps unpack the words into their MMAs' register operand, so W_q never
# passes through shared memory. Per K step of 64 at 128 x 128 the form above moves about 200 bytes a clock through
# it at the tensor cores' rate (ring, W_q stored and read back, both operands), more than its 128; this one 110.


@functools.cache   # per launch otherwise: two layout objects built on the host each call
def rs_layouts(bn: int, bk: int, warps: int, pairs: bool = False) -> tuple:
    """The packed words' register layouts of an RS program: ([BN, BK / 8] words as loaded, [BN, BK / 16, 2, 4]
    bytes), such that each thread holds byte l = lane % 4 of the words of its MMA fragment's rows and K columns:
    with byte l's two nibbles joined last and the tensor reshaped to [BN, BK], it is wgmma's register operand
    (DotOperandLayout(0, acc, k_width=2): k = 16c + 8h + 2l + e, rows lane / 4 and + 8 a warp's 16, warps 16 rows
    apart, then repeats), as laid out by Triton's linear layouts. BN a multiple of 16 x warps, BK of 16. With
    pairs, weight rows 2j and 2j + 1 load into the thread of fragment rows j and j + 8 (_glu_order)."""
    if bn % (16 * warps) or bk % 16 or warps & (warps - 1):
        raise ValueError(f"an RS tile gives each of its num_warps={warps} (a power of two) 16 of its "
                         f"BLOCK_N={bn} weight rows a step of BLOCK_K={bk} (a multiple of 16)")
    c_bits = [1 << i for i in range((bk // 16).bit_length() - 1)]
    n_reps = [16 * warps << i for i in range((bn // (16 * warps)).bit_length() - 1)]
    warp_rows = [16 << i for i in range(warps.bit_length() - 1)]
    r = {1: 2, 2: 4, 4: 8, 8: 1} if pairs else {}
    words = gl.DistributedLinearLayout(
        reg_bases=[[0, 1]] + [[0, 2 * c] for c in c_bits] + [[r.get(8, 8), 0]] + [[n, 0] for n in n_reps],
        lane_bases=[[0, 0], [0, 0]] + [[r.get(n, n), 0] for n in (1, 2, 4)], warp_bases=[[n, 0] for n in warp_rows],
        block_bases=[], shape=[bn, bk // 8])
    nbytes = gl.DistributedLinearLayout(
        reg_bases=[[8, 0, 0, 0], [0, 0, 1, 0]] + [[0, c, 0, 0] for c in c_bits] + [[n, 0, 0, 0] for n in n_reps],
        lane_bases=[[0, 0, 0, 1], [0, 0, 0, 2], [1, 0, 0, 0], [2, 0, 0, 0], [4, 0, 0, 0]],
        warp_bases=[[n, 0, 0, 0] for n in warp_rows], block_bases=[], shape=[bn, bk // 16, 2, 4])
    return words, nbytes


@gluon.jit
def _rs_mma_partition(sc_ptr, zp_ptr, x_s, q_s, in_ready, in_empty, steps, y_ptr, ws_ptr, bias_ptr, cnt_ptr, M, N,
                      KG, stride_ym, off_m, off_n, kw_lo, pid_k, GROUP: gl.constexpr, HAS_ZP: gl.constexpr,
                      HAS_BIAS: gl.constexpr, SPLIT_K: gl.constexpr, FIXUP: gl.constexpr, ACC: gl.constexpr,
                      WORDS: gl.constexpr, BYTES: gl.constexpr, ROW0: gl.constexpr, ROWS: gl.constexpr, GLU: gl.constexpr):
    """Step i: its words (ring slot i % STAGES) unpacked into W_q in registers, (u - zu)·s rounded once to x's
    dtype as _unpack_steps does; acc += W_q · x(i)ᵀ, retired within the step (the next step's unpacking writes
    registers, and ptxas, 12.8 and 13.4 alike, gave it those of a pending wgmma's register operand, which the
    wait's deps do not keep); then the slot is released, and the other partition (or program) unpacks while these
    MMAs run. Its weight rows: ROW0 .. ROW0 + ROWS of the tile (with GLU in _glu_order). Then _store_rs_acc."""
    STAGES: gl.constexpr = x_s.type.shape[0]
    BM: gl.constexpr = x_s.type.shape[1]
    BK: gl.constexpr = x_s.type.shape[2]
    BN: gl.constexpr = ROWS
    W8: gl.constexpr = BK // 8
    PAIRS: gl.constexpr = sc_ptr.dtype.element_ty == x_s.dtype or sc_ptr.dtype.element_ty == gl.int32
    F16: gl.constexpr = x_s.dtype == gl.float16
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=ACC, k_width=2)
    words3: gl.constexpr = gl.SliceLayout(3, BYTES)
    rows1: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, words3))
    off_n = off_n + ROW0
    rn = gl.minimum(off_n + _glu_rows(gl.arange(0, BN, layout=rows1), GLU), N - 1).to(gl.int64)   # past N: not stored
    lanes1: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(0, gl.SliceLayout(0, BYTES)))
    # prmt's selector taking byte l of a word into byte 0, zeros above: one instruction for a shift and a mask
    sel = gl.expand_dims(gl.expand_dims(gl.expand_dims(0x4440 + gl.arange(0, 4, layout=lanes1), 0), 0), 0)
    s_nxt = gl.load(sc_ptr + rn * KG + (kw_lo * 8) // GROUP)
    if HAS_ZP:
        z_nxt = gl.load(zp_ptr + rn * KG + (kw_lo * 8) // GROUP)
    else:
        z_nxt = gl.full([BN], 8, gl.int32, rows1)
    acc = gl.zeros([BN, BM], gl.float32, ACC)
    for i in range(steps):
        slot = i % STAGES
        s_cur = s_nxt
        z_cur = z_nxt
        g_nxt = gl.minimum(((kw_lo + (i + 1) * W8) * 8) // GROUP, KG - 1)
        s_nxt = gl.load(sc_ptr + rn * KG + g_nxt)
        if HAS_ZP:
            z_nxt = gl.load(zp_ptr + rn * KG + g_nxt)
        mbarrier.wait(in_ready.index(slot), (i // STAGES) & 1)
        words = gl.convert_layout(gl.reshape(_glu_order(q_s.index(slot).slice(ROW0, BN).load(WORDS), GLU),
                                             [BN, BK // 16, 2]), words3)
        fence_async_shared()   # the read is ordered before the loader's next TMA write of the slot
        b = _byte_of(gl.expand_dims(words, 3), sel)                                         # [BN, C, H, L]
        zc = gl.expand_dims(gl.expand_dims(gl.expand_dims(z_cur, 1), 2), 3)
        sc = gl.expand_dims(gl.expand_dims(gl.expand_dims(s_cur, 1), 2), 3)
        if PAIRS:
            t = (b * 0x1001).to(gl.int32, bitcast=True)
            # sc: the scale, or with rs_scales' words its bits and the zero point (zc then unused)
            zz, ss = _pair_operands(sc, zc, F16)
            if F16:
                lo, hi = _pair_f16(t, zz, ss)
            else:
                lo, hi = _pair_bf16(t, zz, ss)
        else:   # the exact u - zu in fp32, times the fp32 scale, then x's dtype
            bi = b.to(gl.int32, bitcast=True)
            zf = zc.to(gl.float32)
            sf = sc.to(gl.float32)
            lo = ((((bi & 0xF) | 0x4B000000).to(gl.float32, bitcast=True) - 8388608.0 - zf) * sf).to(x_s.dtype)
            hi = (((((bi >> 4) & 0xF) | 0x4B000000).to(gl.float32, bitcast=True) - 8388608.0 - zf) * sf).to(
                x_s.dtype)
        a = gl.convert_layout(gl.reshape(gl.join(lo, hi), [BN, BK]), a_l, assert_trivial=True)
        acc = warpgroup_mma(a, x_s.index(slot).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(in_empty.index(slot))
    _store_rs_acc(acc, y_ptr, ws_ptr, bias_ptr, cnt_ptr, M, N, stride_ym, off_m, off_n, pid_k, HAS_BIAS, SPLIT_K,
                  FIXUP, GLU)


@gluon.jit
def int4_rs_kernel(x_desc, q_desc, sc_ptr, zp_ptr, y_ptr, ws_ptr, bias_ptr, cnt_ptr, M, N, K8, KG, stride_ym, KW_SPLIT,
                   GROUP: gl.constexpr, HAS_ZP: gl.constexpr, HAS_BIAS: gl.constexpr, SPLIT_K: gl.constexpr,
                   FIXUP: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, LOADER_REGS: gl.constexpr,
                   WORDS: gl.constexpr, BYTES: gl.constexpr, PARTS: gl.constexpr, MMA_REGS: gl.constexpr,
                   GLU: gl.constexpr):
    """The RS form: int4_wgmma_kernel's programs, tile order and loader, with the MMA warps (16 weight rows each)
    unpacking their own operand: num_warps, or with PARTS = 2 as many again in a second partition, each BLOCK_N / 2
    of the rows; a partition's warps wait for each other every step, two partitions do not (_rs_mma_partition)."""
    BM: gl.constexpr = x_desc.block_type.shape[0]
    BK: gl.constexpr = x_desc.block_type.shape[1]
    BN: gl.constexpr = q_desc.block_type.shape[0]
    W8: gl.constexpr = q_desc.block_type.shape[1]
    NW: gl.constexpr = gl.num_warps()
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BM, 16])

    off_m, off_n, pid_k, kw_lo, steps = _program_tile(M, N, K8, KW_SPLIT, BM, BN, W8, GROUP_M)

    x_s = gl.allocate_shared_memory(x_desc.dtype, [STAGES, BM, BK], x_desc.layout)
    q_s = gl.allocate_shared_memory(gl.int32, [STAGES, BN, W8], q_desc.layout)
    in_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    in_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(in_ready.index(s), count=1)
        # released by each MMA partition (its words read, its MMA of x retired)
        mbarrier.init(in_empty.index(s), count=PARTS)
    fence_async_shared()

    # The loader's other arguments (the unpackers' and W_q's of the form above) are placeholders.
    loader_args = (x_desc, q_desc, sc_ptr, zp_ptr, x_s, q_s, x_s, in_ready, in_empty, in_ready, in_empty, off_n,
                   off_m, kw_lo, steps, N, KG, GROUP)
    ROWS: gl.constexpr = BN // PARTS
    # Each partition's arguments written out: Gluon takes a worker's constants only from a tuple
    # written at the call (a tuple held in a variable takes tensors only).
    if PARTS == 1:
        gl.warp_specialize([(_rs_mma_partition, (sc_ptr, zp_ptr, x_s, q_s, in_ready, in_empty, steps, y_ptr, ws_ptr,
                                                 bias_ptr, cnt_ptr, M, N, KG, stride_ym, off_m, off_n, kw_lo, pid_k,
                                                 GROUP, HAS_ZP, HAS_BIAS, SPLIT_K, FIXUP, acc_l, WORDS, BYTES, 0, ROWS,
                                                 GLU)),
                            (_load_partition, loader_args)],
                           [1], [LOADER_REGS])
    else:
        gl.warp_specialize([(_rs_mma_partition, (sc_ptr, zp_ptr, x_s, q_s, in_ready, in_empty, steps, y_ptr, ws_ptr,
                                                 bias_ptr, cnt_ptr, M, N, KG, stride_ym, off_m, off_n, kw_lo, pid_k,
                                                 GROUP, HAS_ZP, HAS_BIAS, SPLIT_K, FIXUP, acc_l, WORDS, BYTES, 0, ROWS,
                                                 GLU)),
                            (_rs_mma_partition, (sc_ptr, zp_ptr, x_s, q_s, in_ready, in_empty, steps, y_ptr, ws_ptr,
                                                 bias_ptr, cnt_ptr, M, N, KG, stride_ym, off_m, off_n, kw_lo, pid_k,
                                                 GROUP, HAS_ZP, HAS_BIAS, SPLIT_K, FIXUP, acc_l, WORDS, BYTES, ROWS,
                                                 ROWS, GLU)),
                            (_load_partition, loader_args)], [NW, 1], [MMA_REGS, LOADER_REGS])


@gluon.jit
def _program_tile(M, N, K8, KW_SPLIT, BM: gl.constexpr, BN: gl.constexpr, W8: gl.constexpr, GROUP_M: gl.constexpr):
    """This program's x-row and weight-row offsets, K split, first word and steps, in the tile order
    of both kernels: GROUP_M blocks of x's rows per weight-row block sweep (common.swizzle's)."""
    pid = gl.program_id(0)
    pid_k = gl.program_id(1)
    num_m = gl.cdiv(M, BM)
    num_n = gl.cdiv(N, BN)
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    gm = gl.minimum(num_m - first_m, GROUP_M)
    off_m = (first_m + (pid % width) % gm) * BM
    off_n = ((pid % width) // gm) * BN
    kw_lo = pid_k * KW_SPLIT
    steps = gl.cdiv(gl.minimum(kw_lo + KW_SPLIT, K8) - kw_lo, W8)
    return off_m, off_n, pid_k, kw_lo, steps


@gluon.jit
def _store_acc(acc, y_ptr, ws_ptr, bias_ptr, M, N, stride_ym, off_m, off_n, pid_k, HAS_BIAS: gl.constexpr,
               SPLIT_K: gl.constexpr):
    """acc [BN weight rows, BM x rows] into y (one split, with the bias) or the split's fp32 partials."""
    LAYOUT: gl.constexpr = acc.type.layout
    BN: gl.constexpr = acc.type.shape[0]
    BM: gl.constexpr = acc.type.shape[1]
    out_n = off_n + gl.arange(0, BN, layout=gl.SliceLayout(1, LAYOUT))
    out_m = off_m + gl.arange(0, BM, layout=gl.SliceLayout(0, LAYOUT))
    mask = (out_n[:, None] < N) & (out_m[None, :] < M)
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += gl.expand_dims(gl.load(bias_ptr + out_n, mask=out_n < N, other=0.0).to(gl.float32), 1)
        gl.store(y_ptr + out_m[None, :].to(gl.int64) * stride_ym + out_n[:, None], acc.to(y_ptr.dtype.element_ty),
                 mask=mask)
    else:
        gl.store(ws_ptr + pid_k.to(gl.int64) * M * N + out_m[None, :].to(gl.int64) * N + out_n[:, None], acc,
                 mask=mask)


# A barrier over the calling partition's warps: Gluon's thread_barrier on Triton 3.6, barrier on 3.9.
_partition_barrier = getattr(gl, "thread_barrier", None) or gl.barrier


@gluon.jit
def _store_rs_acc(acc, y_ptr, ws_ptr, bias_ptr, cnt_ptr, M, N, stride_ym, off_m, off_n, pid_k,
                  HAS_BIAS: gl.constexpr, SPLIT_K: gl.constexpr, FIXUP: gl.constexpr, GLU: gl.constexpr):
    """_store_acc's y or partials of an RS partition (with GLU _store_glu's y); with FIXUP the last of its
    tile's SPLIT_K splits to arrive then adds them up (_fixup)."""
    if GLU:
        _store_glu(acc, y_ptr, bias_ptr, M, N, stride_ym, off_m, off_n, HAS_BIAS)
    else:
        _store_acc(acc, y_ptr, ws_ptr, bias_ptr, M, N, stride_ym, off_m, off_n, pid_k, HAS_BIAS, SPLIT_K)
    if FIXUP:
        _fixup(y_ptr, ws_ptr, bias_ptr, cnt_ptr, M, N, stride_ym, off_m, off_n, HAS_BIAS, SPLIT_K,
               acc.type.shape[0], acc.type.shape[1])


@gluon.jit
def _fixup(y_ptr, ws_ptr, bias_ptr, cnt_ptr, M, N, stride_ym, off_m, off_n, HAS_BIAS: gl.constexpr,
           SPLIT_K: gl.constexpr, BN: gl.constexpr, BM: gl.constexpr):
    """common.last_to_finish and split_sum for the [BN weight rows, BM x rows] block at (off_n, off_m): the partition's
    partial stores ordered before one acq_rel arrival on the block's counter (one a block of BN rows: an RS tile's
    partitions count apart); the last of the SPLIT_K splits to arrive resets it to 0 and adds the partials s = 0 ..
    SPLIT_K - 1 in order, read from L2, then the bias, rounded once: splitk_reduce_kernel's sum, the same bytes
    whichever split arrives last. 4 x rows a warp at a time, weight rows on the lanes (the contiguous side)."""
    NW: gl.constexpr = gl.num_warps()
    CH: gl.constexpr = 4 * NW
    L: gl.constexpr = gl.BlockedLayout([BN // 32, 1], [32, 1], [1, NW], [0, 1])
    # A partition whose rows all lie past N stores nothing and takes no ticket: its counter would be
    # the next block of x rows' first (the index counts blocks of BN rows up to N).
    if off_n < N:
        _partition_barrier()
        cnt = cnt_ptr + (off_m // BM) * gl.cdiv(N, BN) + off_n // BN
        ticket = gl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT_K - 1:
            gl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")
            _partition_barrier()
            mn = gl.to_tensor(M).to(gl.int64) * N   # (M or N may arrive as a plain int: Triton specialises 1)
            out_n = off_n + gl.arange(0, BN, layout=gl.SliceLayout(1, L))
            n_ok = out_n < N
            if HAS_BIAS:
                b = gl.expand_dims(gl.load(bias_ptr + out_n, mask=n_ok, other=0.0).to(gl.float32), 1)
            for m0 in range(off_m, off_m + BM, CH):
                out_m = m0 + gl.arange(0, CH, layout=gl.SliceLayout(0, L))
                mask = n_ok[:, None] & (out_m[None, :] < M)
                part = ws_ptr + (out_m[None, :].to(gl.int64) * N + out_n[:, None])
                acc = gl.load(part, mask=mask, other=0.0, cache_modifier=".cg")
                for s in gl.static_range(1, SPLIT_K):
                    acc += gl.load(part + s * mn, mask=mask, other=0.0, cache_modifier=".cg")
                if HAS_BIAS:
                    acc += b
                gl.store(y_ptr + out_m[None, :].to(gl.int64) * stride_ym + out_n[:, None],
                         acc.to(y_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def _pair_operands(sc, zc, F16: gl.constexpr):
    """(zz, ss) for _pair_bf16 / _pair_f16: the u-domain zero point's and the scale's 16-bit patterns,
    each twice in an int32. sc [..] is the scale in x's dtype and zc the zero point, or sc is
    rs_scales' int32 word (the scale's bits | the zero point << 16) and zc is not read."""
    base: gl.constexpr = 0x64006400 if F16 else 0x43004300
    if sc.dtype == gl.int32:
        zz = base + (sc >> 16) * 0x10001
        ss = (sc & 0xFFFF) * 0x10001
    else:
        zz = base + zc * 0x10001
        ss = (sc.to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF) * 0x10001
    return zz, ss


def rs_scales(w, dtype: torch.dtype) -> torch.Tensor:
    """The scales an RS launch reads: w.scale, or for a weight with zero points and scales in x's
    dtype one int32 word a (row, group), the scale's 16 bits | the u-domain zero point << 16, so
    each K step gathers one word a row where it gathered two (with two, AWQ took 1.1-1.2x GPTQ's
    time on the same tile at 128 rows on an H100, and as much with every zero point 8:
    benchmarks/results/ab-nvidia-h100-2026-12-06.json). Made once a weight and kept on it (the
    zero points' bytes again), anew for a weight whose scales or zero points were replaced."""
    if w.zero_point is None or w.scale.dtype != dtype or dtype not in (torch.bfloat16, torch.float16):
        return w.scale
    key = (w.scale.data_ptr(), w.zero_point.data_ptr(), tuple(w.scale.shape))
    kept = w.__dict__.get("_rs_scale_zero")
    if kept is None or kept[0] != key:
        words = (w.scale.view(torch.int16).to(torch.int32) & 0xFFFF) | (w.zero_point << 16)
        kept = w.__dict__["_rs_scale_zero"] = (key, words.contiguous())
    return kept[1]


@gluon.jit
def _byte_of(w, sel):
    """prmt.b32 of w's bytes and zeros by sel (0x4440 + l: byte l of w, zero-extended), w [.., 1] and sel
    [1, .., L] broadcast: the RS form's byte of each word, where a shift and a mask took two
    integer instructions."""
    w, sel = gl.broadcast(w, sel)
    return gl.inline_asm_elementwise("prmt.b32 $0, $1, 0, $2;", "=r,r,r", [w, sel], dtype=gl.int32, is_pure=True,
                                     pack=1)


@gluon.jit
def _glu_rows(r, GLU: gl.constexpr):
    """The weight row (of the partition's) that fragment row r holds: r, or with GLU (_glu_order)
    16a + 2c + b for r = 16a + 8b + c (c < 8), so each thread holds a gate row and its up row."""
    if GLU:
        r = (r & -16) + 2 * (r & 7) + ((r >> 3) & 1)
    return r


@gluon.jit
def _glu_order(words, GLU: gl.constexpr):
    """words [BN, W8] as loaded (rs_layouts with pairs: weight row 16a + 2c + b in the thread of
    fragment row 16a + 8b + c) re-indexed by fragment row, which relabels registers and moves no data;
    words unchanged without GLU."""
    if GLU:   # (one return: Gluon types a function's every return, a pruned branch's too)
        BN: gl.constexpr = words.type.shape[0]
        W8: gl.constexpr = words.type.shape[1]
        words = gl.reshape(gl.permute(gl.reshape(words, [BN // 16, 8, 2, W8]), (0, 2, 1, 3)), [BN, W8])
    return words


@gluon.jit
def _store_glu(acc, y_ptr, bias_ptr, M, N, stride_ym, off_m, off_n, HAS_BIAS: gl.constexpr):
    """y[m, off_n / 2 + h] = silu(gate) · up of an RS partition's acc [BN, BM] whose rows are in
    _glu_order (gate row 2h in fragment row 16a + c, its up row in 16a + 8 + c, h = 8a + c: one
    thread's registers), with one split: each plus its bias and rounded to y's dtype, then
    common.store_glu_tile's SwiGLU (libdevice's exp, IEEE division; silu rounded before the product)."""
    BN: gl.constexpr = acc.type.shape[0]
    BM: gl.constexpr = acc.type.shape[1]
    dt: gl.constexpr = y_ptr.dtype.element_ty
    gate, up = gl.split(gl.reshape(gl.permute(gl.reshape(acc, [BN // 16, 2, 8, BM]), (0, 2, 3, 1)), [BN // 2, BM, 2]))
    L: gl.constexpr = gate.type.layout
    h = off_n // 2 + gl.arange(0, BN // 2, layout=gl.SliceLayout(1, L))
    m = off_m + gl.arange(0, BM, layout=gl.SliceLayout(0, L))
    if HAS_BIAS:
        gate += gl.expand_dims(gl.load(bias_ptr + 2 * h, mask=h < N // 2, other=0.0).to(gl.float32), 1)
        up += gl.expand_dims(gl.load(bias_ptr + 2 * h + 1, mask=h < N // 2, other=0.0).to(gl.float32), 1)
    g = gate.to(dt).to(gl.float32)
    silu = gl.div_rn(g, 1.0 + gl.extra.libdevice.exp(-g)).to(dt).to(gl.float32)
    gl.store(y_ptr + m[None, :].to(gl.int64) * stride_ym + h[:, None], (silu * up.to(dt).to(gl.float32)).to(dt),
             mask=(h[:, None] < N // 2) & (m[None, :] < M))
