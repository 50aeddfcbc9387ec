"""Tile check: chosen tiles of a template against its reference on the GPU, several fresh inputs
each, and the same input twice (the bytes must agree), with what each compiled kernel asks for.

    python benchmarks/tile_check.py --cache caches/nvidia-h200.json [--templates int4_w4a16]
    python benchmarks/tile_check.py --tiles '[{...}, ...]' --formats int4-awq --shapes down --rows 256
                                    [--repeats 4] [--out FILE]

--cache: for every entry of the file (of --templates; tiles of --paths), its tile and every candidate its tuning
recorded as failing the reference check, on that key's shape, format and activation dtype, at the
key's bucket of rows. --tiles: each tile of the JSON list on every --formats x --shapes x --rows.
Outputs are NaN-filled first, so an element never written fails; the check and its tolerance are
the tuner's (vsr.autotune.tuner.check_output, tolerance_for), and a dense weight runs in the
activations' dtype, as the runtime converts it. Each compiled kernel's registers,
spills and shared memory are read from Triton's cache after its first launch and reported with
the case that compiled it (a later case launching the same variants says so; its JSON row lists no
kernels). Writes JSON
(benchmarks/results/tile-check-<device>-<date>.json by default) and prints one line per tile.
Exit status 1 when any tile fails.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common_bench import SHAPES, code_commit, compiled_kernels, make_weight, result_path  # noqa: E402

from vsr.autotune.buckets import bucket_for  # noqa: E402
from vsr.autotune.keys import CacheKey  # noqa: E402
from vsr.autotune.shapes import format_label  # noqa: E402
from vsr.autotune.tuner import check_output, same_bytes, tolerance_for  # noqa: E402
from vsr.kernels import registry  # noqa: E402
from vsr.runtime.linear import to_run_dtype  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def cases_from_cache(path: Path, templates: set[str], paths: set[str]) -> list[dict]:
    out = []
    for e in json.loads(path.read_text())["entries"]:
        key = e["key"]
        if templates and key["template"] not in templates:
            continue
        base = dict(format=format_label(CacheKey.from_dict(key)), N=key["N"], K=key["K"], M=key["bucket"],
                    act_dtype=key["act_dtype"])
        tiles = [(e["tile"], "shipped")] + [(c["tile"], "failed when tuned") for c in e["candidates"]
                                            if not c["ok"] and "reference check failed" in (c["error"] or "")]
        out += [dict(base, tile=t, why=why) for t, why in tiles if not paths or t["path"] in paths]
    return out


def run_case(case: dict, repeats: int, dev) -> dict:
    x_dtype = DTYPES[case["act_dtype"]]
    # The tuner's weight for the key (scales in the activations' dtype, as vsr-tune and vsr-tune
    # verify make them), with a bias; a dense weight runs in the activations' dtype (the runtime
    # converts it once at load).
    w = to_run_dtype(make_weight(case["format"], case["N"], case["K"], dev, seed=7, bias=True, model_dtype=x_dtype),
                     x_dtype)
    g = torch.Generator(device=dev).manual_seed(11)
    x = torch.randn(case["M"], case["K"], generator=g, device=dev).to(x_dtype)
    t = registry.template_for(w, x_dtype)
    bound = tolerance_for(t.problem(w, bucket_for(case["M"]), x_dtype), x_dtype)   # the tuner's own check
    before = set(compiled_kernels())
    bad, reasons, same = 0, [], True
    for r in range(repeats):
        if r:
            x = torch.randn(case["M"], case["K"], generator=g, device=dev).to(x_dtype)
        ref = t.reference(x, w)
        ys = []
        for _ in range(2):
            y = torch.full(ref.shape, float("nan"), dtype=ref.dtype, device=dev)
            t.launch(x, w, dict(case["tile"]), out=y)
            torch.cuda.synchronize()
            ys.append(y)
        reason = check_output(ys[0], ref, x_dtype, bound)
        bad += reason is not None
        reasons += [reason] if reason else []
        same &= same_bytes(ys[0], ys[1])
    new = [v for k, v in compiled_kernels().items() if k not in before]
    return dict(case, template=t.name, failed_inputs=bad, repeats=repeats, reasons=reasons, deterministic=same,
                kernels=[{"name": v["kernel"], "registers": v["n_regs"], "spills": v["n_spills"], "shared": v["shared"]}
                         for v in new])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path)
    ap.add_argument("--templates", default="", help="comma-separated template names (with --cache)")
    ap.add_argument("--paths", default="", help="comma-separated tile paths (with --cache; default all)")
    ap.add_argument("--tiles", help="a JSON list of tiles")
    ap.add_argument("--formats", default="int4-gptq,int4-awq")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--rows", default="256")
    ap.add_argument("--act-dtype", default="bfloat16", choices=sorted(DTYPES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if bool(a.cache) == bool(a.tiles):
        ap.error("give --cache or --tiles")
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    if a.cache:
        cases = cases_from_cache(a.cache, {s for s in a.templates.split(",") if s}, {s for s in a.paths.split(",") if s})
    else:
        cases = [dict(format=f, N=SHAPES[s][0], K=SHAPES[s][1], M=int(m), act_dtype=a.act_dtype, tile=tile,
                      why="asked", shape=s)
                 for tile in json.loads(a.tiles) for f in a.formats.split(",") for s in a.shapes.split(",")
                 for m in a.rows.split(",")]
    rows, fails = [], 0
    for case in cases:
        try:
            r = run_case(case, a.repeats, dev)
        except Exception as e:  # a compile or launch failure is a failed tile, named
            r = dict(case, failed_inputs=a.repeats, repeats=a.repeats, deterministic=None,
                     error=f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
        fails += r["failed_inputs"] > 0 or r.get("deterministic") is False
        rows.append(r)
        k = r.get("kernels")
        # No kernel new to this case: its variants were compiled (and reported) for an earlier one.
        res = (f"regs {k[-1]['registers']} spills {k[-1]['spills']} smem {k[-1]['shared']}" if k else
               "kernels as compiled for an earlier case" if "error" not in r else "")
        print(f"{r['format']:10s} {r['N']:6d} {r['K']:6d} M={r['M']:<5d} {r['act_dtype'][:4]} {r['why']:18s} "
              f"bad {r['failed_inputs']}/{r['repeats']} det {r.get('deterministic')} {res} "
              f"{json.dumps(r['tile'], sort_keys=True)} {r.get('error', '')}{'; '.join(r.get('reasons') or [])[:200]}",
              flush=True)
    out = Path(a.out) if a.out else result_path("tile-check", torch.cuda.get_device_name())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "tile-check", "device": torch.cuda.get_device_name(),
                               "torch": torch.__version__, "triton": __import__("triton").__version__,
                               "commit": code_commit(), "rows": rows}, indent=1))
    print(f"{len(rows) - fails}/{len(rows)} tiles passed; {out}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
