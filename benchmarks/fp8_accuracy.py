"""How far fp8 W8A8 products land from the exact product of their codes, and what holding them
closer costs (run on the GPU; a study, not a test).

On sm_90 Triton compiles an fp8 `tl.dot` with max_num_imprecise_acc = 2^30: the wgmma adds its
products into the fp32 accumulator in the tensor core's reduced precision, as
`_scaled_mm(..., use_fast_accum=True)` does (the peer BENCHMARKS.md names). On random inputs the
rounding errors cancel (the benchmarks' checks see 0.5-1% of max|y|). Where x lines up with a
weight row, a long dot product without cancellation, they add up. With max_num_imprecise_acc = P
the kernel adds each P-product partial sum into a second, full-precision accumulator instead.

For each shape and M it prints, and writes as JSON, for two inputs (x random; x aligned with
weight row 0):
  err     max|y - ref| / max|ref| over the output, ref the exact fp32 product of the same codes
          (fp8.reference_linear)
  row0    |y[:, 0] - ref[:, 0]| / |ref[:, 0]|: the aligned output's own relative error
  us      graph-replayed time (common_bench.graph_ms) of the same shipped tile
for vsr's shipped tile as compiled (P none), with P = 128 and 32 (each in its own process: the
promotion is compiled into the kernels, so gemm._dot is replaced before anything compiles; Triton
refuses P above a tile's BLOCK_K, and the tiles are those tuned without promotion), and
for `_scaled_mm` with and without fast accumulation on the same codes and scales.

    python benchmarks/fp8_accuracy.py [--points qkv:1,qkv:1024,o:1024] [--promote none,128,32]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common_bench import (SHAPES, code_commit, graph_ms, make_weight, result_path, scaled_mm,  # noqa: E402
                          scaled_mm_weight_scale, shipped_tile, torch_quant)

from vsr.autotune.buckets import bucket_for  # noqa: E402
from vsr.kernels import fp8 as fp8mod  # noqa: E402
from vsr.kernels import registry  # noqa: E402

_PROMOTED_DOT = '''import triton
import triton.language as tl


@triton.jit
def _dot(a, b, acc, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, max_num_imprecise_acc={P})
'''


def promote(p: int) -> None:
    """Make every gemm.py kernel compiled from now on add its fp8 products into the fp32
    accumulator every p products (Triton needs the function's source in a file)."""
    from vsr.kernels import gemm
    d = Path(tempfile.mkdtemp(prefix="vsr_promote_"))
    (d / f"promoted_dot_{p}.py").write_text(_PROMOTED_DOT.format(P=p))
    sys.path.insert(0, str(d))
    gemm._dot = __import__(f"promoted_dot_{p}")._dot


def inputs(w, M: int, K: int, dev) -> dict[str, torch.Tensor]:
    """x random, and x aligned with weight row 0 (its dequantized values plus a little noise)."""
    g = torch.Generator(dev).manual_seed(1)
    rnd = torch.randn(M, K, device=dev, generator=g)
    row0 = w.weight[0].float() * w.weight_scale[0].float()
    aligned = row0[None, :] / row0.abs().max() * 3 + 0.1 * rnd
    return {"random": rnd.to(torch.bfloat16), "aligned": aligned.to(torch.bfloat16)}


def errors(y: torch.Tensor, ref: torch.Tensor, aligned: bool) -> dict:
    """err over the output; row0 only where x is aligned with row 0 (elsewhere ref[:, 0] may be
    near zero and the ratio means nothing)."""
    yf, rf = y.float(), ref.float()
    out = {"err": ((yf - rf).abs().max() / rf.abs().max()).item()}
    if aligned:
        out["row0"] = ((yf[:, 0] - rf[:, 0]).abs() / rf[:, 0].abs().clamp_min(1e-30)).max().item()
    return out


def child(points: list[tuple[str, int]], p: int | None) -> list[dict]:
    if p is not None:
        promote(p)
    dev = torch.device("cuda")
    rows = []
    for sh, M in points:
        N, K = SHAPES[sh]
        w = make_weight("fp8", N, K, dev, seed=0)
        t = registry.template_for(w, torch.bfloat16)
        prob = t.problem(w, bucket_for(M), torch.bfloat16)
        tile = shipped_tile(t, prob, dev) or t.default_tile(prob)
        for name, x in inputs(w, M, K, dev).items():
            ref = fp8mod.reference_linear(x, w)
            row = {"shape": sh, "M": M, "input": name, "promote": p, "tile": tile,
                   **errors(t.launch(x, w, tile), ref, name == "aligned")}
            if name == "random":
                row["us"] = graph_ms([lambda: t.launch(x, w, tile)]) * 1e3
            rows.append(row)
            if p is None:   # the peer, on the same codes and scales as the reference
                for fast in (True, False):
                    y = peer(x, w, fast)
                    rows.append({"shape": sh, "M": M, "input": name, "provider": f"scaled_mm fast={fast}",
                                 **errors(y, ref, name == "aligned")})
    return rows


def peer(x: torch.Tensor, w, fast: bool = True) -> torch.Tensor:
    """`_scaled_mm` on the reference's own activation codes and scales (common_bench's peer), with
    or without fast accumulation."""
    return scaled_mm(*torch_quant(x), w, scaled_mm_weight_scale(w), fast=fast)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", default="qkv:1,qkv:256,qkv:1024,qkv:4096,o:1,o:1024,down:1024")
    ap.add_argument("--promote", default="none,128,32", help="P values, 'none' for the kernels as shipped")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    points = [(s, int(m)) for s, m in (p.split(":") for p in a.points.split(","))]
    if a.child is not None:
        print(json.dumps(child(points, None if a.child == "none" else int(a.child))))
        return 0
    t0, rows = time.time(), []
    for p in a.promote.split(","):
        r = subprocess.run([sys.executable, __file__, "--points", a.points, "--child", p],
                           capture_output=True, text=True)
        if r.returncode:
            print(r.stderr[-3000:], file=sys.stderr)
            return 1
        rows += json.loads(r.stdout.strip().splitlines()[-1])
    for r in rows:
        who = r.get("provider") or f"vsr P={r['promote']}"
        us = f"{r['us']:8.1f} us" if "us" in r else " " * 11
        row0 = f"row0 {r['row0']:.2e}" if "row0" in r else " " * 13
        print(f"{r['shape']:8} M={r['M']:<5} {r['input']:8} {who:22} err {r['err']:.2e}  {row0} {us}")
    out = Path(a.out) if a.out else result_path("fp8-accuracy", torch.cuda.get_device_name())
    out.write_text(json.dumps({"benchmark": "fp8-accuracy", "device": torch.cuda.get_device_name(),
                               "torch": torch.__version__, "triton": __import__("triton").__version__,
                               "commit": code_commit(), "wall_s": time.time() - t0,
                               "rows": rows}, indent=1))
    print("->", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
