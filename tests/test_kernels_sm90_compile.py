"""The forward's non-GEMM kernels compiled for the H200 (sm_90) on the CPU, through Triton's own
compiler and argument binder (benchmarks/sm90_fit.py's Recorder), in a process without the
interpreter: the exact RoPE contracts no rounded product into a bf16 FMA, and the gated delta
rule's kernels fit the H200's shared memory at Qwen3.5's head size (K = V = 128) and, for 16-bit
inputs, run their products on the tensor cores (wgmma) within their registers: cuobjdump's stack
size of the compiled kernel under 1 KB a thread (the scan's default spills 288 bytes); fp32 products, as
common.f32_precision gives them on an NVIDIA GPU (tf32x3), issue TF32 MMAs; the int4 frag tiles'
weight operand never passes through shared memory."""
from __future__ import annotations

import atexit
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"

# Each probe runs in a process of its own (no interpreter), argv[1] the benchmarks directory.
_PRELUDE = r"""
import json, os, re, sys
import torch, triton
sys.path.insert(0, sys.argv[1])
from sm90_fit import DEVICES, H200, Recorder, resource_usage
from triton.runtime.jit import JITFunction

compile_ = triton.compile
"""

_PROBE = _PRELUDE + r"""
rec, ptx, delta = Recorder(DEVICES["h200"]), {}, []
def compile_and_keep(src, *a, **k):
    kernel = compile_(src, *a, **k)
    name = src.fn.__name__
    ptx.setdefault(name, []).append(kernel.asm["ptx"])
    if name in ("_ut_kernel", "_scan_kernel"):
        delta.append({"kernel": name, "dtype": DTYPE, "stack": resource_usage(kernel.asm["cubin"])[1],
                      "wgmma": len(re.findall(r"wgmma\.mma_async", kernel.asm["ptx"]))})
    return kernel
triton.compile = compile_and_keep
JITFunction.__getitem__ = lambda fn, grid: (lambda *a, **k: rec.launch(fn, a, k))

from vsr.kernels import delta_rule, rope
T, D = 4, 128
q, k, w = torch.randn(T, 8 * D).bfloat16(), torch.randn(T, 2 * D).bfloat16(), torch.randn(D).bfloat16()
cos, sin = torch.randn(T, D), torch.randn(T, D)
rope.qk_norm_rope(q, k, w, w, cos, sin, 1e-6, exact=True)
rope.rope(q, k, cos, sin, D, exact=True)
for dt in (torch.bfloat16, torch.float32):
    DTYPE = str(dt)
    qq, kk = torch.randn(1, 70, 2, 128).to(dt), torch.randn(1, 70, 2, 128).to(dt)
    v, g, beta = torch.randn(1, 70, 6, 128).to(dt), -torch.rand(1, 70, 6), torch.rand(1, 70, 6).to(dt)
    delta_rule.chunk_gated_delta_rule(qq, kk, v, g, beta)

# fp32 products as on the H200 (common.f32_precision asks the device's features): the built-in
# router's shapes, each row bucket's default tile of the dense and int4 templates.
from vsr.kernels import common, dense, gemm, int4
from vsr.autotune.synth import random_weight
common.device_features = lambda device: H200.features
gemm.multiprocessors = lambda device: H200.multiprocessors
f32 = []
for fmt, N, K in (("dense", 1536, 384), ("dense", 384, 1536), ("int4", 1152, 384)):
    params = {} if fmt == "dense" else {"bits": 4, "group": 128, "symmetric": True, "act_order": False}
    w = random_weight(fmt, N, K, params, torch.float32, "cpu", bias=True)
    mod = dense if fmt == "dense" else int4
    for M in (16, 64, 256, 1024):
        x = torch.randn(M, K)
        counts = {n: len(v) for n, v in ptx.items()}
        mod.launch(x, w, mod.default_tile(mod.problem(w, M, torch.float32)))
        for name, texts in ptx.items():
            for text in texts[counts.get(name, 0):]:
                f32.append({"format": fmt, "N": N, "K": K, "M": M, "kernel": name,
                            "tf32_mma": len(re.findall(r"mma[.a-z_]*\.sync\.aligned[^;]*\.tf32", text)),
                            "fma_f32": len(re.findall(r"fma\.rn\.f32", text))})
from vsr.kernels import attention
for D in attention.HEAD_DIMS:
    for S in (70, 512):
        q, kv = torch.randn(2, S, 4, D), torch.randn(2, S, 2, D)
        attention.attention(q, kv, kv, torch.tensor([S, 9], dtype=torch.int32), causal=True, gate=torch.randn(2, S, 4, D))
# Within pdl.programmatic_forward (H200 features: PDL), every forward kernel and the dense product
# compile with their waits and the forward kernels with their early release.
from vsr.kernels import activation, conv1d, head, norm, pdl
start = {n: len(v) for n, v in ptx.items()}
with pdl.programmatic_forward():
    x, wn = torch.randn(T, 256).bfloat16(), torch.randn(256).bfloat16()
    norm.rms_norm(x, wn, 1e-6, residual=x)
    wh = torch.randn(D).bfloat16()
    norm.gated_rms_norm(torch.randn(T, 4 * D).bfloat16(), torch.randn(T, 4 * D).bfloat16(), wh, 1e-6)
    rope.qk_norm_rope(torch.randn(T, 8 * D).bfloat16(), torch.randn(T, 2 * D).bfloat16(), wh, wh,
                      torch.randn(T, D), torch.randn(T, D), 1e-6, exact=True)
    activation.silu_mul(torch.randn(T, 512).bfloat16())
    qa, kva = torch.randn(1, 70, 4, D).bfloat16(), torch.randn(1, 70, 2, D).bfloat16()
    attention.attention(qa, kva, kva, torch.tensor([70], dtype=torch.int32), causal=True)
    head.last_token_score(x, torch.tensor([T], dtype=torch.int32), torch.randn(3, 256).bfloat16())
    conv1d.causal_conv1d_silu(torch.randn(1, 70, 256).bfloat16(), torch.randn(256, 4).bfloat16())
    qq, kk = torch.randn(1, 70, 2, 128).bfloat16(), torch.randn(1, 70, 2, 128).bfloat16()
    delta_rule.chunk_gated_delta_rule(qq, kk, torch.randn(1, 70, 6, 128).bfloat16(), -torch.rand(1, 70, 6),
                                      torch.rand(1, 70, 6).bfloat16())
    delta_rule.deltanet_gates(torch.randn(T, 12).bfloat16(), -torch.rand(6), torch.rand(6))
    wd = random_weight("dense", 1536, 384, {}, torch.bfloat16, "cpu", bias=True)
    dense.launch(torch.randn(128, 384).bfloat16(), wd, dense.default_tile(dense.problem(wd, 128, torch.bfloat16)))
pdl_ptx = {n: [("griddepcontrol.wait" in t, "griddepcontrol.launch_dependents" in t) for t in v[start.get(n, 0):]]
           for n, v in ptx.items() if v[start.get(n, 0):]}
print(json.dumps({"rows": list(rec.compiled.values()), "limit": rec.device.shared, "delta": delta, "f32": f32,
                  "pdl": pdl_ptx,
                  "rope_bf16_fma": sum(len(re.findall(r"fma\.rn\.bf16", p)) for p in ptx["_rope_kernel"])}))
"""


def _compile_env() -> dict:
    """This process's environment without the interpreter: the kernels must compile."""
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def _triton() -> tuple[int, int]:
    return tuple(int(p) for p in __import__("triton").__version__.split(".")[:2])


def _ptxas() -> str:
    """Triton's pre-Hopper ptxas (Triton >= 3.9 ships one of its own for sm_90 and newer)."""
    from triton import knobs
    return knobs.nvidia.ptxas.path


PROBE_THREADS = 2


def _probes() -> dict:
    """Each compiling process of this module by name: (argv given its output directory, timeout s).
    A test reads one through the fixture of its name (compiled, frag_compiled) or names it in a
    `probe` mark; _probes_of derives from those which probes the selected tests need."""
    fit = [sys.executable, str(BENCH / "sm90_fit.py")]
    return {"wgmma": (lambda d: [sys.executable, "-c", _WGMMA_PROBE, str(BENCH)], 600),   # the longest first
            "compiled": (lambda d: [sys.executable, "-c", _PROBE, str(BENCH)], 300),
            "frag_compiled": (lambda d: [sys.executable, "-c", _FRAG_PROBE, str(BENCH)], 600),
            "older_ptxas": (lambda d: [sys.executable, str(BENCH / "rs_wgmma_hazards.py"), "--ptxas", _ptxas(),
                                       "--buckets", "128", "--out", str(d / "hazards.json")], 600),
            "glu": (lambda d: [sys.executable, "-c", _GLU_PROBE, str(BENCH)], 600),
            "glu_fit": (lambda d: fit + ["--formats", "bf16,fp8", "--shapes", "gate_up", "--buckets", "128,1024,2048",
                                         "--tiles", "shipped", "--glu", "--out", str(d / "fit.json")], 600),
            "int4_glu_fit": (lambda d: fit + ["--formats", "int4-gptq", "--shapes", "gate_up", "--buckets", "128,1024",
                                              "--tiles", "shipped", "--out", str(d / "fit.json")], 600),
            "fit_report": (lambda d: fit + ["--formats", "bf16", "--shapes", "gate_up", "--buckets", "1", "--glu",
                                            "--out", str(d / "fit.json")], 300)}


def _probes_of(item) -> set[str]:
    """The probes a collected test reads: its `probe` marks and the probe fixtures it requests;
    none for a test its skipif marks skip (their conditions are evaluated by now)."""
    if any(m.args and m.args[0] is True for m in item.iter_markers("skipif")):
        return set()
    return {m.args[0] for m in item.iter_markers("probe")} | (set(item.fixturenames) & set(_probes()))


class _Background:
    """The probes of the selected tests, run from the end of collection (tests/conftest.py calls
    start) by two threads that take them in _probes() order, so that they compile while the
    modules before this one run; a test waits for its own probe only. Two threads, because in
    series the probes (about 530 s on a 2-core machine) outlast the modules before this one, and
    its tests would wait on the last of them with a core idle. Their command lines and
    environment are taken at start, before any test can patch what they read. A probe no thread
    started runs when its test asks for it."""

    def __init__(self):
        self.done: dict[str, threading.Event] = {}
        self.results: dict[str, tuple] = {}
        self.dirs: list[tempfile.TemporaryDirectory] = []
        self.running: set[subprocess.Popen] = set()
        self.env: dict | None = None   # the environment at start: tests that run meanwhile may patch theirs
        atexit.register(self.stop)

    def _plan(self, name: str) -> tuple[list[str], int, Path]:
        """Probe `name`'s command line, timeout and output directory, made now."""
        argv, timeout = _probes()[name]
        d = tempfile.TemporaryDirectory()
        self.dirs.append(d)
        return argv(Path(d.name)), timeout, Path(d.name)

    def _run(self, name: str, plan: tuple[list[str], int, Path]) -> None:
        argv, timeout, d = plan
        try:
            self.results[name] = (self._call(argv, timeout), d)
        except Exception as e:   # a probe past its timeout fails its tests, not the thread
            self.results[name] = (e, d)
        self.done[name].set()

    def _call(self, argv: list[str], timeout: int) -> subprocess.CompletedProcess:
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=self.env or _compile_env()) as proc:
            self.running.add(proc)
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise
            finally:
                self.running.discard(proc)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def stop(self) -> None:
        """At exit: no probe outlives the test run."""
        for proc in list(self.running):
            proc.kill()

    def start(self, wanted: set[str]) -> None:
        names = [n for n in _probes() if n in wanted and n not in self.done]
        self.env = _compile_env()
        plans = {n: self._plan(n) for n in names}
        for n in names:
            self.done[n] = threading.Event()
        todo = queue.SimpleQueue()
        for n in names:
            todo.put(n)

        def work() -> None:
            while True:
                try:
                    n = todo.get_nowait()
                except queue.Empty:
                    return
                self._run(n, plans[n])

        # Daemon threads, not a ThreadPoolExecutor: its workers are joined at exit, so a run that
        # stops early would wait for every queued probe.
        for _ in range(min(PROBE_THREADS, len(names))):
            threading.Thread(target=work, daemon=True).start()

    def result(self, name: str) -> tuple[subprocess.CompletedProcess, Path]:
        if name not in self.done:
            self.done[name] = threading.Event()
            self._run(name, self._plan(name))
        self.done[name].wait()
        p, d = self.results[name]
        if isinstance(p, Exception):
            raise p
        return p, d


_BACKGROUND = _Background()


def start_background_probes(items: list) -> None:
    """Called by tests/conftest.py with this module's selected tests."""
    _BACKGROUND.start(set().union(*map(_probes_of, items)))


def _json(name: str) -> dict:
    """The JSON probe `name` prints last."""
    p, _ = _BACKGROUND.result(name)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _out(name: str, file: str) -> dict:
    """The JSON file probe `name` writes."""
    p, d = _BACKGROUND.result(name)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-3000:])
    return json.loads((d / file).read_text())


@pytest.fixture(scope="module")
def compiled():
    return _json("compiled")


def test_exact_rope_keeps_every_rounding(compiled):
    assert any(r["kernel"] == "_rope_kernel" for r in compiled["rows"])
    assert compiled["rope_bf16_fma"] == 0


def test_delta_rule_fits_the_h200(compiled):
    rows = [r for r in compiled["rows"] if r["kernel"] in ("_ut_kernel", "_scan_kernel")]
    assert {r["kernel"] for r in rows} == {"_ut_kernel", "_scan_kernel"} and len(rows) >= 2
    for r in rows:
        assert r["fits"] and r["shared"] <= compiled["limit"], r


def test_delta_rule_runs_on_tensor_cores_within_its_registers(compiled):
    rows = [r for r in compiled["delta"] if r["dtype"] == "torch.bfloat16"]
    assert {r["kernel"] for r in rows} == {"_ut_kernel", "_scan_kernel"}
    for r in rows:
        assert r["wgmma"] > 0 and r["stack"] < 1024, r


def test_fp32_products_run_on_the_tensor_cores(compiled):
    # tf32x3 (common.f32_precision on an NVIDIA GPU): every product kernel of an fp32 call at 16 rows
    # and more issues TF32 MMAs; IEEE products would be FMA loops with none. (int4 from 256 rows
    # multiplies a transient dense copy with the dense kernels, compiled once for both.)
    rows = [r for r in compiled["f32"] if "reduce" not in r["kernel"] and "dequant" not in r["kernel"]]
    assert {(r["format"], r["M"]) for r in rows} >= {("dense", 16), ("dense", 64), ("dense", 256), ("dense", 1024),
                                                     ("int4", 16), ("int4", 64)}
    for r in rows:
        assert r["tf32_mma"] > 0, r


def test_fp32_attention_fits_the_h200_at_every_head_dim(compiled):
    # tf32x3 stages the operands' TF32 parts in shared memory: attention._config's fp32 tiles fit.
    rows = [r for r in compiled["rows"] if r["kernel"] == "_attention_kernel" and r["constexprs"].get("F32") == "'tf32x3'"]
    assert {r["constexprs"]["D"] for r in rows} == {"32", "64", "128", "256"}
    for r in rows:
        assert r["fits"] and r["shared"] <= compiled["limit"], r


def test_programmatic_forward_compiles_waits_and_releases(compiled):
    # kernels.pdl: each forward kernel waits for the kernel before it and releases the one after; the
    # dense product (launched as a dependent) waits. Nothing else changes in them (tests/gpu checks
    # the bytes).
    got = compiled["pdl"]
    forward = {"_norm_kernel", "_gated_norm_kernel", "_rope_kernel", "_activation_kernel", "_attention_kernel",
               "_score_kernel", "_conv_kernel", "_ut_kernel", "_scan_kernel", "_gates_kernel"}
    assert forward <= set(got), sorted(forward - set(got))
    for name in forward:
        assert got[name] and all(w and r for w, r in got[name]), (name, got[name])
    products = [v for n, vs in got.items() if n not in forward for v in vs]
    assert products and all(w for w, _ in products), got


_FRAG_PROBE = _PRELUDE + r"""
from vsr.kernels import common, gemm, int4, wgmma_hazard
from vsr.autotune.synth import random_weight

rec, rows, kernels = Recorder(H200), [], {}
def loop_body(ptx):
    lines = ptx.splitlines()
    head = next(i for i, l in enumerate(lines) if "Loop Header" in l)
    label = lines[head].split(":")[0].strip()
    tail = max(i for i, l in enumerate(lines) if i > head and "bra" in l and label in l)
    return "\n".join(lines[head:tail + 1])
found = {}
def compile_and_keep(src, *a, **k):
    kernel = compile_(src, *a, **k)
    name = src.fn.__name__
    if name in ("_int4_frag_kernel", "_int4_join_kernel"):
        body = loop_body(kernel.asm["ptx"])
        rs, hazards = wgmma_hazard.check_cubin(kernel.asm["cubin"])
        found[name] = {"stack": resource_usage(kernel.asm["cubin"])[1], "shared": int(kernel.metadata.shared),
                       "st_shared": body.count("st.shared"), "ldmatrix": body.count("ldmatrix"),
                       "wgmma": body.count("wgmma.mma_async"), "pairs": body.count("mul.rn.bf16x2"),
                       "rs_wgmma": rs, "hazards": hazards}
    return kernel
triton.compile = compile_and_keep
JITFunction.__getitem__ = lambda fn, grid: (lambda *a, **k: rec.launch(fn, a, k))
common.device_features = lambda device: H200.features
gemm.multiprocessors = lambda device: H200.multiprocessors
t = int4.TEMPLATE
for FMT, sym in (("gptq", True), ("awq", False)):
    w = random_weight("int4", 34816, 5120, {"bits": 4, "group": 128, "symmetric": sym, "act_order": False},
                      torch.bfloat16, "cpu")
    for bucket in (16, 32, 64, 128, 256, 1024):
        x = torch.randn(bucket, 5120).bfloat16()
        for tile in [c for c in t.search_space(t.problem(w, bucket, x.dtype))
                     if c["path"] == "frag" or c["path"] == "join" and c.get("SCALE_W")]:
            name = "_int4_frag_kernel" if tile["path"] == "frag" else "_int4_join_kernel"
            t.launch(x, w, tile)
            key = next(k for k in reversed(rec.current) if name in k)
            if key not in kernels:   # (launches that specialise alike compile once)
                kernels[key] = found.pop(name)
            rows.append(dict(kernels[key], tile=tile, fmt=FMT, bucket=bucket))
# Without the wait (where Triton needs it): the same frag tile's SASS has the writes the check finds.
unwaited, waits = None, int4.mma_wait(H200.features)
if waits:
    int4.mma_wait = lambda dev: False
    x = torch.randn(128, 5120).bfloat16()
    t.launch(x, w, dict(next(c for c in t.search_space(t.problem(w, 128, x.dtype)) if c["path"] == "frag")))
    unwaited = len(found.pop("_int4_frag_kernel")["hazards"])
print(json.dumps({"rows": rows, "limit": rec.device.shared, "mma_wait": waits, "unwaited_hazards": unwaited}))
"""


@pytest.fixture(scope="module")
def frag_compiled():
    return _json("frag_compiled")


def test_int4_frag_operand_never_passes_through_shared_memory(frag_compiled):
    # Every frag tile of the search space at buckets 16-1024, on the 27B-class gate_up (bf16 x, GPTQ
    # and AWQ): the loop's MMAs take the weight operand from the registers it was unpacked in, so the
    # loop body holds no shared-memory store and no ldmatrix (the join path holds 8 of each a
    # thread a step), uses the PTX pairs with the packed scale multiply, keeps no stack and fits
    # the H200's shared memory. Tiles with a tail (TAIL_TILES) are held to it by their second
    # launch's kernel, the split one.
    rows = [r for r in frag_compiled["rows"] if r["tile"]["path"] == "frag"]
    assert {(r["fmt"], r["bucket"]) for r in rows} == {(f, b) for f in ("gptq", "awq") for b in (16, 32, 64, 128, 256, 1024)}
    assert len([r for r in rows if "TAIL_TILES" not in r["tile"]]) == 2 * (2 + 2 + 3 + 3 + 3 + 2)
    assert {r["bucket"] for r in rows if "TAIL_TILES" in r["tile"]} == {16, 32, 64, 128, 256}
    for r in rows:
        assert r["st_shared"] == 0 and r["ldmatrix"] == 0 and r["wgmma"] > 0, r
        assert r["pairs"] > 0 and r["stack"] == 0 and r["shared"] <= frag_compiled["limit"], (r["tile"], r)


def test_int4_register_operand_wgmmas_are_never_overwritten_in_flight(frag_compiled):
    # The frag and SCALE_W join tiles of the space give their weight operand to wgmma in registers.
    # In none of their compiled kernels does an instruction write a register that a wgmma still in
    # flight reads (kernels/wgmma_hazard.py, over the SASS): because the kernels retire each step's
    # wgmmas (int4.mma_wait), or, on Triton >= 3.9 assembling with ptxas >= 13.4, by the SASS itself.
    rows = frag_compiled["rows"]
    from vsr.kernels import int4
    assert frag_compiled["mma_wait"] == (int4._TRITON < (3, 9) or (int4.ptxas_release(90) or (0, 0)) < (13, 4))
    if frag_compiled["mma_wait"]:   # the check is not vacuous: without the wait it finds them
        assert frag_compiled["unwaited_hazards"], frag_compiled["unwaited_hazards"]
    assert any(r["tile"]["path"] == "join" for r in rows)
    for r in rows:
        assert r["rs_wgmma"] > 0, r["tile"]
        assert r["hazards"] == [], (r["tile"], r["hazards"][:3])


@pytest.mark.skipif(_triton() < (3, 9),
                    reason="before Triton 3.9 the kernels wait whatever the ptxas (the test above)")
@pytest.mark.probe("older_ptxas")
def test_int4_kernels_wait_under_an_older_ptxas():
    """Triton 3.9's SASS of the frag and SCALE_W join kernels keeps a pending wgmma's operand
    intact only as its own ptxas (13.4) assembles it: pointed at an older one (its pre-Hopper
    ptxas, CUDA 12.9, as a system toolkit would be), the launcher turns the wait on and no kernel
    writes such a register; without the wait they do (benchmarks/rs_wgmma_hazards.py, bucket 128)."""
    (got,) = _out("older_ptxas", "hazards.json")["rows"]
    if got["ptxas"] is None or tuple(got["ptxas"]) >= (13, 4):
        pytest.skip(f"this Triton's pre-Hopper ptxas is {got['ptxas']}, not an older one")
    assert got["mma_wait"] is True
    assert got["launcher"]["kernels"] >= 4 and got["launcher"]["with_writes"] == 0, got
    assert got["unwaited"]["kernels"] == got["launcher"]["kernels"] and got["unwaited"]["with_writes"] > 0, got


_GLU_PROBE = _PRELUDE + r"""
# Every path of the dense, fp8 and int4 templates with the SwiGLU epilogue (GLU), bf16, compiled
# for the H200: the kernels, their split-K and stream-K reductions and the GEMVs.
from vsr.kernels import common, dense, fp8, gemm, int4
from vsr.autotune.synth import random_weight

rec = Recorder(H200)
JITFunction.__getitem__ = lambda fn, grid: (lambda *a, **k: rec.launch(fn, a, k))
common.device_features = lambda device: H200.features
gemm.multiprocessors = lambda device: 5    # stream-K: tiles left over for the reduction
T = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "SPLIT_K": 1, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}
GEMV = dict(T, path="gemv", BLOCK_M=1, BLOCK_N=8)
DENSE = [dict(T, path="tma"), dict(T, path="tma", BLOCK_N2=16), dict(T, path="tma", PERSISTENT=1),
         dict(T, path="tma-sk"), dict(T, path="tma-sk", FIXUP=1), dict(T, path="tma-swap", BLOCK_M=16, SPLIT_K=2),
         dict(T, path="tiled"), dict(T, path="splitk", SPLIT_K=2), dict(T, path="splitk", SPLIT_K=2, FIXUP=1), GEMV]
INT4 = [dict(T, path="frag", BLOCK_K=128), dict(T, path="join", BLOCK_K=128, SCALE_W=1),
        dict(T, path="join", BLOCK_K=128, SPLIT_K=2), dict(T, path="slices", BLOCK_M=16, BLOCK_K=128),
        dict(T, path="swap", BLOCK_M=16), dict(T, path="splitk", BLOCK_M=16, SPLIT_K=2),
        dict(T, path="dequant-tma"), dict(GEMV, SPLIT_K=2)]
launches = []
wd = random_weight("dense", 1024, 512, {}, torch.bfloat16, "cpu", bias=True)
w4 = random_weight("int4", 1024, 512, {"bits": 4, "group": 128, "symmetric": False, "act_order": False},
                   torch.bfloat16, "cpu", bias=True)
w8 = random_weight("fp8", 1024, 512, {}, torch.bfloat16, "cpu", bias=True)
FP8 = [dict(t, BLOCK_K=128) for t in DENSE]
for mod, w, tiles in ((dense, wd, DENSE), (int4, w4, INT4), (fp8, w8, FP8)):
    for tile in tiles:
        rec.current = []
        mod.launch(torch.randn(1 if tile["path"] == "gemv" else 200, 512).bfloat16(), w, tile, glu=True)
        launches.append({"tile": tile, "kernels": [rec.compiled[k] for k in rec.current]})
print(json.dumps({"launches": launches, "limit": rec.device.shared}))
"""


@pytest.mark.probe("glu")
def test_swiglu_products_compile_for_the_h200():
    """Every path with the SwiGLU epilogue compiles for sm_90 and fits its shared memory (the
    interpreter reads globals a compiled kernel may not: this is where such an error shows)."""
    got = _json("glu")
    assert len(got["launches"]) == 28
    for launch in got["launches"]:
        assert launch["kernels"], launch["tile"]
        for k in launch["kernels"]:
            assert "error" not in k and k["fits"], (launch["tile"], k)
        glu = [k for k in launch["kernels"] if k["constexprs"].get("GLU") == "True"]
        assert glu, (launch["tile"], [k["kernel"] for k in launch["kernels"]])


@pytest.mark.probe("glu_fit")
def test_swiglu_gate_up_products_keep_their_wgmma_pipelined():
    # The 27B gate|up on the shipped tiles with the SwiGLU epilogue (the runtime's dense and FP8
    # forms: one tile a program at 128 rows, stream-K at 1,024, FP8 persistent at 2,048): ptxas
    # serializes none of their wgmma instructions. With two accumulators in a walk of tiles
    # flattened into the K loop it did (C7515), and the product took 1.4x as long on an H100.
    rows = _out("glu_fit", "fit.json")["rows"]
    assert len(rows) == 6 and all(r["glu"] for r in rows)
    tma = [k for r in rows for k in r["kernels"] if k["kernel"] in ("tma_gemm_kernel", "tma_streamk_kernel")]
    assert len(tma) == 6
    for r in rows:
        for k in r["kernels"]:
            assert k["wgmma_serialized"] is None, (r["format"], r["bucket"], k)


@pytest.mark.probe("int4_glu_fit")
def test_sm90_fit_gives_int4_gate_up_swiglu_where_the_runtime_does():
    # int4's gate|up takes SwiGLU in the product on its large-M tiles only (int4.glu_in_epilogue:
    # the transient copy's TMA product), as the runtime runs it: the shipped frag tile with a tail
    # at 128 rows launches plain (its two launches), the dequantized copy's at 1,024 with SwiGLU;
    # both fit.
    rows = {r["bucket"]: r for r in _out("int4_glu_fit", "fit.json")["rows"]}
    assert rows[128]["tile"]["path"] == "frag" and rows[128]["tile"].get("TAIL_TILES")
    assert rows[128]["glu"] is False and rows[1024]["glu"] is True
    assert all(r["error"] is None and r["kernels"] for r in rows.values()), rows


@pytest.mark.probe("fit_report")
def test_sm90_fit_reports_registers_and_stack_and_launches_the_swiglu_epilogue_on_request():
    # --glu: gate_up launches with the SwiGLU epilogue whatever the runtime does; every compiled
    # kernel carries the registers and stack bytes cuobjdump reads off its cubin.
    result = _out("fit_report", "fit.json")
    assert result["glu"] is True
    (row,) = result["rows"]
    assert row["glu"] is True and row["kernels"]
    for k in row["kernels"]:
        assert isinstance(k["registers"], int) and 0 < k["registers"] <= 255
        assert isinstance(k["stack"], int) and k["stack"] >= 0


_WGMMA_PROBE = _PRELUDE + r"""
from vsr.kernels import common, int4, wgmma_hazard
from vsr.autotune.synth import random_weight

rec, rows, found = Recorder(H200), [], []
def compile_and_keep(src, *a, **k):
    kernel = compile_(src, *a, **k)
    if src.fn.__name__ in ("int4_wgmma_kernel", "int4_rs_kernel"):
        ptx = kernel.asm["ptx"]
        rs, hazards = wgmma_hazard.check_cubin(kernel.asm["cubin"])
        found.append({"stack": resource_usage(kernel.asm["cubin"])[1], "shared": int(kernel.metadata.shared),
                      "kernel": src.fn.__name__,
                      # Triton 3.8 writes the state space's scope (st.shared::cta.v4)
                      "st_shared_v4": len(re.findall(r"st\.shared(?:::cta)?\.v4", ptx)),
                      "wgmma": ptx.count("wgmma.mma_async"), "wait1": ptx.count("wgmma.wait_group.sync.aligned 1;"),
                      "tma": ptx.count("cp.async.bulk.tensor"), "setmaxnreg": ptx.count("setmaxnreg"),
                      "pairs": ptx.count("mul.rn.bf16x2") + ptx.count("mul.rn.f16x2"), "rs_wgmma": rs,
                      "hazards": len(hazards), "atomics": ptx.count("atom.")})
    return kernel
triton.compile = compile_and_keep
JITFunction.__getitem__ = lambda fn, grid: (lambda *a, **k: rec.launch(fn, a, k))
common.device_features = lambda device: H200.features
t = int4.TEMPLATE
kernels = {}
def launched(x, w, tile, glu=False):
    # The wgmma kernels one launch ran (a tile with a tail runs two), each with what its compile
    # found (kernels compile once, in launch order; a failed compile finds nothing).
    n, before = len(rec.current), set(rec.compiled)
    t.launch(x, w, tile, glu=glu)
    keys = [k for k in dict.fromkeys(rec.current[n:]) if "int4_wgmma_kernel" in k or "int4_rs_kernel" in k]
    for key in keys:
        if key not in kernels:
            got = found.pop(0) if key not in before and "error" not in rec.compiled[key] else {}
            kernels[key] = dict(got, **{k: v for k, v in rec.compiled[key].items() if k in ("registers", "error")})
    return [kernels[k] for k in keys]
for sym in (True, False):
    w = random_weight("int4", 34816, 5120, {"bits": 4, "group": 128, "symmetric": sym, "act_order": False},
                      torch.bfloat16, "cpu")
    for bucket in (64, 128, 256):
        x = torch.randn(bucket, 5120).bfloat16()
        for tile in [c for c in t.search_space(t.problem(w, bucket, x.dtype)) if c["path"] == "wgmma"]:
            rows += [dict(k, tile=tile, sym=sym, bucket=bucket) for k in launched(x, w, tile)]
    # The large-M RS forms whole-K with the SwiGLU epilogue (their split tiles, whose epilogue stores
    # partials instead, are not compiled here).
    x = torch.randn(1024, 5120).bfloat16()
    for tile in [c for c in t.search_space(t.problem(w, 1024, x.dtype)) if c["path"] == "wgmma" and c["SPLIT_K"] == 1]:
        rows += [dict(k, tile=tile, sym=sym, bucket="1024 glu") for k in launched(x, w, tile, glu=True)]
# fp16 with fp32 scales (the fp32 conversion, not the packed pairs), a K that ends inside a step.
w = random_weight("int4", 777, 1056, {"bits": 4, "group": 128, "symmetric": False, "act_order": False},
                  torch.float16, "cpu")
w.scale = w.scale.float()
for tile in (dict(path="wgmma", BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, SPLIT_K=1, GROUP_M=8, num_warps=4, num_stages=3),
             dict(path="wgmma", RS=1, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, SPLIT_K=1, GROUP_M=8, num_warps=8,
                  num_stages=3)):
    rows += [dict(k, tile=tile, sym=False, bucket="fp32 scales") for k in launched(torch.randn(300, 1056).half(), w, tile)]
print(json.dumps({"rows": rows, "limit": rec.device.shared}))
"""


@pytest.mark.probe("wgmma")
def test_int4_wgmma_tiles_compile_for_the_h200_in_both_forms():
    # Every wgmma tile of the space (buckets 64-256, and the whole-K RS tiles at 1,024 with their SwiGLU
    # epilogue, "1024 glu"; 27B-class gate_up, GPTQ and AWQ, bf16 x)
    # compiles for sm_90 without spilling and fits the H200's shared memory, the ring filled by TMA
    # and the partitions resizing their registers (warp specialisation); scales in x's dtype convert
    # by packed pairs, fp32 scales (fp16 x, a K that ends inside a step) in fp32. The unpacking
    # warpgroup's form: its MMAs read both operands from shared memory (no register operand a later
    # step could overwrite), one MMA in flight across a step (a wait for 1). The RS form: its MMAs
    # read W_q from registers, which no shared-memory store carries (the other form's 16-byte
    # stores of it), and no instruction writes a pending wgmma's register operand (the hazard
    # check): it retires each step's MMA. An RS tile with a tail (TAIL_TILES) is held to this by
    # both its launches' kernels, the whole-K one and the split one; one with FIXUP holds atomics
    # (its arrivals), the rest none.
    got = _json("wgmma")
    rows = got["rows"]
    buckets = (64, 128, 256, "1024 glu")
    assert {(r["sym"], r["bucket"]) for r in rows} == {(s, b) for s in (True, False) for b in buckets} | {
        (False, "fp32 scales")}
    assert len([r for r in rows if r["bucket"] == "1024 glu"]) == 6
    for r in rows:
        assert "error" not in r and r["stack"] == 0 and r["shared"] <= got["limit"], r
        assert r["wgmma"] > 0 and r["hazards"] == 0 and r["tma"] > 0 and r["setmaxnreg"] > 0, r
        assert (r["pairs"] > 0) == (r["bucket"] != "fp32 scales"), r
        if r["kernel"] == "int4_wgmma_kernel":
            assert r["rs_wgmma"] == 0 and r["wait1"] > 0 and r["st_shared_v4"] > 0, r
        else:
            assert r["rs_wgmma"] > 0 and r["st_shared_v4"] == 0, r
    assert {r["kernel"] for r in rows} == {"int4_wgmma_kernel", "int4_rs_kernel"}
    assert all((r["atomics"] > 0) == bool(r["tile"].get("FIXUP")) for r in rows)
    assert {r["bucket"] for r in rows if r["tile"].get("FIXUP")} == {64, 128, 256}
    tails = [r for r in rows if r["tile"].get("TAIL_TILES")]
    assert {r["bucket"] for r in tails} == {64, 128, 256} and all(r["kernel"] == "int4_rs_kernel" for r in tails)
    assert len(tails) == 2 * len({(r["sym"], r["bucket"], repr(sorted(r["tile"].items()))) for r in tails})
