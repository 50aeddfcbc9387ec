"""What limits the speed targets still missed (issue 4 point 6), on the kernels and shipped tiles.

    python benchmarks/limits.py [--shapes qkv,down] [--out FILE]

Each case times the shipped tile of a call (caches/nvidia-h200.json, CUDA-graph replay cycling
through weight copies larger than the L2, as bench_gemm.py) beside variants that isolate one cost:
  int4 M=1      the shipped tile's bandwidth (slices or GEMV) beside fp8's and bf16's shipped
                tiles on the same N x K: the share of copy bandwidth each reaches;
  int4 M=64     the shipped tile beside a bf16 weight's pointer-load split-K product on the same
                block sizes and split (no unpacking in the loop; for a "slices", "join" or "swap" tile
                this is the untransposed product: the dense template has no pointer-load
                transposed path);
  int4 M=256+   the transient-dequantization path split into its two launches;
  fp8 M=256+    the call split into the activation prologue and the product alone, beside
                _scaled_mm alone;
  bf16 M=256+   the shipped tile beside cuBLAS.
Then a resource report (registers, spills, shared memory) of every kernel compiled on the way.
Every timed call (and each part of a split call) is checked against its reference first
(`checked`, `parts_checked`, `fp8_parts_checked` in the rows). Tiles are looked up with miss
policy "error": after a kernel change, re-tune the shipped cache first.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common_bench import (SHAPES, SHIPPED_CACHE, check, checked_launch, code_commit, compiled_kernels,  # noqa: E402
                          copy_TBps, graph_ms, result_path, scaled_mm, scaled_mm_weight_scale, weight_copies)

from vsr.autotune.buckets import bucket_for  # noqa: E402
from vsr.autotune.resolver import TileResolver  # noqa: E402
from vsr.kernels import dense, fp8, int4, int4_tiles, registry  # noqa: E402


def us(fns) -> float:
    return round(graph_ms(fns) * 1e3, 2)


def shipped_tile(resolver, w, M):
    t = registry.template_for(w, torch.bfloat16)
    return t, resolver.tile(t, t.problem(w, bucket_for(M), torch.bfloat16))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="qkv,down")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    res = TileResolver(SHIPPED_CACHE, "error", torch.device("cuda"))
    bw = copy_TBps()
    rows = []

    def row(**r):
        rows.append(r)
        print(json.dumps(r), flush=True)

    for sh in a.shapes.split(","):
        N, K = SHAPES[sh]
        w4, w8, wb = (weight_copies(f, N, K, "cuda") for f in ("int4-gptq", "fp8", "bf16"))
        # int4 M=1: bytes per second of the int4 GEMV and of fp8's GEMV.
        x1 = torch.randn(1, K, device="cuda").to(torch.bfloat16)
        for fmt, ws in (("int4-gptq", w4), ("fp8", w8), ("bf16", wb)):
            t, tile = shipped_tile(res, ws[0], 1)
            ms = us([lambda w=w: t.launch(x1, w, tile) for w in ws])
            row(case="M=1 bandwidth", shape=sh, format=fmt, tile=tile, us=ms,
                checked=checked_launch(t.launch, x1, ws[0], tile, t.reference(x1, ws[0]))[0],
                bw_share=round(ws[0].nbytes() / (ms * 1e-6) / (bw * 1e12), 3))
        # int4 M=64: the shipped tile, and bf16 weights through a split-K tile of its blocks.
        x64 = torch.randn(64, K, device="cuda").to(torch.bfloat16)
        t4, tile4 = shipped_tile(res, w4[0], 64)
        tb, tileb = shipped_tile(res, wb[0], 64)
        same = dict(tile4, path="splitk" if tile4["path"] == "splitk" else "tiled")
        row(case="int4 M=64 unpack cost", shape=sh, int4_tile=tile4, bf16_same_tile=same,
            checked=(checked_launch(t4.launch, x64, w4[0], tile4, t4.reference(x64, w4[0]))[0]
                     and checked_launch(tb.launch, x64, wb[0], same, tb.reference(x64, wb[0]))[0]),
            int4_us=us([lambda w=w: t4.launch(x64, w, tile4) for w in w4]),
            bf16_same_tile_us=us([lambda w=w: tb.launch(x64, w, same) for w in wb]),
            bf16_shipped_tile=tileb, bf16_shipped_us=us([lambda w=w: tb.launch(x64, w, tileb) for w in wb]),
            cublas_us=us([lambda w=w: x64 @ w.weight.t() for w in wb]))
        for M in (256, 1024):
            x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
            # int4: the transient-dequantization path in its two launches.
            t4, tile4 = shipped_tile(res, w4[0], M)
            r = {"case": f"int4 M={M} parts", "shape": sh, "tile": tile4,
                 "call_us": us([lambda w=w: t4.launch(x, w, tile4) for w in w4])}
            gt = int4_tiles.dense_tile(tile4)   # the dense tile a dequant path multiplies with (None for others)
            if gt is not None:
                dw = dense.DenseWeight(int4.dequantize_transient(w4[0], torch.bfloat16))
                r["parts_checked"] = checked_launch(dense.launch, x, dw, gt, t4.reference(x, w4[0]))[0]
                r.update(dequant_us=us([lambda w=w: int4.dequantize_transient(w, torch.bfloat16) for w in w4]),
                         gemm_us=us([lambda: dense.launch(x, dw, gt)]))
                moved = w4[0].nbytes() + N * K * 2
                r["dequant_bytes_share_of_copy"] = round(moved / (r["dequant_us"] * 1e-6) / (bw * 1e12), 3)
            r["cublas_us"] = us([lambda w=w: x @ w.weight.t() for w in wb])
            tb, tileb = shipped_tile(res, wb[0], M)
            r["bf16_tile"], r["bf16_us"] = tileb, us([lambda w=w: tb.launch(x, w, tileb) for w in wb])
            # fp8: prologue and product apart, and _scaled_mm alone.
            t8, tile8 = shipped_tile(res, w8[0], M)
            xq, xs = fp8.quantize_activation_triton(x)
            y = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")   # poisoned: checked below
            prod = [lambda w=w: fp8.launch_product(xq, xs, w, y, tile8) for w in w8]
            # fp32 scales made outside the timed calls (as bench_gemm's peers): _scaled_mm alone.
            sa = xs.float()[:, None]
            scaled = [lambda w=w, sb=scaled_mm_weight_scale(w): scaled_mm(xq, sa, w, sb) for w in w8]
            ref8 = t8.reference(x, w8[0])
            prod[0]()
            r["fp8_parts_checked"] = check(y, ref8)[0] and check(scaled[0](), ref8)[0]
            r.update(fp8_tile=tile8, fp8_call_us=us([lambda w=w: t8.launch(x, w, tile8) for w in w8]),
                     fp8_prologue_us=us([lambda p=fp8.tile_prologue(tile8, K)[0]: fp8.quantize_activation_triton(x, p)]),
                     fp8_product_us=us(prod), scaled_mm_alone_us=us(scaled))
            row(**r)
    doc = {"benchmark": "limits", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "commit": code_commit(), "copy_TBps": round(bw, 3), "rows": rows,
           "resources": list(compiled_kernels().values())}
    out = Path(a.out) if a.out else result_path("limits", doc["device"])
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
