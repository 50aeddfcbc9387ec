"""The autotune cache benchmark (issue 5 proofs a, b, e), on a GPU.

    python benchmarks/bench_cache.py --out-dir DIR [--time-budget-27b S] [--time-budget-minilm S]
                                     [--max-candidates N] [--max-candidates-small N]
                                     [--formats bf16,fp8,int4-gptq,int4-awq]

1. tune (this process): a fresh cache; the 27B-class set (BENCHMARKS.md shapes) x every bucket x
   every format, timed as cold_tune_s; then the built-in router's MiniLM shapes. Keys are tuned
   shape by shape, each shape for every format, so a time budget leaves whole shapes untuned
   and says so. Then the outputs of every recorded (format, bucket) of the qkv layer on seeded
   random data are hashed with the tiles this process tuned, and the cache is exported to
   DIR/nvidia-h200.json (the shipped form).
2. load (two further processes): open the exported file with miss policy "error", time loading
   every key of the 27B-class model (warm_load_ms: opening the file and resolving every key,
   median of repeats, first load too), then recompute the same outputs and hash them. Every
   loading process must count zero timing calls and every hash must equal the tuner's.
3. write DIR/cache-<device>-<date>.json with the keys BENCHMARKS.md names.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common_bench import code_commit, device_slug, result_path  # noqa: E402

from vsr.autotune import shapes, synth, tuner  # noqa: E402
from vsr.autotune.buckets import ROW_BUCKETS, parse_buckets  # noqa: E402
from vsr.autotune.resolver import TileResolver  # noqa: E402
from vsr.kernels.registry import template_for  # noqa: E402

DEV = "cuda"
BUCKETS = ROW_BUCKETS


def export_name() -> str:
    """The shipped file's name: the device name, lower-case, dashed (NVIDIA H200 -> nvidia-h200.json).
    The runtime picks a shipped file by the identity inside it, never by this name."""
    from vsr.autotune.device_id import current_device_identity
    return device_slug(current_device_identity(DEV).name) + ".json"


def _sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def _small_weight(fs, act):
    # Format parameters do not depend on N, K: a small weight of the format gives them.
    return shapes.weight_for(fs, 16, 256, act, DEV)


def problems_27b(formats, spec):
    """(format, template, problem) for every key of the 27B-class model, without building the weights."""
    out = []
    for fs in formats:
        act = shapes.act_dtype_for(fs, None)
        w = _small_weight(fs, act)
        t = template_for(w, act, emulate=fs.emulate)
        for _, N, K in shapes.parse_shapes(spec):
            for b in BUCKETS:
                out.append((fs.name, t, replace(t.problem(w, b, act), N=N, K=K)))
    return out


def hash_outputs(resolver, formats, buckets_by_format, hash_shape):
    """sha256 of y = template.launch(x, w, tile) for each (format, bucket), seeded data."""
    _, N, K = hash_shape
    out = {}
    for fs in formats:
        todo = buckets_by_format.get(fs.name, [])
        if not todo:
            continue
        act = shapes.act_dtype_for(fs, None)
        w = shapes.weight_for(fs, N, K, act, DEV, seed=7)
        t = template_for(w, act, emulate=fs.emulate)
        for b in todo:
            x = synth.random_activations(b, K, act, DEV, seed=11 + b)
            tile = resolver.tile(t, t.problem(w, b, act))
            y = t.launch(x, w, tile)
            _sync()
            out[f"{fs.name}/{b}"] = hashlib.sha256(y.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()
    return out


def small_candidates(args) -> int | None:
    """Tiles tried per key of the --small shapes: --max-candidates-small, else --max-candidates
    (None: all)."""
    return args.max_candidates_small if args.max_candidates_small is not None else args.max_candidates


def role_tune(args):
    from vsr.autotune.jobs import shape_jobs

    dev = torch.device(DEV)
    hash_shape = shapes.parse_shapes(args.big)[0]
    formats = shapes.parse_formats(args.formats)
    db = Path(args.out_dir) / "fresh.db"
    for p in (db, Path(str(db) + "-wal"), Path(str(db) + "-shm")):
        p.unlink(missing_ok=True)
    resolver = TileResolver(db, "tune", dev, jobs=args.jobs)
    report = {}
    small_n = small_candidates(args)
    for name, spec, budget, most in (("27b", args.big, args.time_budget_27b, args.max_candidates),
                                     ("minilm", args.small, args.time_budget_minilm, small_n)):
        t0 = time.monotonic()
        jobs = []
        for label, N, K in shapes.parse_shapes(spec):  # shape-major: every format gets each shape
            jobs += shape_jobs(f"{N}x{K}", args.formats if name == "27b" else args.small_formats, dev, BUCKETS)
        tuned = skipped = failed = 0
        for job in jobs:
            if time.monotonic() - t0 > budget:
                skipped += 1
                continue
            try:
                resolver.tune(job["template"], job["problem"], weight=job["weight"], max_candidates=most)
                tuned += 1
            except Exception as e:  # reported, the run goes on
                failed += 1
                print(f"FAILED {resolver.key(job['template'], job['problem']).short()}: {e}", flush=True)
            del job["weight"]
        secs = time.monotonic() - t0
        report[name] = {"keys": len(jobs), "tuned": tuned, "skipped_time_budget": skipped, "failed": failed,
                        "seconds": round(secs, 2)}
        print(f"{name}: {tuned}/{len(jobs)} keys tuned in {secs:.1f}s ({skipped} skipped, {failed} failed)",
              flush=True)
        if DEV == "cuda":
            torch.cuda.empty_cache()
    # which (format, bucket) of the hash shape are recorded
    have = {e.digest for e in resolver.store.entries()}
    by_fmt = {}
    for fs in formats:
        act = shapes.act_dtype_for(fs, None)
        w = _small_weight(fs, act)
        t = template_for(w, act, emulate=fs.emulate)
        by_fmt[fs.name] = [b for b in BUCKETS
                           if resolver.key(t, replace(t.problem(w, b, act), N=hash_shape[1], K=hash_shape[2])).digest() in have]
    hashes = hash_outputs(resolver, formats, by_fmt, hash_shape)
    from vsr.autotune.store import export_json
    n = export_json(resolver.store, Path(args.out_dir) / export_name())
    json.dump({"report": report, "hashes": hashes, "by_format": by_fmt, "exported": n,
               "tune_timing_calls": resolver.timing_calls},
              open(Path(args.out_dir) / "tune.json", "w"), indent=1)


def role_load(args):
    formats = shapes.parse_formats(args.formats)
    cache = Path(args.out_dir) / export_name()
    before = tuner.timing_calls()
    import warnings
    warnings.simplefilter("ignore")  # misses (keys a time budget left untuned) are counted below instead
    probs = problems_27b(formats, args.big)  # built before the clock starts: the keys a model load resolves
    times, resolver = [], None
    missing = 0
    for _ in range(args.load_repeats):
        _sync()
        t0 = time.perf_counter()
        resolver = TileResolver(cache, "default", DEV)  # "default": a 27B key the budget left untuned is counted, not fatal
        for _, t, p in probs:
            resolver.tile(t, p)
        times.append((time.perf_counter() - t0) * 1e3)
    recorded = sum(resolver.key(t, p).digest() in resolver._loaded for _, t, p in probs)
    by_fmt = json.load(open(Path(args.out_dir) / "tune.json"))["by_format"]
    strict = TileResolver(cache, "error", DEV)
    hashes = hash_outputs(strict, formats, by_fmt, shapes.parse_shapes(args.big)[0])
    json.dump({"load_ms": times, "keys": len(probs), "recorded": recorded, "hashes": hashes,
               "process_timing_calls": tuner.timing_calls() - before},
              open(Path(args.out_dir) / f"load{args.index}.json", "w"), indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--role", default="all", choices=("all", "tune", "load"))
    ap.add_argument("--index", type=int, default=0)
    ap.add_argument("--formats", default="bf16,fp8,int4-gptq,int4-awq")
    ap.add_argument("--time-budget-27b", type=float, default=540.0)
    ap.add_argument("--time-budget-minilm", type=float, default=120.0)
    ap.add_argument("--max-candidates", type=int, default=None, help="tiles tried per key (default: all)")
    ap.add_argument("--max-candidates-small", type=int, default=None,
                    help="tiles tried per key of the --small shapes (default: --max-candidates)")
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--load-repeats", type=int, default=5)
    ap.add_argument("--big", default="27b", help="the model whose cold tune and load are measured")
    ap.add_argument("--small", default="minilm", help="further shapes recorded in the shipped file")
    # The built-in router is an fp32 model: on a GPU at --dtype auto it runs fp32 dense and
    # fp32-activation FP8; bf16 forms serve --dtype bfloat16.
    ap.add_argument("--small-formats", default="bf16,fp32,fp8,fp8@fp32,int4-gptq,int4-awq,int4-gptq@fp32,int4-awq@fp32")
    ap.add_argument("--device", default="cuda", help="cpu only for a smoke test of this script")
    ap.add_argument("--buckets", default="all", help="all (the record); fewer only for a smoke test")
    ap.add_argument("--skip-tune", action="store_true", help="reuse out-dir's tune.json and nvidia-h200.json")
    args = ap.parse_args()
    global DEV, BUCKETS
    DEV = args.device
    BUCKETS = parse_buckets(args.buckets)
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    if args.role == "tune":
        return role_tune(args)
    if args.role == "load":
        return role_load(args)
    commit = code_commit()  # of the code as it is when the run starts (the parent's: its children run it)

    if args.skip_tune:  # re-measure loading of an earlier run's export (tune.json, nvidia-h200.json in out-dir)
        print("skipping the tune: loading the existing export", flush=True)
    base = [sys.executable, __file__, "--out-dir", args.out_dir, "--formats", args.formats, "--big", args.big,
            "--small", args.small, "--small-formats", args.small_formats, "--device", args.device,
            "--buckets", args.buckets]
    if not args.skip_tune:
        subprocess.run(base + ["--role", "tune", "--time-budget-27b", str(args.time_budget_27b),
                               "--time-budget-minilm", str(args.time_budget_minilm), "--jobs", str(args.jobs)]
                       + ([] if args.max_candidates is None else ["--max-candidates", str(args.max_candidates)])
                       + ([] if args.max_candidates_small is None
                          else ["--max-candidates-small", str(args.max_candidates_small)]),
                       check=True)
    for i in (1, 2):  # two fresh processes, one after the other (they share one GPU)
        subprocess.run(base + ["--role", "load", "--index", str(i), "--load-repeats", str(args.load_repeats)],
                       check=True)
    tune = json.load(open(Path(args.out_dir) / "tune.json"))
    loads = [json.load(open(Path(args.out_dir) / f"load{i}.json")) for i in (1, 2)]
    identical = bool(tune["hashes"]) and all(ld["hashes"] == tune["hashes"] for ld in loads)
    from vsr.autotune.device_id import current_device_identity
    ident = current_device_identity(DEV)
    import triton
    t27 = tune["report"]["27b"]
    hs = shapes.parse_shapes(args.big)[0]
    doc = {
        "benchmark": "cache", "device": ident.name, "device_identity": json.loads(ident.key()), "torch": torch.__version__, "triton": triton.__version__,
        "commit": commit,
        "formats": args.formats.split(","),
        "warm_load_ms": round(statistics.median(ms for ld in loads for ms in ld["load_ms"]), 3),
        "warm_load_first_ms": [round(ld["load_ms"][0], 3) for ld in loads],
        "warm_load_keys": loads[0]["keys"], "warm_load_keys_recorded": loads[0]["recorded"],
        # The process-wide counter already includes the resolvers' own counts: adding both double-counted.
        "timing_calls_on_load": sum(ld["process_timing_calls"] for ld in loads),
        "cross_process_identical": identical,
        "cross_process_outputs": len(tune["hashes"]),
        "cold_tune_from_earlier_run": bool(args.skip_tune),
        "tune_commit": os.environ.get("VSR_TUNE_COMMIT", "") if args.skip_tune else commit,
        "cold_tune_s": t27["seconds"], "cold_tune_complete": t27["tuned"] == t27["keys"],
        "cold_tune": tune["report"], "max_candidates": args.max_candidates,
        "max_candidates_small": small_candidates(args),
        "rows": [{"format": k.split("/")[0], "shape": hs[0], "N": hs[1], "K": hs[2],
                  "M": int(k.split("/")[1]), "provider": "vsr", "graph": False, "ms": None, "floor_ms": None,
                  "checked": all(ld["hashes"].get(k) == v for ld in loads), "sha256": v}
                 for k, v in sorted(tune["hashes"].items())],
    }
    result_path("cache", ident.name, args.out_dir).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k != "rows"}, indent=1))


if __name__ == "__main__":
    main()
