"""Which kernels the peers launch, with what grid and tile, beside vsr's (torch.profiler, one GPU).

    python benchmarks/peer_kernels.py [--shapes qkv,o] [--ms 256,1024] [--out FILE]

Per (shape, M): cuBLAS BF16 (`x @ w.t()`), `_scaled_mm` FP8 with row-wise scales (activations
quantized outside the profiled calls) and vsr's bf16 and fp8 products on the shipped cache's tiles,
each called a few times under torch.profiler. Every CUDA kernel launched is reported with its grid,
block, registers, shared memory and device microseconds per call, and for cuBLAS's kernels the
tile and cluster their names spell (`..._tilesize128x256x64_cluster2x1x1_...` or nvjet's
`nvjet_..._128x256_64x4_2x1_...`). Those are in cuBLAS's own column-major terms: for `x @ w.t()`
"tile" [a, b] is a weight rows (N) by b rows of x (M), as the grid shows (qkv, M = 256: a 168x128
tile on a grid of 2 x 61, 61 x 168 ~ N = 10240). It times nothing for the ratios (bench_gemm.py does): it says
what the peer does where vsr is slower (bf16 at M = 256-1024, NOTES "Next kernel session" item 4).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common_bench import (SHAPES, SHIPPED_CACHE, code_commit, make_weight, result_path, scaled_mm,  # noqa: E402
                          scaled_mm_weight_scale, shipped_tile, torch_quant)

from vsr.autotune.buckets import bucket_for  # noqa: E402
from vsr.autotune.store import write_atomic  # noqa: E402
from vsr.kernels import registry  # noqa: E402

_CUTLASS = re.compile(r"tilesize(\d+)x(\d+)x(\d+)")
_CLUSTER = re.compile(r"cluster(\d+)x(\d+)x(\d+)")
_NVJET = re.compile(r"nvjet_\w*?_(\d+)x(\d+)_(\d+)x(\d+)_(\d+)x(\d+)_")


def tile_of_name(name: str) -> dict | None:
    """The tile (and cluster) a cuBLAS kernel's name spells, or None: CUTLASS-style names give
    `tilesizeMxNxK` and `clusterAxBxC`; nvjet names `MxN_KxSTAGES_AxB` after the precision tag."""
    m = _NVJET.search(name)
    if m:
        a, b, k, st, c1, c2 = map(int, m.groups())
        return {"tile": [a, b], "k": k, "stages": st, "cluster": [c1, c2]}
    m = _CUTLASS.search(name)
    if m:
        out = {"tile": [int(m[1]), int(m[2])], "k": int(m[3])}
        c = _CLUSTER.search(name)
        if c:
            out["cluster"] = [int(c[1]), int(c[2]), int(c[3])]
        return out
    return None


def kernels_of(events: list[dict], calls: int) -> list[dict]:
    """The CUDA kernels of a chrome trace's events ("cat": "kernel"), one row per kernel name in
    order of first launch: grid, block, registers, shared memory, launches and device us per call."""
    rows: dict[str, dict] = {}
    for ev in events:
        if ev.get("cat") != "kernel":
            continue
        a = ev.get("args", {})
        r = rows.setdefault(ev["name"], {"name": ev["name"], "grid": a.get("grid"), "block": a.get("block"),
                                         "registers": a.get("registers per thread"),
                                         "smem": a.get("shared memory"), "launches": 0, "us": 0.0})
        r["launches"] += 1
        r["us"] += float(ev.get("dur", 0.0))
    out = []
    for r in rows.values():
        us, n = r.pop("us"), r.pop("launches")
        out.append({**r, "launches_per_call": n / calls, "us_per_call": us / calls, "tile": tile_of_name(r["name"])})
    return out


def profile(fn, calls: int = 5) -> list[dict]:
    fn()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "trace.json"
        prof.export_chrome_trace(str(p))
        events = json.loads(p.read_text()).get("traceEvents", [])
    return kernels_of(events, calls)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--ms", default="1,16,64,256,1024,4096")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("peer_kernels.py needs a CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    out = Path(a.out) if a.out else result_path("peer-kernels", torch.cuda.get_device_name(dev))
    doc = {"benchmark": "peer-kernels", "device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
           "commit": code_commit(), "tile_cache": SHIPPED_CACHE.name, "rows": []}
    for sh in a.shapes.split(","):
        N, K = SHAPES[sh]
        wb, w8 = make_weight("bf16", N, K, dev), make_weight("fp8", N, K, dev)
        sb = scaled_mm_weight_scale(w8)
        for M in map(int, a.ms.split(",")):
            x = torch.randn(M, K, device=dev).to(torch.bfloat16)
            q, s = torch_quant(x)
            provs = {"cublas-bf16": lambda: x @ wb.weight.t(), "scaled_mm": lambda: scaled_mm(q, s, w8, sb)}
            tiles = {}
            for fmt, w in (("bf16", wb), ("fp8", w8)):
                t = registry.template_for(w, x.dtype)
                # The shipped tile whatever kernel source it was tuned for (a branch stales the cache).
                tile = tiles[f"vsr-{fmt}"] = shipped_tile(t, t.problem(w, bucket_for(M), x.dtype), dev)
                provs[f"vsr-{fmt}"] = lambda t=t, w=w, tile=tile: t.launch(x, w, tile)
            for name, fn in provs.items():
                ks, err = [], None
                if name in tiles and tiles[name] is None:
                    err = f"{SHIPPED_CACHE.name} has no tile for this key"
                else:
                    try:
                        ks = profile(fn)
                    except Exception as e:   # one provider failing leaves the others' rows
                        err = f"{type(e).__name__}: {e}"
                row = {"shape": sh, "N": N, "K": K, "M": M, "provider": name, "kernels": ks, "error": err}
                if name in tiles:
                    row["vsr_tile"] = tiles[name]
                doc["rows"].append(row)
                main_k = max(ks, key=lambda k: k["us_per_call"]) if ks else None
                print(f"{sh:8s} M={M:<5d} {name:12s} " + (f"{main_k['us_per_call']:8.1f} us  grid={main_k['grid']} "
                      f"tile={main_k['tile'] or ''} {main_k['name'][:90]}" if main_k else f"ERROR {err}"), flush=True)
            write_atomic(out, json.dumps(doc, indent=1))   # after every M: a cut-short run keeps its rows
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
