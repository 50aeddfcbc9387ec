"""Variant studies: candidate kernel designs timed beside the shipped template, in one run.

    python benchmarks/variants.py [--study small-m,persistent,int4-slices] [--shapes qkv,o,gate_up,down]
                                  [--ms 16,64] [--out FILE]

Earlier studies are in git history with their results under benchmarks/results/variants-*.json:
run 5 (int4 conversions, TMA descriptors, the fp8 GEMV), run 6 (the TMA lead, which turned out
to be launch overhead), and run 9 (commit ed0340c: fp8 quantization fused into the product
kernel, 2-12x slower than the prologue; int4 swap products at M=16-128, +10-40% at M=32-128 with
pointer loads; persistent TMA kernels, bf16 at M=4096 0.88x -> 1.05x cuBLAS). Run 9's winners
are in the templates now. Run 10 (results files *-run10*.json, verdicts in NOTES.md): small-m
and persistent (below) put tma-swap and persistent tiles into the defaults; mid-m (TMA split-K
and warp-specialized K loops for bf16 at M=256/1024) and int4-tma (TMA-fed deep pipelines for
int4) found no gain and are in git history (commit c5ab24d).

small-m: bf16 and fp8 at M = 1-64 (run 7: bf16 1.00-1.07x cuBLAS, fp8 with its quantization
1.24-1.47x, target 1.6x; M=1 moves 51-77% of copy bandwidth for fp8). The shipped default tile
(and the CUDA-core GEMV at one row) against the transposed TMA product ("tma-swap",
common.tma_swap_kernel): the weight tile fills the MMA's 64-row side and x's few rows its
16-column side, both streamed by the copy engine.

persistent: the shipped TMA kernel on its default tile at M >= 1024 in both forms
(PERSISTENT 0/1), for bf16, fp8 and int4's transient-dequantization path.

int4-slices (written after run 10, checked under the interpreter, never run on a GPU): the
shipped int4 kernels unpack a [BN, BK/8, 8] nibble tensor and reshape it to [BN, BK] (k = 8·word
+ nibble). The hypothesis under test (the SASS has not been read): that interleaving reshape
keeps Triton from giving the loaded words the MMA operand's layout, so the unpacked tile goes
through a layout conversion (a shared-memory round trip). int4_slices_kernel
never reshapes: nibble j of every word is its own [BN, BK/8] operand, multiplied with the x
columns 8·word + j (a strided load of the small activation tile), eight MMAs of depth BK/8
per step, weights as the left operand (registers), split-K as the shipped swap path.

Every output is checked against the format's reference before its time counts; times are
CUDA-graph replays (no host launch time) cycling through weight copies larger than the L2.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common_bench import SHAPES, SHIPPED_CACHE, check, code_commit, graph_ms, weight_copies  # noqa: E402

from vsr.autotune.buckets import bucket_for  # noqa: E402
from vsr.kernels import common, registry  # noqa: E402


def _timed(row, run, ws, ref, base):
    """Check run(w0) against ref, then time run over the weight copies (graph replay)."""
    try:
        row["ok"], row["rel_err"] = check(run(ws[0]).clone(), ref)
        row["ms"] = graph_ms([lambda w=w: run(w) for w in ws])
        row["ratio_vs_cublas"] = base / row["ms"]
    except Exception as e:  # a variant that does not compile is a finding
        row["ok"], row["error"] = False, f"{type(e).__name__}: {str(e)[:300]}"
    return row


DEV = "cuda"  # the studies' device (the tests run them on the CPU through the interpreter)
# The studies' activation dtype. The CPU tests use fp16: the Triton interpreter computes tl.dot on
# bf16 operands wrongly, so bf16 outputs there could not be checked.
ACT = torch.bfloat16


def _weights(fmt, N, K, dev):
    """weight_copies, the dense ("bf16") weights in the activation dtype ACT."""
    ws = weight_copies(fmt, N, K, dev)
    if fmt == "bf16" and ACT != torch.bfloat16:
        ws = [dataclasses.replace(w, weight=w.weight.to(ACT)) for w in ws]
    return ws


def _baseline(rows, x, wb, **ids) -> float:
    """cuBLAS bf16 on the same rows, graph-replayed over the bf16 weight copies: every ratio's
    denominator, recorded as a row of its own."""
    base = graph_ms([lambda w=w: x @ w.weight.t() for w in wb])
    rows.append(dict(ids, variant="cublas-bf16", ms=base))
    return base


def _run_cases(rows, log, cases, ws, ref, base, **ids) -> None:
    """cases: (name, tile, run(w)); each checked, timed and recorded with the ids."""
    for name, tile, run in cases:
        rows.append(_timed(dict(ids, variant=name, tile=tile), run, ws, ref, base))
        log(rows[-1])


def swap_tiles(bucket: int, N: int, K: int, elem_bytes: int) -> list[dict]:
    """tma-swap candidates for a small bucket: 64 or 128 weight rows, 256 or 512 bytes of K per
    step, the split that gives 2 or 4 waves of programs, pipelines as deep as shared memory allows."""
    bm = min(64, max(16, bucket))
    out = []
    for bn, kbytes, waves, stages in ((128, 256, 2, 4), (128, 256, 4, 4), (64, 256, 2, 6), (128, 512, 2, 3),
                                      (64, 512, 4, 4), (128, 256, 1, 6), (64, 256, 4, 8)):
        bk = kbytes // elem_bytes
        split = common._split_for(bucket, N, K, bm, bn, bk, 16, waves=waves) if waves > 1 else 1
        t = common.tile("tma-swap", bm, bn, bk, split, 4, stages)
        if t not in out and common.smem_bytes(t, elem_bytes, elem_bytes) <= common.SMEM_LIMIT:
            out.append(t)
    return out


@triton.jit
def _nibble_pair(w, zz, F16: tl.constexpr):
    """(u_j - z, u_{j+4} - z) of each (pre-shifted) word as two bf16 (f16) tensors: one LOP3 puts
    nibbles 0 and 4 into the mantissas of the pair 128 + u (the exponent of 128; f16: 1024), one
    packed subtraction takes 128 + z off both, exactly (NVIDIA sm_90 PTX; not the interpreter)."""
    if F16:
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t; lop3.b32 t, $2, 0x000F000F, 0x64006400, 0xEA; sub.rn.f16x2 t, t, $3; "
            "mov.b32 {$0, $1}, t; }", "=h,=h,r,r", [w, zz], dtype=(tl.float16, tl.float16), is_pure=True, pack=1)
    return tl.inline_asm_elementwise(
        "{ .reg .b32 t; lop3.b32 t, $2, 0x000F000F, 0x43004300, 0xEA; sub.rn.bf16x2 t, t, $3; "
        "mov.b32 {$0, $1}, t; }", "=h,=h,r,r", [w, zz], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=1)


@triton.jit
def int4_slices_kernel(x_ptr, q_ptr, sc_ptr, zp_ptr, y_ptr, ws_ptr, M, N, K, K8, KG, stride_xm, stride_ym, KW_SPLIT,
                       GROUP: tl.constexpr, HAS_ZP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr,
                       PAIRS: tl.constexpr = False, F16: tl.constexpr = False, XPERM: tl.constexpr = False,
                       REPACK: tl.constexpr = False):
    """acc[BN, BM] = Σ_j W_j · x_jᵀ per BLOCK_K step, W_j [BN, BK/8] the j-th nibble of each word
    (k = 8·word + j) and x_j the matching columns of x: no reshape of the unpacked weights. The
    group scale on each step's fp32 partial sum (BLOCK_K divides the group), split-K partial sums
    to the workspace. The zero point (or 8) is subtracted exactly, either in fp32 through the
    mantissa of 2^23 (any backend, the interpreter included) or, with PAIRS (NVIDIA sm_90 PTX),
    two nibbles per instruction: nibbles j and j+4 of a word masked into the mantissas of a
    bf16x2 (or f16x2) pair of 128 + u (1024 + u), then one packed subtraction of 128 + z.
    XPERM: x arrives with the columns of each BLOCK_K block in slice order (column j·BK/8 + w
    holds x[8·w + j], permuted by the launcher), so each x_j is a contiguous [BM, BK/8] load
    instead of a stride-8 gather. REPACK: the words were repacked once at load (repack_pairs):
    of each pair of words (a, b), one holds a's nibbles 0-3 and b's nibbles 0-3 in its two
    halves, the other their nibbles 4-7, so a nibble field of one word is already the
    (word 2p, word 2p+1) pair that the MMA operand keeps in one register."""
    pid_m, pid_n = common.swizzle(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = (offs_m % M).to(tl.int64)
    rn = (offs_n % N).to(tl.int64)
    W8: tl.constexpr = BLOCK_K // 8
    kw_lo = pid_k * KW_SPLIT
    kw_hi = tl.minimum(kw_lo + KW_SPLIT, K8)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kw0 in range(kw_lo, kw_hi, W8):
        offs_w = kw0 + tl.arange(0, W8)
        words = tl.load(q_ptr + rn[:, None] * K8 + offs_w[None, :], mask=offs_w[None, :] < kw_hi, other=0)
        g = (kw0 * 8) // GROUP
        scale = tl.load(sc_ptr + rn * KG + g).to(tl.float32)
        if HAS_ZP:
            zu = tl.load(zp_ptr + rn * KG + g)
        else:
            zu = tl.full((BLOCK_N,), 8, tl.int32)
        part = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        if REPACK:
            halves = tl.split(tl.reshape(words.to(tl.uint32, bitcast=True), (BLOCK_N, W8 // 2, 2)))
            if PAIRS:
                zz = ((0x64006400 if F16 else 0x43004300) + zu * 0x10001)[:, None] + tl.zeros_like(halves[0])
            else:
                z = 8388608.0 + zu.to(tl.float32)
            for j in tl.static_range(8):
                src = halves[j // 4] >> (4 * (j % 4))
                if PAIRS:
                    a, b = _nibble_pair(src, zz, F16)
                else:
                    a = ((src & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - z[:, None]
                    b = (((src >> 16) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - z[:, None]
                kj = kw0 * 8 + j * W8 + tl.arange(0, W8) if XPERM else offs_w * 8 + j
                xj = tl.load(x_ptr + rm[None, :] * stride_xm + kj[:, None], mask=kj[:, None] < K, other=0.0)
                wj = tl.reshape(tl.join(a, b), (BLOCK_N, W8))
                part = tl.dot(wj.to(xj.dtype), xj, part)
        elif PAIRS:
            # (128 + z) in both halves of a bf16x2 (1024 + z for f16x2): exact, z < 16.
            zz = ((0x64006400 if F16 else 0x43004300) + zu * 0x10001)[:, None] + tl.zeros_like(words)
            uw = words.to(tl.uint32, bitcast=True)
            for j in tl.static_range(4):
                lo, hi = _nibble_pair(uw >> (4 * j), zz, F16)
                kj = kw0 * 8 + j * W8 + tl.arange(0, W8) if XPERM else offs_w * 8 + j
                kj4 = kj + 4 * W8 if XPERM else kj + 4
                xj = tl.load(x_ptr + rm[None, :] * stride_xm + kj[:, None], mask=kj[:, None] < K, other=0.0)
                xj4 = tl.load(x_ptr + rm[None, :] * stride_xm + kj4[:, None], mask=kj4[:, None] < K, other=0.0)
                part = tl.dot(lo, xj, part)
                part = tl.dot(hi, xj4, part)
        else:
            z = 8388608.0 + zu.to(tl.float32)
            for j in tl.static_range(8):
                f = (((words >> (4 * j)) & 0xF) | 0x4B000000).to(tl.float32, bitcast=True)   # 2^23 + u
                kj = kw0 * 8 + j * W8 + tl.arange(0, W8) if XPERM else offs_w * 8 + j
                xj = tl.load(x_ptr + rm[None, :] * stride_xm + kj[:, None], mask=kj[:, None] < K, other=0.0)
                part = tl.dot((f - z[:, None]).to(xj.dtype), xj, part)
        acc += part * scale[:, None]
    common.store_or_stash(tl.trans(acc), y_ptr, ws_ptr, pid_k, offs_m, offs_n, M, N, stride_ym,
                          y_ptr, y_ptr, y_ptr, y_ptr, SPLIT_K, False, False, False, False)


def repack_pairs(packed: torch.Tensor) -> torch.Tensor:
    """The REPACK layout of int4_slices_kernel, made once per weight (a permutation of its
    nibbles, no dequantized copy): words (a, b) -> (a[0:16] | b[0:16] << 16, a[16:32] | b[16:32]
    << 16), bits counted from the low end; an odd word count gets a zero word."""
    p = packed.to(torch.int64) & 0xFFFFFFFF
    if p.shape[1] % 2:
        p = torch.nn.functional.pad(p, (0, 1))
    a, b = p[:, 0::2], p[:, 1::2]
    out = torch.stack(((a & 0xFFFF) | ((b & 0xFFFF) << 16), (a >> 16) | (b & 0xFFFF0000)), dim=2).flatten(1)
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32).contiguous()


def launch_int4_slices(x, w, tile, pairs: bool = False, xperm: bool = False, repacked: torch.Tensor | None = None):
    """y = x · dequant(W)ᵀ through int4_slices_kernel (no bias, no act-order: the study's weights);
    pairs: the PTX two-nibble conversion (CUDA, bf16/fp16 activations only); xperm: x's columns
    put in slice order first (one torch copy of x, part of the timed call; K % BLOCK_K == 0);
    repacked: repack_pairs(w.packed), made once at load (not part of the call)."""
    assert not pairs or (x.is_cuda and x.dtype in (torch.bfloat16, torch.float16))
    if xperm:
        bk = tile["BLOCK_K"]
        assert x.shape[1] % bk == 0, "the slice-order permutation takes whole BLOCK_K blocks"
        x = x.view(x.shape[0], -1, bk // 8, 8).transpose(2, 3).reshape(x.shape)
    M, K = x.shape
    N = w.N
    bm, bn, bk = tile["BLOCK_M"], tile["BLOCK_N"], tile["BLOCK_K"]
    assert w.group_size % bk == 0 and bk >= 128 and w.act_perm is None and w.bias is None
    k_split, split = common.split_plan(K, tile)
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    ws = torch.empty((split, M, N), dtype=torch.float32, device=x.device) if split > 1 else y
    zp = w.zero_point if w.zero_point is not None else w.packed
    int4_slices_kernel[(common.cdiv(M, bm) * common.cdiv(N, bn), split)](
        x, w.packed if repacked is None else repacked, w.scale, zp, y, ws, M, N, K,
        (w.packed if repacked is None else repacked).stride(0), w.scale.stride(0), x.stride(0), y.stride(0),
        k_split // 8, GROUP=w.group_size, HAS_ZP=w.zero_point is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        SPLIT_K=split, GROUP_M=tile.get("GROUP_M", 8), PAIRS=pairs, F16=x.dtype == torch.float16, XPERM=xperm,
        REPACK=repacked is not None,
        num_warps=tile["num_warps"], num_stages=tile["num_stages"])
    if split > 1:
        common.reduce_splits(ws, y, split, M, N, None, None, None, None)
    return y


def study_int4_slices(shapes, ms, log):
    dev = torch.device(DEV)
    t = registry.TEMPLATES["int4_w4a16"]
    resolver = _shipped_resolver(dev)
    rows = []
    for sh in shapes:
        N, K = SHAPES[sh]
        wb = _weights("bf16", N, K, dev)
        weights = {fmt: _weights(fmt, N, K, dev) for fmt in ("int4-gptq", "int4-awq")}
        reps = {id(w): repack_pairs(w.packed) for ws in weights.values() for w in ws}   # once per weight, as at load
        for M in ms:
            x = torch.randn(M, K, device=dev).to(ACT)
            base = _baseline(rows, x, wb, study="int4-slices", shape=sh, M=M)
            for fmt, ws in weights.items():
                ids = dict(study="int4-slices", format=fmt, shape=sh, M=M)
                p = t.problem(ws[0], bucket_for(M), x.dtype)
                tuned = resolver.tile(t, p) if resolver is not None else t.default_tile(p)
                cases = [("tuned tile (shipped)", tuned, lambda w: t.launch(x, w, tuned))]
                bm = min(64, max(16, bucket_for(M)))
                for bn, stages, waves in ((128, 3, 4), (128, 4, 2), (64, 3, 4), (64, 4, 8)):
                    split = common._split_for(bucket_for(M), N, K, bm, bn, 128, 16, waves=waves)
                    tile = common.tile("int4-slices", bm, bn, 128, split, 4, stages)
                    cases.append(("nibble slices", tile, lambda w, tile=tile: launch_int4_slices(x, w, tile)))
                    cases.append(("nibble slices, x permuted", tile,
                                  lambda w, tile=tile: launch_int4_slices(x, w, tile, xperm=True)))
                    cases.append(("nibble slices, repacked", tile,
                                  lambda w, tile=tile: launch_int4_slices(x, w, tile, repacked=reps[id(w)])))
                    if dev.type == "cuda":   # inline PTX: not under the interpreter
                        cases += [(f"nibble slices, PTX pairs{', x permuted' if xp else ''}{', repacked' if rp else ''}",
                                   tile, lambda w, tile=tile, xp=xp, rp=rp: launch_int4_slices(
                                       x, w, tile, pairs=True, xperm=xp, repacked=reps[id(w)] if rp else None))
                                  for xp, rp in ((False, False), (True, False), (False, True), (True, True))]
                _run_cases(rows, log, cases, ws, t.reference(x, ws[0]), base, **ids)
    return rows


def _shipped_resolver(dev):
    """The shipped cache's tiles on the GPU (misses fall back to default tiles); None on the CPU."""
    if dev.type != "cuda":
        return None
    from vsr.autotune.resolver import TileResolver
    return TileResolver(SHIPPED_CACHE, "default", dev)


def study_small_m(shapes, ms, log):
    dev = torch.device(DEV)
    rows = []
    for sh in shapes:
        N, K = SHAPES[sh]
        wb, w8 = _weights("bf16", N, K, dev), _weights("fp8", N, K, dev)
        for M in ms:
            x = torch.randn(M, K, device=dev).to(ACT)
            base = _baseline(rows, x, wb, study="small-m", shape=sh, M=M)
            for fmt, ws, tname, eb in (("bf16", wb, "dense", 2), ("fp8", w8, "fp8_w8a8", 1)):
                t = registry.TEMPLATES[tname]
                p = t.problem(ws[0], bucket_for(M), x.dtype)
                tiles = [("shipped default tile", t.default_tile(p))]
                if M == 1:
                    tiles += [("gemv", c) for c in common.gemv_tiles(K, eb)[:2]]
                tiles += [("tma-swap", c) for c in swap_tiles(bucket_for(M), N, K, eb)]
                cases = [(name, c, lambda w, c=c: t.launch(x, w, c)) for name, c in tiles]
                _run_cases(rows, log, cases, ws, t.reference(x, ws[0]), base,
                           study="small-m", format=fmt, shape=sh, M=M)
    return rows


def study_persistent(shapes, ms, log):
    dev = torch.device(DEV)
    rows = []
    for sh in shapes:
        N, K = SHAPES[sh]
        weights = {fmt: _weights(fmt, N, K, dev) for fmt in ("bf16", "fp8", "int4-gptq")}
        for M in ms:
            x = torch.randn(M, K, device=dev).to(ACT)
            base = _baseline(rows, x, weights["bf16"], study="persistent", shape=sh, M=M)
            for fmt, tname in (("bf16", "dense"), ("fp8", "fp8_w8a8"), ("int4-gptq", "int4_w4a16")):
                t = registry.TEMPLATES[tname]
                ws = weights[fmt]
                d = t.default_tile(t.problem(ws[0], bucket_for(M), x.dtype))
                cases = [(f"PERSISTENT={v}", dict(d, PERSISTENT=v), lambda w, c=dict(d, PERSISTENT=v): t.launch(x, w, c))
                         for v in (0, 1)]
                _run_cases(rows, log, cases, ws, t.reference(x, ws[0]), base,
                           study="persistent", format=fmt, shape=sh, M=M)
    return rows


STUDIES = {"small-m": (study_small_m, "1,16,64"), "persistent": (study_persistent, "1024,4096"),
           "int4-slices": (study_int4_slices, "1,16,64,128")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", default=",".join(STUDIES), help=f"comma-separated, of {', '.join(STUDIES)}")
    ap.add_argument("--shapes", default="qkv,o,gate_up,down")
    ap.add_argument("--ms", default=None, help="rows (default: per study)")
    ap.add_argument("--out", default=os.environ.get("OUT", ".") + "/variants.json")
    a = ap.parse_args()
    t0 = time.time()
    rows = []
    for name in a.study.split(","):
        fn, default_ms = STUDIES[name]
        rows += fn(a.shapes.split(","), [int(m) for m in (a.ms or default_ms).split(",")],
                   lambda r: print(json.dumps(r), flush=True))
    Path(a.out).write_text(json.dumps({"benchmark": "variants", "commit": code_commit(),
                                       "device": torch.cuda.get_device_name(), "triton": triton.__version__,
                                       "torch": torch.__version__, "rows": rows, "seconds": time.time() - t0}, indent=1))
    print("\nstudy      format     shape M     variant                          us      vs cuBLAS  tile")
    for r in rows:
        if "ratio_vs_cublas" in r:
            t = r["tile"]
            shape = (f"{t['path']} {t['BLOCK_M']}x{t['BLOCK_N']}x{t['BLOCK_K']} split {t['SPLIT_K']} "
                     f"s{t['num_stages']}{' P' if t.get('PERSISTENT') else ''}" if t else "")
            print(f"{r['study']:10s} {r.get('format', ''):10s} {r['shape']:5s} {r['M']:5d} {r['variant']:32s} "
                  f"{r['ms'] * 1e3:7.1f}  {r['ratio_vs_cublas']:.2f}x  {shape}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
