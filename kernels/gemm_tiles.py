"""Tile spaces and default tiles of the dense and fp8 templates' products (gemm.py), which int4
and nvfp4 build on too: the fields of a tile, the split that fills the multiprocessors, the
shared memory a tile's pipeline needs, and the candidates per row bucket.
"""
from __future__ import annotations

from vsr.kernels import common
from vsr.kernels.gemm import tma_aligned


# Shared memory a block may opt into on sm_90 (H100/H200): 227 KiB. Candidates whose
# pipelined operand tiles need more are pruned from the search space.
SMEM_LIMIT = 232448

def gemv_tiles(K: int, elem_bytes: float) -> list[dict]:
    """GEMV candidates around 8 weight rows x 512 bytes of each per step (4 warps, 3 stages), the same
    bytes per step for wider weights; the first is the default."""
    kmax = max(32, common.next_pow2(K))
    out = []
    for bn, nbytes, warps, stages in ((8, 512, 4, 3), (8, 512, 4, 1), (4, 1024, 4, 3), (8, 1024, 4, 3),
                                      (16, 512, 4, 3), (16, 256, 4, 3), (8, 512, 8, 3)):
        t = tile("gemv", 1, bn, min(max(32, int(nbytes / elem_bytes)), kmax), 1, warps, stages)
        if t not in out:
            out.append(t)
    return out

# Multiprocessors the spaces size their grids for (the H200's; a space depends on the shape alone).
SMS = 132


def _split_for(bucket: int, N: int, K: int, bm: int, bn: int, bk: int, max_split: int, sms: int = SMS,
               waves: int = 2) -> int:
    """Split K until the grid holds `waves` programs per multiprocessor (deterministic in the shape).
    Small-M calls are memory-bound: more programs keep more loads in flight."""
    programs = common.cdiv(N, bn) * common.cdiv(bucket, bm)
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
    """tma-swap candidates for buckets <= 32 (bm rows of x): one split with deep pipelines first, then
    2-way splits (for the longest layers). gemm_space drops those too deep for shared memory."""
    out = []
    for kbytes, bn, stages in ((256, 128, 6), (256, 64, 8), (256, 128, 4), (512, 128, 3), (256, 64, 6),
                               (512, 64, 4), (128, 128, 8), (512, 64, 6)):
        out.append(swap_tile(int(kbytes / b_bytes), bn, stages, bm=bm))
    for kbytes, bn, stages in ((256, 128, 6), (256, 64, 8)):
        bk = int(kbytes / b_bytes)
        if K // 2 >= 4 * bk:
            out.append(swap_tile(bk, bn, stages, split=2, bm=bm))
    return out

# Above bucket 128, a product of fewer 128 x 128 output tiles than this also takes split-K candidates.
NARROW_TILES = 32

# Row buckets from which TMA tiles are also tried in their persistent form (on the H200 it loses
# at 256 rows, is mixed at 1024 and gains at 4096).
PERSISTENT_FROM = 1024
# Row buckets from which TMA tiles are also tried stream-K (on the H200 it wins on most 27B-class
# shapes from 512 rows, at 256 on some; at 128 rows, over all the rows in one tile, it lost on o
# and down by 2-36%).
STREAMK_FROM = 256

def k_step(a_bytes: float) -> int:
    """The tiled paths' default BLOCK_K: 64 elements, 128 for 1-byte operands, 32 for fp32 ones."""
    return 128 if a_bytes <= 1 else 64 if a_bytes <= 2 else 32

def default_gemm_tile(bucket: int, N: int, K: int, a_bytes: float, b_bytes: float, tma: bool = True) -> dict:
    """The deterministic tile of a row bucket, from (bucket, N, K, operand sizes) alone: for buckets
    <= 16 the transposed TMA product (16- and 8-bit operands; split-K over 16-row tiles where TMA
    is not allowed or for fp32), TMA tiles from bucket 32 where the row strides allow (pointer-load
    tiles where not), stream-K for buckets 512-2048, persistent from bucket 4096. fp8 operands take
    twice the K step."""
    wide = a_bytes <= 2 and b_bytes <= 2
    swap = tma and tma_aligned(K, a_bytes, b_bytes) and a_bytes <= 2
    if bucket <= 16 and swap:
        # The transposed TMA product, one split, 6 stages of 256 bytes of K: splitting K costs the
        # reduction's launch and a pipeline filling anew per split.
        return swap_tile(int(256 / b_bytes), 128, 6)
    if bucket == 32 and swap:
        # 32 rows of x against 64 weight rows, 8 stages: the tuner's pick on the 27B-class shapes.
        return swap_tile(int(256 / b_bytes), 64, 8, bm=32)
    if bucket <= 16:
        bk = 128 if wide else 64
        return tile("splitk", 16, 64, bk, _split_for(bucket, N, K, 16, 64, bk, 16, waves=8), 4, 4)
    kx = k_step(a_bytes) / 64
    if not (tma and tma_aligned(K, a_bytes, b_bytes)):
        bm = 32 if bucket == 32 else 64 if bucket <= 256 else 128
        return tile("tiled", bm, 128, int(64 * kx), 1, 4 if bm <= 64 else 8, 3)
    if bucket <= 128:
        # Few row blocks: narrow the columns until the grid has about half a wave of programs. 64
        # rows at bucket 32 too: a 32-row tile wastes its multiprocessor on this memory-bound
        # product, and the TMA copy zero-fills the rows past M for free.
        bm = 64
        bn = 128 if common.cdiv(N, 128) >= 66 else 64
        return tile("tma", bm, bn, int(128 * kx), 1, 4, 4 if bn == 128 else 6)
    if bucket <= 256:
        return tile("tma", 64, 128, int(64 * kx), 1, 4, 4)
    if bucket <= 2048:
        # Stream-K over 128-row tiles: the leftover tiles' K steps spread over every multiprocessor.
        # fp32 operands (tf32x3 MMAs) keep three stages on the 256-wide tile: the MMA epilogue's
        # staging beside four would pass the H200's shared memory (278,584 of 232,448 bytes).
        bn = 128 if bucket <= 512 else 256
        return tile("tma-sk", 128, bn, int(64 * kx), 1, 8, 3 if kx < 1 and bn == 256 else 4)
    # The largest buckets walk their tiles persistently: one tile's epilogue overlaps the next's loads.
    return dict(tile("tma", 128, 256, int(64 * kx), 1, 8, 4 if kx == 1 else 3), PERSISTENT=1)

def smem_bytes(t: dict, a_bytes: float, b_bytes: float) -> int:
    bn = t["BLOCK_N"] + t.get("BLOCK_N2", 0)
    return int(t["num_stages"] * (t["BLOCK_M"] * t["BLOCK_K"] * a_bytes + t["BLOCK_K"] * bn * b_bytes))

# Wide TMA tiles (gemm._tma_wide_tile: BLOCK_N + BLOCK_N2 weight rows) by row bucket, as
# (BLOCK_M, BLOCK_N, BLOCK_N2, warps, stages). Powers of two do not give the widths that make a
# layer's programs fit the H200 at once: at M = 256, 64 x 160 tiles make 256 programs on qkv and
# 64 x 80 tiles 256 on o and down, two per multiprocessor (264 places), where plain 64 x 128 tiles
# make 320 and 160. The 128-row tiles are one program per multiprocessor, as cuBLAS runs (128 x
# 320 on 8 warps: 253 registers, no spills, sm_90). At 128 rows, 64 x 80 tiles make 256 programs
# on qkv and 128 x 272 tiles 128 on gate_up, where 128 x 128 tiles make 80 and 272 (2.06 waves).
# At 2,048 rows, 128 x 320 tiles make 256 programs on o and down (1.94 waves) where 128 x 256 tiles
# make 320 (2.42). Each bucket keeps the tiles that win a key.
WIDE_SPLITS = {128: ((128, 256, 16, 8, 4), (64, 64, 16, 4, 4)),
               256: ((128, 128, 32, 8, 3), (128, 128, 32, 8, 4),
                     (64, 128, 32, 4, 4), (64, 64, 16, 4, 4), (64, 128, 64, 4, 3)),
               512: ((128, 128, 32, 8, 3), (128, 128, 32, 8, 4), (64, 128, 32, 4, 3), (64, 128, 32, 4, 4)),
               1024: ((128, 256, 64, 8, 3), (128, 256, 64, 8, 4)),
               2048: ((128, 256, 64, 8, 3), (128, 256, 64, 8, 4))}

# Stream-K tiles of 256 rows of x at bucket 256, as (BLOCK_N, warps, stages): one tile holds all
# the rows, so each weight tile is fetched once, and the K steps of the 40-272 tiles of the 27B
# shapes are shared out over every multiprocessor (they win on down and gate_up).
TALL_SK_256 = ((128, 8, 4), (128, 8, 3), (64, 4, 4))

def wide_tiles(bk: int, bucket: int) -> list[dict]:
    return [dict(tile("tma", bm, bn, bk, 1, warps, st), BLOCK_N2=bn2) for bm, bn, bn2, warps, st in WIDE_SPLITS[bucket]]

def pick_group(tile: dict):
    """The tuner's pick group of a dense, fp8 or nvfp4 tile (Template.pick_group): its path; wide TMA
    tiles (BLOCK_N2) in a group per BLOCK_M, and 256-row stream-K tiles in one of their own, since
    they are kernel forms that few tiles of their path stand for."""
    if tile.get("BLOCK_N2"):
        return tile.get("path"), "wide", tile.get("BLOCK_M")
    if tile.get("path") == "tma-sk" and tile.get("BLOCK_M", 0) >= 256:
        return "tma-sk", "tall"
    return tile.get("path")

def _one_wave_split_tiles(bucket: int, N: int, K: int, forms: list[tuple[int, int, int, int]],
                          halves: bool = False) -> list[dict]:
    """"splitk" tiles of 128 weight rows for forms (rows, BLOCK_K, warps, stages), K split for about
    one wave of programs (and half that with `halves`); none where K takes no split."""
    out = []
    for bm, bk, warps, stages in forms:
        full = _split_for(bucket, N, K, bm, 128, bk, 16, waves=1)
        for split in sorted({full, full // 2 if halves else full} - {0, 1}):
            out.append(tile("splitk", bm, 128, bk, split, warps, stages))
    return out


def gemm_space(bucket: int, N: int, K: int, a_bytes: float, b_bytes: float, default: dict,
               bk_choices=None, tma: bool = True) -> list[dict]:
    """Candidate tiles for a row bucket, `default` first, pruned by shared memory. Buckets >= 32 take
    tiled candidates with TMA descriptors (where the row strides allow and `tma`) and with pointer
    loads; buckets in WIDE_SPLITS, with TMA, also the wide TMA tiles."""
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
            if bucket == 128 and "tma" in paths:
                # One 128-row TMA tile over all the rows, on 8 warps.
                cands += [tile("tma", 128, bn, bk, 1, 8, st) for bn in (64, 128, 256) for bk in bks[:2]
                          for st in (3, 4)]
            if bucket == 32 and "tma" in paths and a_bytes <= 2:
                # The transposed product on 32 rows of x (buckets <= 16 take it on 16).
                cands += swap_space(K, b_bytes, bm=32)[:6]
        else:
            shapes = [(bm, bn, bk, w, st) for bm in (64, 128) for bn in (128, 256) for bk in bks[:2]
                      for w in (4, 8) for st in (3, 4) if not (bm == 128 and bn == 256 and w == 4)]
        for path in paths:
            for bm, bn, bk, w, st in shapes:
                cands.append(tile(path, bm, bn, bk, 1, w, st))
        # The large TMA tiles (128 rows, 8 warps): the ones whose stream-K and persistent forms are
        # tried (64-row stream-K tiles lose on every 27B-class shape).
        large = [(bm, bn, bk, w, st) for bm, bn, bk, w, st in shapes if bm == 128 and w == 8]
        if bucket >= STREAMK_FROM and "tma" in paths:
            cands += [tile("tma-sk", bm, bn, bk, 1, w, st) for bm, bn, bk, w, st in large]
        if bucket == 256 and "tma" in paths:
            cands += [tile("tma-sk", 256, bn, k_step(a_bytes), 1, w, st) for bn, w, st in TALL_SK_256]
        if bucket in WIDE_SPLITS and "tma" in paths:
            cands += wide_tiles(k_step(a_bytes), bucket)
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
            if bucket == 128 and tma and common.cdiv(N, 128) < SMS:
                # (The dense and fp8 spaces.) All 128 rows in one tile on 8 warps: each weight byte
                # crosses from L2 once, where the 64-row tiles read it twice (at 128 rows the
                # 27B-class o and down make 40 output tiles of 128 columns, 80 programs of 64 x 128).
                cands += _one_wave_split_tiles(bucket, N, K, [(128, bk, 8, 4 if bk == 64 else 3) for bk in bks[:2]],
                                               halves=True)
        elif common.cdiv(bucket, 128) * common.cdiv(N, 128) < NARROW_TILES:
            # A narrow product leaves most multiprocessors idle without split-K: Qwen3.5's 96-row
            # in_proj_b|a at 1,024 rows makes 8 tiles of 128 x 128 (16 of 64 x 128), each 80 K steps.
            cands += _one_wave_split_tiles(bucket, N, K, [(64, bks[0], 4, 4), (128, bks[0], 8, 4)])
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
