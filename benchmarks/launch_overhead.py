"""Host time of vsr's launch path against its GPU time (H200 run 6, benchmarks/NOTES.md).

    python benchmarks/launch_overhead.py [--shapes qkv,down] [--ms 64,256,1024] [--formats bf16,fp8]
                                         [--profile] [--out FILE]

Per (format, shape, M) with the template's default tile: host microseconds per call (200 calls
issued back to back, timed on the CPU), the eager time (triton do_bench, L2 cleared) and the CUDA
graph replay time; for fp8 also its activation-quantization prologue alone. Where host time per
call exceeds the graph time, eager figures measure the Python launch path, not the kernel.
--profile adds, per row, the ten functions with the most host time over those calls (cProfile).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common_bench import SHAPES, code_commit, eager_ms, graph_ms, make_weight, result_path  # noqa: E402

from vsr.autotune.buckets import bucket_for  # noqa: E402
from vsr.kernels import fp8 as fp8mod  # noqa: E402
from vsr.kernels import registry  # noqa: E402


def host_us_per_call(fn, calls: int = 200) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return host


def profile_top(fn, calls: int = 200, top: int = 10) -> list[dict]:
    """The `top` functions by own host time over `calls` calls of fn (cProfile, microseconds per call)."""
    fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    st = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (file, line, name), (cc, nc, tt, ct, _) in st.stats.items():
        rows.append({"fn": f"{Path(file).name}:{line}:{name}", "own_us": tt / calls * 1e6, "cum_us": ct / calls * 1e6,
                     "calls_per_call": nc / calls})
    return sorted(rows, key=lambda r: -r["own_us"])[:top]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="qkv,down")
    ap.add_argument("--ms", default="64,256,1024")
    ap.add_argument("--formats", default="bf16,fp8")
    ap.add_argument("--profile", action="store_true", help="add a cProfile breakdown of each row's host time")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = []
    for sh in a.shapes.split(","):
        N, K = SHAPES[sh]
        for fmt in a.formats.split(","):
            w = make_weight(fmt, N, K, "cuda")
            for M in (int(m) for m in a.ms.split(",")):
                x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
                t = registry.template_for(w, x.dtype)
                tile = t.default_tile(t.problem(w, bucket_for(M), x.dtype))
                fn = lambda: t.launch(x, w, tile)  # noqa: E731
                row = {"format": fmt, "shape": sh, "M": M, "tile": tile, "host_us_per_call": host_us_per_call(fn),
                       "eager_us": eager_ms(fn) * 1e3, "graph_us": graph_ms([fn]) * 1e3}
                if a.profile:
                    row["profile"] = profile_top(fn)
                if fmt == "fp8":
                    q = lambda: fp8mod.quantize_activation_triton(x)  # noqa: E731
                    row.update(quant_eager_us=eager_ms(q) * 1e3, quant_graph_us=graph_ms([q]) * 1e3)
                rows.append(row)
                print(json.dumps(row), flush=True)
    doc = {"benchmark": "launch-overhead", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "commit": code_commit(), "rows": rows}
    out = Path(a.out) if a.out else result_path("launch-overhead", doc["device"])
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
