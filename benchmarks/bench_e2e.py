"""End-to-end benchmark: a whole forward of the 27B-class router in every format, beside the peers.

    python benchmarks/bench_e2e.py [--model qwen3|qwen3_5] [--formats bf16,fp8,...] [--configs 1x128,...]
                                   [--providers vsr,cublas-bf16,scaled_mm+quant,transformers]
                                   [--modes graph,eager] [--layers 64] [--reps 10] [--out FILE]
    python benchmarks/bench_e2e.py --merge PART.json [PART.json ...] [--out FILE]

BENCHMARKS.md "End to end". The model (e2e_models.py: the 27B-class Qwen3 or Qwen3.5 config, random
weights made on the GPU per tensor in each format) runs through the runtime's own model code
(vsr.runtime.models: Qwen3Router / Qwen3_5Router built by a Builder), Triton kernels for the
products (QLinear, tiles from an autotune cache: the shipped one by default) and the rest
(ops.triton_ops), the kernel set a package of the format gets at dtype auto (engine.load_engine's
rule: the approximate set for a quantized one; --kernel-set exact forces the exact one). Providers:
  vsr              that model;
  vsr-pdl          that model within kernels.pdl.programmatic_forward: its kernels launched as
                   programmatic dependents (sm_90+; run only when asked for);
  vsr-act          that model with its gate|up products plain and SwiGLU by the activation kernel
                   after them, as where runtime/fuse.SWIGLU_IN_PRODUCT is off (run when asked for);
  cublas-bf16      the same model object, its linear layers swapped for F.linear on the same bf16
                   weights (bf16 rows only);
  scaled_mm+quant  the same, linears swapped for torch's per-token quantization + _scaled_mm on
                   the same fp8 weights (fp8 rows only);
  transformers     transformers' Qwen3ForSequenceClassification (Qwen3_5TextForSequenceClassification)
                   in bf16 with sdpa attention, its tensors the vsr model's own (bf16 rows only);
each with CUDA graphs (runtime.engine.GraphedForward, captured after an eager warm run, replayed on
fixed inputs) and eager; a failed capture is recorded on the eager row (graph_error). A format
the device cannot run (nvfp4 W4A4 on Hopper) is recorded under "not_run" with the reason.
Defaults: Qwen3 at 1x128, 16x128 and 1x1024, graphs and eager; Qwen3.5 at 1x128 and 1x1024, graphs
(the peers swap the linears only: every other operation stays on the model's Triton ops).
--device cpu runs the whole orchestration on the reference path without graphs (the tests).

Checks (before a provider's time counts): the provider's forward of the first --check-layers layers
(every product shape and kernel of a full forward; a random 64-layer Qwen3.5 amplifies rounding
differences chaotically, so the full depth cannot be compared) against the same layers of the
same weights on the reference path (each format's pure-torch reference linears and the runtime's
reference ops): the last tokens' final hidden states within a relative L2 error and the
probabilities within an absolute error (CHECK_TOL); graph rows through a CUDA graph of those layers
as well; the full forward's output finite. An FP8 row of the approximate kernel set that misses
those tolerances is checked against the unquantized model instead (the same weights dequantized,
bf16 activations, the reference ops; check["vs_unquantized"]): its hidden states no further from
it than UNQUANTIZED_MARGIN times the exact reference's; its graph row, that and the graph's
probabilities within the quantized tolerance of eager's (check["vs_eager_prob_err"]). The graph's
bytes against eager's are recorded (graph_same_bytes).

Times: median of --reps forwards (each synchronised: a forward's latency), after --warm seconds of
the provider's own calls. Floor of a forward (BENCHMARKS.md): max(every linear weight's bytes once /
the copy bandwidth, the products' FLOPs / the format's matrix rate: fp8's _scaled_mm ceiling for
fp8, bf16's for every other format), ceilings measured in the same run (bench_gemm.ceilings). vsr
rows split each forward's device time (torch.profiler, a graph replay where the profiler sees its
kernels, else an eager forward) into products_ms (the kernels of the product templates: kernels/
gemm, dense, fp8, int4, int4_wgmma, nvfp4, common) and rest_ms (every other kernel).

Rows: BENCHMARKS.md's e2e keys, and requests, tokens, layers, kernel_set, check_layers, check
{hidden_rel_err, prob_err[, graph_same_bytes]}, graph_error where a capture failed; vsr rows
products_ms, rest_ms, kernels (the longest eight), split_from (or split_error); transformers' Qwen3.5
rows fla and causal_conv1d (whether flash-linear-attention / causal-conv1d were importable, which
transformers then runs in place of its pure-torch delta rule and conv). The top level adds not_run,
errors (a provider or format that failed, the others measured) and tiles (the cache's keys found
only for older kernels, "stale", and those it lacks, "missed": their tiles are the miss policy's).

One device command runs at most ten minutes: run the formats in parts (--formats, --out PART) and
read them together with --merge (targets.join_results: one commit, no point twice). The JSON is
written after every format and configuration ("partial": true until the run ends). The speed
targets (e2e_targets.E2E_TARGETS) are printed last, each met or missed with its figures.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib.util
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import e2e_models  # noqa: E402
from e2e_targets import (CONFIGS, DEFAULT_PROVIDERS, FORMATS, PROVIDERS, evaluate, merge,  # noqa: E402
                         not_run_lines, report, table)
from common_bench import (SHIPPED_CACHE, code_commit, make_weight, result_path, scaled_mm,  # noqa: E402
                          scaled_mm_weight_scale, shipped_entry, torch_quant)

from vsr.autotune.keys import make_key  # noqa: E402
from vsr.autotune.tuner import eager_timer  # noqa: E402
from vsr.kernels import activation  # noqa: E402
from vsr.kernels import fp8 as fp8_format  # noqa: E402
from vsr.kernels import pdl  # noqa: E402
from vsr.runtime import fuse  # noqa: E402
from vsr.runtime.linear import QLinear  # noqa: E402
from vsr.runtime.models import build_model, linear_names  # noqa: E402
from vsr.runtime.models import ops as ops_mod  # noqa: E402
from vsr.runtime.models.common import Builder  # noqa: E402

# The format each peer computes (its rows carry it): a peer runs in that format's part only.
PEER_FORMAT = {"cublas-bf16": "bf16", "scaled_mm+quant": "fp8", "transformers": "bf16"}
CHECK_LAYERS = 4
# (the last tokens' final hidden: relative L2 error, the probabilities: absolute error) at the
# first CHECK_LAYERS layers; quantized formats on the approximate kernel set round differently.
CHECK_TOL = {"bf16": (0.03, 0.02)}
CHECK_TOL_QUANTIZED = (0.06, 0.05)
# A format whose approximate set quantizes other values than the exact reference does (FP8: the
# norm's and the activation's unrounded fp32 outputs) moves further from that reference than its
# tolerance over a few random layers, as a peer that quantizes on its own does. Such a row is also
# checked against the unquantized model (the same weights dequantized, bf16 activations, the
# reference ops): it passes when its last tokens' hidden states are no further from it than
# UNQUANTIZED_MARGIN times the exact reference's are. (The probabilities are recorded beside: of
# one request they are one draw of two labels, where the hidden states hold 5120 values.) Its
# graph row passes when that check does and the graph's probabilities are the eager ones'.
UNQUANTIZED_FORMATS = {"fp8": fp8_format.dequantize}
UNQUANTIZED_MARGIN = 1.25


# ---- the peers' linear layers ---------------------------------------------------------------

@contextlib.contextmanager
def gate_up_order(model):
    """Every SwiGLU QLinear of `model` (gate and up rows interleaved for its epilogue) with its weight's
    rows in gate|up order, in place, while inside (fuse.side_by_side(..., in_place=True)), and
    interleaved again after: the peers, the unquantized twin and transformers' twin read them so.
    No copy of a weight sits beside the model's (the 27B BF16 model and copies of its gate|up
    weights do not fit an 80 GB card together)."""
    found = [m for m in model.modules() if isinstance(m, QLinear) and m.glu]
    for m in found:
        fuse.side_by_side(m.weight, in_place=True)
    try:
        yield model
    finally:
        for m in found:
            fuse.interleave_rows(m.weight)


@contextlib.contextmanager
def swiglu_by_activation_kernel(model):
    """The vsr-act provider: every SwiGLU QLinear of `model` a plain product of its weight in gate|up
    order (gate_up_order) while inside, so the model runs the activation kernel after it (and, in
    the FP8 approximate set, hands it the norm's codes and the down product the activation's), as
    the runtime does where fuse.SWIGLU_IN_PRODUCT is off; its tiles are the same."""
    with gate_up_order(model):
        found = [m for m in model.modules() if isinstance(m, QLinear) and m.glu]
        for m in found:
            m.glu = False
        try:
            yield model
        finally:
            for m in found:
                m.glu = True


class CublasLinear(torch.nn.Module):
    """F.linear (cuBLAS on the GPU) on a dense weight: the cublas-bf16 peer's linear layer. For a
    QLinear with a SwiGLU epilogue (its rows in gate|up order inside gate_up_order), F.linear, then
    the runtime's activation kernel, as the model runs it after a plain product: cuBLAS has no such
    epilogue."""

    format = "dense"

    def __init__(self, q):
        super().__init__()
        self.w, self.glu = q.weight, q.glu

    def forward(self, x):
        y = F.linear(x, self.w.weight, self.w.bias)
        return activation.silu_mul(y) if self.glu else y


class ScaledMMLinear(torch.nn.Module):
    """torch-op per-token quantization, then _scaled_mm with row-wise scales and fast accumulation
    (common_bench's FP8 peer), on an fp8 weight: the scaled_mm+quant peer's linear layer. For a
    QLinear with a SwiGLU epilogue, as CublasLinear (inside gate_up_order)."""

    format = "fp8"

    def __init__(self, q):
        super().__init__()
        self.w, self.glu = q.weight, q.glu
        self.sb = scaled_mm_weight_scale(self.w)

    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])
        y = scaled_mm(*torch_quant(x2), self.w, self.sb)
        if self.w.bias is not None:
            y = y + self.w.bias
        y = y.reshape(*x.shape[:-1], y.shape[-1])
        return activation.silu_mul(y) if self.glu else y


PEER_LINEARS = {"cublas-bf16": CublasLinear, "scaled_mm+quant": ScaledMMLinear}


class UnquantizedLinear(torch.nn.Module):
    """F.linear on the weight dequantized in x's dtype at each call (UNQUANTIZED_FORMATS): the
    unquantized twin's linear layer, for the check of the first layers only (inside gate_up_order)."""

    def __init__(self, q):
        super().__init__()
        self.w = q.weight   # (no glu: the model applies the activation after it)

    def forward(self, x):
        W = UNQUANTIZED_FORMATS[self.w.format](self.w).to(x.dtype)
        return F.linear(x, W, None if self.w.bias is None else self.w.bias.to(x.dtype))


@contextlib.contextmanager
def linears_as(model, make):
    """Every QLinear of `model` (in Projections too) replaced by make(qlinear) while inside."""
    found = [(parent, name, child) for parent in model.modules()
             for name, child in parent._modules.items() if isinstance(child, QLinear)]
    for parent, name, child in found:
        parent._modules[name] = make(child)
    try:
        yield model
    finally:
        for parent, name, child in found:
            parent._modules[name] = child


@contextlib.contextmanager
def reference_path(model):
    """`model` on the reference path while inside: each linear its format's pure-torch reference,
    the rest the runtime's reference ops (ops.REFERENCE, the exact set)."""
    saved = {"ops": model.ops, "exact": model.exact}
    model.ops, model.exact = ops_mod.REFERENCE, True
    try:
        with linears_as(model, lambda q: QLinear(q.weight, "reference", glu=q.glu)):
            yield model
    finally:
        for a, v in saved.items():
            setattr(model, a, v)


@contextlib.contextmanager
def first_layers(model, n: int):
    """The forward of `model` cut to its first n layers while inside (the vsr routers' per-layer
    lists; transformers' num_hidden_layers)."""
    if isinstance(model, e2e_models.TransformersRouter):
        cfg = model.hf.config
        saved = cfg.num_hidden_layers
        cfg.num_hidden_layers = min(n, saved)
        try:
            yield model
        finally:
            cfg.num_hidden_layers = saved
        return
    saved = {a: getattr(model, a) for a in ("layers", "norms", "types", "params") if hasattr(model, a)}
    if not isinstance(saved.get("layers"), torch.nn.ModuleList):
        raise TypeError(f"{type(model).__name__} holds no ModuleList of layers to cut")
    for a, v in saved.items():
        setattr(model, a, torch.nn.ModuleList(list(v)[:n]) if isinstance(v, torch.nn.ModuleList) else v[:n])
    try:
        yield model
    finally:
        for a, v in saved.items():
            setattr(model, a, v)


# ---- the model, its tiles, inputs -----------------------------------------------------------

class CacheTiles:
    """vsr's tiles as users run them from a cache file (default the shipped one): the file's tile for
    the exact key, else its tile for the key's lineage (a branch's kernel edit stales the keys:
    common_bench.shipped_entry), else the TileResolver's miss policy. Stale and missed keys are
    recorded (the result's "tiles")."""

    def __init__(self, cache, policy: str, device, as_device: str | None = None):
        from vsr.autotune.device_id import current_device_identity
        from vsr.autotune.resolver import TileResolver
        self.cache, self.device = Path(cache), torch.device(device)
        self.resolver = TileResolver(self.cache, policy, self.device)
        self.stale, self.missed = set(), set()
        # as_device: the cache's tiles of another device of this one's vendor, capability and
        # multiprocessors (an H200's on an H100: both sm_90 with 132), where this one has none
        self.identity = None
        if as_device:
            self.identity = dataclasses.replace(current_device_identity(self.device), name=as_device)

    def tile(self, template, problem, **kw) -> dict:
        key = self.resolver.key(template, problem)
        e = shipped_entry(template, problem, self.device, self.cache, self.identity)
        if e is not None:
            # stale: the entry was tuned for other kernels (its key against the key of the device
            # whose tiles are read: as_device's, whose name differs from this one's)
            if e.key != (make_key(template, problem, self.identity) if self.identity else key):
                self.stale.add(key.short())
            return dict(e.tile)
        self.missed.add(key.short())
        return self.resolver.tile(template, problem, **kw)

    def summary(self) -> dict:
        return {"cache": str(self.cache), "as_device": self.identity and self.identity.name, "stale": len(self.stale),
                "missed": sorted(self.missed)}


def build_vsr(config: dict, loader, device, tiles, kernel_set: str):
    """(model, builder, kernel set) of the runtime's router over the loader's weights: on a CUDA
    device the Triton path (tiles from `tiles`), on the CPU the reference path; kernel_set "auto"
    picks as load_engine does (the approximate set for a quantized format on the Triton path)."""
    from vsr.runtime.engine import approximate_allowed
    dev = torch.device(device)
    mode = "triton" if dev.type == "cuda" else "reference"
    fmts = loader.check_linears(linear_names(config, loader)).values()
    allowed = approximate_allowed(mode, fmts, False)
    if kernel_set == "approximate" and not allowed:
        raise ValueError("--kernel-set approximate runs only for a quantized format on the Triton path")
    chosen = "approximate" if allowed and kernel_set != "exact" else "exact"
    b = Builder(loader, lambda w: QLinear(w, mode, tiles=tiles), torch.bfloat16, dev, False,
                kernels=mode, exact=chosen == "exact")
    with torch.no_grad():
        model = build_model(config, b).eval()
    return model, b, chosen


def make_inputs(B: int, S: int, vocab: int, device, seed: int = 1):
    """Random token ids in [1, vocab) (never the pad id 0: transformers pools the last non-pad
    token), no padding."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(1, vocab, (B, S), generator=g).to(device)
    return ids, torch.ones(B, S, dtype=torch.long, device=device), torch.full((B,), S, dtype=torch.int32, device=device)


def linear_totals(builder) -> tuple[int, int]:
    """(bytes of every linear weight, sum of N·K) of the products a forward runs."""
    ws = [m.weight for m in builder.linears.values()]
    return sum(w.nbytes() for w in ws), sum(w.N * w.K for w in ws)


def floor_ms(fmt: str, wbytes: int, macs: int, tokens: int, ceil: dict) -> float:
    """A forward's roofline floor: every linear weight's bytes once at the copy bandwidth, or its
    products' FLOPs at the format's matrix rate (fp8's for fp8, bf16's for the others), the longer."""
    rate = ceil["fp8_TFLOPs"] if fmt == "fp8" else ceil["bf16_TFLOPs"]
    return max(wbytes / (ceil["copy_TBps"] * 1e12), 2 * macs * tokens / (rate * 1e12)) * 1e3


def not_run_reason(fmt: str, device) -> str | None:
    """Why this device cannot run format `fmt` on the Triton path (its template choice refuses), or None."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    from vsr.kernels import registry
    try:
        registry.template_for(make_weight(fmt, 128, 256, dev), torch.bfloat16)
    except (RuntimeError, ValueError) as e:
        return str(e)
    return None


# ---- checks, timing, the device-time split --------------------------------------------------

def outputs(model, inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """(the last tokens' final-normed hidden [B, H] fp32, the probabilities [B, L] fp32)."""
    ids, am, lengths = inputs
    h = model.encode(ids, am)
    last = h[torch.arange(h.shape[0], device=h.device), lengths.long() - 1].float()
    return last, model(ids, am, lengths).float()


@contextlib.contextmanager
def unquantized_path(model):
    """`model` with each linear layer's weight dequantized (UnquantizedLinear) on the reference ops."""
    with reference_path(model), gate_up_order(model), linears_as(model, UnquantizedLinear):
        yield model


def against_unquantized(hidden, probs, unq, ref_dist: dict) -> dict:
    """The check of an approximate-set row against the unquantized model's outputs `unq`: its
    hidden states' distance from them within UNQUANTIZED_MARGIN times the exact reference's
    (ref_dist); the probabilities' distances recorded beside."""
    rh, rp = unq
    out = {"hidden_rel_err": ((hidden - rh).norm() / rh.norm().clamp_min(1e-30)).item(),
           "reference_hidden_rel_err": ref_dist["hidden_rel_err"],
           "prob_err": (probs - rp).abs().max().item(), "reference_prob_err": ref_dist["prob_err"]}
    finite = bool(torch.isfinite(probs).all()) and bool(torch.isfinite(hidden).all())
    out["ok"] = finite and out["hidden_rel_err"] <= UNQUANTIZED_MARGIN * ref_dist["hidden_rel_err"]
    return out


def compare(hidden, probs, ref, fmt: str) -> dict:
    """The check of one provider's outputs against the reference's (CHECK_TOL)."""
    tol_h, tol_p = CHECK_TOL.get(fmt, CHECK_TOL_QUANTIZED)
    rh, rp = ref
    out = {"prob_err": (probs - rp).abs().max().item()}
    if hidden is not None:
        out["hidden_rel_err"] = ((hidden - rh).norm() / rh.norm().clamp_min(1e-30)).item()
    finite = bool(torch.isfinite(probs).all()) and (hidden is None or bool(torch.isfinite(hidden).all()))
    out["ok"] = finite and out["prob_err"] <= tol_p and out.get("hidden_rel_err", 0.0) <= tol_h
    return out


def graphed(model, device):
    from vsr.runtime.engine import GraphedForward
    return GraphedForward(model, torch.device(device), kept=1, capture_at=1)


def warm_then_time(fn, reps: int, warm_s: float) -> float:
    """Median ms of `reps` synchronised calls (the tuner's eager timer), after `warm_s` seconds of
    calls, each waited for (unsynchronised graph replays would queue up far past warm_s)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warm_s:
        fn()
        sync()
    return eager_timer(fn, reps)


def product_kernel_names() -> set[str]:
    """The kernels of the product templates (the @triton.jit and @gluon.jit kernels of kernels/
    gemm, dense, fp8, int4, int4_wgmma, nvfp4 and common, each named *kernel): the launches a
    QLinear makes."""
    from triton.runtime.jit import KernelInterface   # (a JITFunction; under the interpreter, its stand-in)
    from vsr.kernels import common, dense, fp8, gemm, int4, int4_wgmma, nvfp4
    return {n for m in (common, dense, fp8, gemm, int4, int4_wgmma, nvfp4) for n, f in vars(m).items()
            if isinstance(f, KernelInterface) and n.endswith("kernel")}


def split_kernels(kernels: list[tuple[str, float]], products: set[str]) -> dict:
    """{products_ms, rest_ms, kernels: the 8 longest (name, ms, product)} of a forward's device
    kernels [(name, us)]; a kernel is a product's when its name is (or starts with) one of `products`."""
    def is_product(name: str) -> bool:
        return any(name == p or name.startswith(p) for p in products)
    by = {}
    for name, us in kernels:
        by[name] = by.get(name, 0.0) + us
    prod = sum(us for n, us in by.items() if is_product(n))
    top = sorted(by.items(), key=lambda kv: -kv[1])[:8]
    return {"products_ms": prod / 1e3, "rest_ms": (sum(by.values()) - prod) / 1e3,
            "kernels": [{"name": n, "ms": round(us / 1e3, 4), "product": is_product(n)} for n, us in top]}


def device_kernels(fn) -> list[tuple[str, float]]:
    """[(kernel name, us)] of every device kernel (and copy) one call of fn runs (torch.profiler)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [(e.name, e.time_range.elapsed_us()) for e in prof.events() if e.device_type == DeviceType.CUDA]


def device_split(eager_fn, graph_fn) -> dict:
    """split_kernels of a graph replay where the profiler sees its kernels, else of an eager forward;
    products_ms None with the reason off a CUDA device or where the profiler sees no kernel."""
    if not torch.cuda.is_available():
        return {"products_ms": None, "rest_ms": None, "split_error": "no CUDA device"}
    names = product_kernel_names()
    for source, fn in (("graph", graph_fn), ("eager", eager_fn)):
        if fn is None:
            continue
        try:
            ks = device_kernels(fn)
        except Exception as e:   # the split is left out and says why; the times stand
            return {"products_ms": None, "rest_ms": None, "split_error": f"{type(e).__name__}: {e}"}
        if ks:
            return {**split_kernels(ks, names), "split_from": source}
    return {"products_ms": None, "rest_ms": None, "split_error": "the profiler saw no device kernel"}


# ---- one format ---------------------------------------------------------------------------

def providers_for(fmt: str, providers) -> list[str]:
    return [p for p in providers if p in ("vsr", "vsr-pdl", "vsr-act") or PEER_FORMAT.get(p) == fmt]


def provider_rows(name: str, fmt: str, router, inputs, ref_n, a, log, base: dict, split: bool,
                  unq=None) -> list[dict]:
    """The rows of one provider at one configuration: its check (first a.check_layers layers, eager
    and through a CUDA graph), then its eager and graph times (a.modes); a failed capture leaves the
    eager row with graph_error. vsr's rows carry the device-time split. `unq`: (the unquantized
    model's outputs, the exact reference's distance from them) for a row the exact reference's
    tolerance fails (against_unquantized)."""
    dev = inputs[0].device
    with first_layers(router, a.check_layers):
        got = outputs(router, inputs)
        check = compare(*got, ref_n, fmt)
        if unq is not None and not check["ok"]:
            check["vs_unquantized"] = against_unquantized(*got, *unq)
            check["ok"] = check["vs_unquantized"]["ok"]
    full = router(*inputs)
    finite = bool(torch.isfinite(full).all())
    check["ok"] = check["ok"] and finite
    log(f"  {name:16s} check {json.dumps({k: round(v, 5) if isinstance(v, float) else v for k, v in check.items()})}")
    modes = a.modes if dev.type == "cuda" else ["eager"]   # (no CUDA graphs off a CUDA device)
    times, gcheck, graph_error, g = {}, None, None, None
    if "graph" in modes:
        try:
            with first_layers(router, a.check_layers):
                gn = graphed(router, dev)
                gn(*inputs)
                gprobs = gn(*inputs).float()
                gcheck = compare(None, gprobs, ref_n, fmt)
                if "vs_unquantized" in check and not gcheck["ok"]:
                    gcheck["vs_eager_prob_err"] = (gprobs - got[1]).abs().max().item()
                    gcheck["ok"] = check["ok"] and gcheck["vs_eager_prob_err"] <= CHECK_TOL_QUANTIZED[1]
                del gn
            g = graphed(router, dev)
            g(*inputs)   # the capture (after its eager warm run)
            ms = warm_then_time(lambda: g(*inputs), a.reps, a.warm)
            out = g(*inputs)
            gcheck["ok"] = gcheck["ok"] and check["ok"] and bool(torch.isfinite(out).all())
            gcheck["graph_same_bytes"] = torch.equal(out, full)
            times[True] = ms
        except Exception as e:   # recorded on the eager row, which is then timed whatever --modes says
            graph_error = f"{type(e).__name__}: {e}"
            log(f"  {name:16s} graph failed: {graph_error}")
            g = None
    if "eager" in modes or graph_error is not None:
        times[False] = warm_then_time(lambda: router(*inputs), a.reps, a.warm)
    sp = {}
    if split:
        sp = device_split(lambda: router(*inputs), (lambda: g(*inputs)) if g is not None else None)
    rows = []
    for is_graph, ms in times.items():
        c = gcheck if is_graph else check
        row = {**base, "provider": name, "graph": is_graph, "ms": ms, "checked": bool(c["ok"]),
               "check": {k: v for k, v in c.items() if k != "ok"}, **sp}
        if graph_error is not None and not is_graph:
            row["graph_error"] = graph_error
        rows.append(row)
        split_note = "" if sp.get("products_ms") is None else \
            f" products {sp['products_ms']:.3f} rest {sp['rest_ms']:.3f}"
        log(f"  {name:16s} {'graph' if is_graph else 'eager'} {ms:9.3f} ms (floor {row['floor_ms']:.3f})"
            + split_note + ("" if row["checked"] else " UNCHECKED"))
    return rows


def format_rows(fmt: str, a, config: dict, ceil: dict, tiles, log, extra_errors: list) -> Iterator[list[dict]]:
    """Every row of one format, a configuration's at a time: its model built once (transformers'
    twin over its tensors), then each configuration's providers."""
    loader_cls = e2e_models.MODELS[a.model][1]
    dev = torch.device(a.device)
    t0 = time.time()
    loader = loader_cls(config, fmt, dev)
    model, b, kernel_set = build_vsr(config, loader, dev, tiles, a.kernel_set)
    wbytes, macs = linear_totals(b)
    log(f"{fmt}: built in {time.time() - t0:.1f} s, linear weights {wbytes / 1e9:.2f} GB, kernel set {kernel_set}")
    routers = {"vsr": model, "vsr-pdl": model, "vsr-act": model}
    hf_note = {}
    provs = providers_for(fmt, a.providers)
    if "transformers" in provs:
        try:
            with gate_up_order(model):   # (its gate and up weights: views of those rows)
                hf = e2e_models.transformers_twin(a.model, config, b, loader,
                                                  {"model.embed_tokens.weight": model.embed})
            routers["transformers"] = e2e_models.TransformersRouter(hf)
            if a.model == "qwen3_5":
                hf_note = {"fla": importlib.util.find_spec("fla") is not None,
                           "causal_conv1d": importlib.util.find_spec("causal_conv1d") is not None}
        except Exception as e:
            extra_errors.append({"format": fmt, "provider": "transformers", "error": f"{type(e).__name__}: {e}"})
            log(f"  transformers unavailable: {type(e).__name__}: {e}")
    rows = []
    with torch.inference_mode():
        for cname in a.configs:
            B, S = CONFIGS[cname]
            inputs = make_inputs(B, S, config["vocab_size"], dev)
            with reference_path(model), first_layers(model, a.check_layers):
                ref_n = outputs(model, inputs)
            unq = None
            if fmt in UNQUANTIZED_FORMATS and kernel_set == "approximate":
                with unquantized_path(model), first_layers(model, a.check_layers):
                    u = outputs(model, inputs)
                unq = (u, compare(*ref_n, u, fmt))
            base = {"model": a.model, "format": fmt, "config": cname, "requests": B, "tokens": S,
                    "layers": config["num_hidden_layers"], "kernel_set": kernel_set,
                    "floor_ms": floor_ms(fmt, wbytes, macs, B * S, ceil), "check_layers": a.check_layers}
            log(f"{fmt} {cname}:")
            for p in provs:
                if p not in routers and p not in PEER_LINEARS:   # (transformers' twin failed: logged)
                    continue
                try:
                    if p in PEER_LINEARS:
                        with gate_up_order(model), linears_as(model, lambda q, p=p: PEER_LINEARS[p](q)):
                            rows += provider_rows(p, fmt, model, inputs, ref_n, a, log, base, False, unq)
                    elif p == "transformers":
                        with gate_up_order(model):
                            rows += provider_rows(p, fmt, routers[p], inputs, ref_n, a, log,
                                                  {**base, **hf_note, "kernel_set": None}, False)
                    elif p == "vsr-pdl":
                        with pdl.programmatic_forward():
                            rows += provider_rows(p, fmt, model, inputs, ref_n, a, log, base, True, unq)
                    elif p == "vsr-act":
                        with swiglu_by_activation_kernel(model):
                            rows += provider_rows(p, fmt, model, inputs, ref_n, a, log, base, True, unq)
                    else:
                        rows += provider_rows(p, fmt, model, inputs, ref_n, a, log, base, True, unq)
                except Exception as e:   # this provider is left out and said so; the others run
                    extra_errors.append({"format": fmt, "config": cname, "provider": p,
                                         "error": f"{type(e).__name__}: {e}"})
                    log(f"  {p} failed: {type(e).__name__}: {e}")
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
            yield rows
            rows = []


# ---- results ------------------------------------------------------------------------------

def measure_ceilings(device) -> dict:
    """bench_gemm's ceilings on a CUDA device; on the CPU (the orchestration test) a copy and an
    fp32 product timed by the tuner's eager timer, one matrix rate for every format."""
    if torch.device(device).type == "cuda":
        from bench_gemm import ceilings
        return ceilings()
    a = torch.empty(1 << 24, dtype=torch.uint8).random_()
    b = torch.empty_like(a)
    copy = 2 * a.numel() / (eager_timer(lambda: b.copy_(a), 5) * 1e-3) / 1e12
    x = torch.randn(256, 256)
    rate = 2 * 256 ** 3 / (eager_timer(lambda: x @ x, 5) * 1e-3) / 1e12
    return {"copy_TBps": round(copy, 4), "bf16_TFLOPs": round(rate, 4), "fp8_TFLOPs": round(rate, 4),
            "note": "cpu: one fp32 product's rate for every format"}


def device_name(device) -> str:
    return torch.cuda.get_device_name() if torch.device(device).type == "cuda" else "cpu"


def versions() -> dict:
    out = {"torch": torch.__version__}
    for m in ("triton", "transformers"):
        try:
            out[m] = __import__(m).__version__
        except ImportError:
            out[m] = None
    return out


def write(out: Path, head: dict, rows: list, partial: bool, t_start: float) -> None:
    from vsr.autotune.store import write_atomic
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, json.dumps({**head, "wall_s": round(time.time() - t_start, 1), "partial": partial,
                                  "rows": rows}, indent=1, default=str))


# ---- main ---------------------------------------------------------------------------------

def _list(ap, spec: str, known, what: str) -> list[str]:
    items = [s for s in spec.split(",") if s]
    bad = [s for s in items if s not in known]
    if bad:
        ap.error(f"--{what}: unknown {', '.join(bad)} (known: {', '.join(known)})")
    return items


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=tuple(e2e_models.MODELS), default="qwen3")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--configs", default=None, help="default: 1x128,16x128,1x1024 (qwen3), 1x128,1x1024 (qwen3_5)")
    ap.add_argument("--providers", default=",".join(DEFAULT_PROVIDERS))
    ap.add_argument("--modes", default=None, help="graph,eager (default: both for qwen3, graph for qwen3_5)")
    ap.add_argument("--layers", type=int, default=64, help="decoder layers (fewer for a quick check)")
    ap.add_argument("--config", type=Path, default=None, help="a config.json to run instead of the 27B-class one")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warm", type=float, default=1.0, help="seconds of a provider's calls before its timing")
    ap.add_argument("--check-layers", type=int, default=CHECK_LAYERS)
    ap.add_argument("--kernel-set", choices=("auto", "exact", "approximate"), default="auto")
    ap.add_argument("--cache", type=Path, default=SHIPPED_CACHE, help="the autotune cache of vsr's tiles")
    ap.add_argument("--miss-policy", choices=("default", "error", "tune"), default="default")
    ap.add_argument("--cache-as-device", default=None, metavar="NAME",
                    help="run the cache's tiles of the device NAME (e.g. 'NVIDIA H200' on an H100: the same "
                         "capability and multiprocessors), recorded in the result's tiles")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--merge", type=Path, nargs="+", default=None,
                    help="read these e2e results (one commit) together: the table and the targets")
    a = ap.parse_args(argv)
    a.formats = _list(ap, a.formats, FORMATS, "formats")
    a.providers = _list(ap, a.providers, PROVIDERS, "providers")
    a.configs = _list(ap, a.configs or ("1x128,16x128,1x1024" if a.model == "qwen3" else "1x128,1x1024"),
                      tuple(CONFIGS), "configs")
    a.modes = _list(ap, a.modes or ("graph,eager" if a.model == "qwen3" else "graph"), ("graph", "eager"), "modes")
    if a.layers < 1 or a.reps < 1 or a.check_layers < 1:
        ap.error("--layers, --reps and --check-layers must be at least 1")
    return a


def main(argv=None) -> int:
    a = parse(argv)
    if a.merge:
        try:
            result = merge([json.loads(p.read_text()) for p in a.merge])
        except ValueError as e:
            print(f"--merge: {e}", file=sys.stderr)
            return 2
        if a.out:
            a.out.write_text(json.dumps(result, indent=1, default=str))
        print(table(result["rows"]))
        print(not_run_lines(result))
        print(report(evaluate(result)))
        return 0
    t_start = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - t_start:6.1f}s] {msg}", flush=True)
    config = json.loads(a.config.read_text()) if a.config else e2e_models.MODELS[a.model][0](a.layers)
    dev = torch.device(a.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False   # the reference path's fp32 products in IEEE fp32
    ceil = measure_ceilings(dev)
    log(f"ceilings {ceil}")
    tiles = CacheTiles(a.cache, a.miss_policy, dev, a.cache_as_device) if dev.type == "cuda" else None
    head = {"benchmark": "e2e", "device": device_name(dev), **versions(), "commit": code_commit(),
            "model": a.model, "layers": config["num_hidden_layers"], "hidden": config["hidden_size"],
            "formats": a.formats, "configs": a.configs, "providers": a.providers, "modes": a.modes,
            "reps": a.reps, "warm_s": a.warm, "check_layers": a.check_layers, "check_tol": CHECK_TOL,
            "check_tol_quantized": CHECK_TOL_QUANTIZED, "kernel_set": a.kernel_set, "ceilings": ceil,
            "not_run": [], "errors": []}
    out = a.out or result_path("e2e", head["device"])
    rows = []
    for fmt in a.formats:
        why = not_run_reason(fmt, dev)
        if why is not None:
            head["not_run"].append({"format": fmt, "why": why})
            log(f"{fmt}: not run: {why}")
            continue
        try:
            for part in format_rows(fmt, a, config, ceil, tiles, log, head["errors"]):
                rows += part
                head["tiles"] = tiles.summary() if tiles else None
                write(out, head, rows, True, t_start)
        except Exception as e:   # a format that cannot be built is reported; the next one runs
            head["errors"].append({"format": fmt, "error": f"{type(e).__name__}: {e}"})
            log(f"{fmt} failed: {type(e).__name__}: {e}")
        gc.collect()   # the format's weights (the generator's frame, a traceback's) before the next format's
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        write(out, head, rows, True, t_start)
    head["tiles"] = tiles.summary() if tiles else None
    write(out, head, rows, False, t_start)
    log(f"wrote {out} ({len(rows)} rows)")
    print(table(rows))
    print(not_run_lines(head))
    print(report(evaluate({"rows": rows})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
