"""Start-up: time to the first answer of a fresh `python -m vsr.cli.run` process (issue 39, point 5).

Each case is a new process, Python start included, as a user runs the product, with an empty
Triton cache dir of its own (a temp TRITON_CACHE_DIR), timed from spawn to its first answer line
on stdout (`first_answer_s`) and to its exit (`total_s`):

- the built-in router and one quantized package (default vsr/intent-minilm-W4A16-GPTQ), one
  request (`--text`) and 2,048 held-out test requests (`--input`, JSONL);
- on a GPU, each without a compiled-kernel bundle (VSR_KERNEL_BUNDLE=off: every kernel compiles)
  and with the bundle of this device (autotune/bundle.py; --bundle names one), and a process
  whose kernels are already compiled (the same Triton cache dir, warm: `triton_cache` "warm");
  on the CPU no kernel compiles, so the rows carry bundle false only.

Python's own bytecode is on disk before the timing, as after `pip install` (which compiles it):
one untimed process per package runs first, and where PYTHONDONTWRITEBYTECODE is set (the H200
image sets it; every process would then compile vsr's, its dependencies' and torch's sources
again, about 2 s) the processes write and read their bytecode under a PYTHONPYCACHEPREFIX of
their own instead (`bytecode` in the record says which).

Writes `start-<device>-<date>.json` (BENCHMARKS.md, the `start` schema): rows with `package`,
`bundle`, `triton_cache`, `requests`, `first_answer_s`, `total_s` (medians over --repeats), the
bundle's size, and the targets of issue 39 point 6, each met or missed, also printed.

    python benchmarks/bench_start.py [--device cuda] [--router PKG|none] [--quantized PKG|none]
                                     [--repeats 3] [--out-dir benchmarks/results]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

ROUTER = "vsr/intent-minilm"
QUANTIZED = "vsr/intent-minilm-W4A16-GPTQ"
TEXT = "turn on the kitchen lights"
# Issue 39 point 6: (device kind, what, limit).
TARGETS = {
    "cuda": [("router first answer, bundle, empty Triton cache", 2.5),
             ("int4 first answer, bundle, empty Triton cache", 3.0),
             ("2048 requests, bundle, empty Triton cache / kernels compiled", 1.3)],
    "cpu": [("router first answer", 3.0)],
}


def timed_run(args: list[str], env: dict) -> tuple[float, float]:
    """(seconds to the first stdout line, seconds to exit) of `python -m vsr.cli.run ARGS`."""
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "vsr.cli.run", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env)
    first = p.stdout.readline()
    t_first = time.perf_counter() - t0
    rest, err = p.communicate()
    t_end = time.perf_counter() - t0
    if p.returncode != 0 or not first:
        raise RuntimeError(f"vsr-run {' '.join(args)} exited {p.returncode}: {err.decode()[-2000:]}")
    return t_first, t_end


def bytecode_env(env: dict, work: Path) -> tuple[dict, str]:
    """The children's environment with bytecode written and read as an installed package has it,
    and what was done: PYTHONDONTWRITEBYTECODE dropped for a PYTHONPYCACHEPREFIX under `work`
    where it was set."""
    if not env.get("PYTHONDONTWRITEBYTECODE"):
        return env, "as the environment writes it"
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    return env, "PYTHONDONTWRITEBYTECODE was set: written under a PYTHONPYCACHEPREFIX of the run"


def requests_file(n: int, out: Path, texts_file: str | None = None) -> Path:
    """n requests at an even stride of the intents' test split (or of texts_file's JSONL texts, for
    a machine without the intents' sources), as JSONL for `--input`."""
    if texts_file:
        texts = [json.loads(line)["text"] for line in Path(texts_file).read_text().splitlines() if line.strip()]
    else:
        from vsr.runtime.intents import load_split
        texts = [s.text for s in load_split()["test"]]
    with open(out, "w") as f:
        for i in range(n):
            f.write(json.dumps({"text": texts[i * len(texts) // n]}) + "\n")
    return out


def targets_of(rows: list[dict], kind: str, requests: int) -> list[dict]:
    """TARGETS[kind], each with its value read off the rows (by role) and met or not (None: not run)."""
    def pick(role, b, tc, n):
        return next((r for r in rows if r["role"] == role and r["bundle"] == b and r["triton_cache"] == tc
                     and r["requests"] == n), None)

    if kind == "cuda":
        vals = [pick("router", True, "empty", 1), pick("quantized", True, "empty", 1)]
        big_b, big_w = pick("quantized", True, "empty", requests), pick("quantized", False, "warm", requests)
        measured = [v and v["first_answer_s"] for v in vals] + [
            big_b and big_w and round(big_b["total_s"] / big_w["total_s"], 3)]
    else:
        measured = [(pick("router", False, "empty", 1) or {}).get("first_answer_s")]
    return [{"target": what, "limit": limit, "value": value, "met": None if value is None else value <= limit}
            for (what, limit), value in zip(TARGETS[kind], measured)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    ap.add_argument("--router", default=ROUTER, help="the router package (a name or folder; 'none' skips it)")
    ap.add_argument("--quantized", default=QUANTIZED,
                    help="the quantized package (a name or folder of an int4 package; 'none' skips it)")
    ap.add_argument("--requests", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--texts-file", default=None, help='JSONL {"text": ...} lines to take the requests from in '
                                                      "place of the test split (bench_serve.py --write-texts makes one)")
    ap.add_argument("--bundle", default=None, help="the bundle to time (default: the one vsr-run finds)")
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args()

    import torch
    import triton

    from common_bench import code_commit, result_path
    from vsr.autotune import bundle as kb
    from vsr.autotune.device_id import current_device_identity
    from vsr.runtime import builtin

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    kind = torch.device(device).type
    ident = current_device_identity(device)
    roles = {role: pkg for role, pkg in (("router", args.router), ("quantized", args.quantized)) if pkg != "none"}
    for p in roles.values():
        builtin.resolve(p)   # built before any timing (a first build compresses with llm-compressor)

    bundle_path = args.bundle
    if kind == "cuda" and bundle_path is None:
        from vsr.autotune.resolver import shipped_cache_for
        from vsr.runtime.paths import cache_root
        cache = shipped_cache_for(ident)
        for d in kb.search_dirs(cache, cache_root() / "bundles"):
            for p in sorted(d.glob(f"*{kb.SUFFIX}")):
                try:
                    kb.check_compatible(kb.read_manifest(p), p, ident, triton.__version__)
                    bundle_path = str(p)
                    break
                except kb.BundleError:
                    continue
            if bundle_path:
                break

    work = Path(tempfile.mkdtemp(prefix="bench-start-"))
    inp = requests_file(args.requests, work / "requests.jsonl", args.texts_file)
    base_env, bytecode = bytecode_env({k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, work)
    rows = []
    modes = [(False, "empty")]
    if kind == "cuda":
        modes = [(False, "empty"), (False, "warm")] + ([(True, "empty")] if bundle_path else [])
    try:
        for role, pkg in roles.items():
            extra = ["--emulate"] if kind == "cpu" and any(s in pkg for s in ("FP8", "NVFP4")) else []
            # Untimed: the bytecode of every module a run imports is written (its Triton dir is dropped).
            timed_run([pkg, "--device", device, *extra, "--text", TEXT],
                      dict(base_env, TRITON_CACHE_DIR=str(work / "tc-bytecode"),
                           VSR_KERNEL_BUNDLE=bundle_path if bundle_path else "off"))
            shutil.rmtree(work / "tc-bytecode", ignore_errors=True)
            for use_bundle, tcache in modes:
                for label, cli in (("1", ["--text", TEXT]), (str(args.requests), ["--input", str(inp), "--json"])):
                    firsts, totals = [], []
                    warm_dir = work / f"warm-{pkg.replace('/', '_')}-{label}"
                    for r in range(args.repeats):
                        cdir = warm_dir if tcache == "warm" else work / f"tc-{len(rows)}-{r}"
                        if tcache == "warm" and r == 0:   # the compiles that make the dir warm: untimed
                            timed_run([pkg, "--device", device, *extra, *cli],
                                      dict(base_env, TRITON_CACHE_DIR=str(cdir), VSR_KERNEL_BUNDLE="off"))
                        env = dict(base_env, TRITON_CACHE_DIR=str(cdir),
                                   VSR_KERNEL_BUNDLE=bundle_path if use_bundle else "off")
                        f, t = timed_run([pkg, "--device", device, *extra, *cli], env)
                        firsts.append(f)
                        totals.append(t)
                        if tcache == "empty":
                            shutil.rmtree(cdir, ignore_errors=True)
                    row = {"package": pkg, "role": role, "bundle": use_bundle, "triton_cache": tcache, "requests": int(label),
                           "device": device, "first_answer_s": round(statistics.median(firsts), 3),
                           "total_s": round(statistics.median(totals), 3),
                           "first_answer_s_all": [round(x, 3) for x in firsts]}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    targets = targets_of(rows, kind, args.requests)
    record = {
        "benchmark": "start", "device": ident.name if kind == "cuda" else f"cpu ({platform.processor()})",
        "torch": torch.__version__, "triton": triton.__version__, "commit": code_commit(),
        "python": platform.python_version(), "cpu_count": os.cpu_count(), "repeats": args.repeats,
        "bytecode": bytecode,
        "requests_source": Path(args.texts_file).name if args.texts_file else "the intents' test split",
        "bundle": bundle_path and Path(bundle_path).name,
        "bundle_bytes": bundle_path and Path(bundle_path).stat().st_size,
        "rows": rows, "targets": targets,
    }
    out = result_path("start", "cpu" if kind == "cpu" else ident.name, args.out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    for t in targets:
        state = "n/a" if t["met"] is None else ("met" if t["met"] else "MISSED")
        print(f"target {t['target']}: {t['value']} (limit {t['limit']}): {state}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
