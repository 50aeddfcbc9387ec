"""Variant study: a candidate kernel design timed beside the shipped template, on the same tiles, in one run.

    python benchmarks/variants.py [--shapes qkv,down] [--ms 64,256] [--out FILE]

Run 5 (benchmarks/NOTES.md) studied the int4 GEMV's nibble conversion, int4 split-K conversions,
TMA descriptors and an fp8 GEMV; the winners moved into kernels/ and the study's code is in git
history (commits 78fe409 and 3a07e94, results under benchmarks/results/variants-*-run5*.json).

What is left here is run 5's open lead: the same TMA tile measured 38.6 us in the study's kernel and
49.5 us through the shipped kernel (bf16, qkv, M=64; 56 vs 83 us on down). The study's kernel wraps
the K loop in a one-iteration `tl.range` tile loop (it doubled as the persistent kernel); the shipped
one does not. This script times both on identical tiles, through the shipped launcher and a lean
one, so the difference can be pinned on the loop nest or on the launch path.
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
from common_bench import SHAPES, check, code_commit, eager_ms, make_weight  # noqa: E402

from vsr.kernels import common, registry  # noqa: E402
from vsr.kernels import fp8 as fp8mod  # noqa: E402


@triton.jit
def gemm_tma_tile_loop(a_desc, b_desc, y_ptr, rs_ptr, cs_ptr, M, N, K, stride_ym, HAS_SCALES: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """common.tma_gemm_kernel's product inside a one-iteration tile loop (run 5's study kernel)."""
    start = tl.program_id(0)
    for t in tl.range(start, start + 1, 1):
        pid_m, pid_n = common.swizzle(t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(tl.cdiv(K, BLOCK_K)):
            acc = tl.dot(a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K]), b_desc.load([pid_n * BLOCK_N, ki * BLOCK_K]).T,
                         acc)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = common.epilogue(acc, offs_m, offs_n, M, N, y_ptr, rs_ptr, cs_ptr, y_ptr, False, HAS_SCALES, HAS_SCALES,
                              False)
        tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def lean_launch(kernel, a, b, y, tile, rs=None, cs=None):
    """A launcher with no checks: descriptors, one launch."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    bm, bn, bk = tile["BLOCK_M"], tile["BLOCK_N"], tile["BLOCK_K"]
    grid = (triton.cdiv(a.shape[0], bm) * triton.cdiv(b.shape[0], bn),)
    ad, bd = TensorDescriptor.from_tensor(a, [bm, bk]), TensorDescriptor.from_tensor(b, [bn, bk])
    if kernel is common.tma_gemm_kernel:
        kernel[grid](ad, bd, y, y, y if rs is None else rs, y if cs is None else cs, y, a.shape[0], b.shape[0],
                     a.shape[1], y.stride(0), HAS_BIAS=False, HAS_RS=rs is not None, HAS_CS=cs is not None,
                     HAS_ALPHA=False, IEEE=False, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8,
                     num_warps=tile["num_warps"], num_stages=tile["num_stages"])
    else:
        kernel[grid](ad, bd, y, y if rs is None else rs, y if cs is None else cs, a.shape[0], b.shape[0], a.shape[1],
                     y.stride(0), HAS_SCALES=rs is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8,
                     num_warps=tile["num_warps"], num_stages=tile["num_stages"])
    return y


def study(shapes, ms, log):
    dev = torch.device("cuda")
    rows = []
    for sh in shapes:
        N, K = SHAPES[sh]
        wd = make_weight("bf16", N, K, dev)
        w8 = make_weight("fp8", N, K, dev)
        for M in ms:
            x = torch.randn(M, K, device=dev).to(torch.bfloat16)
            y = torch.empty((M, N), dtype=x.dtype, device=dev)
            base = eager_ms(lambda: x @ wd.weight.t())
            rows.append(dict(fmt="bf16", shape=sh, M=M, variant="cublas", ms=base))
            td, tf = registry.TEMPLATES["dense"], registry.TEMPLATES["fp8_w8a8"]
            xq, xs = fp8mod.quantize_activation_triton(x)
            for fmt, t, w, a, b, rs, cs, ref in (
                    ("bf16", td, wd, x, wd.weight, None, None, td.reference(x, wd)),
                    ("fp8", tf, w8, xq, w8.weight, xs, w8.weight_scale, tf.reference(x, w8))):
                for tile in [c for c in t.search_space(t.problem(w, M, x.dtype)) if c["path"] == "tma"][:4]:
                    for name, fn in (("shipped-launch", lambda: t.launch(x, w, tile)),
                                     ("shipped-kernel-lean-launch",
                                      lambda: lean_launch(common.tma_gemm_kernel, a, b, y, tile, rs, cs)),
                                     ("tile-loop-kernel-lean-launch",
                                      lambda: lean_launch(gemm_tma_tile_loop, a, b, y, tile, rs, cs))):
                        row = dict(fmt=fmt, shape=sh, M=M, variant=name, tile=tile)
                        try:
                            row["ok"], row["rel_err"] = check(fn().clone(), ref)
                            row["ms"] = eager_ms(fn)
                            row["ratio"] = base / row["ms"]
                        except Exception as e:  # a variant that does not compile is a finding
                            row["ok"], row["error"] = False, f"{type(e).__name__}: {str(e)[:300]}"
                        rows.append(row)
                        log(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="qkv,down")
    ap.add_argument("--ms", default="64,256")
    ap.add_argument("--out", default=os.environ.get("OUT", ".") + "/variants.json")
    a = ap.parse_args()
    t0 = time.time()
    rows = study(a.shapes.split(","), [int(m) for m in a.ms.split(",")], lambda r: print(json.dumps(r), flush=True))
    Path(a.out).write_text(json.dumps({"benchmark": "variants", "commit": code_commit(),
                                       "device": torch.cuda.get_device_name(), "triton": triton.__version__,
                                       "torch": torch.__version__, "rows": rows, "seconds": time.time() - t0}, indent=1))
    print("\nfmt  shape M     variant                        ms(us)  vs cuBLAS  tile")
    for r in rows:
        if "ratio" in r:
            t = r["tile"]
            print(f"{r['fmt']:4s} {r['shape']:5s} {r['M']:5d} {r['variant']:30s} {r['ms'] * 1e3:7.1f}  {r['ratio']:.2f}x  "
                  f"{t['BLOCK_M']}x{t['BLOCK_N']}x{t['BLOCK_K']} w{t['num_warps']} s{t['num_stages']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
