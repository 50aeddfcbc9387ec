"""Hardware counters of a few products, to say what limits them: run under Nsight Compute.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis -o REPORT \\
        python benchmarks/profile_points.py [--format bf16] [--points o:256,down:256] [--tiles FILE] [--gluon]
    ncu --import REPORT.ncu-rep --csv --page raw > counters.csv

Each case of each point runs once outside the profiled range (compilation, autotune lookup),
then once inside it, in an NVTX range named "<shape>:<M> <case>". The report lists the kernels
in launch order, case by case as the script prints them (run 23: ncu 2025.3.1's
`--print-nvtx-rename kernel` left the kernels' own names in the raw page). Cases: cuBLAS bf16
(`x @ w.t()` on a bf16 weight of the same shape), vsr's shipped tile for --format (a record
name of BENCHMARKS.md: bf16, fp8, int4-gptq, int4-awq; the H200 cache's tile, the template's
default where it holds none), the tiles of --tiles (a JSON list of {"name": ..., "tile": {...}}
for that format's template), and with --gluon (bf16 only) the warp-specialised Gluon study
kernel (gluon_ws.py) on its best 128 x 128 form of run 22. Every output is checked against its
format's reference (common_bench.check, the benchmarks' tolerance) before its range is profiled.
Nsight Compute flushes the caches before each replayed pass, so each kernel starts with its
weight in memory, not in L2, as the benchmarks' weight copies arrange.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common_bench import SHAPES, check, make_weight, shipped_tile  # noqa: E402

from vsr.autotune.buckets import bucket_for  # noqa: E402
from vsr.kernels import registry  # noqa: E402

# The Gluon study's best one-tile-per-program form at M=256 on o and down (run 22).
GLUON_TILE = dict(BM=128, BN=128, BK=64, stages=7, warps=8)


def cases(t, x, w, wd, extra: list[dict], gluon: bool) -> list[tuple[str, object, object]]:
    """(name, zero-argument call returning y, its reference) for each case of one point: cuBLAS
    on the bf16 weight wd, the others on w in t's format."""
    p = t.problem(w, bucket_for(x.shape[0]), x.dtype)
    tile = shipped_tile(t, p, x.device) or t.default_tile(p)
    ref, ref_d = t.reference(x, w), wd.weight.float()
    out = [("cublas", lambda: x @ wd.weight.t(), (x.float() @ ref_d.t()).to(x.dtype)),
           ("vsr shipped", lambda: t.launch(x, w, tile), ref)]
    out += [(e["name"], lambda e=e: t.launch(x, w, e["tile"]), ref) for e in extra]
    if gluon:
        import gluon_ws
        out.append(("gluon ws 128x128 s7", lambda: gluon_ws.ws_gemm(x, wd.weight, GLUON_TILE), out[0][2]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", default="o:256,down:256", help="shape:M, comma-separated")
    ap.add_argument("--format", default="bf16", choices=("bf16", "fp8", "int4-gptq", "int4-awq"),
                    help="the weight format of vsr's cases (cuBLAS always runs bf16)")
    ap.add_argument("--tiles", default=None, help="JSON file: a list of {name, tile} for the format's template")
    ap.add_argument("--gluon", action="store_true", help="also the Gluon warp-specialised study kernel (bf16)")
    a = ap.parse_args(argv)
    if a.gluon and a.format != "bf16":
        ap.error("--gluon profiles the bf16 study kernel: use it with --format bf16")
    extra = json.loads(Path(a.tiles).read_text()) if a.tiles else []
    dev = torch.device("cuda")
    bad = 0
    for point in a.points.split(","):
        sh, m = point.split(":")
        N, K = SHAPES[sh]
        wd = make_weight("bf16", N, K, dev, seed=0)
        w = wd if a.format == "bf16" else make_weight(a.format, N, K, dev, seed=0)
        t = registry.template_for(w, torch.bfloat16)
        # seed 1: make_weight draws seed 0's stream on the same device, and x drawn from it too would
        # line up with the weight's rows (run 27: fp8's fast accumulation then misses the check)
        x = torch.randn(int(m), K, device=dev, generator=torch.Generator(dev).manual_seed(1)).to(torch.bfloat16)
        for name, call, ref in cases(t, x, w, wd, extra, a.gluon):
            ok, err = check(call(), ref)
            bad += not ok
            print(f"{point:10} {name:28} rel_err {err:.2e} {'ok' if ok else 'WRONG'}", flush=True)
            torch.cuda.profiler.start()
            torch.cuda.nvtx.range_push(f"{point} {name}")
            call()
            torch.cuda.nvtx.range_pop()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
