"""GEMM benchmark: every vsr format x the 27B-class shapes x M, beside the peers, in one run.

    python benchmarks/bench_gemm.py [--ms 1,16,64,256,1024,4096] [--shapes ...] [--formats ...]
                                    [--sweep N | --cache FILE] [--peers P,... | --peers none]
                                    [--out FILE]

BENCHMARKS.md "Method": ceilings (copy bandwidth, bf16 8192^3, fp8 _scaled_mm 8192^3)
measured in the same run; random data; every row checked against its reference before
its time counts; eager times are triton's do_bench medians (L2 cleared before each call);
for every M also CUDA-graph replays cycling through weight copies that together exceed twice the
L2, each timed in its own steady state, after 200 ms of its own replays (common_bench.steady_graph_ms: the H200 is
power-limited under these products, and a provider timed after lighter work runs up to 18% faster
than after heavier), and from M=256 after a second's idle first (the tuner's STEADY_REST_S: the
power limiter's state carries over for seconds; docs/cache.md). vsr tiles come from an autotune cache (--cache: the
tiles users run) or from vsr.autotune.tuner.sweep over the template's search space (--sweep N
candidates per key, 0 = default tiles). JSON keys as BENCHMARKS.md
"Results file"; a ratio table is printed last, then issue 4's targets read off the run (targets.py).
The whole table takes about 560 s on the H200 (qkv, o and gate_up 449 s, down 112 s), the
second's rest before each steady case included (nvfp4's swept candidates rest too, in the tuner's
timer): past one 10-minute device command, so
run it as `--shapes qkv,o,gate_up` and `--shapes down` and read the targets off both files at once
(`targets.py A.json B.json`). A run cut short keeps the shapes it finished (`"partial": true`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common_bench import (SHAPES, check, checked_launch, code_commit, copy_TBps, eager_ms, gpu_state,  # noqa: E402
                          result_path, steady_graph_ms, scaled_mm, scaled_mm_weight_scale, torch_quant, weight_copies)

from vsr.autotune.buckets import bucket_for  # noqa: E402
from vsr.autotune.store import write_atomic  # noqa: E402
from vsr.autotune.tuner import candidates, steady_rest_s  # noqa: E402
from vsr.kernels import fp8 as fp8mod  # noqa: E402
from vsr.kernels import int4 as int4mod  # noqa: E402
from vsr.kernels import registry  # noqa: E402

VSR_FORMATS = ("bf16", "fp8", "int4-gptq", "int4-awq", "nvfp4-emulated")


def ceilings() -> dict:
    dev = "cuda"
    copy = copy_TBps(dev)
    n = 8192
    x = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    y = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    t = eager_ms(lambda: x @ y)
    bf16 = 2 * n ** 3 / (t * 1e-3) / 1e12
    xq = x.to(torch.float8_e4m3fn)
    yq = y.to(torch.float8_e4m3fn).t().contiguous().t()
    sa = torch.ones(n, 1, device=dev)
    sb = torch.ones(1, n, device=dev)
    t = eager_ms(lambda: torch._scaled_mm(xq, yq, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True))
    fp8 = 2 * n ** 3 / (t * 1e-3) / 1e12
    return {"copy_TBps": round(copy, 3), "bf16_TFLOPs": round(bf16, 1), "fp8_TFLOPs": round(fp8, 1)}


def floor_ms(fmt: str, wbytes: int, M: int, N: int, K: int, ceil: dict) -> float:
    """The roofline floor of a call: its bytes at the copy bandwidth or its flops at the ceiling of
    the tensor cores it runs on, whichever is longer (fp8 on fp8's; nvfp4's emulation dequantizes
    to bf16 products, so bf16's, as every other format)."""
    moved = wbytes + M * K * 2 + M * N * 2
    rate = ceil["fp8_TFLOPs"] if fmt == "fp8" else ceil["bf16_TFLOPs"]
    return max(moved / (ceil["copy_TBps"] * 1e12), 2 * M * N * K / (rate * 1e12)) * 1e3


# The benchmark's device (the CPU tests run the orchestration on "cpu").
DEV = "cuda"


@dataclasses.dataclass
class Case:
    """One provider at one point: its calls (one per weight copy), its check (ok, max rel error),
    the bytes of its weight, and the fields its rows carry besides the common ones."""

    fmt: str
    provider: str
    fns: list
    check: tuple
    wbytes: int
    extra: dict = dataclasses.field(default_factory=dict)


def vsr_setup(fmt: str, copies):
    """(template, weight copies) of a vsr format at one shape (copies(fmt): its weights, shape_rows')."""
    ws = copies(fmt)
    return registry.template_for(ws[0], torch.bfloat16, emulate=fmt == "nvfp4-emulated"), ws


def vsr_case(fmt: str, setup, x: torch.Tensor, n_sweep: int, resolver=None) -> Case:
    """vsr's case at x's rows: the tile from `resolver` (an autotune cache, what users run) when
    given, else from a sweep of n_sweep candidates, else the default tile."""
    from vsr.autotune.tuner import sweep
    t, ws = setup
    w0 = ws[0]
    p = t.problem(w0, bucket_for(x.shape[0]), x.dtype)
    tile, swept = t.default_tile(p), 0
    if resolver is not None:
        tile = resolver.tile(t, p)
    elif n_sweep > 0:
        res = sweep(t, w0, x, tiles=candidates(t.search_space(p), n_sweep, t.pick_group))
        swept = len(res)
        if res and res[0]["ok"]:
            tile = res[0]["tile"]
    ok = checked_launch(t.launch, x, w0, tile, t.reference(x, w0))
    return Case(fmt, "vsr", [lambda w=w: t.launch(x, w, tile) for w in ws], ok, w0.nbytes(),
                {"template": t.name, "tile": tile, "candidates_swept": swept,
                 "tile_source": "cache" if resolver is not None else "sweep" if n_sweep > 0 else "default"})


PEERS = ("cublas-bf16", "scaled_mm", "scaled_mm+quant", "tinygemm", "gemlite")


def peer_setup(N: int, K: int, peers, log, copies) -> dict:
    """The named peers' weights at one shape (only theirs are made; copies(fmt): a format's weights,
    shared with vsr's cases, shape_rows')."""
    s = {"peers": peers}
    # cuBLAS bf16
    s["wds"] = copies("bf16") if "cublas-bf16" in peers else []
    # FP8 _scaled_mm with row-wise scales
    s["w8s"] = copies("fp8") if {"scaled_mm", "scaled_mm+quant"} & set(peers) else []
    s["sb"] = [scaled_mm_weight_scale(w) for w in s["w8s"]]
    # int4: tinygemm and gemlite on the GPTQ weight (w = (u - 8) · scale, group 128)
    s["wis"] = copies("int4-gptq") if {"tinygemm", "gemlite"} & set(peers) else []
    s["tg"] = []
    for w in (s["wis"] if "tinygemm" in peers else []):
        u = int4mod.unpack_int4(w.packed, K)
        pk = ((u[:, ::2] << 4) | u[:, 1::2]).to(torch.uint8)
        wp = torch._convert_weight_to_int4pack(pk.contiguous(), 8)
        sz = torch.stack([w.scale.t(), torch.zeros_like(w.scale.t())], dim=-1).contiguous()
        s["tg"].append((wp, sz))
    s["gl"] = []
    if "gemlite" in peers:
        try:
            from gemlite import DType, GemLiteLinearTriton
            for w in s["wis"]:
                u = int4mod.unpack_int4(w.packed, K).to(torch.uint8)
                g = GemLiteLinearTriton(4, group_size=128, in_features=K, out_features=N,
                                        input_dtype=DType.BF16, output_dtype=DType.BF16)
                g.pack(u, w.scale, torch.full_like(w.scale, 8), bias=None)
                s["gl"].append(g)
        except Exception as e:
            log({"gemlite": f"unavailable: {type(e).__name__}: {e}"})
            s["gl"] = []
    return s


def peer_cases(s: dict, x: torch.Tensor, log) -> list[Case]:
    """The named peers' cases at x's rows, each checked against its format's reference."""
    peers, M = s["peers"], x.shape[0]
    out = []
    if s["wds"]:
        wds = s["wds"]
        out.append(Case("bf16", "cublas-bf16", [lambda w=w: x @ w.weight.t() for w in wds],
                        check(x @ wds[0].weight.t(), registry.TEMPLATES["dense"].reference(x, wds[0])), wds[0].nbytes()))
    if s["w8s"]:
        w8s, sb = s["w8s"], s["sb"]
        ref8 = fp8mod.reference_linear(x, w8s[0])
        if "scaled_mm" in peers:
            xq, sa = torch_quant(x)   # quantized once, outside the timed calls
            out.append(Case("fp8", "scaled_mm", [lambda w=w, b=b: scaled_mm(xq, sa, w, b) for w, b in zip(w8s, sb)],
                            check(scaled_mm(xq, sa, w8s[0], sb[0]), ref8), w8s[0].nbytes()))

        def sq(w, b):
            return scaled_mm(*torch_quant(x), w, b)
        if "scaled_mm+quant" in peers:
            out.append(Case("fp8", "scaled_mm+quant", [lambda w=w, b=b: sq(w, b) for w, b in zip(w8s, sb)],
                            check(sq(w8s[0], sb[0]), ref8), w8s[0].nbytes()))
    tg, gl = s["tg"], s["gl"]
    if tg or gl:
        wi = s["wis"][0]
        refi = int4mod.reference_linear(x, wi)
    if tg:
        y = torch._weight_int4pack_mm(x, tg[0][0], 128, tg[0][1])
        out.append(Case("int4-gptq", "tinygemm", [lambda p=p: torch._weight_int4pack_mm(x, p[0], 128, p[1]) for p in tg],
                        check(y, refi), wi.nbytes()))
    if gl:
        try:
            for g in gl:  # gemlite's own warm-up (autotune) for this M
                g(x)
            out.append(Case("int4-gptq", "gemlite", [lambda g=g: g(x) for g in gl], check(gl[0](x), refi), wi.nbytes()))
        except Exception as e:
            log({"gemlite": f"M={M} failed: {type(e).__name__}: {e}"})
    return out


def point_rows(sh: str, N: int, K: int, M: int, cases: list[Case], ceil: dict, log) -> list[dict]:
    """Every case's rows at one point: its eager time (triton's do_bench median, the cases one
    after another: vsr's Python launch path costs 66-177 us of host time per call on the H200,
    which hides the kernel up to M ~ 1024, so BENCHMARKS.md asks for both figures: every M here)
    and its CUDA-graph time, each
    case in its own steady state (common_bench.steady_graph_ms), from rest where the tuner times
    its candidates from rest (tuner.steady_rest_s), so the two measure alike. A case that cannot be timed is left out and
    logged as an error (main writes every logged error into the results file)."""
    rows, live = [], {}
    for i, c in enumerate(cases):
        try:
            live[i] = eager_ms(c.fns[0])
        except Exception as e:
            log({"provider": c.provider, "format": c.fmt, "M": M, "error": f"{type(e).__name__}: {e}"})
    states = {}   # the GPU's temperature, power and clock as each graph timing ended
    graph, errors = steady_graph_ms({i: cases[i].fns for i in live},
                                    after=lambda i: states.__setitem__(i, gpu_state()),
                                    rest_s=steady_rest_s(bucket_for(M)))
    for i, err in errors.items():
        log({"provider": cases[i].provider, "format": cases[i].fmt, "M": M, "error": f"graph: {err}"})
    for i, eager in live.items():
        c = cases[i]
        for is_graph, ms_ in ((False, eager), (True, graph.get(i))):
            if ms_ is None:
                continue
            rows.append({"format": c.fmt, "shape": sh, "N": N, "K": K, "M": M, "provider": c.provider,
                         "graph": is_graph, "ms": ms_, "floor_ms": floor_ms(c.fmt, c.wbytes, M, N, K, ceil),
                         "checked": c.check[0], "max_rel_err": c.check[1], **c.extra,
                         **({"gpu": states.get(i)} if is_graph else {})})
            log(rows[-1])
    return rows


def shape_rows(sh: str, ms, ceil: dict, log, peers=PEERS, formats=VSR_FORMATS, n_sweep: int = 0,
               resolver=None, cache_formats=()) -> list[dict]:
    """Every row of one shape: at each M the peers' and vsr's cases on the same x (point_rows);
    vsr's tiles from `resolver` for cache_formats, else as vsr_case says."""
    N, K = SHAPES[sh]
    made = {}   # each format's weight copies made once, for the peers and vsr alike

    def copies(fmt):
        if fmt not in made:
            made[fmt] = weight_copies(fmt, N, K, torch.device(DEV))
        return made[fmt]
    ps = peer_setup(N, K, peers, log, copies) if peers else None
    vs = {fmt: vsr_setup(fmt, copies) for fmt in formats}
    rows = []
    for M in ms:
        x = torch.randn(M, K, device=torch.device(DEV)).to(torch.bfloat16)
        cases = peer_cases(ps, x, log) if ps else []
        cases += [vsr_case(fmt, vs[fmt], x, n_sweep, resolver if fmt in cache_formats else None) for fmt in formats]
        rows += point_rows(sh, N, K, M, cases, ceil, log)
        del x, cases   # before the next M's are made
    return rows


def timed_rows(rows, fmt: str, prov: str, shape: str, M: int) -> dict[bool, dict]:
    """{graph: row} of one (format, provider, shape, M): its eager and CUDA-graph figures."""
    return {r["graph"]: r for r in rows if r["format"] == fmt and r["provider"] == prov and r["shape"] == shape
            and r["M"] == M}


def graph_row(rows, fmt: str, prov: str, shape: str, M: int) -> dict | None:
    """The row of a result that counts for (format, provider, shape, M) on its own: its CUDA-graph
    figure where it has one, else its eager one; None when the run did not time it."""
    c = timed_rows(rows, fmt, prov, shape, M)
    return c.get(True) or c.get(False)


def graph_pair(rows, a: tuple[str, str], b: tuple[str, str], shape: str, M: int) -> tuple[dict | None, dict | None]:
    """The rows of two (format, provider) at one point, timed alike: both CUDA-graph figures where
    both have one, else both eager; (None, None) when either was not timed."""
    ra, rb = timed_rows(rows, *a, shape, M), timed_rows(rows, *b, shape, M)
    for graph in (True, False):
        if graph in ra and graph in rb:
            return ra[graph], rb[graph]
    return None, None


def speedup(rows, fmt: str, prov: str, shape: str, M: int,
            base=("bf16", "cublas-bf16")) -> tuple[float | None, dict | None]:
    """(base's time / this provider's, this provider's row) at one point, timed alike (graph_pair):
    the ratio to cuBLAS BF16 by default; (None, None) when either was not timed."""
    v, c = graph_pair(rows, (fmt, prov), base, shape, M)
    return (c["ms"] / v["ms"], v) if v and c else (None, None)


def bandwidth_share(row: dict) -> float:
    """The share of the copy bandwidth a call at M=1 moves its bytes at (there its floor is its bytes)."""
    return row["floor_ms"] / row["ms"]


def geomean(xs) -> float:
    xs = list(xs)
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


# The peers a format's table row names beside cuBLAS, as (provider, its label in the note).
TABLE_PEERS = {"int4-gptq": (("tinygemm", "tinygemm"), ("gemlite", "gemlite")), "fp8": (("scaled_mm+quant", "sm+q"),)}


def ratio_table(rows) -> str:
    """vsr speed-up over cuBLAS bf16 (graph figures where both have them), per format/M/shape."""
    shapes = sorted({r["shape"] for r in rows}, key=list(SHAPES).index)
    ms = sorted({r["M"] for r in rows})
    lines = ["| format | M | " + " | ".join(f"{s} vs cuBLAS" for s in shapes) + " | geomean | note |",
             "|---|---|" + "---|" * (len(shapes) + 2)]
    for fmt in [f for f in VSR_FORMATS if any(r["format"] == f and r["provider"] == "vsr" for r in rows)]:
        for M in ms:   # (a format this run did not measure has no row: it printed "nanx" before)
            rs, note = [], []
            for sh in shapes:
                r, _ = speedup(rows, fmt, "vsr", sh, M)
                rs.append(float("nan") if r is None else r)
                v = graph_row(rows, fmt, "vsr", sh, M)
                if v and not v["checked"]:
                    note.append(f"{sh} UNCHECKED")
                for peer, label in TABLE_PEERS.get(fmt, ()):
                    pr, _ = speedup(rows, fmt, "vsr", sh, M, base=(fmt, peer))
                    if pr is not None:
                        note.append(f"{sh} {pr:.2f}x {label}")
                if M == 1 and v:
                    note.append(f"{sh} {bandwidth_share(v):.0%} BW")
            gm = geomean(r for r in rs if r == r)
            lines.append(f"| {fmt} | {M} | " + " | ".join(f"{r:.2f}x" for r in rs) + f" | {gm:.2f}x | "
                         + "; ".join(note) + " |")
    return "\n".join(lines)


def peers_of(ap, spec: str | None) -> tuple[str, ...]:
    """The peers to time from --peers: every one when it is not given, none for "none", else those
    named (an argparse error for an unknown provider, or a list without the ratios' denominator)."""
    if spec is None:
        return PEERS
    if spec == "none":
        return ()
    peers = tuple(p for p in spec.split(",") if p)
    unknown = set(peers) - set(PEERS)
    if unknown:
        ap.error(f"--peers: unknown {', '.join(sorted(unknown))} (known: {', '.join(PEERS)})")
    if "cublas-bf16" not in peers:
        ap.error("--peers: cublas-bf16 is every ratio's denominator; name it (or use --peers none)")
    return peers


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ms", default="1,16,64,256,1024,4096")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--formats", default=",".join(VSR_FORMATS))
    ap.add_argument("--sweep", type=int, default=12, help="candidates per key from the search space (0: default tile)")
    ap.add_argument("--cache", default=None, help="take vsr's tiles from this autotune cache (.json or .db; "
                    "a missing key is an error) instead of sweeping")
    ap.add_argument("--cache-formats", default="bf16,fp8,int4-gptq,int4-awq",
                    help="with --cache: the formats whose tiles come from it (the shipped cache records these); "
                         "any other format is swept with --sweep candidates, its rows saying so (tile_source)")
    ap.add_argument("--peers", default=None,
                    help=f"comma-separated providers to time, of {', '.join(PEERS)} (default all); cublas-bf16 "
                         "must be among them (the ratios' denominator); 'none' times no peer (and gives no ratios)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()
    a.peers = peers_of(ap, a.peers)
    torch.backends.cuda.matmul.allow_tf32 = False
    t_start = time.time()
    commit = code_commit()  # of the code as it is when the run starts
    errors = []   # every logged error (a case left out, gemlite unavailable), written with the rows

    def log(r: dict) -> None:
        if "error" in r or "gemlite" in r:
            errors.append(r)
        if not a.quiet or "error" in r:
            print(json.dumps(r, default=str), flush=True)
    ceil = ceilings()
    print("ceilings", ceil, flush=True)
    ms = [int(m) for m in a.ms.split(",")]
    resolver = None
    if a.cache:
        from vsr.autotune.resolver import TileResolver
        resolver = TileResolver(a.cache, "error", torch.device(DEV))
    rows = []
    for sh in a.shapes.split(","):
        rows += shape_rows(sh, ms, ceil, log, a.peers, tuple(f for f in a.formats.split(",") if f), a.sweep,
                           resolver, a.cache_formats.split(",") if a.cache else ())
        torch.cuda.empty_cache()
        write(a, commit, ceil, rows, t_start, partial=True, errors=errors)  # a run cut short keeps what it measured
    write(a, commit, ceil, rows, t_start, partial=False, errors=errors)
    print(ratio_table(rows))
    from targets import evaluate, report   # (here: targets.py imports this module's helpers)
    print(report(evaluate({"rows": rows})))
    return 0


def write(a, commit, ceil, rows, t_start, partial, errors=()):
    name = torch.cuda.get_device_name()
    out = Path(a.out) if a.out else result_path("gemm", name)
    write_atomic(out, json.dumps({"benchmark": "gemm", "device": name, "torch": torch.__version__,
                               "triton": triton.__version__, "commit": commit, "ceilings": ceil,
                               "sweep_candidates": a.sweep, "tile_cache": a.cache,
                               "cache_formats": a.cache_formats if a.cache else None,
                               "peers": list(a.peers),   # gemlite's rows are missing where it failed (logged)
                               "wall_s": round(time.time() - t_start, 1),
                               "partial": partial, "errors": list(errors), "rows": rows}, indent=1, default=str))
    print(f"wrote {out} ({len(rows)} rows, {time.time() - t_start:.0f} s)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
