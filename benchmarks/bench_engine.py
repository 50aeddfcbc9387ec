"""Engine benchmark: a whole forward of a router, eager against CUDA graphs (Engine cuda_graphs).

    python benchmarks/bench_engine.py [--reps 50] [--package NAME=DIR ...] [--traffic N] [--profile]
                                      [--out FILE]

The model is a random BERT of the built-in router's shape (all-MiniLM-L6-v2: hidden 384, 6
layers, 12 heads, MLP 1536; tests/tinypkgs.build_random_bert, so no MiniLM wheel is needed),
run by the Triton templates with the shipped autotune cache, in fp32 (the package's own dtype)
and bf16. For each batch (1 short request, 1 long one, 32 requests) it times
Engine.forward (tokenization, the forward and the copy of the answers to the CPU included) on
three engines: eager at the batch's own longest request ("vsr-eager-own", load_engine's
shape_ladder=False), eager at the ladder's shape ("vsr-eager") and with CUDA graphs
("vsr-graphs"), the median of --reps calls after the graphed engine's first two (an eager run,
then the capture, a shape's second call) and the timer's own warm-up call. It checks that the
graphed engine gives the eager engine's bytes on those first two calls and after the timed
replays, and each engine its own bytes again. --profile adds each model's eager host time by
function (cProfile).

--traffic N (default 512; 0 skips it) then, after a warm-up that compiles every kernel, answers
N requests of varied length (1-63 tokens) in two workloads: "file", 64 at a time, the way
`vsr-run --input` calls the engine; and "calls", calls of 1-32 requests (a fixed sequence), the
way a process serving requests as they come might. Each workload runs twice over (a long-lived
process: the second pass finds its shapes seen) on four engines of one model: eager at each
batch's own longest request ("eager-own"), eager at the ladder's shapes (engine.batch_shape,
"eager"), CUDA graphs of every batch's own shape captured on first use (for comparison,
"graphs-own-first") and CUDA graphs at the ladder's shapes captured on a shape's second
call ("graphs"). Rows give the requests per second of each pass, the captures so far, and whether
each graphed engine gave its eager counterpart's bytes (Engine.forward, what Engine.answer runs).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "tests"))
from common_bench import code_commit, result_path  # noqa: E402
from tinypkgs import TEST_TEXTS, Pkg, build_random_bert  # noqa: E402

from vsr.autotune import tuner  # noqa: E402
from vsr.runtime import engine as engine_mod  # noqa: E402
from vsr.runtime.engine import load_engine  # noqa: E402

WORDS = " ".join(TEST_TEXTS).split()


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
    rows = [{"fn": f"{Path(file).name}:{line}:{name}", "own_us": tt / calls * 1e6, "cum_us": ct / calls * 1e6,
             "calls_per_call": nc / calls}
            for (file, line, name), (cc, nc, tt, ct, _) in st.stats.items()]
    return sorted(rows, key=lambda r: -r["own_us"])[:top]


def batches() -> dict[str, list[str]]:
    return {"1 short": [TEST_TEXTS[2]], "1 long": [" ".join(WORDS[:120])],
            "32 mixed": [TEST_TEXTS[i % len(TEST_TEXTS)] + " " + " ".join(WORDS[: 3 * i]) for i in range(32)]}


def traffic(n: int) -> list[str]:
    """n requests of 1-63 tokens (a fixed sequence: a test text and 0-44 more words)."""
    return [TEST_TEXTS[i % len(TEST_TEXTS)] + " " + " ".join(WORDS[: (i * 37) % 45]) for i in range(n)]


def workloads(n: int) -> dict[str, list[list[str]]]:
    """The traffic study's calls (module docstring): "file", 64 requests a call; "calls", 1-32."""
    texts = traffic(n)
    calls, i = [], 0
    while i < n:
        k = 1 + (len(calls) * 13) % 32
        calls.append(texts[i:i + k])
        i += k
    return {"file": [texts[i:i + 64] for i in range(0, n, 64)], "calls": calls}


def traffic_rows(fmt: str, pkg, dtype: str, n: int) -> list[dict]:
    """The --traffic study for one model (module docstring)."""
    rows = []
    names = ("eager-own", "eager", "graphs-own-first", "graphs")
    loads = workloads(n)
    # Every kernel compiled before any timing (each engine loaded below still resolves its layers'
    # tiles from the cache on its first pass: a lookup per layer and bucket, not a compile).
    for ladder in (False, True):
        warm = load_engine(pkg, device="cuda", dtype=dtype, cuda_graphs=False, shape_ladder=ladder)
        for texts in (t for calls in loads.values() for t in calls):
            warm.forward(texts)
    for load, calls in loads.items():
        answers = {}
        for name in names:
            e = load_engine(pkg, device="cuda", dtype=dtype, cuda_graphs=name == "graphs",
                            shape_ladder=not name.endswith(("-own", "-own-first")))
            if name == "graphs-own-first":   # no ladder: each batch's own shape captured on first use
                e.graphed = engine_mod.GraphedForward(e.model, e.device, capture_at=1)
            for rep in (1, 2):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                got = [e.forward(texts) for texts in calls]
                torch.cuda.synchronize()
                s = time.perf_counter() - t0
                answers.setdefault(name, got)
                rows.append({"format": fmt, "shape": "minilm-random", "batch": f"traffic {load} pass {rep}",
                             "requests": n, "calls": len(calls), "provider": f"vsr-{name}", "ms": s * 1e3,
                             "requests_per_s": n / s, "graph": name.startswith("graphs"),
                             "captures": e.graphed.captures if e.graphed is not None else 0,
                             # pass 2 against pass 1's answers (pass 1 is checked by `same` below)
                             "checked": rep == 1 or all(map(torch.equal, got, answers[name]))})
                print(f"{fmt:11s} traffic {load:5s} pass {rep} {name:17s} {n / s:8.0f} requests/s captures "
                      f"{rows[-1]['captures']}", flush=True)
        same = {g: all(map(torch.equal, answers[g], answers[e]))
                for g, e in (("graphs-own-first", "eager-own"), ("graphs", "eager"))}
        for r in rows[-2 * len(names):]:   # this workload's rows: two passes of each engine
            r["checked"] = r["checked"] and same.get(r["provider"][4:], True)
    return rows


def batch_engines(pkg, dtype: str) -> dict:
    """The batch table's engines: eager at each batch's own shape, eager at the ladder's, CUDA
    graphs. The eager ones ask for eager: graphs are load_engine's default on a GPU."""
    return {"vsr-eager-own": load_engine(pkg, device="cuda", dtype=dtype, cuda_graphs=False, shape_ladder=False),
            "vsr-eager": load_engine(pkg, device="cuda", dtype=dtype, cuda_graphs=False),
            "vsr-graphs": load_engine(pkg, device="cuda", dtype=dtype, cuda_graphs=True)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--package", action="append", default=[], metavar="NAME=DIR",
                    help="also a (quantized) package of the same model, run in bf16")
    ap.add_argument("--traffic", type=int, default=512, metavar="N", help="requests of the traffic study (0: none)")
    ap.add_argument("--profile", action="store_true",
                    help="add each model's eager host time by function (cProfile)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    pkg = Pkg(build_random_bert(Path(tempfile.mkdtemp()) / "random-bert"))
    runs = [("fp32", pkg, "float32"), ("bf16", pkg, "bfloat16")]
    for spec in a.package:
        name, sep, path = spec.partition("=")
        if not sep or not Path(path, "config.json").is_file():
            ap.error(f"--package {spec!r}: want NAME=DIR, DIR a package folder with a config.json")
        runs.append((name, Pkg(Path(path)), "bfloat16"))
    rows, profiles = [], []
    for fmt, pkg, dtype in runs:
        engines = batch_engines(pkg, dtype)
        for name, texts in batches().items():
            want = {p: e.forward(texts) for p, e in engines.items()}   # (the graphed engine's first call: eager)
            captured = engines["vsr-graphs"].forward(texts)            # its second: the capture's warm-up run
            first = torch.equal(want["vsr-graphs"], want["vsr-eager"]) and torch.equal(captured, want["vsr-eager"])
            tokens = max(len(t) for t in engines["vsr-eager-own"].tokenizer.encode_checked(texts))
            # (the tuner's eager timer: each forward ends in a copy to the CPU, so a call's time is the caller's wait)
            times = {p: tuner.eager_timer(lambda: e.forward(texts), a.reps) for p, e in engines.items()}
            same = first and all(torch.equal(e.forward(texts), want[p]) for p, e in engines.items())
            for provider, ms in times.items():
                rows.append({"format": fmt, "shape": "minilm-random",
                             "batch": name, "requests": len(texts), "tokens": tokens, "provider": provider,
                             "ms": ms, "graph": provider == "vsr-graphs", "checked": same})
                print(f"{fmt:11s} {name:9s} {len(texts):3d} x {tokens:3d} tokens {provider:13s} {ms:7.3f} ms "
                      f"same bytes {same}", flush=True)
        if a.profile:
            for name, texts in batches().items():
                top = profile_top(lambda: engines["vsr-eager"].forward(texts), calls=20, top=15)
                profiles.append({"format": fmt, "batch": name, "top": top})
                print(f"{fmt} {name}: eager host time by function, us a forward (own / with callees, calls)")
                for t in top:
                    print(f"  {t['own_us']:8.1f} {t['cum_us']:8.1f} {t['calls_per_call']:6.0f}  {t['fn']}")
        if a.traffic:
            rows += traffic_rows(fmt, pkg, dtype, a.traffic)
    out = Path(a.out) if a.out else result_path("engine", torch.cuda.get_device_name())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "engine", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                               "triton": __import__("triton").__version__, "commit": code_commit(), "reps": a.reps,
                               "rows": rows, **({"profiles": profiles} if profiles else {})},
                              indent=1))
    print("| format | batch | eager, own shape ms | eager ms | graphs ms | speedup |\n|---|---|---|---|---|---|")
    per_batch = [r for r in rows if not r["batch"].startswith("traffic")]
    for o, e, g in zip(per_batch[::3], per_batch[1::3], per_batch[2::3]):
        print(f"| {e['format']} | {e['batch']} ({e['requests']} x {e['tokens']}) | {o['ms']:.3f} | {e['ms']:.3f} "
              f"| {g['ms']:.3f} | {e['ms'] / g['ms']:.2f}x |")
    study = [r for r in rows if r["batch"].startswith("traffic")]
    if study:
        names = list(dict.fromkeys(r["provider"] for r in study))
        print("\n| format | workload, pass | " + " | ".join(names) + " |\n|---|---|" + "---|" * len(names))
        for fmt, batch in dict.fromkeys((r["format"], r["batch"]) for r in study):
            cells = [f"{r['requests_per_s']:.0f}/s ({r['captures']} cap.)" for r in study
                     if r["format"] == fmt and r["batch"] == batch]
            print(f"| {fmt} | {batch[8:]} | " + " | ".join(cells) + " |")
    return 0 if all(r["checked"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
