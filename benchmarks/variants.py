"""Variant studies: candidate kernel designs timed beside the shipped template, in one run.

    python benchmarks/variants.py [--study int4-x,int4-join,int4-join-wide,int4-join-tiles,streamk,fp8-prologue,
                                   fixup,int4-fixup-tiles,capture-counters,int4-x-split,wide,wide-64,
                                   wide-few,sk-256,sk-reduce,int4-m1]
                                  [--shapes qkv,o,gate_up,down] [--ms 1,16,64]
                                  [--out FILE]
    python benchmarks/variants.py --study steady-ab --against OLD_CACHE   (every key whose tile the
                                  shipped cache changed, both tiles timed in steady state in turn)
    python benchmarks/variants.py --study steady-order --against OTHER_CACHE [--shapes qkv --ms 1024]
                                  (why that A/B was uneven: each pair timed ABBAABBA four ways)
    python benchmarks/variants.py --study steady-rest --against OTHER_CACHE [--shapes qkv --ms 1024]
                                  (the same pairs, captured, after rests of 0-2 s)

int4-x (session 6, run 12): the int4 slices path at M = 1-256 (GPTQ), the template's default tile
(int4.default_tile, which needs no cache) beside slices tiles. At M = 1-16 it adds tiles that
Triton builds with mma.sync instead of wgmma (2 warps, or fewer than 64 weight rows): sm_90
inspection shows each of the slices kernel's eight wgmmas per step followed by a wait for
completion (operand A in registers), which mma.sync, synchronous by nature, does not pay. At M=1
the GEMV is timed too. Run 12 also timed two ways of reading x, removed after it since both lost
(results/variants-nvidia-h200-2026-11-29-run12-int4-x.json, commit f0f0f9b): TMA boxes (X_TMA)
and in place without the slice-order copy (X_GATHER).

int4-join (session 6, run 12): int4 at M = 1-64 (GPTQ), the default tile beside the join kernel
(the slices kernel's pair conversion joined back into natural K order, one tl.dot per step, x as
stored) on a few tiles. 4-11% faster than the default tile at M=16-64, 5-10% slower at M=1
(results/variants-nvidia-h200-2026-11-29-run12-int4-join.json, measured as this file's study
kernel at commit 2c7db06); it is now the int4 template's "join" path.

Earlier studies are in git history with their results under benchmarks/results/variants-*.json
and their verdicts in NOTES.md: run 5 (int4 conversions, TMA descriptors, the fp8 GEMV), run 6
(the TMA lead, which turned out to be launch overhead), run 9 (commit ed0340c: fp8
quantization fused into the product kernel, 2.4-13x slower than the prologue; int4 swap
products; persistent TMA kernels), run 10 (commit c5ab24d: mid-m and int4-tma; small-m and
persistent, whose winners became the tma-swap and persistent defaults; the last two studies'
code is in commit 3be4345), run 11 (commit 764de3d: int4-slices, file
results/variants-nvidia-h200-2026-11-29-run11-int4-slices.json, which became the slices path),
run 14 (commit 533c776: streamk-occupancy, stream-K tiles with 1-3 programs per
multiprocessor, file results/variants-nvidia-h200-2026-11-30-run14-streamk-occupancy.json: more
programs per multiprocessor did not help, and the tile field it used is gone), and run 16
(commit 5756a0f: fp8-one-row, the one-row quantization inside the transposed TMA
product, 1-18% slower than the prologue and the product on all four shapes, file
results/variants-nvidia-h200-2026-11-30-run16-fp8-one-row.json; commit e0d5ce4:
fp8-program-quant, every program quantizing x's rows into xq itself before its TMA product,
slower at M = 1-16, results/variants-nvidia-h200-2026-11-30-run16-fp8-program-quant.json), and
run 19 (commit c9c10be: the int4-x-split study's third case, PDL: the slice-order copy by a Triton
kernel whose programmatic dependent the slices product is, prefetching its weight rows first; 1.4-2.7
us slower on qkv, o and gate_up at M=1, even on down, file
results/variants-nvidia-h200-2026-11-30-run19-int4-x-split-pdl.json; the tile field was removed), and
run 17 (commit 0fa8b14: swap-sk, bf16 and fp8 at M = 1-64 on the transposed product walked
stream-K over all 132 multiprocessors, 3-30% slower than the shipped tiles at M = 1, 16 and
64, faster at M = 32 on 4 of 8 points only where run 16's 32-row tiles were at fault, file
results/variants-nvidia-h200-2026-11-30-run17-swap-sk.json), and runs 17-18 (commit 78c8cad:
sk-reduce-pdl, the stream-K reduction launched as the product's programmatic dependent, slower
on 14 of the 15 shipped keys, median +2.4%, files
results/variants-nvidia-h200-2026-11-30-run17-sk-reduce-pdl.json and
...-run18-sk-reduce-pdl-{1,2,3}.json; the form was removed in 2829e8f), and run 24 (commit
26e4432, reached from main through the merge 15d9601: sk-fixup, the stream-K parts added by the
in-kernel fixup at 16-128 rows a pass and stored with an L2 evict_last hint, and sk-hint, the
shipped stream-K tiles with and without that hint; files
results/variants-nvidia-h200-2026-11-30-run24-sk-{fixup,hint}.json: the fixup lost at every width,
the hint was within 2.2% at M = 256-1024 but for one point 4.2% slower, and 2.5-8.0% slower
on five of six points at M=2048 (best of three), and was backed out in 8df3207-021a9c7).

Every output is checked against the format's reference before its time counts; times are
CUDA-graph replays (no host launch time) cycling through weight copies larger than the L2.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common_bench import (SHAPES, SHIPPED_CACHE, checked_launch, code_commit, graph_ms, shipped_entry,  # noqa: E402
                          shipped_tile, weight_copies)

from vsr.autotune import tuner  # noqa: E402
from vsr.autotune.buckets import bucket_for  # noqa: E402
from vsr.autotune.store import write_atomic  # noqa: E402
from vsr.kernels import common, fp8, gemm, gemm_tiles, int4, int4_tiles, registry  # noqa: E402


def timed_case(row, launch, x, tile, ws, ref, base):
    """Check launch(x, w0, tile) against ref (into a NaN-filled output), then time it over the
    weight copies (graph replay); a case that fails to compile or run is recorded with the end of
    its error (where a CompilationError names its cause). Also gluon_ws.py's."""
    try:
        row["ok"], row["rel_err"] = checked_launch(launch, x, ws[0], tile, ref)
        row["ms"] = graph_ms([lambda w=w: launch(x, w, tile) for w in ws])
        row["ratio_vs_cublas"] = base / row["ms"]
    except Exception as e:  # a variant that does not compile is a finding
        row["ok"], row["error"] = False, f"{type(e).__name__}: {str(e)[-600:]}"
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


def cublas_baseline(rows, log, x, wb, **ids) -> float:
    """cuBLAS bf16 on the same rows, graph-replayed over the bf16 weight copies in its own steady
    state (tuner.STEADY_WARM_MS first, as bench_gemm.py times it since run 33, from rest at the
    tuner's steady buckets since run 35): every ratio's denominator, recorded (and logged) as a row
    of its own."""
    base = graph_ms([lambda w=w: x @ w.weight.t() for w in wb], warm_ms=tuner.STEADY_WARM_MS,
                    rest_s=tuner.steady_rest_s(bucket_for(x.shape[0])))
    rows.append(dict(ids, variant="cublas-bf16", ms=base))
    log(rows[-1])
    return base


def _run_cases(rows, log, t, x, cases, ws, base, **ids) -> None:
    """cases: (name, tile) of template t, each run on x, checked against t's reference, timed
    and recorded with the ids."""
    ref = t.reference(x, ws[0])
    for name, tile in cases:
        rows.append(timed_case(dict(ids, variant=name, tile=tile), t.launch, x, tile, ws, ref, base))
        log(rows[-1])


# Slices tiles of the int4-x study at BM=16 (M = 1-16): (BLOCK_N, warps, stages, waves). 64/128
# rows at 4 warps and 256 at 8 take wgmma; 2 warps, or 32 rows, take mma.sync.
SMALL_TILES = ((64, 4, 3, 4), (128, 4, 3, 4), (128, 4, 4, 4), (256, 8, 3, 4), (128, 4, 3, 8),
               (32, 4, 3, 4), (64, 2, 3, 4), (128, 2, 3, 4), (128, 2, 4, 8))


def _int4_x_tiles(p):
    """The int4-x study's slices tiles for the Problem p."""
    b, N, K = p.bucket, p.N, p.K
    if b <= 16:
        return [gemm_tiles.tile("slices", 16, bn, 128, gemm_tiles._split_for(b, N, K, 16, bn, 128, 16, waves=wv), warps, st)
                for bn, warps, st, wv in SMALL_TILES]
    tiles = int4_tiles.slices_tiles(p)[:4]
    if b >= 128:
        tiles += [gemm_tiles.tile("slices", 128, bn, 128, gemm_tiles._split_for(b, N, K, 128, bn, 128, 16, waves=wv), warps, 3)
                  for bn, warps, wv in ((128, 8, 2), (64, 4, 4))]
    return tiles


def _points(study, fmts, shapes, ms, rows, log):
    """Each (shape, N, K, M, x, {format: weight copies}, cuBLAS time) of a study, the cuBLAS bf16
    baseline timed and recorded first (one row for every format of the study)."""
    dev = torch.device(DEV)
    for sh in shapes:
        N, K = SHAPES[sh]
        ws = {f: _weights(f, N, K, dev) for f in ("bf16",) + tuple(fmts)}
        for M in ms:
            x = torch.randn(M, K, device=dev).to(ACT)
            yield sh, N, K, M, x, ws, cublas_baseline(rows, log, x, ws["bf16"], study=study, shape=sh, M=M)


def study_int4_x(shapes, ms, log):
    """See the module docstring."""
    t = registry.TEMPLATES["int4_w4a16"]
    rows = []
    for sh, N, K, M, x, copies, base in _points("int4-x", ("int4-gptq",), shapes, ms, rows, log):
        ws = copies["int4-gptq"]
        p = t.problem(ws[0], bucket_for(M), x.dtype)
        default = t.default_tile(p)
        cases = [("default tile", default)]
        if M == 1 and default["path"] != "gemv":
            cases.append(("gemv", next(c for c in t.search_space(p) if c["path"] == "gemv")))
        cases += [("slices", tile) for tile in _int4_x_tiles(p) if tile != default]
        _run_cases(rows, log, t, x, cases, ws, base, study="int4-x", format="int4-gptq", shape=sh, M=M)
    return rows


def _join_study(study, shapes, ms, log, join_tiles):
    """The template's default tile beside the join path on join_tiles(bucket, default), each a
    (BLOCK_M, BLOCK_N, warps, stages, waves, max_split) tuple, at every shape and M (GPTQ)."""
    t = registry.TEMPLATES["int4_w4a16"]
    rows = []
    for sh, N, K, M, x, copies, base in _points(study, ("int4-gptq",), shapes, ms, rows, log):
        ws = copies["int4-gptq"]
        b = bucket_for(M)
        default = t.default_tile(t.problem(ws[0], b, x.dtype))
        cases = [("default tile", default)]
        for bm, bn, warps, st, wv, max_split in join_tiles(b, default):
            split = gemm_tiles._split_for(b, N, K, bm, bn, 128, max_split, waves=wv)
            jt = gemm_tiles.tile("join", bm, bn, 128, split, warps, st)
            if jt not in [c[1] for c in cases]:
                cases.append(("join", jt))
        _run_cases(rows, log, t, x, cases, ws, base, study=study, format="int4-gptq", shape=sh, M=M)
    return rows


def study_int4_join(shapes, ms, log):
    """int4 at M = 1-64 (GPTQ): the template's default tile beside its "join" path (run 12's study
    kernel, now int4._int4_join_kernel) on the same tile and on a few others."""
    def tiles(b, default):
        bm = min(64, max(16, b))
        return [(bm, bn, warps, st, wv, 16) for bn, warps, st, wv in
                ((default["BLOCK_N"], 4, 3, 4), (128, 4, 3, 4), (64, 4, 4, 8), (128, 4, 4, 8))]
    return _join_study("int4-join", shapes, ms, log, tiles)


# Join tiles of the int4-join-wide study: (BLOCK_M rows of x, BLOCK_N weight rows, warps, stages,
# waves). The weight rows are the MMA's M side (operand A, converted in registers), x's rows its N
# side (operand B, from shared memory): 8 warps put two warpgroups on the weight rows.
WIDE_TILES = ((64, 128, 4, 3, 4), (64, 128, 8, 3, 2), (128, 128, 8, 3, 2), (128, 128, 4, 3, 2),
              (128, 64, 4, 3, 2), (128, 256, 8, 2, 1), (256, 128, 8, 2, 1), (256, 64, 4, 2, 1))


def study_int4_join_wide(shapes, ms, log):
    """int4 at M = 128-1024 (GPTQ): the template's default tile (at bucket 256 and up a transient
    dense copy of the weight multiplied on the tensor cores, whose dequantization alone took about
    as long as cuBLAS's whole product at M=256 in run 12) beside the join kernel on wide tiles,
    which unpacks in registers and keeps no dense copy (run 13)."""
    return _join_study("int4-join-wide", shapes, ms, log,
                       lambda b, d: [t + (8,) for t in WIDE_TILES if t[0] <= max(16, b)])


# Join tiles of the int4-join-tiles study: (BLOCK_N weight rows, warps, stages, waves), rows of x
# as in the template (16-64). Fewer than 64 weight rows per warpgroup, or 2 warps, give mma.sync.
JOIN_TILES = ((64, 4, 4, 8), (64, 4, 3, 8), (64, 4, 5, 8), (64, 4, 6, 8), (64, 4, 4, 16), (64, 4, 4, 4),
              (32, 2, 4, 8), (64, 2, 4, 8), (32, 4, 4, 8), (32, 2, 6, 16), (128, 8, 4, 4), (128, 4, 4, 8))


def study_int4_join_tiles(shapes, ms, log):
    """int4 at M = 16-128 (GPTQ): the join path (picked for 26 of the 27B int4 keys at buckets 16-128
    in run 13's first re-tune, always on 64 weight rows) on deeper pipelines, more programs, and
    fewer weight rows or warps (mma.sync instead of wgmma), beside the template's default tile."""
    return _join_study("int4-join-tiles", shapes, ms, log,
                       lambda b, d: [(min(64, max(16, b)),) + t + (16,) for t in JOIN_TILES])


# Stream-K tiles of the streamk study: (BLOCK_M, BLOCK_N, BLOCK_K in bytes of K, warps, stages).
SK_TILES = ((128, 128, 128, 8, 4), (128, 256, 128, 8, 3), (128, 256, 128, 8, 4), (64, 128, 128, 4, 4),
            (64, 256, 128, 4, 3), (128, 128, 256, 8, 3), (64, 128, 256, 4, 3))
# The tiles the shipped cache held for the 27B keys when run 12 benchmarked them
# (results/gemm-nvidia-h200-2026-11-29.json, commit 3efc60d): the study's "tuned" rows.
TUNED_FROM = Path(__file__).resolve().parent / "results" / "gemm-nvidia-h200-2026-11-29.json"


def _tuned_tiles() -> dict:
    """(format, shape, M) -> vsr's tile in the bench_gemm results file TUNED_FROM ({} without it)."""
    if not TUNED_FROM.exists():
        return {}
    rows = json.loads(TUNED_FROM.read_text())["rows"]
    return {(r["format"], r["shape"], r["M"]): r["tile"] for r in rows
            if r["provider"] == "vsr" and not r["graph"] and r.get("tile")}


def study_streamk(shapes, ms, log):
    """bf16 and fp8 at M = 256-2048: the TMA tile walked stream-K ("tma-sk": whole waves of tiles,
    then the leftover tiles' K steps shared evenly by all multiprocessors) beside the template's
    default tile and run 12's tuned tile, on tiles of 64-128 rows. Run 10 ruled out splitting K in
    two (the workspace traffic of whole tiles); o and down at M=1024 make 2.4 waves of 128x128
    tiles, 0.78x and 0.77x cuBLAS in run 12 (graph replay)."""
    tuned = _tuned_tiles()
    rows = []
    for sh, N, K, M, x, ws, base in _points("streamk", ("fp8",), shapes, ms, rows, log):
        wb, w8 = ws["bf16"], ws["fp8"]
        for fmt, key, wf, kbytes in (("bf16", "dense", wb, 2), ("fp8", "fp8_w8a8", w8, 1)):
            t = registry.TEMPLATES[key]
            default = t.default_tile(t.problem(wf[0], bucket_for(M), x.dtype))
            cases = [("default tile", default)]
            if (fmt, sh, M) in tuned and tuned[(fmt, sh, M)] != default:
                cases.append(("tuned tile (run 12)", tuned[(fmt, sh, M)]))
            sk = [gemm_tiles.tile("tma-sk", bm, bn, kb // kbytes, 1, w, st) for bm, bn, kb, w, st in SK_TILES]
            cases += [("stream-K", c) for c in sk if gemm_tiles.smem_bytes(c, kbytes, kbytes) <= gemm_tiles.SMEM_LIMIT]
            _run_cases(rows, log, t, x, cases, wf, base, study="streamk", format=fmt, shape=sh, M=M)
    return rows


# The fp8-prologue study's product tiles are the shipped cache's
# (common_bench.SHIPPED_CACHE), as users run them (runs 15 and 16 took run 14's benchmark tiles
# instead, while the branch they measured changed the cache's keys); a key the cache lacks for
# this device takes the template's default tile.


def _run14_prologue_plan(M: int, K: int) -> fp8.ProloguePlan:
    """The prologue as run 14 shipped it: up to 256 rows the row in one power-of-two register
    block (K = 17408 padded to 32768), beyond that two chunked passes of 2048 columns."""
    if M <= 256 and K <= fp8.PROLOGUE_REGISTER_K:
        bk = common.next_pow2(K)
        return fp8.ProloguePlan(bk, 0, False, 4 if bk <= 2048 else 8 if bk <= 8192 else 16)
    return fp8.ProloguePlan(2048, 0, True, 4)


def _fp8_composed(plan_for, pdl: bool, prefetch: int = 0):
    """fp8.launch with a chosen prologue plan (plan_for(M, K)), the product a programmatic
    dependent of the prologue (pdl; asking the L2 for `prefetch` lines of each weight row first)
    or launched after it as usual."""
    def launch(x, w, tile, out=None):
        return fp8.launch(x, w, tile, out, plan=plan_for(*x.shape), pdl=pdl, prefetch=prefetch)
    return launch


def _product_alone(x, xq, xs, w, tile, out):
    """fp8's product alone on x's prequantized (xq, xs), into `out` or a new [M, N] in x's dtype."""
    y = common.output(x, w.N, out)
    fp8.launch_product(xq, xs, w, y, tile)
    return y


# Rows at which the fp8-prologue study times every prologue plan (elsewhere run 14's and the default).
PLAN_MS = (1, 256, 4096)
# 128-byte lines of each weight row the product asks of the L2 before it waits (fp8-prologue study).
PREFETCH_LINES = (4, 8, 16, 32)


def study_fp8_prologue(shapes, ms, log):
    """fp8's activation prologue (the row's amax, then e4m3 of x / s) and the programmatic
    dependent launch of the product after it. Run 11 measured run 14's prologue at 5.7 / 19.2 us
    at M=256 on qkv / down (K = 17408 padded to one 32768-column block), beside a 50 us product;
    at M <= 16 it is a second launch in series with a 17-35 us product.
    prologue rows: the prologue alone, each plan checked bit for bit against the reference
    quantization: run 14's plan, the two-register-block plan (fp8.prologue_plan) at its own and
    at 4/8/16 warps, the same dividing bf16 rows by s instead of multiplying them by 1/s (run 16),
    and chunked passes. fp8 rows: the whole call on the shipped tile: run 14's
    prologue then the product, the new prologue then the product, the same launched as
    programmatic dependents (PDL, sm_90+), and the product alone on a prequantized x."""
    pdl = common.pdl_supported(torch.device(DEV))
    t = registry.TEMPLATES["fp8_w8a8"]
    rows = []
    for sh, N, K, M, x, ws, base in _points("fp8-prologue", ("fp8",), shapes, ms, rows, log):
        w8 = ws["fp8"]
        rq, rs = fp8.quantize_activation(x)
        plans = [("run-14 plan", _run14_prologue_plan(M, K)), ("two blocks", fp8.prologue_plan(K))]
        plans += [(f"two blocks, {w} warps", fp8.prologue_plan(K, w)) for w in (4, 8, 16)]
        plans = plans if M in PLAN_MS else plans[:2]
        plans += [("chunked 2048, 4 warps", fp8.ProloguePlan(2048, 0, True, 4)),
                  ("chunked 4096, 8 warps", fp8.ProloguePlan(4096, 0, True, 8))]
        plans = [(name, plan, False) for name, plan in plans]
        plans.insert(2, ("two blocks, division", fp8.prologue_plan(K), True))   # bf16 x: no 1/s product
        seen = []
        for name, plan, divide in plans:
            if (plan, divide) in seen:
                continue
            seen.append((plan, divide))
            row = dict(study="fp8-prologue", part="prologue", shape=sh, M=M, variant=name,
                       plan=dataclasses.asdict(plan))
            try:
                xq, xs = fp8.quantize_activation_triton(x, plan, divide=divide)
                row["ok"] = bool(torch.equal(xq.view(torch.uint8), rq.view(torch.uint8))
                                 and torch.equal(xs, rs[:, 0]))
                row["ms"] = graph_ms([lambda p=plan, d=divide: fp8.quantize_activation_triton(x, p, divide=d)])
            except Exception as e:
                row["ok"], row["error"] = False, f"{type(e).__name__}: {str(e)[-600:]}"
            rows.append(row)
            log(row)
        tile = _tile_users_run(t, t.problem(w8[0], bucket_for(M), x.dtype))
        xq, xs = fp8.quantize_activation_triton(x)
        cases = [("run-14 prologue + product", _fp8_composed(_run14_prologue_plan, False)),
                 ("new prologue + product", _fp8_composed(lambda m, k: fp8.prologue_plan(k), False))]
        if pdl:
            cases.append(("new prologue + product, PDL", _fp8_composed(lambda m, k: fp8.prologue_plan(k), True)))
            cases += [(f"new prologue + product, PDL, prefetch {n} lines",
                       _fp8_composed(lambda m, k: fp8.prologue_plan(k), True, n)) for n in PREFETCH_LINES]
            cases.append(("fp8.launch", fp8.launch))
        cases.append(("product alone (x prequantized)",
                      lambda x_, w, tile_, out=None: _product_alone(x_, xq, xs, w, tile_, out)))
        ref = t.reference(x, w8[0])
        for name, launch in cases:
            row = timed_case(dict(study="fp8-prologue", part="fp8", format="fp8", shape=sh, M=M, variant=name,
                              tile=tile), launch, x, tile, w8, ref, base)
            rows.append(row)
            log(row)
    return rows


def _shipped_tile(t, p):
    """The shipped cache's tile for template t's Problem p on this device, whatever kernel source it
    was tuned for (the fixup studies ran on kernels newer than the cache); None if it has none."""
    return shipped_tile(t, p, DEV, SHIPPED_CACHE)


def _tile_users_run(t, p):
    """The tile users run for template t's Problem p here: the shipped cache's, else t's default."""
    return _shipped_tile(t, p) or t.default_tile(p)


# The formats (and templates) of the fixup studies' shipped tiles.
FIXUP_FORMATS = (("bf16", "dense"), ("fp8", "fp8_w8a8"), ("int4-gptq", "int4_w4a16"), ("int4-awq", "int4_w4a16"))

# Extra split-K tiles of the fixup study: for bf16 and fp8 at M <= 16, the transposed product on
# 128 weight rows (256 bytes of K per step, 4 or 6 stages) split 2, 3 and 4 ways (40-272 weight
# tiles on the 27B shapes, so 80-1088 programs).
FIXUP_SWAP = dict(rows=128, kbytes=256, stages=(4, 6), splits=(2, 3, 4))


def study_fixup(shapes, ms, log):
    """Split-K and stream-K partial sums added by each tile's last program to finish (FIXUP,
    common.last_to_finish) against the reduction kernel launched after the product, on the shipped
    cache's split and stream-K tiles (bf16, fp8, int4 GPTQ and AWQ), plus, for bf16 and fp8 at
    M <= 16, transposed-product tiles split 2-4 ways with the fixup (tiles the reduction's cost kept
    out of the cache), and at M=256 the 128-row stream-K tiles both ways."""
    rows = []
    for sh, N, K, M, x, ws, base in _points("fixup", tuple(f for f, _ in FIXUP_FORMATS[1:]), shapes, ms, rows, log):
        for fmt, key in FIXUP_FORMATS:
            t = registry.TEMPLATES[key]
            wf = ws[fmt]
            tile = _shipped_tile(t, t.problem(wf[0], bucket_for(M), x.dtype))
            if tile is None:
                continue
            cases = []
            if tile.get("SPLIT_K", 1) > 1 or tile["path"] in ("tma-sk", "dequant-sk"):
                cases += [("shipped, reduction kernel", dict(tile, FIXUP=0)), ("shipped, in-kernel fixup", dict(tile, FIXUP=1))]
            else:
                cases.append(("shipped", tile))
            kb = 2 if fmt == "bf16" else 1
            if fmt in ("bf16", "fp8") and M <= 16:
                for split in FIXUP_SWAP["splits"]:
                    for st in FIXUP_SWAP["stages"]:
                        c = gemm_tiles.swap_tile(FIXUP_SWAP["kbytes"] // kb, FIXUP_SWAP["rows"], st, split=split)
                        cases.append((f"swap split {split}, fixup", dict(c, FIXUP=1)))
            if fmt in ("bf16", "fp8") and M == 256:
                for bn in (128, 256):
                    c = gemm_tiles.tile("tma-sk", 128, bn, 128 // kb, 1, 8, 3 if bn == 256 and kb == 2 else 4)
                    if gemm_tiles.smem_bytes(c, kb, kb) <= gemm_tiles.SMEM_LIMIT:
                        cases += [(f"sk 128x{bn}, reduction kernel", c), (f"sk 128x{bn}, fixup", dict(c, FIXUP=1))]
            if fmt.startswith("int4") and M in (16, 64) and tile.get("SPLIT_K", 1) > 1:
                for split in sorted({tile["SPLIT_K"] * 2, max(2, tile["SPLIT_K"] // 2)} - {tile["SPLIT_K"]}):
                    cases.append((f"shipped at split {split}, fixup", dict(tile, SPLIT_K=split, FIXUP=1)))
            _run_cases(rows, log, t, x, cases, wf, base, study="fixup", format=fmt, shape=sh, M=M)
    return rows


def study_int4_fixup_tiles(shapes, ms, log):
    """int4 GPTQ at M = 16-64: the shipped tile beside join tiles of 64 or 128 weight rows, 3 or 4
    stages, split 1-8 (with the in-kernel fixup where split > 1): which join tiles the fixup makes
    worth offering beyond run 18's (the fixup study found half the split better at M=64)."""
    rows = []
    t = registry.TEMPLATES["int4_w4a16"]
    for sh, N, K, M, x, ws, base in _points("int4-fixup-tiles", ("int4-gptq",), shapes, ms, rows, log):
        wf = ws["int4-gptq"]
        shipped = _shipped_tile(t, t.problem(wf[0], bucket_for(M), x.dtype))
        cases = [("shipped", shipped)] if shipped else []
        for bn in INT4_FIXUP_TILES["rows"]:
            for st in INT4_FIXUP_TILES["stages"]:
                for split in INT4_FIXUP_TILES["splits"]:
                    c = gemm_tiles.tile("join", min(64, max(16, M)), bn, 128, split, 4, st)
                    if split > 1:
                        c["FIXUP"] = 1
                    if c != shipped:
                        cases.append((f"join {bn} rows, split {split}", c))
        _run_cases(rows, log, t, x, cases, wf, base, study="int4-fixup-tiles", format="int4-gptq", shape=sh, M=M)
    return rows


# The int4-fixup-tiles study's join tiles: weight rows, stages, splits.
INT4_FIXUP_TILES = dict(rows=(64, 128), stages=(3, 4), splits=(1, 2, 4, 8))


class PrezeroedCounters:
    """common.tile_counters for the capture-counters study: while a CUDA graph is captured, slices
    of one buffer zeroed before the capture, each handed out once (`off`: how many so far), so the
    graph holds no zeroing node; otherwise (eager, or the buffer used up: counted in `fallbacks`)
    `shipped`, the function it stands in for."""

    def __init__(self, shipped, counters: int, device):
        self.shipped = shipped
        self.buf = torch.zeros(counters, dtype=torch.int32, device=device)
        self.off = 0
        self.fallbacks = 0

    def __call__(self, device, tiles):
        if torch.cuda.is_current_stream_capturing():
            if self.off + tiles <= self.buf.numel():
                self.off += tiles
                return self.buf[self.off - tiles:self.off]
            self.fallbacks += 1
        return self.shipped(device, tiles)


# Counters in the capture-counters study's zeroed buffer (16 MiB: a timing's graph holds up to
# 200 cycles over the weight copies, each launch needing one counter per output tile).
PREZEROED_COUNTERS = 1 << 22


def study_capture_counters(shapes, ms, log):
    """The shipped in-kernel fixup tiles (FIXUP, split > 1: int4 at M = 1-64 on qkv, o and down in
    run 19), replayed in a CUDA graph three ways: with common.tile_counters as it is (main at run
    19: each captured launch zeroing its own counters in the graph; branch next-retune: slices of a
    pool zeroed before the capture); with counters zeroed before the capture (PrezeroedCounters);
    and the same tile with the reduction kernel instead (FIXUP=0). Run 19's benchmark found the
    fixup tiles 1.2-1.8 us slower in graphs than run 18's, whose counters were shared and zeroed
    once (results/variants-nvidia-h200-2026-11-30-run19-capture-counters.json on main,
    ...-capture-counters-pool.json on next-retune, whose first variant was still called
    "counters zeroed in the graph")."""
    rows = []
    shipped_counters = common.tile_counters
    for sh, N, K, M, x, ws, base in _points("capture-counters", tuple(f for f, _ in FIXUP_FORMATS[1:]), shapes, ms,
                                            rows, log):
        for fmt, key in FIXUP_FORMATS:
            t = registry.TEMPLATES[key]
            wf = ws[fmt]
            tile = _shipped_tile(t, t.problem(wf[0], bucket_for(M), x.dtype))
            if tile is None or not common.split_fixup(tile, common.split_plan(K, tile)[1]):
                continue   # (a stream-K tile's fixup needs no K split, so one would be skipped: none ships)
            ids = dict(study="capture-counters", format=fmt, shape=sh, M=M)
            _run_cases(rows, log, t, x, [("fixup, tile_counters as it is", tile),
                                         ("reduction kernel", dict(tile, FIXUP=0))], wf, base, **ids)
            pre = PrezeroedCounters(shipped_counters, PREZEROED_COUNTERS, x.device)
            common.tile_counters = pre
            try:
                _run_cases(rows, log, t, x, [("fixup, counters zeroed before", tile)], wf, base, **ids)
            finally:
                common.tile_counters = shipped_counters
            rows[-1].update(counters_handed_out=pre.off, fallbacks=pre.fallbacks)
    return rows


def study_int4_x_split(shapes, ms, log):
    """int4 GPTQ and AWQ at M = 1-16 on the shipped cache's slices tiles: x through the slice-order
    copy (a second launch; as shipped) against X_SPLIT (x as stored, each step's block split into
    its slices in registers: no copy, more instructions per step; run 19; at M <= BLOCK_M / 8 the
    launcher now takes X_ROW for it, the rows in place). Points whose shipped tile is not a slices
    tile are skipped."""
    rows = []
    t = registry.TEMPLATES["int4_w4a16"]
    for sh, N, K, M, x, ws, base in _points("int4-x-split", ("int4-gptq", "int4-awq"), shapes, ms, rows, log):
        for fmt in ("int4-gptq", "int4-awq"):
            tile = _shipped_tile(t, t.problem(ws[fmt][0], bucket_for(M), x.dtype))
            if tile is None or tile["path"] != "slices":
                continue
            _run_cases(rows, log, t, x, [("slice-order copy", tile), ("X_SPLIT", dict(tile, X_SPLIT=1))], ws[fmt],
                       base, study="int4-x-split", format=fmt, shape=sh, M=M)
    return rows


@contextlib.contextmanager
def _no_slice_copy():
    """int4.launch with x already in slice order: the slices product (and its reduction) without
    the copy, to time what the copy costs inside a graph."""
    shipped = int4.slice_order
    int4.slice_order = lambda x, bk: x
    try:
        yield
    finally:
        int4.slice_order = shipped


def _x_form(tile: dict, M: int) -> str:
    """The form an X_SPLIT slices tile reads M rows of x in: "X_ROW" where they fit in place (int4.launch
    takes X_ROW at 8·M <= BLOCK_M), else "X_SPLIT"."""
    return "X_ROW" if 8 * M <= tile["BLOCK_M"] else "X_SPLIT"


def study_int4_m1(shapes, ms, log):
    """int4 GPTQ and AWQ at M = 1-16 (run 28): the shipped tile and, where it is a slices tile that
    copies x into slice order, the same with x handed over already in that order (the copy taken
    out of the call); that tile with x as stored (X_SPLIT: each step's block split in registers,
    or, at M <= BLOCK_M / 8, X_ROW: the rows loaded once, row m's slice j in column 8m + j), and
    at M <= 4 the shipped slices tile widened to hold M rows in place and every X_ROW tile of
    the bucket's space.
    Earlier forms of this study: 82d3a38 also timed the no-copy product with its weight held in
    the L2; 76a54f0 and 82d3a38 slices tiles of 1-8 warps on 16-256 weight rows, and 76a54f0 GEMV
    tiles of 16-64 rows, beside the shipped ones; 12f7247 the slices kernel's products on two
    accumulators (a tile field then)."""
    rows = []
    t = registry.TEMPLATES["int4_w4a16"]
    for sh, N, K, M, x, ws, base in _points("int4-m1", ("int4-gptq", "int4-awq"), shapes, ms, rows, log):
        for fmt in ("int4-gptq", "int4-awq"):
            ids = dict(study="int4-m1", format=fmt, shape=sh, M=M)
            w0 = ws[fmt][0]
            p = t.problem(w0, bucket_for(M), x.dtype)
            shipped = _shipped_tile(t, p)
            name = "shipped" if shipped is not None else "default"
            shipped = shipped or t.default_tile(p)
            copies_x = shipped["path"] == "slices" and not shipped.get("X_SPLIT")
            cases = [(name, shipped)]
            in_place = [dict(shipped, X_SPLIT=1)] if copies_x else []
            if M <= 4 and shipped["path"] == "slices":   # (58784fd, run 29: also 32 rows, four in place)
                in_place.append(dict(shipped, BLOCK_M=max(shipped["BLOCK_M"], 8 * p.bucket), X_SPLIT=1))
            for tile in in_place:
                if all(tile != c for _, c in cases):
                    cases.append((f"{name}, {_x_form(tile, M)}", tile))
            if M <= 4 and shipped["path"] == "slices":   # every X_SPLIT tile of the space (X_ROW where they fit)
                cases += [(f"slices, {_x_form(c, M)}", c)
                          for c in int4_tiles.slices_tiles(p) if c.get("X_SPLIT") and all(c != t for _, t in cases)]
            ref = t.reference(x, w0)
            for label, tile in cases:
                rows.append(timed_case(dict(ids, variant=label, tile=tile), t.launch, x, tile, ws[fmt], ref, base))
                log(rows[-1])
            if copies_x:
                # Valid only where launch would neither permute x (act_order) nor pad it itself.
                assert w0.act_perm is None and K % shipped["BLOCK_K"] == 0, (sh, fmt)
                xs = int4.slice_order(x, shipped["BLOCK_K"])
                with _no_slice_copy():
                    rows.append(timed_case(dict(ids, variant=f"{name}, no x copy", tile=shipped),
                                           lambda x_, w, tile, out=None: t.launch(xs, w, tile, out=out),
                                           x, shipped, ws[fmt], ref, base))
                log(rows[-1])
    return rows


def _wide_name(w: dict) -> str:
    return f"wide {w['BLOCK_M']}x{w['BLOCK_N']}+{w['BLOCK_N2']} w{w['num_warps']} s{w['num_stages']}"


def _wide_study(study, shapes, ms, log, wide_tiles, bks=(64, 128), name=_wide_name):
    """bf16 and fp8: the shipped cache's tile against wide_tiles(bk, bucket) (wide TMA tiles:
    BLOCK_N + BLOCK_N2 weight rows, or other candidate tiles with their own `name`; bk from bks,
    bf16's then fp8's). fp8's candidates keep the shipped tile's prologue knobs."""
    rows = []
    for sh, N, K, M, x, ws, base in _points(study, ("fp8",), shapes, ms, rows, log):
        for (fmt, key), bk in zip((("bf16", "dense"), ("fp8", "fp8_w8a8")), bks):
            t = registry.TEMPLATES[key]
            shipped = _shipped_tile(t, t.problem(ws[fmt][0], bucket_for(M), x.dtype))
            # fp8's prologue knobs: the shipped tile's, else the bucket's defaults (fp8 only)
            knobs = ({k: v for k, v in shipped.items() if k in ("PRO_WARPS", "PDL")} if shipped
                     else fp8.prologue_defaults(bucket_for(M)) if fmt == "fp8" else {})
            cases = [("shipped", shipped)] if shipped is not None else []
            cases += [(name(w), dict(w, **knobs)) for w in wide_tiles(bk, bucket_for(M))]
            _run_cases(rows, log, t, x, cases, ws[fmt], base, study=study, format=fmt, shape=sh, M=M)
    return rows


def study_wide(shapes, ms, log):
    """bf16 and fp8 at M = 256-1024: the shipped cache's tile against every wide TMA tile of the
    space (gemm_tiles.wide_tiles: widths no power of two gives, so that a layer's tiles make about
    one wave; run 20's peer_kernels.py: cuBLAS's 168-, 80- and 176-wide tiles at M = 256)."""
    return _wide_study("wide", shapes, ms, log,   # (rows whose bucket has no wide tiles: the shipped tile only)
                       lambda bk, b: gemm_tiles.wide_tiles(bk, b) if b in gemm_tiles.WIDE_SPLITS else [])


def _wide_64(bk: int, splits) -> list[dict]:
    """Wide TMA tiles of 64 rows of x on one warpgroup: one per (BLOCK_N, BLOCK_N2, stages)."""
    return [dict(gemm_tiles.tile("tma", 64, bn, bk, 1, 4, st), BLOCK_N2=bn2) for bn, bn2, st in splits]


# Wide tiles of 64 rows of x on one warpgroup (BLOCK_N, BLOCK_N2, stages), for the wide-64 study.
WIDE_64 = ((128, 32, 3), (128, 32, 4), (64, 16, 3), (64, 16, 4), (64, 32, 3), (128, 64, 3))


def study_wide_64(shapes, ms, log):
    """Wide TMA tiles of 64 rows of x on 4 warps (none in the space) at M = 256-512. Run 21's wide
    tiles (128 rows, 8 warps, one program per multiprocessor) did not beat the shipped 64 x 128
    tiles at bf16 M=256, which run two programs per multiprocessor: 320 programs on qkv, 160 on o
    and down, for 264 places. 64 x 160 tiles make 256 programs on qkv, 64 x 80 tiles 256 on o and
    down: every program of the layer resident at once, none waiting for a second round."""
    return _wide_study("wide-64", shapes, ms, log, lambda bk, bucket: _wide_64(bk, WIDE_64))


# Wide tiles of the wide-few study (BLOCK_N, BLOCK_N2, stages), 64 rows on 4 warps, the K step of
# the shipped TMA tiles at M=64 (128 for bf16, 256 for fp8); those over gemm_tiles.SMEM_LIMIT left out.
WIDE_FEW = ((64, 16, 4), (64, 16, 6), (128, 32, 3), (128, 32, 4))


def study_wide_few(shapes, ms, log):
    """Wide TMA tiles at M = 16-64, where the shipped tiles leave multiprocessors idle on qkv: 64 x
    128 (bf16 and fp8 at M=64) and the transposed 128-row tiles (M=16) make 80 programs for 132
    multiprocessors, and fp8 qkv is 1.47x cuBLAS at M=64 (target 1.6x; run 21). 64 x 80 tiles make
    128 programs on qkv; 64 x 160 makes 64, for comparison (o and down: half as many)."""
    return _wide_study("wide-few", shapes, ms, log, lambda bk, bucket: [   # K steps of 256 bytes: 2- or 1-byte elements
        t for t in _wide_64(bk, WIDE_FEW) if gemm_tiles.smem_bytes(t, 256 // bk, 256 // bk) <= gemm_tiles.SMEM_LIMIT],
        bks=(128, 256))


# Tiles of 256 rows of x for the sk-256 study: (path, BLOCK_N, warps, stages, FIXUP).
SK_256 = (("tma-sk", 128, 8, 3, 0), ("tma-sk", 128, 8, 4, 0), ("tma-sk", 128, 8, 4, 1), ("tma-sk", 64, 8, 4, 0),
          ("tma-sk", 64, 4, 4, 0), ("tma", 128, 8, 4, 0))


def study_sk_256(shapes, ms, log):
    """bf16 and fp8 at M = 256-512: stream-K over tiles of 256 rows of x. At M=256 the shipped
    64 x 128 tiles fetch each weight tile four times and each step's operands move 24 KB into a
    multiprocessor for 1 MFLOP; a 256 x 128 tile fetches the weight once and moves 48 KB for 4
    MFLOP, but o and down then make 40 tiles for 132 multiprocessors, which stream-K shares out
    by K step (the Gluon stream-K form of run 22 paid for its parts in a second kernel; here the
    shipped fixup adds them, or its reduction kernel). The plain 256 x 128 tile is timed too."""
    return _wide_study("sk-256", shapes, ms, log, lambda bk, bucket: [
        dict(gemm_tiles.tile(path, 256, bn, bk, 1, w, st), FIXUP=fx) for path, bn, w, st, fx in SK_256],
        name=lambda t: (f"{t['path']} 256x{t['BLOCK_N']} w{t['num_warps']} s{t['num_stages']}"
                        f"{' fixup' if t['FIXUP'] else ''}"))


# The sk-reduce study's forms of the stream-K reduction: (rows a program adds, warps); None: no
# reduction at all (the product alone, for its time: the leftover tiles are then never written).
SK_REDUCE_FORMS = ((16, 4), (8, 4), (32, 4), (32, 8), (64, 8), None)


@contextlib.contextmanager
def _reduce_form(form):
    """gemm.launch_tma with the stream-K reduction in `form` (see SK_REDUCE_FORMS): its rows per
    program through gemm.STREAMK_REDUCE_ROWS, its warps through a stand-in for the kernel that
    launches the real one with them (or, for None, nothing)."""
    kernel, rows = gemm.streamk_reduce_kernel, gemm.STREAMK_REDUCE_ROWS

    class Launcher:
        def __getitem__(self, grid):
            if form is None:
                return lambda *args, **kwargs: None
            return lambda *args, **kwargs: kernel[grid](*args, **dict(kwargs, num_warps=form[1]))
    gemm.streamk_reduce_kernel = Launcher()
    gemm.STREAMK_REDUCE_ROWS = form[0] if form else rows
    try:
        yield
    finally:
        gemm.streamk_reduce_kernel, gemm.STREAMK_REDUCE_ROWS = kernel, rows


def study_sk_reduce(shapes, ms, log):
    """bf16 at M = 256 and 1024: stream-K tiles (the 256 x 128 one of bucket 256, the 128 x 256
    one of buckets 512-2048) with their reduction in several forms, and the product alone. Run
    23 measured the reduction at 9.4 us on o at M=256 (Nsight Compute) after a 40.6 us product,
    the gap to cuBLAS there; its 640 programs of 16 rows on 4 warps take 86 registers on the
    H200's Triton 3.6. Here: fewer, wider programs or more, narrower ones, and without it (the
    product alone, unchecked: its `ok` is None)."""
    rows = []
    t = registry.TEMPLATES["dense"]
    for sh, N, K, M, x, ws, base in _points("sk-reduce", (), shapes, ms, rows, log):
        bm, bn = (256, 128) if bucket_for(M) == 256 else (128, 256)
        tile = gemm_tiles.tile("tma-sk", bm, bn, gemm_tiles.k_step(x.element_size()), 1, 8, 4)
        ref = t.reference(x, ws["bf16"][0])
        for form in SK_REDUCE_FORMS:
            name = f"reduce {form[0]} rows w{form[1]}" if form else "product alone"
            with _reduce_form(form):
                row = timed_case(dict(study="sk-reduce", format="bf16", shape=sh, M=M, variant=name, tile=tile),
                                 t.launch, x, tile, ws["bf16"], ref, base)
            if form is None and "error" not in row:
                row["ok"] = None
            rows.append(row)
            log(row)
    return rows


# The fp8-overlap study's row chunks (each rounded up to a multiple of the tile's BLOCK_M).
OVERLAP_CHUNKS = (2, 4, 8)
_SIDE_STREAMS: dict = {}


def _fp8_overlapped(chunks: int, tile_for=None, early: bool = False):
    """fp8.launch with its prologue overlapped by its product: x's rows in `chunks` chunks; chunk
    0's rows quantized on the calling stream, the others' on a side stream (after chunk 0's, or
    with it where `early`), each chunk's product on the calling stream once its rows are ready.
    The product is compute-bound at these rows and the prologue memory-bound: a prologue program
    (4-16 warps, a few hundred bytes of shared memory) fits beside a product program on a
    multiprocessor, so chunk i+1's rows can be quantized while chunk i's product runs. tile_for(rows):
    the product tile of a chunk (default the call's tile)."""
    def launch(x, w, tile, out=None):
        M = x.shape[0]
        y = common.output(x, w.N, out)
        main = torch.cuda.current_stream()
        if x.device not in _SIDE_STREAMS:
            _SIDE_STREAMS[x.device] = torch.cuda.Stream(x.device)
        side = _SIDE_STREAMS[x.device]
        rows = -(-M // chunks)
        rows = -(-rows // tile["BLOCK_M"]) * tile["BLOCK_M"]
        bounds = [(r, min(M, r + rows)) for r in range(0, M, rows)]
        plan, _ = fp8.tile_prologue(tile, w.K)
        parts = [None] * len(bounds)   # each chunk's (xq, xs), quantized by fp8's own prologue
        ready = [None] * len(bounds)
        if not early:
            parts[0] = fp8.quantize_activation_triton(x[bounds[0][0]:bounds[0][1]], plan)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            for i in range(0 if early else 1, len(bounds)):
                parts[i] = fp8.quantize_activation_triton(x[bounds[i][0]:bounds[i][1]], plan)
                for t_ in parts[i]:   # made on the side stream, read on the calling one
                    t_.record_stream(main)
                ready[i] = torch.cuda.Event()
                ready[i].record(side)
        for i, (r0, r1) in enumerate(bounds):
            if ready[i] is not None:
                main.wait_event(ready[i])
            t = tile_for(r1 - r0) if tile_for else tile
            fp8.launch_product(*parts[i], w, y[r0:r1], t)
        return y
    return launch


def _fp8_shipped(t, x, w8):
    """(tile, its prologue plan, x quantized by it: xq, xs) of fp8 at x's rows on the shipped tile."""
    tile = _tile_users_run(t, t.problem(w8[0], bucket_for(x.shape[0]), x.dtype))
    plan, _ = fp8.tile_prologue(tile, x.shape[1])
    return (tile, plan, *fp8.quantize_activation_triton(x, plan))


def _prologue_alone_row(study, sh, M, x, plan) -> dict:
    """The prologue alone on x (its plan), graph-timed; exact by construction of the plan (the
    fp8-prologue study checks every plan's bytes)."""
    row = dict(study=study, part="prologue", shape=sh, M=M, variant="prologue alone",
               plan=dataclasses.asdict(plan), ok=True)
    row["ms"] = graph_ms([lambda: fp8.quantize_activation_triton(x, plan)])
    return row


def study_fp8_overlap(shapes, ms, log):
    """fp8 at many rows: the activation prologue (memory-bound, 4-12% of the call at M = 1024-4096)
    overlapped by the product (compute-bound) over row chunks (_fp8_overlapped), against
    fp8.launch on the shipped tile, the product alone on a prequantized x, and the prologue alone.
    Each case checked against the reference; `same_bytes`: its output equal to fp8.launch's."""
    t = registry.TEMPLATES["fp8_w8a8"]
    rows = []
    for sh, N, K, M, x, ws, base in _points("fp8-overlap", ("fp8",), shapes, ms, rows, log):
        w8 = ws["fp8"]
        tile, plan, xq, xs = _fp8_shipped(t, x, w8)
        rows.append(_prologue_alone_row("fp8-overlap", sh, M, x, plan))
        log(rows[-1])

        def own_tile(r):
            return _tile_users_run(t, t.problem(w8[0], bucket_for(r), x.dtype))
        cases = [("fp8.launch", fp8.launch),
                 ("product alone (x prequantized)",
                  lambda x_, w, tile_, out=None: _product_alone(x_, xq, xs, w, tile_, out))]
        for n in OVERLAP_CHUNKS:
            if M // n < 128:
                continue
            cases.append((f"overlap {n} chunks", _fp8_overlapped(n)))
            cases.append((f"overlap {n} chunks, chunk's tile", _fp8_overlapped(n, own_tile)))
            cases.append((f"overlap {n} chunks, early", _fp8_overlapped(n, early=True)))
        ref = t.reference(x, w8[0])
        y0 = fp8.launch(x, w8[0], tile)
        for name, launch in cases:
            row = timed_case(dict(study="fp8-overlap", part="fp8", format="fp8", shape=sh, M=M, variant=name,
                                  tile=tile), launch, x, tile, w8, ref, base)
            if "error" not in row:
                row["same_bytes"] = bool(torch.equal(launch(x, w8[0], tile), y0))
            rows.append(row)
            log(row)
    return rows


def _prologue_then_product(plan):
    """fp8.launch composed by hand: the prologue into fresh buffers, then the product (no PDL)."""
    def launch(x, w, tile, out=None):
        y = common.output(x, w.N, out)
        xq, xs = fp8.quantize_activation_triton(x, plan)
        fp8.launch_product(xq, xs, w, y, tile)
        return y
    return launch


def study_fp8_call_parts(shapes, ms, log):
    """fp8 at many rows, the call against its parts, in A-B-A order: fp8.launch, the product alone
    on a prequantized x, the prologue then the product composed by hand, fp8.launch again, and
    the prologue alone (run 33's fp8-overlap study found the product alone slower than the whole
    call at M=4096 on every shape, and the call 13-16 us slower than its parts at M=1024 on
    gate_up and down). With `nvidia-smi dmon` beside it, the clocks the card ran at."""
    t = registry.TEMPLATES["fp8_w8a8"]
    rows = []
    for sh, N, K, M, x, ws, base in _points("fp8-call-parts", ("fp8",), shapes, ms, rows, log):
        w8 = ws["fp8"]
        tile, plan, xq, xs = _fp8_shipped(t, x, w8)
        ref = t.reference(x, w8[0])
        cases = [("fp8.launch", fp8.launch),
                 ("product alone (x prequantized)",
                  lambda x_, w, tile_, out=None: _product_alone(x_, xq, xs, w, tile_, out)),
                 ("prologue, then product", _prologue_then_product(plan)),
                 ("fp8.launch again", fp8.launch)]
        for name, launch in cases:
            row = timed_case(dict(study="fp8-call-parts", part="fp8", format="fp8", shape=sh, M=M, variant=name,
                                  tile=tile), launch, x, tile, w8, ref, base)
            row["t"] = time.time()
            rows.append(row)
            log(row)
        rows.append(_prologue_alone_row("fp8-call-parts", sh, M, x, plan))
        log(rows[-1])
    return rows


def _peer_and_vsr_cases(study, sh, M, x, ws, rows, log) -> dict:
    """{name: calls over the weight copies} of cuBLAS bf16, vsr bf16 and vsr fp8 on the shipped
    tiles (each checked against its reference first, the check logged as a row) and `_scaled_mm`
    on x quantized outside the calls: the interleave and power-trace studies' cases."""
    from common_bench import scaled_mm, scaled_mm_weight_scale, torch_quant
    cases = {"cublas-bf16": [lambda w=w: x @ w.weight.t() for w in ws["bf16"]]}
    for fmt, tname in (("bf16", "dense"), ("fp8", "fp8_w8a8")):
        t = registry.TEMPLATES[tname]
        tile = _tile_users_run(t, t.problem(ws[fmt][0], bucket_for(M), x.dtype))
        ok, rel = checked_launch(t.launch, x, ws[fmt][0], tile, t.reference(x, ws[fmt][0]))
        rows.append(dict(study=study, format=fmt, shape=sh, M=M, variant="check", ok=ok, rel_err=rel, tile=tile))
        log(rows[-1])
        cases[f"vsr-{fmt}"] = [lambda w=w, t=t, tile=tile: t.launch(x, w, tile) for w in ws[fmt]]
    xq, sa = torch_quant(x)
    sb = [scaled_mm_weight_scale(w) for w in ws["fp8"]]
    cases["scaled_mm"] = [lambda w=w, s=s: scaled_mm(xq, sa, w, s) for w, s in zip(ws["fp8"], sb)]
    return cases


def study_interleave(shapes, ms, log):
    """Timing order at many rows (run 33: the H200 power-limited under the products, a case timed
    after heavier ones slower): _peer_and_vsr_cases, each timed by graph_ms one after another as
    bench_gemm.py did until run 33 (in that order and reversed), and by interleaved_graph_ms
    (replays interleaved round by round, twice)."""
    from common_bench import interleaved_graph_ms
    rows = []
    for sh, N, K, M, x, ws, base in _points("interleave", ("fp8",), shapes, ms, rows, log):
        cases = _peer_and_vsr_cases("interleave", sh, M, x, ws, rows, log)
        for form, order in (("sequential", list(cases)), ("interleaved", None),
                            ("sequential, reversed", list(cases)[::-1]), ("interleaved, again", None)):
            if order is None:
                got, errors = interleaved_graph_ms(cases)
                assert not errors, errors
            else:
                got = {name: graph_ms(cases[name]) for name in order}
            row = dict(study="interleave", shape=sh, M=M, variant=form, ms_by_case=got,
                       ratio_vs_cublas_by_case={k: got["cublas-bf16"] / v for k, v in got.items()})
            rows.append(row)
            log(row)
    return rows


def study_power_trace(shapes, ms, log):
    """How fast a case's speed settles under its own load: _peer_and_vsr_cases replayed back to
    back for 400 ms each, one after another, in both orders (run 33: the first case timed after
    lighter work ran up to 18% faster). Each row: the case timed just before it (`after`; the
    point's cuBLAS baseline, timed unwarmed, before the first), the trace (ms since the case began,
    per-call ms), the median of its first 10 ms and of its last 100 ms."""
    from common_bench import replay_trace
    rows = []
    for sh, N, K, M, x, ws, base in _points("power-trace", ("fp8",), shapes, ms, rows, log):
        cases = _peer_and_vsr_cases("power-trace", sh, M, x, ws, rows, log)
        before = "cublas-bf16 baseline"
        for order in (list(cases), list(cases)[::-1]):
            for name in order:
                tr = replay_trace(cases[name])
                first = [v for t, v in tr if t < 10.0] or [tr[0][1]]
                last = [v for t, v in tr if t >= tr[-1][0] - 100.0]
                row = dict(study="power-trace", shape=sh, M=M, variant=name, after=before,
                           first_10ms=statistics.median(first), last_100ms=statistics.median(last),
                           trace=[(round(t, 2), round(v, 5)) for t, v in tr])
                rows.append(row)
                log(row)
                before = name
    return rows


# The steady-picks study: how many of a key's recorded candidates it times again (the best first).
STEADY_PICKS_TOP = 3
STEADY_PICKS_PASSES = 2


def _over_passes(passes, name):
    """(median ms or None, each pass's ms or None, the first error) of one case over several
    steady_graph_ms passes."""
    got = [times.get(name) for times, _ in passes]
    timed = [g for g in got if g is not None]
    return (statistics.median(timed) if timed else None), got, next((e[name] for _, e in passes if name in e), None)


def study_steady_picks(shapes, ms, log):
    """Would the tuner pick otherwise with the steady-state timer? For the 27B-class bf16 and fp8
    keys at each M's bucket, the shipped cache's best STEADY_PICKS_TOP candidates (by the times its
    tuner recorded with the unwarmed graph timer, about 30 ms a candidate) timed again, each in its
    own steady state (common_bench.steady_graph_ms, as bench_gemm.py times since run 33), in
    STEADY_PICKS_PASSES passes, every one checked against the reference first. Rows: the recorded
    time and each pass's steady time (ms: their median), the shipped tile marked."""
    from common_bench import steady_graph_ms
    rows = []
    for sh, N, K, M, x, ws, base in _points("steady-picks", ("fp8",), shapes, ms, rows, log):
        for fmt, tname in (("bf16", "dense"), ("fp8", "fp8_w8a8")):
            t = registry.TEMPLATES[tname]
            e = shipped_entry(t, t.problem(ws[fmt][0], bucket_for(M), x.dtype), DEV, SHIPPED_CACHE)
            if e is None:
                continue
            cands = sorted((c for c in e.candidates if c["ok"]), key=lambda c: c["ms"])[:STEADY_PICKS_TOP]
            ref = t.reference(x, ws[fmt][0])
            cases, info = {}, {}
            for i, c in enumerate(cands):
                tile = c["tile"]
                ok, rel = checked_launch(t.launch, x, ws[fmt][0], tile, ref)
                info[i] = dict(tile=tile, recorded_ms=c["ms"], ok=ok, rel_err=rel, shipped=tile == e.tile)
                if ok:   # a candidate that fails its check now is reported, not timed
                    cases[i] = [lambda w=w, tile=tile: t.launch(x, w, tile) for w in ws[fmt]]
            # Twice in turn (A B C A B C): what drifts over seconds (the card warming) shows as a
            # difference between the two passes, not between the candidates.
            passes = [steady_graph_ms(cases, rest_s=tuner.steady_rest_s(bucket_for(M)))
                      for _ in range(STEADY_PICKS_PASSES)]
            for i, d in info.items():
                ms_, got, error = _over_passes(passes, i)
                row = dict(study="steady-picks", format=fmt, shape=sh, M=M, variant=f"candidate {i}", **d,
                           ms=ms_, ms_passes=got, error=error, ratio_vs_cublas=base / ms_ if ms_ else None)
                rows.append(row)
                log(row)
    return rows


# The steady-ab study: the file whose tiles the shipped cache's are timed against (--against), and
# how many times each pair is timed (in turn, the order flipped each time).
STEADY_AB_AGAINST: Path | None = None
STEADY_AB_PASSES = 4
STEADY_AB_FORMATS = FIXUP_FORMATS   # every format of the shipped cache's 27B-class keys


def _keys_tiled_apart(study, names, shapes, ms, rows, log):
    """Each (shape, M, format, template, weight copies, x, reference, cuBLAS time, {name: tile}) of
    a study's 27B-class keys (STEADY_AB_FORMATS at each M's bucket) whose tile differs between the
    shipped cache and --against, names[0] naming the shipped cache's tile and names[1] the other's."""
    if STEADY_AB_AGAINST is None:
        raise SystemExit(f"variants.py: --study {study} needs --against CACHE (the cache to compare the shipped one with)")
    for sh, N, K, M, x, ws, base in _points(study, tuple(f for f, _ in STEADY_AB_FORMATS[1:]), shapes, ms, rows, log):
        for fmt, tname in STEADY_AB_FORMATS:
            t = registry.TEMPLATES[tname]
            p = t.problem(ws[fmt][0], bucket_for(M), x.dtype)
            tiles = dict(zip(names, (shipped_tile(t, p, DEV, SHIPPED_CACHE), shipped_tile(t, p, DEV, STEADY_AB_AGAINST))))
            if None in tiles.values() or tiles[names[0]] == tiles[names[1]]:
                continue
            yield sh, M, fmt, t, ws[fmt], x, t.reference(x, ws[fmt][0]), base, tiles


def study_steady_ab(shapes, ms, log):
    """A re-tuned cache against the one it replaced (run 34): at each 27B-class key of each M's
    bucket whose tile differs between the shipped cache and --against, both tiles checked against
    the reference, then each timed in its own steady state (common_bench.steady_graph_ms)
    STEADY_AB_PASSES times, A B, B A, A B, ..., so the card's drift over seconds falls on both
    alike, from rest at the tuner's steady buckets (tuner.steady_rest_s, since run 35). Rows: each
    tile's median over the passes and every pass, marked shipped or against."""
    from common_bench import steady_graph_ms
    rows = []
    for sh, M, fmt, t, ws, x, ref, base, tiles in _keys_tiled_apart("steady-ab", ("shipped", "against"), shapes, ms,
                                                                   rows, log):
        checks = {k: checked_launch(t.launch, x, ws[0], tile, ref) for k, tile in tiles.items()}
        cases = {k: [lambda w=w, tile=tile: t.launch(x, w, tile) for w in ws]
                 for k, tile in tiles.items() if checks[k][0]}
        passes = []
        for i in range(STEADY_AB_PASSES):
            order = list(cases) if i % 2 == 0 else list(reversed(list(cases)))
            passes.append(steady_graph_ms({k: cases[k] for k in order}, rest_s=tuner.steady_rest_s(bucket_for(M))))
        for k, tile in tiles.items():
            ms_, got, error = _over_passes(passes, k)
            row = dict(study="steady-ab", format=fmt, shape=sh, M=M, variant=k, tile=tile, ok=checks[k][0],
                       rel_err=checks[k][1], ms=ms_, ms_passes=got, error=error,
                       ratio_vs_cublas=base / ms_ if ms_ else None)
            rows.append(row)
            log(row)
    return rows


# The steady-order study's sequence of timings: each tile after itself and after the other twice;
# and the idle seconds before each timing of its "captured-rest" mode (0: that mode left out).
STEADY_ORDER = "ABBAABBA"
STEADY_ORDER_REST_S = 1.0
# The steady-rest study's rests (s) before each timing, after the same sequence with none.
STEADY_REST_LENGTHS_S = (0.25, 0.5, 1.0, 2.0)


def _fresh_steady_ms(fns, label: str) -> float:
    """common_bench.steady_graph_ms of one case (its own capture), raising where it could not time it."""
    from common_bench import steady_graph_ms
    times, errors = steady_graph_ms({label: fns})
    if label in errors:
        raise RuntimeError(f"{label}: {errors[label]}")
    return times[label]


def _timed_in_order(study, shapes, ms, log, fresh: bool, rests: dict):
    """steady-order's and steady-rest's rows: at each key whose tile the shipped cache and --against
    give differently (A: shipped, B: against), both tiles timed in the order STEADY_ORDER, each
    timing in its own steady state; with `fresh`, first each timing on its own capture (as
    steady_graph_ms), into outputs allocated inside it ("fresh") and into outputs allocated once
    before ("fresh-out"); then, for each {mode: rest_s} of `rests`, on graphs captured once (in
    the order A B) and only replayed, the card left idle rest_s seconds after each graph's probe
    replay (tuner.steady_replay_ms, as the tuner's sweep). Rows: one a timing, with the tile timed
    just before it (`after`: the previous mode's last timing carries over) and the GPU's
    temperature, power and SM clock read right after it (`gpu`, common_bench.gpu_state); a key
    whose check, capture or timing fails gives one row, its error."""
    from common_bench import _cycle, gpu_state
    rows = []
    for sh, M, fmt, t, ws, x, ref, base, tiles in _keys_tiled_apart(study, ("A", "B"), shapes, ms, rows, log):
        ids = dict(study=study, format=fmt, shape=sh, M=M)
        captured, prev = {}, "what ran before this key"
        try:
            for k, tile in tiles.items():
                ok, rel = checked_launch(t.launch, x, ws[0], tile, ref)
                if not ok:
                    raise RuntimeError(f"tile {k} failed its reference check (max error {rel:.3g} of max|ref|)")

            def sequence(mode, timer):
                nonlocal prev
                for pos, k in enumerate(STEADY_ORDER):
                    ms_ = timer(k)
                    rows.append(dict(ids, mode=mode, position=pos, variant=f"{mode} {k} after {prev}", which=k,
                                     after=prev, tile=tiles[k], ms=ms_, ratio_vs_cublas=base / ms_,
                                     gpu=gpu_state() if x.is_cuda else None))
                    log(rows[-1])
                    prev = k

            label = f"{fmt} {sh} M={M} tile"
            outs = [torch.empty(*ref.shape, device=x.device, dtype=ref.dtype) for _ in ws]
            fns_out = {k: [lambda w=w, y=y, tile=tile: t.launch(x, w, tile, out=y) for w, y in zip(ws, outs)]
                       for k, tile in tiles.items()}
            if fresh:
                sequence("fresh", lambda k: _fresh_steady_ms(
                    [lambda w=w: t.launch(x, w, tiles[k]) for w in ws], f"{label} {k}"))
                sequence("fresh-out", lambda k: _fresh_steady_ms(fns_out[k], f"{label} {k}"))
            for k in tiles:   # captured once, in the order A B
                captured[k] = tuner.capture_graph(_cycle(fns_out[k]), 3.0)
            for mode, rest_s in rests.items():
                sequence(mode, lambda k, rest_s=rest_s: tuner.steady_replay_ms(
                    captured[k][0], captured[k][1] * len(ws), 9, tuner.STEADY_WARM_MS, rest_s=rest_s))
        except Exception as e:   # this key is reported, the others are still timed
            rows.append(dict(ids, variant="error", tiles=tiles, error=f"{type(e).__name__}: {e}"))
            log(rows[-1])
        finally:
            marks = [c[2] for c in captured.values()]
            captured.clear()
            if marks:   # both graphs gone: their fixup counters back to the pool
                tuner.release_captures(marks[0])
    return rows


def study_steady_order(shapes, ms, log):
    """What made run 34's A/B uneven (NOTES run 34 item 5: on 12 of 32 keys the re-tuned tile
    read 6-12% slower timed right after the old one than timed first, and on five the old tile
    4-7% faster timed right after the new one). _timed_in_order's four ways, in this order:
      fresh          each timing captures its own graph (steady_graph_ms, as the A/B and
                     bench_gemm), outputs allocated inside it, nothing else of the key's held;
      fresh-out      the same into outputs allocated once, before these timings (so the other
                     tile's freed graph memory cannot change where this one's output lands);
      captured       each tile's graph captured once, before these timings, and only replayed;
      captured-rest  the same after STEADY_ORDER_REST_S idle seconds before each timing (heat left
                     by the tile before, whose time constant is seconds, not the warm-up's 200 ms,
                     would fade).
    Run 35 (results/variants-nvidia-h200-2026-12-01-run35-steady-order-*.json): the power
    limiter's state, not memory placement; the tuner and the benchmarks time from rest since."""
    rests = {"captured": 0.0}
    if STEADY_ORDER_REST_S > 0:
        rests["captured-rest"] = STEADY_ORDER_REST_S
    return _timed_in_order("steady-order", shapes, ms, log, True, rests)


def study_steady_rest(shapes, ms, log):
    """How long a rest the steady timer needs (run 35): steady-order's captured graphs, timed in
    the order STEADY_ORDER with no rest ("captured"), then after each of STEADY_REST_LENGTHS_S."""
    rests = {"captured": 0.0, **{f"rest {r:g} s": r for r in STEADY_REST_LENGTHS_S}}
    return _timed_in_order("steady-rest", shapes, ms, log, False, rests)

STUDIES = {"int4-x": (study_int4_x, "1,16,64,256"), "int4-join": (study_int4_join, "1,16,64"),
           "int4-join-wide": (study_int4_join_wide, "128,256,512,1024"),
           "int4-join-tiles": (study_int4_join_tiles, "16,32,64,128"),
           "streamk": (study_streamk, "256,512,1024,2048"),
           "fp8-prologue": (study_fp8_prologue, "1,16,64,256,1024,4096"),
           "fixup": (study_fixup, "1,16,64,256,1024"),
           "int4-fixup-tiles": (study_int4_fixup_tiles, "16,64"),
           "capture-counters": (study_capture_counters, "1,16,64"),
           "int4-x-split": (study_int4_x_split, "1,16"), "wide": (study_wide, "256,512,1024"),
           "wide-64": (study_wide_64, "256,512"), "wide-few": (study_wide_few, "16,64"),
           "sk-256": (study_sk_256, "256,512"), "sk-reduce": (study_sk_reduce, "256,1024"),
           "int4-m1": (study_int4_m1, "1,16"), "fp8-overlap": (study_fp8_overlap, "256,1024,4096"),
           "fp8-call-parts": (study_fp8_call_parts, "1024,4096"),
           "interleave": (study_interleave, "256,1024,4096"),
           "power-trace": (study_power_trace, "1024,4096"),
           "steady-picks": (study_steady_picks, "256,1024,4096"),
           "steady-ab": (study_steady_ab, "256,512,1024,2048,4096,8192"),
           "steady-order": (study_steady_order, "512,1024"), "steady-rest": (study_steady_rest, "1024")}


# Seconds between rewrites of the results file while a study runs.
SAVE_EVERY_S = 10.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", default=",".join(STUDIES), help=f"comma-separated, of {', '.join(STUDIES)}")
    ap.add_argument("--shapes", default="qkv,o,gate_up,down")
    ap.add_argument("--ms", default=None, help="rows (default: per study)")
    ap.add_argument("--out", default=os.environ.get("OUT", ".") + "/variants.json")
    ap.add_argument("--against", default=None, help="steady-ab, steady-order and steady-rest: the autotune cache "
                                                    "(.json or .db) "
                                                    "whose tiles the shipped cache's are timed against")
    a = ap.parse_args(argv)
    global STEADY_AB_AGAINST
    STEADY_AB_AGAINST = Path(a.against) if a.against else None
    t0 = time.time()
    head = {"benchmark": "variants", "commit": code_commit(),   # as it is when the run starts
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
            "triton": triton.__version__, "torch": torch.__version__}
    rows: list[dict] = []   # every row, as logged (a study logs each row it returns)
    written = [0.0]         # when the file was last written

    def write(partial: bool) -> None:
        # Atomically, so a kill mid-write leaves the previous, whole file.
        write_atomic(Path(a.out), json.dumps(dict(head, partial=partial, rows=rows, seconds=time.time() - t0),
                                             indent=1))
        written[0] = time.time()

    def log(r: dict) -> None:
        # Written again at most every SAVE_EVERY_S seconds while the study runs, so even a run
        # killed outright keeps most of what it measured (run 11's was stopped before it wrote
        # anything), without the whole file being rewritten after every row.
        print(json.dumps(r), flush=True)
        rows.append(r)
        if time.time() - written[0] >= SAVE_EVERY_S:
            write(True)

    # A run stopped by its time limit (`timeout` sends SIGTERM) or by an error writes what it has.
    # The handler is this call's only: a caller's (pytest's, when a test calls main) comes back.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        for name in a.study.split(","):
            fn, default_ms = STUDIES[name]
            fn(a.shapes.split(","), [int(m) for m in (a.ms or default_ms).split(",")], log)
    except BaseException:
        write(True)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    write(False)
    print("\nstudy      format     shape M     variant                          us      vs cuBLAS  tile")
    for r in rows:
        if r.get("ratio_vs_cublas") is not None:
            t = r["tile"]
            wide = f"+{t['BLOCK_N2']}" if t and t.get("BLOCK_N2") else ""
            shape = (f"{t['path']} {t['BLOCK_M']}x{t['BLOCK_N']}{wide}x{t['BLOCK_K']} split {t['SPLIT_K']} "
                     f"s{t['num_stages']}{' P' if t.get('PERSISTENT') else ''}" if t else "")
            print(f"{r['study']:10s} {r.get('format', ''):10s} {r['shape']:5s} {r['M']:5d} {r['variant']:32s} "
                  f"{r['ms'] * 1e3:7.1f}  {r['ratio_vs_cublas']:.2f}x  {shape}")
        elif "last_100ms" in r:
            print(f"{r['study']:10s} {r['variant']:12s} {r['shape']:7s} {r['M']:5d} after {r['after']:20s} "
                  f"first 10 ms {r['first_10ms'] * 1e3:7.1f} us  last 100 ms {r['last_100ms'] * 1e3:7.1f} us")
        elif "ms_by_case" in r:
            cells = "  ".join(f"{k} {v * 1e3:7.1f} ({r['ratio_vs_cublas_by_case'][k]:.2f}x)" for k, v in r["ms_by_case"].items())
            print(f"{r['study']:10s} {'':10s} {r['shape']:5s} {r['M']:5d} {r['variant']:22s} {cells}")
        elif r.get("part") == "prologue":
            print(f"{r['study']:10s} {'prologue':10s} {r['shape']:5s} {r['M']:5d} {r['variant']:32s} "
                  f"{r.get('ms', float('nan')) * 1e3:7.1f}  {'exact' if r['ok'] else 'WRONG':6s} {r['plan']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
