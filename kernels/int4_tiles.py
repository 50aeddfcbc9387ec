"""The int4 W4A16 template's tile spaces and default tiles (int4.py's kernels, gemm_tiles.py's
fields): per row bucket the slices, join, GEMV, swap and split-K candidates that unpack in the
kernel, and from bucket 256 the dense template's tiles on a transient dequantized copy
("dequant", "dequant-tma", "dequant-sk"); the default tile first; and the tuner's pick groups.
"""
from __future__ import annotations

import torch

from vsr.kernels import common, gemm, gemm_tiles
from vsr.kernels.template import Problem


def _bk_choices(group: int) -> tuple[int, ...]:
    return tuple(b for b in (32, 64, 128, 256) if group % b == 0)


def _gemv_block_k(K: int) -> int:
    """The GEMV's K step: 1024 columns (128 words) where K allows, else K rounded up to a power of two."""
    return min(1024, max(64, common.next_pow2(K)))


def _gemv_tiles(p: Problem) -> list[dict]:
    """GEMV candidates around BLOCK_N 8, 128 words per step, 4 warps."""
    out = []
    for bn, bk, warps in ((8, 1024, 4), (8, 2048, 4), (16, 1024, 4), (8, 1024, 2), (4, 2048, 4), (4, 1024, 4),
                          (8, 512, 4), (16, 512, 4)):
        bk = min(bk, _gemv_block_k(p.K) * (2 if bk > 1024 else 1))
        for s in (1, 2, 4):
            if s == 1 or p.K // s >= bk:
                out.append(gemm_tiles.tile("gemv", 1, bn, bk, s, warps, 2))
    return out


def _dense_bytes(p: Problem) -> int:
    return 4 if p.act_dtype == torch.float32 else 2


def default_tile(p: Problem) -> dict:
    group = p.param("group", 128)
    bks = _bk_choices(group)
    if not bks:
        raise ValueError(f"int4 group size {group} has no BLOCK_K (32..256) that divides it")
    if p.bucket <= 128 and _slices_ok(p) and p.act_dtype != torch.float32:   # fp32 x: the other paths
        return slices_tiles(p)[0]
    if p.bucket == 1:
        # The mantissa-magic GEMV, 8 rows x 128 words per step, 4 warps: on the 27B-class shapes
        # about twice as fast as the split-K tile.
        bk = _gemv_block_k(p.K)
        split = gemm_tiles._split_for(1, p.N, p.K, 1, 8, bk, max_split=1 << 30, waves=4)
        return gemm_tiles.tile("gemv", 1, 8, bk, split, 4, 2)
    if p.bucket >= 256:
        # Large M: a transient dense copy multiplied on the tensor cores beats unpacking inside the
        # main loop (3x on qkv at 4096 rows); its tile is the dense template's default for the bucket.
        b = _dense_bytes(p)
        t = gemm_tiles.default_gemm_tile(p.bucket, p.N, p.K, b, b)
        return dict(t, path=_dequant_paths()[t["path"]])
    if p.act_dtype == torch.float32 and 64 in bks:
        # fp32 x, buckets 2..128: the transposed product, which wins most of the
        # MiniLM keys, where the split-K tile below takes a median 4.8x as long.
        small = p.bucket <= 16
        return gemm_tiles.tile("swap", 16 if small else 32, 128 if small else 64, 64, 2 if small else 1, 4, 3)
    # Buckets 2..128: split-K over tensor-core tiles (2x faster than the tiled form at M = 64).
    bk = max(b for b in bks if b <= 128) if any(b <= 128 for b in bks) else bks[0]
    bm = 16 if p.bucket <= 16 else 32 if p.bucket == 32 else 64
    bn = 64 if p.bucket <= 16 else 128
    split = gemm_tiles._split_for(p.bucket, p.N, p.K, bm, bn, bk, 16 if p.bucket <= 16 else 4,
                              waves=8 if p.bucket <= 16 else 2)
    return gemm_tiles.tile("splitk", bm, bn, bk, split, 4, 4)


def _dequant_paths() -> dict[str, str]:
    """Dense path -> the int4 path that multiplies a transient dense copy with it (int4.DENSE_PATH,
    which the launcher reads, inverted)."""
    from vsr.kernels import int4   # (it imports this module: not at its top)
    return {v: k for k, v in int4.DENSE_PATH.items()}


def _slices_ok(p: Problem) -> bool:
    """The slices path takes 128 columns (16 words, one MMA depth per nibble slice) per step inside
    one group. (Its tiles are candidates for fp32 x too; the default tile and the join path leave
    fp32 out themselves.)"""
    return p.param("group", 128) % 128 == 0


def slices_tiles(p: Problem) -> list[dict]:
    """Candidates of the slices path for buckets 1..128, the default first: x's rows on the MMA's
    narrow side (16-64), 64 or 128 weight rows, the split that gives 2-8 waves of programs."""
    bm = min(64, max(16, p.bucket))
    out = []
    # 2 warps with 64 weight rows: Triton builds mma.sync there, not wgmma (which waits after each
    # of the step's eight products, operand A being in registers); offered at buckets <= 16, where
    # it can win (7% on qkv at M = 1).
    for bn, warps, stages, waves in ((64 if p.bucket <= 16 else 128, 4, 3, 4), (64, 2, 3, 4), (128, 4, 3, 4),
                                     (64, 4, 3, 4), (128, 4, 4, 2), (128, 4, 3, 8), (64, 4, 4, 8), (64, 4, 3, 2),
                                     (128, 4, 4, 4)):
        if warps == 2 and p.bucket > 16:
            continue
        t = gemm_tiles.tile("slices", bm, bn, 128, gemm_tiles._split_for(p.bucket, p.N, p.K, bm, bn, 128, 16, waves=waves),
                        warps, stages)
        if t not in out:
            out.append(t)
    # The first two with the in-kernel fixup where they split K (2-7% faster at M = 16 on AWQ qkv and down).
    out += [dict(t, FIXUP=1) for t in out[:2] if t["SPLIT_K"] > 1]
    # x read as stored (X_SPLIT), no slice-order copy: at buckets 8-16 the default in that form, for
    # the tuner to take where it wins (it ranges from 10% faster to 20% slower by shape). At bucket 1
    # (one row in place, X_ROW) every tile in that form, first, the default among them (13-18%
    # faster on qkv, o and down). At buckets 2 and 4 every tile in that form after the others (at
    # M = 2 X_ROW, two rows in place on 16-row tiles: 3-16% less time; 32-row X_ROW tiles, four rows
    # in place, gain nothing, so none is offered).
    if p.bucket == 1:
        return [dict(t, X_SPLIT=1) for t in out] + out
    if p.bucket <= 4:
        return out + [dict(t, X_SPLIT=1) for t in out]
    if p.bucket <= 16:
        out.append(dict(out[0], X_SPLIT=1))
    return out


def _join_tiles(p: Problem) -> list[dict]:
    """Candidates of the join path from bucket 16: its SCALE_W tiles (_scaled_join_tiles) and, up to
    bucket 256, tiles of the form that scales each step's fp32 product. At 16..128 these take the
    slices path's row blocks; at 128 and 256 also all 128 rows of a block on two warpgroups (on 4
    warps the fp32 accumulator alone takes 128 registers a thread). Above bucket 256 the join tiles
    of 64-128 weight rows lose to the transient dense copy (1.2-2.5x its time), so only those of
    256 weight rows are offered there (_WIDE_JOIN: one pass over the packed weights, where the dense
    copy writes and then reads a 16-bit copy four times their size); below 16 every join tile
    loses to the slices path. The joined operand also passes through shared memory (BN x BK x 2 bytes per stage,
    which the shared-memory estimate leaves out): a tile too large fails to compile and the tuner
    skips it."""
    if p.bucket < 16 or not _slices_ok(p) or p.act_dtype == torch.float32:
        return []
    if p.bucket > 256:
        return _wide_join_tiles(p)
    scaled = _scaled_join_tiles(p)
    wide = [gemm_tiles.tile("join", 128, 128, 128, gemm_tiles._split_for(p.bucket, p.N, p.K, 128, 128, 128, 8, waves=2),
                        8, 3)] if p.bucket >= 128 else []
    if p.bucket == 256:
        return wide + scaled
    bm = min(64, p.bucket)
    # 64 weight rows on 4 warps; 3 stages and 8 waves first (the best join tile at M = 64-128 on
    # the 27B-class shapes), 4 stages and 4 waves at M = 16. Deeper pipelines, 16 waves, 128 weight
    # rows and mma.sync forms (2 warps or 32 weight rows) lose. FIXUP (the splits added by each
    # tile's last program, no reduction kernel) is 4-10% faster at M = 16 with the same split, and
    # at M = 64 with half the split.
    out = []
    for stages, waves, fixup in ((3, 8, 0), (3, 4, 1), (3, 8, 1), (4, 4, 0), (3, 2, 1)):
        t = gemm_tiles.tile("join", bm, 64, 128, gemm_tiles._split_for(p.bucket, p.N, p.K, bm, 64, 128, 16, waves=waves),
                        4, stages)
        if fixup and t["SPLIT_K"] > 1:
            t["FIXUP"] = 1
        if t not in out:
            out.append(t)
    return out + wide + scaled


# Join tiles with the group scale on the weight tile (SCALE_W) per bucket: (rows of x, weight rows,
# warps, stages, waves). The weight rows are the MMA's M side (64 a warpgroup), x's rows its N side
# (up to 256). Shared memory per stage: x's BLOCK_K x BLOCK_M tile and the packed words; 256 rows
# of x at 8 warps hold a 128 x 256 fp32 accumulator (128 registers a thread). At bucket 256 a
# sampled pick of 20 sees three of the four: the likeliest first and last.
# The 256 x 128 tile runs 2 stages, not 3: at 3 stages (222,208 bytes of shared memory, 254
# registers) Triton 3.6's kernel with zero points (AWQ) gives wrong, varying outputs on the H200
# whenever K is split (benchmarks/tile_check.py), though it passes with one split or without zero
# points. The cause is not known; the 2-stage tile passes everywhere.
_SCALED_JOIN = {64: ((64, 64, 4, 3, 8), (64, 64, 4, 4, 4), (64, 128, 8, 3, 4), (64, 128, 4, 3, 4)),
                128: ((64, 64, 4, 3, 8), (128, 128, 8, 3, 2), (128, 64, 4, 3, 4), (64, 128, 8, 4, 4)),
                256: ((128, 128, 8, 4, 2), (128, 64, 4, 4, 2), (256, 64, 4, 3, 2), (256, 128, 8, 2, 1))}


# SCALE_W join tiles of 256 weight rows at BLOCK_K 64, per bucket: (rows of x, warps, stages, waves).
# A join program reads its rows of x whole for each block of weight rows, so x crosses from L2
# M x K x 2 bytes x N / BLOCK_N in all: on the 27B-class gate_up at 256 rows, 1.43 GB with 64
# weight rows and 356 MB with 256, against 1.07 GB of x and weights together for BF16's 128 x 256
# tile. At BLOCK_K 64 these hold their accumulator and joined operand in registers (sm_90, Triton
# 3.9: 100-220 a thread on 8 warps, about 120 on 16, no stack), where the same tiles at BLOCK_K 128
# or without SCALE_W spill. Bucket 64 holds 64 rows of x, 128 and 256 hold 128 (and at 128 also
# 64, twice the programs at half the registers).
_WIDE_JOIN = {64: ((64, 8, 3, 4),), 128: ((128, 8, 2, 2), (128, 8, 3, 2), (128, 16, 3, 2), (64, 8, 3, 2)),
              256: ((128, 8, 2, 2), (128, 8, 3, 2), (128, 16, 3, 2))}


def _wide_join_tiles(p: Problem) -> list[dict]:
    """_WIDE_JOIN's tiles for the bucket (from 256 rows, 256's) where the group takes BLOCK_K 64."""
    if p.param("group", 128) % 64:
        return []
    rows = 64 if p.bucket <= 64 else min(p.bucket, 256)
    return _join_forms(p, [(bm, 256, 64, warps, stages, waves) for bm, warps, stages, waves in _WIDE_JOIN[rows]])


def _scaled_join_tiles(p: Problem) -> list[dict]:
    """Join tiles with SCALE_W (the group scale multiplying the weight tile, not each step's fp32
    product), for buckets 16..256: the join form whose wgmmas Triton keeps in flight across K steps,
    so the nibble conversion overlaps the tensor cores. Buckets 16-32 take 64's tiles. The 256
    weight rows of _WIDE_JOIN come first."""
    rows = 64 if p.bucket <= 64 else p.bucket
    return _wide_join_tiles(p) + _join_forms(p, [(bm, bn, 128, warps, stages, waves)
                                                 for bm, bn, warps, stages, waves in _SCALED_JOIN[rows]])


def _join_forms(p: Problem, forms: list[tuple]) -> list[dict]:
    """SCALE_W join tiles of (rows of x, weight rows, BLOCK_K, warps, stages, waves), the rows of x
    at most the bucket's (at least 16), each split to give about `waves` waves."""
    out = []
    for bm, bn, bk, warps, stages, waves in forms:
        bm = min(bm, max(16, p.bucket))
        t = gemm_tiles.tile("join", bm, bn, bk, gemm_tiles._split_for(p.bucket, p.N, p.K, bm, bn, bk, 16, waves=waves),
                            warps, stages)
        t["SCALE_W"] = 1
        if t not in out:
            out.append(t)
    return out


# Tiles of the frag path per bucket: (rows of x, weight rows, BLOCK_K, warps, stages). A warpgroup
# takes 64 weight rows: with fewer warps than BLOCK_N / 16 Triton reaches the MMA's layout through
# shared memory again, so every tile has at least that many. All compile on sm_90 (Triton 3.6 and
# 3.9) with no stack and no shared-memory store of the operand. Left out: the forms that give wrong,
# run-to-run different outputs on the H200 without int4.mma_wait (Triton 3.6, 27B shapes at 64-1024
# rows), with or without zero points and split K alike: 128 x 128 weight rows on 8 warps (BLOCK_K 64
# and 128), 256 x 128 on 8 warps, 256 x 64 x 64 on 4 warps and 64 x 256 on 16 warps. Their SASS
# writes the operand of a wgmma in flight (kernels/wgmma_hazard.py; triton-lang/triton#9433), as
# every frag form's does under Triton 3.6-3.8 without the wait; with it they are untimed.
_FRAG = {16: ((16, 64, 128, 4, 4), (16, 128, 128, 8, 4)),
         32: ((32, 64, 128, 4, 4), (32, 128, 128, 8, 4)),
         64: ((64, 64, 128, 4, 3), (64, 64, 128, 4, 4), (64, 128, 128, 8, 4)),
         128: ((128, 64, 128, 4, 3), (128, 256, 64, 16, 3), (128, 64, 128, 4, 4)),
         256: ((256, 64, 128, 8, 3), (128, 256, 64, 16, 3), (128, 64, 128, 4, 3)),
         # above 256 rows, against the transient dense copy: 256 weight rows first, since each
         # program reads its rows of x whole once per block of weight rows
         512: ((128, 256, 64, 16, 3), (256, 64, 128, 8, 3))}


def _frag_tiles(p: Problem) -> list[dict]:
    """Candidates of the frag path (int4._int4_frag_kernel) from bucket 16 for half-precision x:
    _FRAG's tiles of the bucket (above 256 rows, 512's, against the transient dense copy), each
    split to give about four waves of programs. BLOCK_K must divide the group: a form whose
    BLOCK_K does not takes the largest power of two from 16 that does."""
    group = p.param("group", 128)
    if p.bucket < 16 or p.act_dtype == torch.float32 or group % 16:
        return []
    out = []
    for bm, bn, bk, warps, stages in _FRAG[min(p.bucket, 512)]:
        while group % bk:
            bk //= 2
        bm = min(bm, p.bucket)
        t = gemm_tiles.tile("frag", bm, bn, bk, gemm_tiles._split_for(p.bucket, p.N, p.K, bm, bn, bk, 16, waves=4),
                            warps, stages)
        if t not in out:
            out.append(t)
    return out


def _frag_programs_per_sm(t: dict) -> int:
    """Programs of a frag tile a multiprocessor holds: its pipeline's stages of x's tile (half
    precision) and the packed words in shared memory, at most 16 warps of them."""
    return max(1, min(gemm_tiles.SMEM_LIMIT // (gemm_tiles.smem_bytes(t, 2, 0.5) + 2048), 16 // t["num_warps"]))


def _tail_tiles(p: Problem, tiles: list[dict], per_sm=_frag_programs_per_sm, sms: int = gemm_tiles.SMS
                ) -> list[dict]:
    """Each whole-K tile (SPLIT_K 1: a split tile's grid is sized by its split) whose last wave of
    programs (per_sm(tile) a multiprocessor) is under half full, with that wave's blocks of weight
    rows launched apart, K split 8 or 16 ways (int4._launch_tail: TAIL_TILES, TAIL_SPLIT), so they
    spread over every multiprocessor instead of running on a few while the rest idle. On the H200,
    gate|up's frag tile at 128 rows (544 programs, two a multiprocessor: 2.06 waves) took 113-115 us
    against 126.9 (benchmarks/results/ab-nvidia-h200-2026-12-06.json, "int4_tail_split")."""
    out = []
    for t in tiles:
        if t["SPLIT_K"] != 1:
            continue
        per = common.cdiv(p.bucket, t["BLOCK_M"])
        blocks = common.cdiv(p.N, t["BLOCK_N"])
        slots = sms * per_sm(t)
        last = blocks * per % slots
        if blocks * per < slots or not 0 < last < slots / 2:
            continue
        tail = blocks - (blocks * per - last) // per
        out += [dict(t, TAIL_TILES=tail, TAIL_SPLIT=s) for s in (8, 16) if p.K // s >= 2 * t["BLOCK_K"]]
    return out


# The wgmma path's forms (int4_wgmma.py: warp-specialised, one program a multiprocessor) by bucket,
# as (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages): x's rows on the MMA's narrow side, one MMA
# warpgroup. 128 weight rows x 128 x rows at 128 and 256 rows; 64 weight rows x 256 x rows (m64n256
# MMAs, half the unpacking an MMA of the first) at 256 and 512 rows, where it was 1.3-1.8x and
# 1.0-1.3x the shipped tiles on the four 27B-class shapes (an H100,
# benchmarks/results/ab-nvidia-h100-2026-12-06.json, "int4_wgmma_ws_256"). Below 128 rows frag's
# tiles were faster on every 27B-class shape; from 1,024 the dequantizing paths, by 1.0-1.4x, also
# against two MMA warpgroups of 128 x 256 (the same record).
_WGMMA = {128: ((128, 128, 64, 4, 4),), 256: ((256, 64, 64, 4, 4), (128, 128, 64, 4, 4)),
          512: ((256, 64, 64, 4, 4),)}
# The RS form (int4_wgmma.int4_rs_kernel: the MMA warps unpack into their register operand, 16
# weight rows a warp; no W_q round trip through shared memory), by bucket, as (BLOCK_M, BLOCK_N,
# BLOCK_K, warps, stages, programs a multiprocessor, MMA partitions): so that one warpgroup unpacks
# while another's MMAs run (each retires its MMAs every step), two warpgroups of one program (which
# wait for each other every step), two partitions of one program sharing x's tiles (which do not),
# or one warpgroup in each of two programs. At 128 rows also 256 weight rows on two partitions (128
# a warpgroup: two m64 MMAs a K step on one x tile, whose bytes are 4x the packed words' at 64 weight
# rows, so the L2 serves half as much) and BLOCK_K 128 (one scale group a step: half the ring waits,
# barriers and MMA drains): on an H100 the first took 0.77-0.98x the time of the forms above on six
# of the eight 27B-class keys, and the second 0.65-0.97x that of the first's picks on all eight;
# neither was faster at 256 rows (benchmarks/results/ab-nvidia-h100-2026-12-07.json). At 1,024 and
# 2,048 rows 256 x rows x 128 weight rows on two partitions (m64n256 MMAs), whose MMAs outlast the
# other partition's unpacking: 0.86-0.97x the transient dense copy's time on the four 27B-class
# keys, the three below the fastest on every one (the same record, "int4_rs_large_m").
_LARGE_M_RS = ((256, 128, 128, 4, 3, 1, 2), (256, 128, 128, 4, 2, 1, 2), (256, 128, 64, 4, 4, 1, 2))
_WGMMA_RS = {64: ((64, 128, 64, 8, 4, 1, 1), (64, 128, 64, 4, 4, 1, 2), (64, 64, 64, 4, 4, 2, 1)),
             128: ((128, 128, 64, 8, 4, 1, 1), (128, 128, 64, 4, 4, 1, 2), (128, 64, 64, 4, 4, 2, 1),
                   (128, 256, 64, 4, 4, 1, 2), (128, 128, 128, 4, 3, 1, 2), (128, 256, 128, 4, 3, 1, 2),
                   (128, 64, 128, 4, 2, 2, 1)),
             256: ((128, 128, 64, 8, 4, 1, 1), (128, 128, 64, 4, 4, 1, 2), (256, 128, 64, 4, 3, 1, 2),
                   (256, 64, 64, 4, 4, 1, 1)),
             1024: _LARGE_M_RS, 2048: _LARGE_M_RS}


def _whole_wave_splits(programs: int, K: int, bk: int, sms: int = gemm_tiles.SMS) -> list[int]:
    """K splits (1-8, at least 4 steps a split) for `sms` programs a wave (one a multiprocessor by
    default; the multiprocessors times their programs for a form that runs several): the fewest whose
    programs fill 85% of their last wave (a partial last wave idles the rest; every split adds a
    pass over fp32 partials), and up to two others of at most 4 that fill 75% of it."""
    def fill(s):
        return programs * s / sms / -(-programs * s // sms)
    splits = [s for s in range(1, 9) if K // s >= 4 * bk] or [1]
    first = next((s for s in splits if fill(s) >= 0.85), max(splits, key=fill))
    return sorted([first] + [s for s in splits if s <= 4 and s != first and fill(s) >= 0.75][:2])


def _wgmma_tiles(p: Problem) -> list[dict]:
    """Candidates of the wgmma path (Hopper only: the launcher refuses it elsewhere) at _WGMMA's and
    _WGMMA_RS's buckets for half-precision x where BLOCK_K divides the group and K allows TMA rows
    of x and the packed words (the launcher's gemm.tma_aligned); K splits for whole waves of the
    form's programs a multiprocessor. The RS forms' split tiles also with FIXUP (the last split adds
    the partials in the kernel: no reduction kernel, whose launch and pass over the partials a
    1x128 int4 forward spends about 1 ms on, 192 of them), and whole-K with a tail (_tail_tiles)
    where their last wave is nearly empty: a split doubles or triples the fp32 partials the
    reduction reads, which on gate|up at 128 rows (35.7 MB at two splits against an 8.9 MB output)
    outweighs the wave it fills."""
    if p.act_dtype == torch.float32 or not gemm.tma_aligned(p.K, 2, 0.5):
        return []
    forms = [(f, {}, 1) for f in _WGMMA.get(p.bucket, ())] + \
        [(f[:5], {"RS": 1, **({"OCC": f[5]} if f[5] > 1 else {}), **({"PARTS": f[6]} if f[6] > 1 else {})}, f[5])
         for f in _WGMMA_RS.get(p.bucket, ())]
    forms = [f for f in forms if p.param("group", 128) % f[0][2] == 0]
    split = [dict(gemm_tiles.tile("wgmma", bm, bn, bk, s, warps, stages), **fields)
             for (bm, bn, bk, warps, stages), fields, occ in forms
             for s in _whole_wave_splits(common.cdiv(p.N, bn) * common.cdiv(p.bucket, bm), p.K, bk,
                                         gemm_tiles.SMS * occ)]
    if p.bucket > 256:   # the large-M forms: their split tiles only (FIXUP and tails untimed there)
        return split
    whole = [dict(gemm_tiles.tile("wgmma", bm, bn, bk, 1, warps, stages), **fields)
             for (bm, bn, bk, warps, stages), fields, occ in forms if fields.get("RS")]
    fixup = [dict(t, FIXUP=1) for t in split if t.get("RS") and t["SPLIT_K"] > 1]
    return split + fixup + _tail_tiles(p, whole, per_sm=lambda t: t.get("OCC", 1))


def _swap_tiles(p: Problem, bks: tuple[int, ...]) -> list[dict]:
    """Candidates of the transposed ("swap") product for buckets 2..128, the likeliest first (rows as
    narrow as the bucket, 128 weight rows, the split that fills the machine): a short sweep's
    strided pick always takes it, as the space's second tile."""
    bk_opts = [b for b in bks if b in (64, 128)] or [max(b for b in bks if b <= 128)]
    bm0 = min(64, max(16, p.bucket))
    first = gemm_tiles.tile("swap", bm0, 128, bk_opts[-1],
                        gemm_tiles._split_for(p.bucket, p.N, p.K, bm0, 128, bk_opts[-1], 16, waves=4), 4, 3)
    out = [first]
    for bm in (16, 32, 64):
        if bm > max(16, p.bucket):
            continue
        for bn in (64, 128):
            for bk in bk_opts:
                for split in (1, 2, 4, 8):
                    t = gemm_tiles.tile("swap", bm, bn, bk, split, 4, 3)
                    if p.K // split >= bk and t not in out:
                        out.append(t)
    return out


def _interleave(a: list, b: list) -> list:
    """a[0], b[0], a[1], b[1], ...: a strided pick then sees both lists."""
    out = []
    for i in range(max(len(a), len(b))):
        out += a[i:i + 1] + b[i:i + 1]
    return out


def search_space(p: Problem) -> list[dict]:
    bks = _bk_choices(p.param("group", 128))
    d = default_tile(p)
    mma = gemm_tiles.gemm_space(p.bucket, p.N, p.K, 2, 0.5, d, bk_choices=bks, tma=False)[1:]
    slices = slices_tiles(p) if p.bucket <= 128 and _slices_ok(p) else []
    frag = _frag_tiles(p)
    frag += _tail_tiles(p, frag) if p.bucket <= 256 else []   # above, the dequantizing paths win
    if p.bucket == 1:
        rest = _interleave(slices, _gemv_tiles(p) + mma)
    elif p.bucket >= 256:
        b = _dense_bytes(p)
        dequant = _dequant_paths()
        rest = [dict(t, path=dequant[t["path"]]) for t in gemm_tiles.gemm_space(p.bucket, p.N, p.K, b, b, d)[1:]
                if t["path"] in dequant] + _wgmma_tiles(p) + mma[:4] + _interleave(frag, _join_tiles(p))
    else:
        rest = _interleave(_wgmma_tiles(p), _interleave(_interleave(_interleave(frag, slices),
                                                                    _join_tiles(p)),
                                                        _interleave(_swap_tiles(p, bks), mma)))
    out, seen = [d], {tuple(sorted(d.items()))}
    for t in rest:
        key = tuple(sorted(t.items()))
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


def pick_group(tile: dict):
    """The tuner's pick group of an int4 tile (Template.pick_group): its path, with SCALE_W join tiles
    (those of 256 weight rows apart) and X_SPLIT slices tiles in groups of their own (kernel forms
    that few tiles stand for); the dequantizing paths' tiles as gemm_tiles groups them."""
    if tile.get("SCALE_W"):
        return tile.get("path"), "scale-w-256" if tile.get("BLOCK_N") == 256 else "scale-w"
    if tile.get("X_SPLIT"):
        return tile.get("path"), "x-split"
    return gemm_tiles.pick_group(tile)
