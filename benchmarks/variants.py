"""Variant study: a candidate kernel design timed beside the shipped template, on the same tiles, in one run.

    python benchmarks/variants.py [--shapes qkv,down] [--ms 16,64,256,1024,4096] [--out FILE]

Earlier studies (run 5: int4 conversions, TMA descriptors, the fp8 GEMV; run 6: the TMA lead,
which turned out to be launch overhead) are in git history (commits 78fe409, 3a07e94, f7244a8),
their results under benchmarks/results/variants-*.json.

This one answers issue 4's choice for FP8 W8A8: per-token activation quantization fused into
the product kernel, or a Triton prologue kernel ("whichever the benchmark shows faster"). The
shipped template runs the prologue (fp8._act_quant_kernel), then the product. The fused variant
below quantizes inside the product kernel: each program first takes the amax of its BLOCK_M
rows over all of K, then quantizes every A tile in registers before the MMA. It needs no
launch and no [M, K] e4m3 buffer, but every column-block program repeats the amax pass and
the quantization of its rows (N / BLOCK_N times the prologue's work). Both give the
reference's exact roundings. Timed by CUDA-graph replay (no host launch time in the figures),
on the shipped tile's shape with pointer loads for both (the fused kernel cannot take A
through TMA: A is quantized in registers), plus the shipped path with its own cached tile.
Every output is checked against the format's reference before its time counts.
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


def pointer_tile(tile: dict, M: int) -> dict:
    """The tile's shape as a one-split pointer-load tile (what the fused kernel can run); rows at
    least 16 (tl.dot's minimum)."""
    bm = max(16, tile["BLOCK_M"] if tile["path"] in ("tma", "tiled", "splitk") else 16)
    return common.tile("tiled", bm, max(16, tile["BLOCK_N"]), max(32, tile["BLOCK_K"]), 1,
                       tile["num_warps"], tile["num_stages"])


def study(shapes, ms, log):
    dev = torch.device("cuda")
    t8 = registry.TEMPLATES["fp8_w8a8"]
    rows = []
    for sh in shapes:
        N, K = SHAPES[sh]
        w0 = make_weight("fp8", N, K, dev)
        ws = [w0] + [make_weight("fp8", N, K, dev, seed=i) for i in range(1, copies_for(w0.nbytes()))]
        wb = [make_weight("bf16", N, K, dev, seed=i) for i in range(len(ws))]
        for M in ms:
            x = torch.randn(M, K, device=dev).to(torch.bfloat16)
            ref = t8.reference(x, w0)
            shipped = t8.default_tile(t8.problem(w0, bucket_for(M), x.dtype))
            same = pointer_tile(shipped, M)
            base = graph_ms([lambda w=w: x @ w.weight.t() for w in wb])
            rows.append(dict(shape=sh, M=M, variant="cublas-bf16", ms=base))
            for name, tile, run in (("prologue+product, default tile", shipped, lambda w, t: t8.launch(x, w, t)),
                                    ("prologue+product, pointer tile", same, lambda w, t: t8.launch(x, w, t)),
                                    ("fused, pointer tile", same, lambda w, t: launch_fused(x, w, t))):
                row = dict(shape=sh, M=M, variant=name, tile=tile)
                try:
                    row["ok"], row["rel_err"] = check(run(w0, tile).clone(), ref)
                    row["ms"] = graph_ms([lambda w=w: run(w, tile) for w in ws])
                    row["ratio_vs_cublas"] = base / row["ms"]
                except Exception as e:  # a variant that does not compile is a finding
                    row["ok"], row["error"] = False, f"{type(e).__name__}: {str(e)[:300]}"
                rows.append(row)
                log(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="qkv,down")
    ap.add_argument("--ms", default="16,64,256,1024,4096")
    ap.add_argument("--out", default=os.environ.get("OUT", ".") + "/variants.json")
    a = ap.parse_args()
    t0 = time.time()
    rows = study(a.shapes.split(","), [int(m) for m in a.ms.split(",")], lambda r: print(json.dumps(r), flush=True))
    Path(a.out).write_text(json.dumps({"benchmark": "variants", "commit": code_commit(),
                                       "device": torch.cuda.get_device_name(), "triton": triton.__version__,
                                       "torch": torch.__version__, "rows": rows, "seconds": time.time() - t0}, indent=1))
    print("\nshape M     variant                          us      vs cuBLAS")
    for r in rows:
        if "ratio_vs_cublas" in r:
            print(f"{r['shape']:5s} {r['M']:5d} {r['variant']:32s} {r['ms'] * 1e3:7.1f}  {r['ratio_vs_cublas']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
