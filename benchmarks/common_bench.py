"""Weights, timers, checks and paths shared by the benchmark scripts (benchmarks only)."""
from __future__ import annotations

import dataclasses
import datetime
import functools
import math
import os
import subprocess
from pathlib import Path

import torch

from vsr.autotune import shapes, synth, tuner
from vsr.autotune.device_id import current_device_identity
from vsr.autotune.keys import make_key
from vsr.autotune.store import entries_by_lineage
from vsr.autotune.tuner import TOLERANCES as TOL
from vsr.kernels import fp8 as fp8mod

# The 27B-class shapes of BENCHMARKS.md, as vsr-tune knows them: name -> (N, K).
SHAPES = {name: (N, K) for name, N, K in shapes.SHAPES_27B}
RESULTS = Path(__file__).resolve().parent / "results"
# The shipped autotune cache of the H200: the tiles users run there.
SHIPPED_CACHE = Path(__file__).resolve().parent.parent / "caches" / "nvidia-h200.json"
L2_BYTES = 60 << 20

# Benchmark format names (BENCHMARKS.md), each made by make_weight.
FORMATS = ("bf16", "fp8", "int4-gptq", "int4-awq", "nvfp4", "nvfp4-emulated")


def device_slug(name: str) -> str:
    """A device name as results and shipped caches name files: "NVIDIA H200" -> "nvidia-h200"."""
    return name.lower().replace(" ", "-")


def result_path(benchmark: str, device_name: str, out_dir: str | Path | None = None) -> Path:
    """`<benchmark>-<device>-<date>.json` (BENCHMARKS.md "Results file"), by default under this
    checkout's benchmarks/results/ whatever the working directory."""
    date = datetime.date.today().isoformat()
    return Path(out_dir if out_dir is not None else RESULTS) / f"{benchmark}-{device_slug(device_name)}-{date}.json"


def code_commit() -> str:
    """The commit of the code measured (BENCHMARKS.md "commit"): $VSR_COMMIT when set (the device
    copy of the tree has no git history: the caller passes it), else this checkout's HEAD, asked
    of the repository this file is in (not of the working directory), with "-dirty" when tracked
    files outside benchmarks/results/ differ from it (the code measured is then not that commit);
    "unknown" without git."""
    env = os.environ.get("VSR_COMMIT", "").strip()
    if env:
        return env
    repo = str(Path(__file__).resolve().parent.parent)
    try:
        head = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True)
        if head.returncode != 0 or not head.stdout.strip():
            return "unknown"
        status = subprocess.run(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no", "--",
                                 ".", ":(exclude)benchmarks/results"], capture_output=True, text=True)
    except OSError:  # no git on this machine
        return "unknown"
    dirty = status.returncode != 0 or bool(status.stdout.strip())
    return head.stdout.strip() + ("-dirty" if dirty else "")


@functools.cache
def _entries_by_lineage(cache: Path) -> dict:
    """A cache file's entries by key lineage (store.entries_by_lineage), read once; none when the
    file does not exist (a checkout without a shipped cache for this device)."""
    return entries_by_lineage([cache]) if cache.exists() else {}


def shipped_entry(template, problem, device, cache: Path = SHIPPED_CACHE, identity=None):
    """The entry (autotune.store.Entry: tile, candidates) `cache` (default the shipped one) holds for
    template's Problem on `device` (or on the device `identity` names, a DeviceIdentity, where it is
    not this machine's): its exact key's, else that of a key tuned for another kernel source or
    Triton (a branch's kernels stale the cache, and a branch's benchmarks still want the tiles users
    run), every other key field matching; None if it has neither."""
    want = make_key(template, problem, identity or current_device_identity(torch.device(device)))
    entries = _entries_by_lineage(Path(cache)).get(want.lineage(), [])
    exact = [e for e in entries if e.key == want]
    return (exact or entries)[0] if entries else None


def shipped_tile(template, problem, device, cache: Path = SHIPPED_CACHE, identity=None) -> dict | None:
    """The tile of shipped_entry (a copy), None where there is no entry."""
    e = shipped_entry(template, problem, device, cache, identity)
    return dict(e.tile) if e else None


def compiled_kernels() -> dict[int, dict]:
    """id -> {kernel, n_regs, n_spills, shared, num_warps, num_stages, constexprs} of every variant
    Triton has compiled in this process for a vsr template (the @triton.jit functions of the kernel
    modules). A variant's registers and spills are known only once its handles are loaded, so this
    loads them (without, a kernel compiled but not yet launched in this process reads None)."""
    import triton
    from vsr.kernels import common, gemm, int4, nvfp4
    out = {}
    for mod in (common, gemm, fp8mod, int4, nvfp4):
        for name, fn in vars(mod).items():
            if not isinstance(fn, triton.runtime.jit.JITFunction):
                continue
            for caches in getattr(fn, "device_caches", {}).values():
                for k in caches[0].values():
                    k = k.result() if hasattr(k, "result") else k
                    k._init_handles()
                    md = k.metadata
                    consts = getattr(k.src, "constants", {})
                    out[id(k)] = {"kernel": name, "n_regs": k.n_regs, "n_spills": k.n_spills, "shared": md.shared,
                                  "num_warps": md.num_warps, "num_stages": md.num_stages,
                                  "constexprs": {str(a): v for a, v in consts.items()
                                                 if isinstance(v, (int, bool, str))}}
    return out


def scaled_mm_weight_scale(w8) -> torch.Tensor:
    """An fp8 weight's per-channel scales as `_scaled_mm` takes them (fp32, [1, N]); made once,
    outside the timed calls."""
    return w8.weight_scale.float()[None, :].contiguous()


def torch_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp8 reference's own torch-op activation quantization (per-token amax, division in x's
    dtype), its scales in fp32 for `_scaled_mm`."""
    q, s = fp8mod.quantize_activation(x)
    return q, s.float()


def scaled_mm(xq: torch.Tensor, sa: torch.Tensor, w8, sb: torch.Tensor, fast: bool = True) -> torch.Tensor:
    """The `_scaled_mm` FP8 peer: row-wise scales, fast accumulation (BENCHMARKS.md; `fast=False`
    for the accumulation Hopper promotes), bf16 out."""
    return torch._scaled_mm(xq, w8.weight.t(), sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast)


def make_weight(fmt: str, N: int, K: int, device, seed: int = 0, bias: bool = False,
                model_dtype: torch.dtype = torch.bfloat16):
    """Random weights of realistic magnitudes (never zeros) in the kernels' layouts, made on `device`:
    the synthetic weights vsr-tune times (vsr.autotune.synth) for the format's parameters, with
    scales in `model_dtype` (the tuner's: a key's activation dtype), plus an optional random bias
    in that dtype."""
    fs = shapes.FORMATS[fmt]
    w = synth.random_weight(fs.fmt, N, K, dict(fs.params), model_dtype, device, seed)
    if bias:
        g = torch.Generator(device=torch.device(device)).manual_seed(seed + 1000)
        w = dataclasses.replace(w, bias=(torch.randn(N, generator=g, device=device) * 0.1).to(model_dtype))
    return w


def copies_for(nbytes: int, most: int = 8) -> int:
    """How many weight copies to rotate so the rotation is at least twice the L2."""
    return max(1, min(most, math.ceil(2 * L2_BYTES / max(1, nbytes))))


def weight_copies(fmt: str, N: int, K: int, device) -> list:
    """make_weight's seed-0 weight and further seeds, enough copies that cycling through them
    keeps each call's weight out of the L2 (copies_for)."""
    w0 = make_weight(fmt, N, K, device, seed=0)
    return [w0] + [make_weight(fmt, N, K, device, seed=i) for i in range(1, copies_for(w0.nbytes()))]


def copy_TBps(device="cuda") -> float:
    """The copy-bandwidth ceiling: a 1 GiB device copy, bytes read plus written, do_bench median."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device=device).random_()
    b = torch.empty_like(a)
    return 2 * a.numel() / (eager_ms(lambda: b.copy_(a)) * 1e-3) / 1e12


def eager_ms(fn) -> float:
    """Median per call; triton's do_bench clears the L2 before every call."""
    import triton.testing
    return float(triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median"))


def _cycle(fns):
    """One call of each of `fns` (one per weight copy), as a single function to capture."""
    def cycle() -> None:
        for f in fns:
            f()
    return cycle


def graph_ms(fns, target_ms: float = 3.0, reps: int = 9, warm_ms: float = 0.0, rest_s: float = 0.0) -> float:
    """Median per-call time of a CUDA graph that cycles through `fns` (one per weight copy, so a
    small layer is not timed out of L2): the tuner's graph timer over one cycle, per call; with
    warm_ms, the graph first replayed back to back for that long, whatever a call takes, after
    rest_s idle seconds where given."""
    return tuner.cuda_graph_timer(_cycle(fns), target_ms, reps, warm_ms=warm_ms, rest_s=rest_s) / len(fns)


def steady_graph_ms(cases: dict, warm_ms: float = tuner.STEADY_WARM_MS, target_ms: float = 3.0,
                    reps: int = 9, after=None, rest_s: float = 0.0) -> tuple[dict, dict]:
    """({name: median per-call ms}, {name: error}) of each case's CUDA graph (a list of calls, one
    per weight copy, as graph_ms), timed in its own steady state: after rest_s idle seconds where
    given (the tuner's STEADY_REST_S says why), its graph replayed back to back for warm_ms (the
    tuner's STEADY_WARM_MS), then `reps` timed replays. Without the warm-up, the same calls at
    M=4096 run up to 18% faster when timed first than when timed after heavier ones
    (docs/cache.md, "Timing"). A case whose warm-up or capture raises is left out, with its error;
    the others are timed. `after(name)`, where given, is called as each case's timing ends (bench_gemm
    reads the GPU's state there, gpu_state)."""
    times, errors = {}, {}
    for name, fns in cases.items():
        try:
            times[name] = graph_ms(fns, target_ms, reps, warm_ms, rest_s)
        except Exception as e:   # this case is reported, the others are still timed
            errors[name] = f"{type(e).__name__}: {e}"
        if after is not None and name in times:
            after(name)
    return times, errors


def gpu_state() -> dict:
    """The GPU's temperature (C), power draw (W) and SM clock (MHz) as NVML reports them now (power
    and clock averaged over NVML's last sample period, 1/6 to 1 s), each None where it cannot be
    read (no NVML binding, nvidia-ml-py, installed; no GPU). A power-limited GPU's steady time
    moves with what ran before it (docs/cache.md, "Timing"); these say what state a case ran in."""
    out = {}
    for name, read, scale in (("temp_c", "temperature", 1), ("power_w", "power_draw", 1e-3),
                              ("sm_mhz", "clock_rate", 1)):
        try:
            out[name] = getattr(torch.cuda, read)() * scale
        except Exception:   # an optional reading: its absence is recorded as None
            out[name] = None
    return out


def checked_launch(launch, x: torch.Tensor, w, tile: dict, ref: torch.Tensor) -> tuple[bool, float]:
    """check() of launch(x, w, tile, out=y) into a NaN-filled y: an element the kernel never
    writes fails (a fresh output could reuse a freed buffer that already holds the answer)."""
    y = torch.full(ref.shape, float("nan"), dtype=ref.dtype, device=x.device)
    launch(x, w, tile, out=y)
    return check(y, ref)


def check(y: torch.Tensor, ref: torch.Tensor) -> tuple[bool, float]:
    """(ok, max error / max|ref|): every element within rtol·|ref| + atol·max|ref|, no NaN."""
    rtol, atol = TOL[ref.dtype]
    yf, rf = y.float(), ref.float()
    if not torch.isfinite(yf).all():
        return False, float("nan")
    scale = rf.abs().max().item() or 1.0
    err = (yf - rf).abs()
    ok = bool((err <= atol * scale + rtol * rf.abs()).all())
    return ok, err.max().item() / scale
