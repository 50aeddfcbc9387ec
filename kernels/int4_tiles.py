"""The int4 W4A16 template's tile spaces and default tiles (int4.py's kernels, gemm_tiles.py's
fields): per row bucket the slices, join, GEMV, swap and split-K candidates that unpack in the
kernel, and from bucket 256 the dense template's tiles on a transient dequantized copy
("dequant", "dequant-tma", "dequant-sk"); the default tile first; and the tuner's pick groups.
"""
from __future__ import annotations

import torch

from vsr.kernels import common, gemm_tiles
from vsr.kernels.template import Problem


def _bk_choices(group: int) -> tuple[int, ...]:
    return tuple(b for b in (32, 64, 128, 256) if group % b == 0)


def dequant_block_k(group: int) -> int:
    """The dequantization kernel's K step: the largest power of two up to 256 that divides the group."""
    return next(b for b in (256, 128, 64, 32, 16, 8) if group % b == 0)


def _gemv_block_k(K: int) -> int:
    """The GEMV's K step: 1024 columns (128 words) where K allows, else K rounded up to a power of two."""
    return min(1024, max(64, common.next_pow2(K)))


def _gemv_tiles(p: Problem) -> list[dict]:
    """GEMV candidates around the run-5 winners (BLOCK_N 8, 128 words per step, 4 warps)."""
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
        # H200 (run 5): the mantissa-magic GEMV, 8 rows x 128 words per step, 4 warps, took
        # 1.2-1.35x cuBLAS on the 27B shapes, against 0.54-0.93x for the split-K tile.
        bk = _gemv_block_k(p.K)
        split = gemm_tiles._split_for(1, p.N, p.K, 1, 8, bk, max_split=1 << 30, waves=4)
        return gemm_tiles.tile("gemv", 1, 8, bk, split, 4, 2)
    if p.bucket >= 256:
        # Large M: a transient dense copy multiplied on the tensor cores beats unpacking inside
        # the main loop (H200, qkv, M=4096: 0.67x cuBLAS against 0.22x); the dense tile is the
        # dense template's own default for the bucket (TMA where the strides allow).
        b = _dense_bytes(p)
        t = gemm_tiles.default_gemm_tile(p.bucket, p.N, p.K, b, b)
        return dict(t, path=_DEQUANT_PATH[t["path"]])
    if p.act_dtype == torch.float32 and 64 in bks:
        # fp32 x (IEEE products), buckets 2..128: the transposed product won most of the MiniLM
        # keys of the H200 re-tune of run 11 (NOTES run 11), where the split-K tile below took a
        # median 4.8x (up to 37x) as long. (The cache shipped after run 15: 32 of these 42 keys
        # swap, 8 slices, 2 split-K.)
        small = p.bucket <= 16
        return gemm_tiles.tile("swap", 16 if small else 32, 128 if small else 64, 64, 2 if small else 1, 4, 3)
    # Buckets 2..128: split-K over tensor-core tiles (measured 2x faster than the tiled
    # form at M=64; the dense and fp8 templates go tiled from bucket 32).
    bk = max(b for b in bks if b <= 128) if any(b <= 128 for b in bks) else bks[0]
    bm = 16 if p.bucket <= 16 else 32 if p.bucket == 32 else 64
    bn = 64 if p.bucket <= 16 else 128
    split = gemm_tiles._split_for(p.bucket, p.N, p.K, bm, bn, bk, 16 if p.bucket <= 16 else 4,
                              waves=8 if p.bucket <= 16 else 2)
    return gemm_tiles.tile("splitk", bm, bn, bk, split, 4, 4)


_DEQUANT_PATH = {"tma": "dequant-tma", "tma-sk": "dequant-sk", "tiled": "dequant"}
_DENSE_PATH = {v: k for k, v in _DEQUANT_PATH.items()}


def dense_tile(tile: dict) -> dict | None:
    """The dense template's tile that a large-M path ("dequant", "dequant-tma", "dequant-sk")
    multiplies its transient dense copy with (the same tile on "tiled", "tma" or "tma-sk"); None
    for the paths that unpack in the kernel."""
    path = _DENSE_PATH.get(tile.get("path"))
    return None if path is None else dict(tile, path=path)


def _slices_ok(p: Problem) -> bool:
    """The slices path takes 128 columns (16 words, one MMA depth per nibble slice) per step inside
    one group. (Its tiles are candidates for fp32 x too, and the shipped H200 cache holds fp32 keys
    they won; the default tile, which takes another path for fp32 x, and the join kernel, which
    refuses fp32 x, leave fp32 out themselves.)"""
    return p.param("group", 128) % 128 == 0


def slices_tiles(p: Problem) -> list[dict]:
    """Candidates of the slices path for buckets 1..128, the default first: x's rows on the MMA's
    narrow side (16-64), 64 or 128 weight rows, the split that gives 2-8 waves of programs. The
    first is run 11's best on qkv/o at M=1-16 (BN 64) and M=64-128 (BN 128), 3 stages."""
    bm = min(64, max(16, p.bucket))
    out = []
    # 2 warps with 64 weight rows: Triton builds mma.sync there, not wgmma (which waits after each
    # of the step's eight products, operand A being in registers); run 12: 0.93x the default's
    # time on qkv at M=1, the same on down (measured at M <= 16 only; the run-12 re-tune picked
    # it for no 27B-class key), so it is offered at buckets <= 16 only.
    for bn, warps, stages, waves in ((64 if p.bucket <= 16 else 128, 4, 3, 4), (64, 2, 3, 4), (128, 4, 3, 4),
                                     (64, 4, 3, 4), (128, 4, 4, 2), (128, 4, 3, 8), (64, 4, 4, 8), (64, 4, 3, 2),
                                     (128, 4, 4, 4)):
        if warps == 2 and p.bucket > 16:
            continue
        t = gemm_tiles.tile("slices", bm, bn, 128, gemm_tiles._split_for(p.bucket, p.N, p.K, bm, bn, 128, 16, waves=waves),
                        warps, stages)
        if t not in out:
            out.append(t)
    # The first two with the in-kernel fixup where they split K (H200 run 18, variants.py --study
    # fixup: the shipped slices tiles of AWQ qkv and down at M=16 2.2% / 6.9% faster with it).
    out += [dict(t, FIXUP=1) for t in out[:2] if t["SPLIT_K"] > 1]
    # The default with x read as stored (X_SPLIT) at buckets 8-16 (H200 run 19, variants.py --study
    # int4-x-split, the shipped slices tiles: 5-10% faster on o at M=1, up to 20% slower on
    # gate_up; qkv and down 3-10% slower), for the tuner to take where it wins. At bucket 1 (one
    # row: X_ROW) every tile in that form, first, the default among them (run 28, variants.py
    # --study int4-m1: 13-18% faster than the shipped tiles on qkv, o and down, level on gate_up).
    # At buckets 2 and 4 every tile in that form too, after the others: at M=2 that is X_ROW (two
    # rows in place on 16-row tiles), at M=3-4 the general form (H200 run 29, variants.py --study
    # int4-m1 at 58784fd, the best such tile against the shipped one: at M=2 3-16% less time on
    # every 27B shape and format, GPTQ down 31.2 -> 26.3 us; at M=4 GPTQ gate_up 54.2 -> 49.6 us,
    # o 3% less, the others level; 32-row X_ROW tiles, four rows in place, took from 1% less (GPTQ
    # qkv) to 20% more (AWQ o) at best, so none is offered).
    if p.bucket == 1:
        return [dict(t, X_SPLIT=1) for t in out] + out
    if p.bucket <= 4:
        return out + [dict(t, X_SPLIT=1) for t in out]
    if p.bucket <= 16:
        out.append(dict(out[0], X_SPLIT=1))
    return out


def _join_tiles(p: Problem) -> list[dict]:
    """Candidates of the join path for buckets 16..256: its SCALE_W tiles (_scaled_join_tiles) and
    tiles of the form that scales each step's fp32 product, below. At 16..128 these take the
    slices path's row blocks; at 128 and 256 also all 128 rows of a block on two warpgroups (8
    warps; on 4 warps that tile took 2.4-3.2x as long at M=128-256, its fp32 accumulator alone 128
    registers a thread). Run 13, the 27B shapes, against the untuned default tile: at M=128 the
    best join tile took 0.88-0.99x the slices default's time (1.11x on gate_up); at M=256 0.96x the
    dense copy's on gate_up, 1.07-1.12x on the others; at M=512-1024 even the best join tile lost
    by 1.2-1.9x, and so did every SCALE_W tile in run 25 (1.2-2.5x the best dense copy's time,
    results/tune-int4-forms-nvidia-h200-2026-11-30-run25b.json): no join tile is offered above 256.
    None below bucket 16: at M=1 the slices default was 5-10% faster (run 12). The joined operand
    also passes through shared memory (BN x BK x 2 bytes per stage, which the search space's
    shared-memory estimate leaves out): a tile too large for a device's shared memory fails to
    compile and the tuner skips it."""
    if not 16 <= p.bucket <= 256 or not _slices_ok(p) or p.act_dtype == torch.float32:
        return []
    scaled = _scaled_join_tiles(p)
    wide = [gemm_tiles.tile("join", 128, 128, 128, gemm_tiles._split_for(p.bucket, p.N, p.K, 128, 128, 128, 8, waves=2),
                        8, 3)] if p.bucket >= 128 else []
    if p.bucket == 256:
        return wide + scaled
    bm = min(64, p.bucket)
    # 64 weight rows on 4 warps (every 27B-class join pick of run 13's re-tune); 3 stages and 8
    # waves first: in run 13's tile study at M=64-128, on all four 27B shapes, the best join tile
    # or within 2.1% of the best (4 stages, 4 waves), at 0.84-0.92x the slices default's time. At
    # M=16 (4 stages, 4 waves) was the best join tile on qkv, o and down, 0.95-1.00x the default's
    # time (on gate_up no join tile came within 1.1x). Deeper pipelines (5-6 stages), 16 waves,
    # 128 weight rows, and mma.sync forms (2 warps or 32 weight rows) all lost there.
    # FIXUP (the splits added by each tile's last program, no reduction kernel): H200 run 18,
    # variants.py --study fixup, on run 17's join tiles: at M=16 the same split 4-10% faster; at
    # M=64 half the split 4-9% faster than the tile with its reduction kernel (qkv GPTQ 36.0 ->
    # 33.8 us, o 33.3 -> 30.5, down 58.4 -> 55.7), the same split slower.
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
# sampled pick of 20 (caches/retune.sh) sees three of the four, the second left out: the likeliest
# first and last (at 16-128 it sees all four).
# The 256 x 128 tile runs 2 stages, not 3: at 3 stages (222,208 bytes of shared memory, 254
# registers) Triton 3.6's kernel with zero points (AWQ) gave wrong outputs that differed from run to
# run on the H200 whenever K was split (run 26, benchmarks/tile_check.py; run 25's tuner had
# refused it on every AWQ key for the same reason), though the same tile passed with one split, at 2
# stages, and without zero points. Not understood; the 2-stage tile passed everywhere.
_SCALED_JOIN = {64: ((64, 64, 4, 3, 8), (64, 64, 4, 4, 4), (64, 128, 8, 3, 4), (64, 128, 4, 3, 4)),
                128: ((64, 64, 4, 3, 8), (128, 128, 8, 3, 2), (128, 64, 4, 3, 4), (64, 128, 8, 4, 4)),
                256: ((128, 128, 8, 4, 2), (128, 64, 4, 4, 2), (256, 64, 4, 3, 2), (256, 128, 8, 2, 1))}


def _scaled_join_tiles(p: Problem) -> list[dict]:
    """Join tiles with SCALE_W (the group scale multiplying the weight tile, not each step's fp32
    product), for buckets 16..256: the one join form whose wgmmas Triton keeps in flight across K
    steps (see int4._int4_join_kernel), so the nibble conversion can overlap the tensor cores at the
    many-row buckets where the fp32-scaled join lost to the transient dense copy (run 13). Buckets
    16-32 take 64's tiles on their own rows of x."""
    rows = 64 if p.bucket <= 64 else p.bucket
    out = []
    for bm, bn, warps, stages, waves in _SCALED_JOIN[rows]:
        bm = min(bm, max(16, p.bucket))
        t = gemm_tiles.tile("join", bm, bn, 128, gemm_tiles._split_for(p.bucket, p.N, p.K, bm, bn, 128, 16, waves=waves),
                            warps, stages)
        t["SCALE_W"] = 1
        if t not in out:
            out.append(t)
    return out


def _swap_tiles(p: Problem, bks: tuple[int, ...]) -> list[dict]:
    """Candidates of the transposed ("swap") product for buckets 2..128, the likeliest first (rows
    as narrow as the bucket, 128 weight rows, the split that fills the machine): a short sweep's
    strided pick always takes the second tile of the space, so that one is this first tile."""
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
    if p.bucket == 1:
        rest = _interleave(slices, _gemv_tiles(p) + mma)
    elif p.bucket >= 256:
        b = _dense_bytes(p)
        rest = [dict(t, path=_DEQUANT_PATH[t["path"]]) for t in gemm_tiles.gemm_space(p.bucket, p.N, p.K, b, b, d)[1:]
                if t["path"] in _DEQUANT_PATH] + mma[:4] + _join_tiles(p)   # in-loop unpacking: 0.22x against 0.67x (run 3)
    else:
        rest = _interleave(_interleave(slices, _join_tiles(p)), _interleave(_swap_tiles(p, bks), mma))
    out, seen = [d], {tuple(sorted(d.items()))}
    for t in rest:
        key = tuple(sorted(t.items()))
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


def pick_group(tile: dict):
    """The tuner's pick group of an int4 tile (Template.pick_group): join tiles with the group
    scale on the weight tile (SCALE_W) on their own (run 25: a kernel form whose products stay in
    flight across K steps, the fp32-scaled join's do not), and slices tiles that read x as stored
    (X_SPLIT; at M <= BLOCK_M / 8 rows in place, X_ROW, the form that won run 28's study at one row
    and run 29's at two) too; the dequantizing paths' tiles as gemm_tiles groups them."""
    if tile.get("SCALE_W"):
        return tile.get("path"), "scale-w"
    if tile.get("X_SPLIT"):
        return tile.get("path"), "x-split"
    return gemm_tiles.pick_group(tile)
