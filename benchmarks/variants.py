"""Variant studies: candidate kernel designs timed beside the shipped template, in one run.

    python benchmarks/variants.py [--study fp8-fused,int4-mid,persistent] [--shapes qkv,down] [--out FILE]

Earlier studies (run 5: int4 conversions, TMA descriptors, the fp8 GEMV; run 6: the TMA lead,
which turned out to be launch overhead) are in git history (commits 78fe409, 3a07e94, f7244a8),
their results under benchmarks/results/variants-*.json. The studies here were written in
session 3 and checked under the interpreter (tests/test_variants.py), never run on a GPU.

fp8-fused: issue 4's choice for FP8 W8A8, per-token activation quantization fused into the
product kernel or a Triton prologue kernel ("whichever the benchmark shows faster"). The
shipped template runs the prologue (fp8._act_quant_kernel), then the product. The fused
variant quantizes inside the product kernel: each program first takes the amax of its
BLOCK_M rows over all of K, then quantizes every A tile in registers before the MMA. It
needs no launch and no [M, K] e4m3 buffer, but every column-block program repeats the amax
pass and the quantization of its rows (N / BLOCK_N times the prologue's work). Both give
the reference's exact roundings. Timed on the shipped tile's shape with pointer loads for
both (the fused kernel cannot take A through TMA: A is quantized in registers), plus the
shipped path with its own default tile.

int4-mid: int4 at M = 16-128 (run 7: 0.42-0.83x cuBLAS; target >= 1x up to M=256). The
shipped split-K tile against the transposed product of run 8 ("swap": the unpacked weights
are the MMA's left operand, the few rows of x its narrow side; +18-44% at M=64, commit
1e92cc2) and the same with both operands fetched by TMA (packed words [BN, BK/8] and x
[BM, BK] through descriptors, zero-filled past the edges).

persistent: bf16 and fp8 products at M >= 256 (run 7: bf16 0.78-0.91x cuBLAS there, fp8's
product alone 0.89x `_scaled_mm` at M=1024 on qkv): the shipped TMA kernel (one program per
output tile) against a persistent one (a program per multiprocessor walking the tiles, as in
Triton's persistent-matmul tutorial), with pointer or TMA stores, on the same tile.

Every output is checked against the format's reference before its time counts; times are
CUDA-graph replays (no host launch time) cycling through weight copies larger than the L2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common_bench import SHAPES, check, code_commit, copies_for, graph_ms, make_weight  # noqa: E402

from vsr.autotune.buckets import bucket_for  # noqa: E402
from vsr.kernels import common, registry  # noqa: E402
from vsr.kernels import fp8 as fp8mod  # noqa: E402


@triton.jit
def fp8_fused_quant_kernel(x_ptr, w_ptr, y_ptr, wsc_ptr, M, N, K, stride_xm, stride_wn, stride_ym, EPS,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           GROUP_M: tl.constexpr, RECIPROCAL: tl.constexpr, HW_CVT: tl.constexpr):
    """y = (Σ_k e4m3(x/s)·w) · s · w_scale with s = amax(x row)/448, all in one kernel."""
    pid_m, pid_n = common.swizzle(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = (offs_m % M).to(tl.int64)
    rn = (offs_n % N).to(tl.int64)
    amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + rm[:, None] * stride_xm + offs_k[None, :], mask=offs_k[None, :] < K, other=0.0)
        amax = tl.maximum(amax, tl.max(tl.abs(a.to(tl.float32)), axis=1))
    if RECIPROCAL:  # as fp8._act_quant_kernel: torch on CUDA multiplies by fp32(1/448)
        s = (amax * 0.0022321429569274187).to(x_ptr.dtype.element_ty).to(tl.float32)
    else:
        s = tl.div_rn(amax, 448.0).to(x_ptr.dtype.element_ty).to(tl.float32)
    s = tl.where(s == 0.0, EPS, s)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + rm[:, None] * stride_xm + offs_k[None, :], mask=offs_k[None, :] < K, other=0.0)
        q = tl.div_rn(a.to(tl.float32), s[:, None]).to(x_ptr.dtype.element_ty).to(tl.float32)
        q = tl.minimum(tl.maximum(q, -448.0), 448.0)
        if HW_CVT:
            qa = q.to(tl.float8e4nv)
        else:  # the interpreter's cast rounds wrongly (see common.e4m3_encode)
            qa = common.e4m3_encode(q).to(tl.float8e4nv, bitcast=True)
        b = tl.load(w_ptr + rn[None, :] * stride_wn + offs_k[:, None], mask=offs_k[:, None] < K, other=0.0)
        acc = tl.dot(qa, b, acc)
    acc = acc * s[:, None]     # row scale, then channel scale: the reference's order of roundings
    acc = common.epilogue(acc, offs_m, offs_n, M, N, wsc_ptr, wsc_ptr, wsc_ptr, wsc_ptr, False, False, True, False)
    tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def launch_fused(x, w, tile, out=None):
    """The fused variant on fp8 weight w (no bias), with the tile's BLOCK_M/N/K and warps/stages."""
    M, K = x.shape
    N = w.N
    y = out if out is not None else torch.empty((M, N), dtype=x.dtype, device=x.device)
    bm, bn, bk = tile["BLOCK_M"], tile["BLOCK_N"], tile["BLOCK_K"]
    fp8_fused_quant_kernel[(common.cdiv(M, bm) * common.cdiv(N, bn),)](
        x, w.weight, y, w.weight_scale, M, N, K, x.stride(0), w.weight.stride(0), y.stride(0),
        fp8mod.dtype_eps(x.dtype), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=tile.get("GROUP_M", 8),
        RECIPROCAL=x.is_cuda, HW_CVT=fp8mod._hardware_e4m3(x.device),
        num_warps=tile["num_warps"], num_stages=tile["num_stages"])
    return y


@triton.jit
def int4_swap_kernel(x_ptr, x_desc, q_ptr, q_desc, sc_ptr, zp_ptr, y_ptr, ws_ptr, bias_ptr, M, N, K, K8, KG,
                     stride_xm, stride_ym, KW_SPLIT, GROUP: tl.constexpr, HAS_ZP: tl.constexpr,
                     HAS_BIAS: tl.constexpr, USE_TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, GROUP_M: tl.constexpr):
    """acc[BN, BM] = W_tile · x_tileᵀ over this split's K range, the group scale on each BLOCK_K
    tile's partial product (BLOCK_K divides the group). USE_TMA: x [BM, BK] and the packed words
    [BN, BK/8] come through descriptors (zero-filled past the edges: a zero x column cancels the
    (0 - zu) weight of a zero-filled word); else through masked pointer loads (run 8's kernel).
    A split's range is a whole number of BLOCK_K tiles, so no tile crosses into the next split."""
    pid_m, pid_n = common.swizzle(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = (offs_m % M).to(tl.int64)
    rn = (offs_n % N).to(tl.int64)
    kw_lo = pid_k * KW_SPLIT
    kw_hi = tl.minimum(kw_lo + KW_SPLIT, K8)
    k_hi = tl.minimum((kw_lo + KW_SPLIT) * 8, K)
    shifts = (tl.arange(0, 8) * 4)[None, None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kw0 in range(kw_lo, kw_hi, BLOCK_K // 8):
        k0 = kw0 * 8
        if USE_TMA:
            xt = x_desc.load([pid_m * BLOCK_M, k0]).T                                   # [BK, BM]
            words = q_desc.load([pid_n * BLOCK_N, kw0])                                 # [BN, BK/8]
        else:
            offs_k = k0 + tl.arange(0, BLOCK_K)
            offs_w = kw0 + tl.arange(0, BLOCK_K // 8)
            xt = tl.load(x_ptr + rm[None, :] * stride_xm + offs_k[:, None], mask=offs_k[:, None] < k_hi, other=0.0)
            words = tl.load(q_ptr + rn[:, None] * K8 + offs_w[None, :], mask=offs_w[None, :] < K8, other=0)
        u = tl.reshape((words[:, :, None] >> shifts) & 0xF, (BLOCK_N, BLOCK_K))       # k = 8·word + nibble
        f = (u | 0x4B000000).to(tl.float32, bitcast=True)                               # 2^23 + u, exactly
        g = k0 // GROUP
        if HAS_ZP:
            zu = tl.load(zp_ptr + rn * KG + g)
            wt = (f - (8388608.0 + zu.to(tl.float32))[:, None]).to(xt.dtype)
        else:
            wt = (f - 8388616.0).to(xt.dtype)
        scale = tl.load(sc_ptr + rn * KG + g).to(tl.float32)
        acc += tl.dot(wt, xt) * scale[:, None]
    common.store_or_stash(tl.trans(acc), y_ptr, ws_ptr, pid_k, offs_m, offs_n, M, N, stride_ym,
                          bias_ptr, bias_ptr, bias_ptr, bias_ptr, SPLIT_K, HAS_BIAS, False, False, False)


def launch_int4_swap(x, w, tile, use_tma: bool, out=None):
    """y = x · dequant(W)ᵀ + b through int4_swap_kernel (bf16/fp16 x, no act-order permutation)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    assert w.act_perm is None and x.dtype in (torch.bfloat16, torch.float16)
    M, K = x.shape
    N = w.N
    bm, bn, bk = tile["BLOCK_M"], tile["BLOCK_N"], tile["BLOCK_K"]
    assert w.group_size % bk == 0 and bk % 32 == 0, f"BLOCK_K={bk} must divide the group and hold 4 words"
    k_split, split = common.split_plan(K, tile)
    y = out if out is not None else torch.empty((M, N), dtype=x.dtype, device=x.device)
    ws = torch.empty((split, M, N), dtype=torch.float32, device=x.device) if split > 1 else y
    xd = qd = None
    if use_tma:
        assert common.tma_aligned(K, x.element_size()) and w.packed.shape[1] % 4 == 0, "TMA needs 16-byte rows"
        xd = TensorDescriptor.from_tensor(x, [bm, bk])
        qd = TensorDescriptor.from_tensor(w.packed, [bn, bk // 8])
    grid = (common.cdiv(M, bm) * common.cdiv(N, bn), split)
    int4_swap_kernel[grid](x, xd, w.packed, qd, w.scale, w.zero_point if w.zero_point is not None else w.packed,
                           y, ws, w.bias if w.bias is not None else y, M, N, K, w.packed.shape[1], w.scale.shape[1],
                           x.stride(0), y.stride(0), k_split // 8, GROUP=w.group_size, HAS_ZP=w.zero_point is not None,
                           HAS_BIAS=w.bias is not None, USE_TMA=use_tma, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                           SPLIT_K=split, GROUP_M=tile.get("GROUP_M", 8),
                           num_warps=tile["num_warps"], num_stages=tile["num_stages"])
    if split > 1:
        common.reduce_splits(ws, y, split, M, N, w.bias, None, None, None)
    return y


@triton.jit
def persistent_tma_kernel(a_desc, b_desc, y_desc, y_ptr, rs_ptr, cs_ptr, M, N, K, stride_ym,
                          HAS_RS: tl.constexpr, HAS_CS: tl.constexpr, TMA_STORE: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr):
    """common.tma_gemm_kernel's product as a persistent kernel: NUM_PROGRAMS programs (one per
    multiprocessor) walk the output tiles in the swizzled order, so tile set-up and the epilogue
    of one tile overlap the next tile's loads (Triton's persistent-matmul tutorial design).
    TMA_STORE writes the tile through a descriptor instead of masked pointer stores."""
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for t in tl.range(tl.program_id(0), num_tiles, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = common.swizzle(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            acc = tl.dot(a_desc.load([pid_m * BLOCK_M, k0]), b_desc.load([pid_n * BLOCK_N, k0]).T, acc)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = common.epilogue(acc, offs_m, offs_n, M, N, y_ptr, rs_ptr, cs_ptr, y_ptr, False, HAS_RS, HAS_CS, False)
        if TMA_STORE:
            y_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(y_desc.dtype))
        else:
            tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :],
                     acc.to(y_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def launch_persistent(a, b, y, tile, tma_store: bool, rs=None, cs=None, programs: int | None = None):
    """y = epilogue(a · bᵀ) through persistent_tma_kernel with the tile's shape."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    M, K = a.shape
    N = b.shape[0]
    bm, bn, bk = tile["BLOCK_M"], tile["BLOCK_N"], tile["BLOCK_K"]
    if programs is None:
        programs = torch.cuda.get_device_properties(a.device).multi_processor_count if a.is_cuda else 4
    programs = min(programs, common.cdiv(M, bm) * common.cdiv(N, bn))
    if tma_store:
        assert common.tma_aligned(N, y.element_size()), "a TMA store needs 16-byte output rows"
    yd = TensorDescriptor.from_tensor(y, [bm, bn]) if tma_store else None
    persistent_tma_kernel[(programs,)](
        TensorDescriptor.from_tensor(a, [bm, bk]), TensorDescriptor.from_tensor(b, [bn, bk]), yd, y,
        y if rs is None else rs, y if cs is None else cs, M, N, K, y.stride(0),
        HAS_RS=rs is not None, HAS_CS=cs is not None, TMA_STORE=tma_store, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
        GROUP_M=tile.get("GROUP_M", 8), NUM_PROGRAMS=programs,
        num_warps=tile["num_warps"], num_stages=tile["num_stages"])
    return y


def pointer_tile(tile: dict, M: int) -> dict:
    """The tile's shape as a one-split pointer-load tile (what the fused kernel can run); rows at
    least 16 (tl.dot's minimum)."""
    bm = max(16, tile["BLOCK_M"] if tile["path"] in ("tma", "tiled", "splitk") else 16)
    return common.tile("tiled", bm, max(16, tile["BLOCK_N"]), max(32, tile["BLOCK_K"]), 1,
                       tile["num_warps"], tile["num_stages"])


def _timed(row, run, ws, ref, base):
    """Check run(w0) against ref, then time run over the weight copies (graph replay)."""
    try:
        row["ok"], row["rel_err"] = check(run(ws[0]).clone(), ref)
        row["ms"] = graph_ms([lambda w=w: run(w) for w in ws])
        row["ratio_vs_cublas"] = base / row["ms"]
    except Exception as e:  # a variant that does not compile is a finding
        row["ok"], row["error"] = False, f"{type(e).__name__}: {str(e)[:300]}"
    return row


def _weights(fmt, N, K, dev):
    w0 = make_weight(fmt, N, K, dev)
    return [w0] + [make_weight(fmt, N, K, dev, seed=i) for i in range(1, copies_for(w0.nbytes()))]


DEV = "cuda"  # the studies' device (the tests run them on the CPU through the interpreter)


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


def study_fp8_fused(shapes, ms, log):
    dev = torch.device(DEV)
    t8 = registry.TEMPLATES["fp8_w8a8"]
    rows = []
    for sh in shapes:
        N, K = SHAPES[sh]
        ws, wb = _weights("fp8", N, K, dev), _weights("bf16", N, K, dev)
        for M in ms:
            x = torch.randn(M, K, device=dev).to(torch.bfloat16)
            ids = dict(study="fp8-fused", shape=sh, M=M)
            base = _baseline(rows, x, wb, **ids)
            shipped = t8.default_tile(t8.problem(ws[0], bucket_for(M), x.dtype))
            same = pointer_tile(shipped, M)
            cases = [(name, tile, lambda w, run=run, tile=tile: run(x, w, tile))
                     for name, tile, run in (("prologue+product, default tile", shipped, t8.launch),
                                             ("prologue+product, pointer tile", same, t8.launch),
                                             ("fused, pointer tile", same, launch_fused))]
            _run_cases(rows, log, cases, ws, t8.reference(x, ws[0]), base, **ids)
    return rows


def swap_tiles(bucket: int, N: int, K: int) -> list[dict]:
    """Run 8's likeliest swap tile for the bucket, and two neighbours."""
    bm = min(64, max(16, bucket))
    split = common._split_for(bucket, N, K, bm, 128, 128, 16, waves=4)
    return [common.tile("swap", bm, 128, 128, split, 4, 3), common.tile("swap", bm, 128, 128, split, 4, 4),
            common.tile("swap", bm, 64, 128, min(16, split * 2), 4, 4)]


def study_int4_mid(shapes, ms, log):
    dev = torch.device(DEV)
    t4 = registry.TEMPLATES["int4_w4a16"]
    rows = []
    for sh in shapes:
        N, K = SHAPES[sh]
        wb = _weights("bf16", N, K, dev)
        for fmt in ("int4-gptq", "int4-awq"):
            ws = _weights(fmt, N, K, dev)
            for M in ms:
                x = torch.randn(M, K, device=dev).to(torch.bfloat16)
                ids = dict(study="int4-mid", format=fmt, shape=sh, M=M)
                base = _baseline(rows, x, wb, **ids)
                shipped = t4.default_tile(t4.problem(ws[0], bucket_for(M), x.dtype))
                cases = [("shipped default tile", shipped, lambda w, t=shipped: t4.launch(x, w, t))]
                for t in swap_tiles(bucket_for(M), N, K):
                    cases += [("swap, pointer loads", t, lambda w, t=t: launch_int4_swap(x, w, t, use_tma=False)),
                              ("swap, TMA", t, lambda w, t=t: launch_int4_swap(x, w, t, use_tma=True))]
                _run_cases(rows, log, cases, ws, t4.reference(x, ws[0]), base, **ids)
    return rows


def study_persistent(shapes, ms, log):
    """bf16 and fp8 products (fp8 on pre-quantized activations: the product alone) at large M:
    the shipped TMA kernel with its default tile against the persistent kernel on that tile."""
    dev = torch.device(DEV)
    rows = []
    for sh in shapes:
        N, K = SHAPES[sh]
        wb, w8 = _weights("bf16", N, K, dev), _weights("fp8", N, K, dev)
        for M in ms:
            x = torch.randn(M, K, device=dev).to(torch.bfloat16)
            xq, xs = fp8mod.quantize_activation_triton(x)
            base = _baseline(rows, x, wb, study="persistent", shape=sh, M=M)
            for fmt, ws, a, tname in (("bf16", wb, x, "dense"), ("fp8", w8, xq, "fp8_w8a8")):
                t = registry.TEMPLATES[tname]
                tile = t.default_tile(t.problem(ws[0], bucket_for(M), x.dtype))
                if tile["path"] != "tma":
                    continue
                y = torch.empty((M, N), dtype=x.dtype, device=dev)
                sc = (lambda w: {}) if fmt == "bf16" else (lambda w: {"rs": xs, "cs": w.weight_scale})
                cases = [("shipped TMA kernel", tile,
                          lambda w: (common.launch_tma(a, w.weight, y, tile, owner=w, **sc(w)), y)[1]),
                         ("persistent, pointer store", tile, lambda w: launch_persistent(a, w.weight, y, tile, False, **sc(w))),
                         ("persistent, TMA store", tile, lambda w: launch_persistent(a, w.weight, y, tile, True, **sc(w)))]
                if fmt == "fp8":
                    cases.append(("scaled_mm alone", None, lambda w: torch._scaled_mm(
                        xq, w.weight.t(), scale_a=xs.float()[:, None], scale_b=w.weight_scale.float()[None, :],
                        out_dtype=torch.bfloat16, use_fast_accum=True)))
                _run_cases(rows, log, cases, ws, t.reference(x, ws[0]), base,
                           study="persistent", format=fmt, shape=sh, M=M)
    return rows


STUDIES = {"fp8-fused": (study_fp8_fused, "16,64,256,1024,4096"), "int4-mid": (study_int4_mid, "16,32,64,128"),
           "persistent": (study_persistent, "256,1024,4096")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", default=",".join(STUDIES), help=f"comma-separated, of {', '.join(STUDIES)}")
    ap.add_argument("--shapes", default="qkv,down")
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
            shape = (f"{t['BLOCK_M']}x{t['BLOCK_N']}x{t['BLOCK_K']} split {t['SPLIT_K']} s{t['num_stages']}"
                     if t else "")
            print(f"{r['study']:10s} {r.get('format', 'fp8'):10s} {r['shape']:5s} {r['M']:5d} {r['variant']:32s} "
                  f"{r['ms'] * 1e3:7.1f}  {r['ratio_vs_cublas']:.2f}x  {shape}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
