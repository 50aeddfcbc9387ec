"""GPU check: every format x row bucket x 27B-class shape against its reference, default tiles.

    python benchmarks/gpu_check.py [--buckets 1,16,...] [--shapes qkv,o] [--out FILE]

Prints a pass table (one line per format and shape, one mark per bucket) and writes
JSON (benchmarks/results/gpu-check-<device>-<date>.json by default). The reference
runs on the GPU in fp32 (no tf32). Outputs are pre-filled with NaN so an element the
kernel never writes fails. Exit status 1 when any check fails.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common_bench import FORMATS, SHAPES, check, code_commit, make_weight, result_path  # noqa: E402

from vsr.autotune.buckets import parse_buckets  # noqa: E402
from vsr.kernels import registry  # noqa: E402


def runnable_formats() -> list[str]:
    cc = torch.cuda.get_device_capability()
    return [f for f in FORMATS if f != "nvfp4" or cc[0] in (10, 12)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--buckets", default="all")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    buckets = parse_buckets(a.buckets)
    fmts = [f for f in a.formats.split(",") if f in runnable_formats()]
    shapes = a.shapes.split(",")
    # Odd row counts beside the buckets: the edge of a tile must be masked right.
    ms = sorted(set(buckets) | {m for m in (3, 100, 1000) if max(buckets) >= m})
    rows, fails = [], 0
    table = []
    for fmt in fmts:
        for sh in shapes:
            N, K = SHAPES[sh]
            w = make_weight(fmt, N, K, dev, seed=1, bias=True)
            x = torch.randn(max(ms), K, device=dev).to(torch.bfloat16)
            t = registry.template_for(w, x.dtype, emulate=(fmt == "nvfp4-emulated"))
            ref = t.reference(x, w)
            marks = []
            for m in ms:
                from vsr.autotune.buckets import bucket_for
                p = t.problem(w, bucket_for(m), x.dtype)
                tile = t.default_tile(p)
                y = torch.full((m, N), float("nan"), dtype=x.dtype, device=dev)
                t0 = time.perf_counter()
                try:
                    t.launch(x[:m], w, tile, out=y)
                    torch.cuda.synchronize()
                    ok, rel = check(y, ref[:m])
                    err = None
                except Exception as e:  # a compile/launch failure is a failed check, named
                    ok, rel, err = False, float("nan"), f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                fails += not ok
                marks.append("." if ok else "X")
                rows.append({"format": fmt, "template": t.name, "shape": sh, "N": N, "K": K, "M": m,
                             "bucket": bucket_for(m), "tile": tile, "ok": ok, "max_rel_err": rel, "error": err,
                             "s": round(time.perf_counter() - t0, 3)})
            table.append(f"{fmt:15s} {sh:8s} {''.join(marks)}")
            del w, ref, x
            torch.cuda.empty_cache()
    commit = code_commit()
    name = torch.cuda.get_device_name()
    out = Path(a.out) if a.out else result_path("gpu-check", name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "gpu-check", "device": name, "torch": torch.__version__,
                               "triton": triton.__version__, "commit": commit, "rows_M": ms,
                               "passed": len(rows) - fails, "failed": fails, "rows": rows}, indent=1))
    print(f"M columns: {ms}")
    print("\n".join(table))
    for r in rows:
        if not r["ok"]:
            print("FAIL", r["format"], r["shape"], r["M"], r["tile"], r["max_rel_err"], r["error"])
    print(f"{len(rows) - fails}/{len(rows)} passed -> {out}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
