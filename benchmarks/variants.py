"""Variant studies: candidate kernel designs timed beside the shipped template, in one run.

    python benchmarks/variants.py [--study small-m,persistent] [--shapes qkv,o,gate_up,down]
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

int4-slices (run 11, file results/variants-nvidia-h200-2026-11-29-run11-int4-slices.json): each
nibble slice of the packed words its own MMA operand, no reshape; forms with x in slice order,
PTX two-nibble conversion and words repacked at load. PTX + x in slice order won (1.1-1.5x the
swap path at M=16-128, ahead of the GEMV at M=1; repacking added 0-5%) and is the int4
template's "slices" path; the study's code is in git history (commit 764de3d).

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


def _baseline(rows, log, x, wb, **ids) -> float:
    """cuBLAS bf16 on the same rows, graph-replayed over the bf16 weight copies: every ratio's
    denominator, recorded (and logged) as a row of its own."""
    base = graph_ms([lambda w=w: x @ w.weight.t() for w in wb])
    rows.append(dict(ids, variant="cublas-bf16", ms=base))
    log(rows[-1])
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
            base = _baseline(rows, log, x, wb, study="small-m", shape=sh, M=M)
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
            base = _baseline(rows, log, x, weights["bf16"], study="persistent", shape=sh, M=M)
            for fmt, tname in (("bf16", "dense"), ("fp8", "fp8_w8a8"), ("int4-gptq", "int4_w4a16")):
                t = registry.TEMPLATES[tname]
                ws = weights[fmt]
                d = t.default_tile(t.problem(ws[0], bucket_for(M), x.dtype))
                cases = [(f"PERSISTENT={v}", dict(d, PERSISTENT=v), lambda w, c=dict(d, PERSISTENT=v): t.launch(x, w, c))
                         for v in (0, 1)]
                _run_cases(rows, log, cases, ws, t.reference(x, ws[0]), base,
                           study="persistent", format=fmt, shape=sh, M=M)
    return rows


def study_int4_xtma(shapes, ms, log):
    """int4 at M = 16-256: the shipped tuned tile, the template's slices path, and the same tiles
    with the slices kernel's X_TMA flag (x's slices as TMA boxes, staged ahead by the pipeliner,
    instead of pointer loads through registers; not yet in the search space). BM up to 64, and
    128 with 8 warps from bucket 128."""
    dev = torch.device(DEV)
    t = registry.TEMPLATES["int4_w4a16"]
    resolver = _shipped_resolver(dev)
    rows = []
    for sh in shapes:
        N, K = SHAPES[sh]
        wb = _weights("bf16", N, K, dev)
        weights = {fmt: _weights(fmt, N, K, dev) for fmt in ("int4-gptq", "int4-awq")}
        for M in ms:
            x = torch.randn(M, K, device=dev).to(ACT)
            base = _baseline(rows, log, x, wb, study="int4-xtma", shape=sh, M=M)
            b = bucket_for(M)
            for fmt, ws in weights.items():
                p = t.problem(ws[0], b, x.dtype)
                tuned = resolver.tile(t, p) if resolver is not None else t.default_tile(p)
                cases = [("tuned tile (shipped)", tuned, lambda w: t.launch(x, w, tuned))]
                shapes_ = [(min(64, max(16, b)), bn, 4, st, wv) for bn, st, wv in ((128, 3, 4), (128, 4, 2), (64, 3, 4))]
                if b >= 128:
                    shapes_ += [(128, 128, 8, 3, 2), (128, 64, 4, 3, 4)]
                for bm, bn, warps, stages, waves in shapes_:
                    tile = common.tile("slices", bm, bn, 128, common._split_for(b, N, K, bm, bn, 128, 16, waves=waves),
                                       warps, stages)
                    cases += [("slices (template)", tile, lambda w, tile=tile: t.launch(x, w, tile)),
                              ("slices, x by TMA", dict(tile, X_TMA=1),
                               lambda w, tile=dict(tile, X_TMA=1): t.launch(x, w, tile))]
                _run_cases(rows, log, cases, ws, t.reference(x, ws[0]), base, study="int4-xtma", format=fmt,
                           shape=sh, M=M)
    return rows


STUDIES = {"small-m": (study_small_m, "1,16,64"), "persistent": (study_persistent, "1024,4096"),
           "int4-xtma": (study_int4_xtma, "16,64,128,256")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", default=",".join(STUDIES), help=f"comma-separated, of {', '.join(STUDIES)}")
    ap.add_argument("--shapes", default="qkv,o,gate_up,down")
    ap.add_argument("--ms", default=None, help="rows (default: per study)")
    ap.add_argument("--out", default=os.environ.get("OUT", ".") + "/variants.json")
    a = ap.parse_args(argv)
    t0 = time.time()
    rows: list[dict] = []   # the finished studies' rows
    live: list[dict] = []   # the running study's rows as they are logged

    def write(out_rows: list[dict], partial: bool) -> None:
        # Rewritten after every row, so a run stopped by a time limit keeps what it measured (run
        # 11's was stopped before it wrote anything).
        # A new file renamed over the old one: a kill mid-write leaves the previous, whole file.
        tmp = Path(a.out + ".tmp")
        tmp.write_text(json.dumps({"benchmark": "variants", "commit": code_commit(),
                                   "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                                   "triton": triton.__version__,
                                   "torch": torch.__version__, "partial": partial, "rows": out_rows,
                                   "seconds": time.time() - t0}, indent=1))
        os.replace(tmp, a.out)

    def log(r: dict) -> None:
        print(json.dumps(r), flush=True)
        live.append(r)
        write(rows + live, True)

    for name in a.study.split(","):
        fn, default_ms = STUDIES[name]
        live.clear()
        rows += fn(a.shapes.split(","), [int(m) for m in (a.ms or default_ms).split(",")], log)
    write(rows, False)
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
