"""Do the templates' default tiles compile for a GPU of the device table (default the H200, sm_90)
on this Triton, within its shared memory? No GPU needed.

    python benchmarks/sm90_fit.py [--device h200|a100|l40s|mi300x] [--formats bf16,...]
                                  [--shapes qkv,...,minilm-down] [--buckets all]
                                  [--tiles default|shipped] [--glu] [--out FILE]

A key the shipped cache does not hold runs its template's default tile, and the shipped cache is
keyed by device and Triton version: so on any other device or Triton every key starts on its
default tile. This drives each template's launcher on the CPU as it would run on the device (its
device features and multiprocessors, DEVICES), catches every kernel launch, and compiles that
kernel with the same arguments, constexprs, warps and stages for the device's target through
Triton's own argument binder, then reads the shared memory the compiled kernel asks for and, for
sm_90, checks its SASS for a write into the registers of a register-operand wgmma still in flight
(kernels/wgmma_hazard.py). The gate_up shape launches as the runtime runs it: with the SwiGLU
epilogue in the formats that have one (runtime/fuse.GLU_FORMATS) where runtime/fuse.SWIGLU_IN_PRODUCT
is on and the template gives the tile the epilogue (Template.glu_in_epilogue: int4 only on its
large-M tiles). A launch that would not fit,
that Triton's backend refuses, or whose kernel has such a write is reported (and the exit status
is 1): on the GPU it would raise, or could race. Only shared memory and those writes are checked;
each NVIDIA kernel's registers and stack a thread (where ptxas puts what it spills) are reported
with it, and for sm_90 ptxas's note where it serializes the kernel's wgmma instructions
("wgmma_serialized", its C75xx notes: every MMA then waits for the one before, whatever the
pipeline asked). `--glu` launches gate_up with the SwiGLU epilogue whatever the runtime does, to
read its cost there. One constexpr differs from a GPU launch: fp8's activation quantization takes
RECIPROCAL from x.is_cuda, False here (a kernel of no shared memory to speak of).
`--tiles shipped` (H200 only) launches the shipped cache's tile of each key instead (tuned on the
device's Triton; its default where the cache has none).

On the H200 every default and every shipped launch fits, 1,232 of 1,232 each (the gate_up
launches of dense and FP8 weights with SwiGLU), on Triton 3.6 (the H200's), none with such a write;
ptxas serializes the wgmmas of one kernel, the shipped pointer-load tile of fp8@fp32 on minilm-down
at 2,048 and 4,096 rows (benchmarks/results/sm90-fit-nvidia-h200-2026-12-06*.json). Each launch
is compiled from its own arguments because their specialization matters: compiled from a bare
signature, a shipped H200 tile that runs on the device asks for 262,176 bytes and would read as
not fitting.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common_bench import SHAPES, SHIPPED_CACHE, code_commit, make_weight, shipped_tile  # noqa: E402

from vsr.autotune import shapes as named_shapes  # noqa: E402
from vsr.autotune.buckets import parse_buckets  # noqa: E402
from vsr.autotune.device_id import DeviceIdentity  # noqa: E402
from vsr.kernels import common, gemm, gemm_tiles, registry, wgmma_hazard  # noqa: E402
from vsr.runtime import fuse  # noqa: E402

@dataclass(frozen=True)
class Device:
    """A GPU as its launchers and Triton's compiler see it."""

    name: str
    target: GPUTarget
    features: common.DeviceFeatures   # what the launchers ask of it (common.device_features)
    multiprocessors: int              # a persistent or stream-K grid's size (gemm.multiprocessors)
    shared: int                       # bytes of shared memory (LDS) a block may use, opted in


def _nvidia(cc: tuple[int, int]) -> common.DeviceFeatures:
    return common.DeviceFeatures(nvidia=True, capability=cc, pdl=cc >= (9, 0), hardware_e4m3=cc >= (8, 9))


# Devices of the seeds' table. The H200's limit is the tile spaces' own (gemm_tiles.SMEM_LIMIT).
DEVICES = {"h200": Device("NVIDIA H200", GPUTarget("cuda", 90, 32), _nvidia((9, 0)), 132, gemm_tiles.SMEM_LIMIT),
           "a100": Device("NVIDIA A100", GPUTarget("cuda", 80, 32), _nvidia((8, 0)), 108, 166912),
           "l40s": Device("NVIDIA L40S", GPUTarget("cuda", 89, 32), _nvidia((8, 9)), 142, 101376),
           "mi300x": Device("AMD Instinct MI300X", GPUTarget("hip", "gfx942", 64),
                            common.DeviceFeatures(nvidia=False, capability=None, pdl=False, hardware_e4m3=False),
                            304, 65536)}
H200 = DEVICES["h200"]
# The shipped cache's device (--tiles shipped).
H200_IDENTITY = DeviceIdentity(vendor="nvidia", name="NVIDIA H200", capability=(9, 0), multiprocessors=132)
# The formats the H200 runs (nvfp4 W4A4 needs FP4 tensor cores), with their activation dtype: the
# dense ones in their own, the quantized ones in bf16 and, as vsr-tune spells it (fmt@fp32), in
# fp32 (the built-in router is an fp32 model: its quantized siblings run fp32 activations).
FORMATS = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp8": torch.bfloat16,
           "int4-gptq": torch.bfloat16, "int4-awq": torch.bfloat16, "nvfp4-emulated": torch.bfloat16,
           "fp8@fp32": torch.float32, "int4-gptq@fp32": torch.float32, "int4-awq@fp32": torch.float32,
           "nvfp4-emulated@fp32": torch.float32}
# The 27B-class shapes by name, then the built-in router's (MiniLM) as minilm-<name>.
SHAPE_TABLE = {**SHAPES, **{f"minilm-{n}": (N, K) for n, N, K in named_shapes.SHAPES_MINILM}}
# The shapes the runtime runs as gate|up products (the built-in router's MLP is not gated).
GLU_SHAPES = ("gate_up",)


def resource_usage(cubin: bytes) -> tuple[int, int]:
    """(registers, stack bytes) a thread of a compiled NVIDIA kernel, as the cuobjdump that Triton's
    backend ships reads them; ptxas puts the registers it spills on the stack."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([wgmma_hazard.cuobjdump(), "-res-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    return int(re.search(r"REG:(\d+)", out).group(1)), int(re.search(r"STACK:(\d+)", out).group(1))


def ptxas() -> str:
    """The ptxas Triton's NVIDIA backend compiles sm_90 with (its bundled one or ptxas-blackwell)."""
    from triton.backends.nvidia.compiler import get_ptxas
    return get_ptxas(90).path


def wgmma_serialized(ptx: str) -> str | None:
    """ptxas's note where it serializes a kernel's wgmma instructions, or None: `ptxas -v` of the
    kernel's PTX for sm_90a, by the ptxas Triton compiles it with."""
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "kernel.ptx")
        Path(src).write_text(ptx)
        out = subprocess.run([ptxas(), "-arch=sm_90a", "-v", src, "-o", os.path.join(d, "kernel.cubin")],
                             capture_output=True, text=True, check=True)
    m = re.search(r"\(C75\d\d\)[^\n]*wgmma\.mma_async instructions are serialized[^\n]*", out.stdout + out.stderr)
    return m.group(0) if m else None


def _source(fn):
    """The compiler's source class for fn: Gluon's for a Gluon kernel (its layouts are explicit)."""
    return GluonASTSource if isinstance(fn, GluonJITFunction) else ASTSource


class Recorder:
    """Stands in for JITFunction.__getitem__: compiles each distinct launch for `device`, once."""

    def __init__(self, device: Device = H200):
        from triton.compiler import make_backend
        self.device = device
        self.backend = make_backend(device.target)
        self.binders: dict = {}   # per kernel: Triton's argument binder for this backend
        self.compiled: dict[str, dict] = {}
        self.current: list[str] = []   # the keys the launch being driven compiled

    def launch(self, fn, args, kwargs) -> None:
        # Triton's own binder and argument packing (JITFunction.run's steps before a compile), so
        # each argument is specialized as a real launch would: integers divisible by 16 and
        # 16-byte-aligned pointers marked, which changes the compiled kernel (and its shared
        # memory) against a bare signature; and a launch option the backend lacks is refused.
        from triton import knobs
        from triton.runtime.jit import create_function_from_signature
        kwargs = dict(kwargs, debug=kwargs.get("debug", fn.debug) or knobs.runtime.debug,
                      instrumentation_mode=knobs.compilation.instrumentation_mode)
        if hasattr(knobs.compilation, "fpsan_homomorphic_casts"):   # Triton 3.9's run() sets it too
            kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
        if fn not in self.binders:
            self.binders[fn] = create_function_from_signature(fn.signature, fn.params, self.backend)
        bound, specialization, options = self.binders[fn](*args, **kwargs)
        options, signature, constexprs, attrs = fn._pack_args(self.backend, kwargs, bound, specialization, options)
        key = repr((fn.__name__, signature, sorted(constexprs.items(), key=repr), sorted(attrs.items(), key=repr),
                    sorted(options.__dict__.items(), key=repr)))
        if key not in self.compiled:
            row = {"kernel": fn.__name__, "warps": options.num_warps, "stages": options.num_stages,
                   "constexprs": {fn.params[k[0]].name: repr(v) for k, v in constexprs.items() if len(k) == 1}}
            try:
                k = triton.compile(_source(fn)(fn, signature, constexprs, attrs), target=self.device.target,
                                   options=options.__dict__)
                row.update(shared=int(k.metadata.shared), fits=int(k.metadata.shared) <= self.device.shared)
                if self.device.target.backend == "cuda":
                    row["registers"], row["stack"] = resource_usage(k.asm["cubin"])
                if self.device.target.backend == "cuda" and self.device.target.arch == 90:
                    rs, found = wgmma_hazard.check_cubin(k.asm["cubin"])
                    row.update(rs_wgmma=rs, wgmma_hazards=len(found), wgmma_hazard_examples=found[:3],
                               fits=row["fits"] and not found, wgmma_serialized=wgmma_serialized(k.asm["ptx"]))
            except Exception as e:  # a kernel that does not compile for the device is a finding too
                row.update(shared=None, fits=False, error=f"{type(e).__name__}: {str(e)[-300:]}")
            self.compiled[key] = row
        self.current.append(key)


def drive(rec: Recorder, fmts, shape_names, buckets, log, shipped: bool = False, glu: bool = False) -> list[dict]:
    """Each (format, shape, bucket)'s default tile (with `shipped`, the shipped cache's tile where
    it has one) launched on the CPU as on the recorder's device; with `glu` the gate|up products
    of fuse.GLU_FORMATS apply SwiGLU in their epilogue, as the runtime's do where
    fuse.SWIGLU_IN_PRODUCT is on."""
    from triton.runtime.jit import JITFunction
    if shipped and rec.device != H200:
        raise ValueError("the shipped cache holds the H200's tiles: --tiles shipped is for the H200 only")
    dev = rec.device
    patches = [(JITFunction, "__getitem__", lambda fn, grid: lambda *a, **k: rec.launch(fn, a, k)),
               (common, "device_features", lambda device: dev.features),
               (gemm, "multiprocessors", lambda device: dev.multiprocessors)]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    rows = []
    try:
        for obj, name, new in patches:
            setattr(obj, name, new)
        for fmt in fmts:
            dtype = FORMATS[fmt]
            for sh in shape_names:
                N, K = SHAPE_TABLE[sh]
                # scales in the activations' dtype, as the tuner makes a key's weight
                w = make_weight("bf16" if fmt in ("fp16", "fp32") else fmt.split("@")[0], N, K, "cpu",
                                model_dtype=dtype)
                if fmt in ("fp16", "fp32"):
                    w = type(w)(w.weight.to(dtype), None)
                t = registry.template_for(w, dtype, emulate=fmt.split("@")[0] == "nvfp4-emulated")
                glu_shape = sh in GLU_SHAPES and w.format in fuse.GLU_FORMATS
                x = torch.empty(max(buckets), K, dtype=dtype)
                for b in buckets:
                    p = t.problem(w, b, dtype)
                    tile = shipped_tile(t, p, "cpu", SHIPPED_CACHE, identity=H200_IDENTITY) if shipped else None
                    source, tile = ("shipped", tile) if tile else ("default", t.default_tile(p))
                    # gate|up products of these formats apply SwiGLU in their epilogue where the
                    # runtime's do (fuse.SWIGLU_IN_PRODUCT, on the tiles the template gives it:
                    # Template.glu_in_epilogue), or as asked (glu).
                    in_product = glu_shape and (glu or (fuse.SWIGLU_IN_PRODUCT and t.glu_in_epilogue(tile)))
                    rec.current = []
                    err = None
                    try:
                        if in_product:
                            t.launch(x[:b], w, tile, glu=True)
                        else:
                            t.launch(x[:b], w, tile)
                    except Exception as e:  # the launcher itself refused: a finding
                        err = f"{type(e).__name__}: {str(e)[-300:]}"
                    kernels = [rec.compiled[k] for k in rec.current]
                    row = dict(format=fmt, shape=sh, N=N, K=K, bucket=b, tile=tile, source=source, glu=in_product,
                               error=err,
                               kernels=[dict(kernel=r["kernel"], shared=r["shared"], registers=r.get("registers"),
                                             stack=r.get("stack"), wgmma_hazards=r.get("wgmma_hazards", 0),
                                             wgmma_serialized=r.get("wgmma_serialized"))
                                        for r in kernels],
                               fits=err is None and bool(kernels) and all(r["fits"] for r in kernels))
                    rows.append(row)
                    log(row)
    finally:
        for obj, name, old in saved:
            setattr(obj, name, old)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=sorted(DEVICES), default="h200")
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--shapes", default=",".join(SHAPE_TABLE), help=f"of {', '.join(SHAPE_TABLE)}")
    ap.add_argument("--buckets", default="all")
    ap.add_argument("--tiles", choices=("default", "shipped"), default="default")
    ap.add_argument("--glu", action="store_true",
                    help="launch gate_up with the SwiGLU epilogue (fuse.GLU_FORMATS), whatever the runtime does")
    ap.add_argument("--out", default=None, help="JSON of every launch and every compiled kernel")
    a = ap.parse_args(argv)
    for name, given, known in (("format", a.formats, FORMATS), ("shape", a.shapes, SHAPE_TABLE)):
        unknown = [v for v in given.split(",") if v not in known]
        if unknown:
            ap.error(f"unknown {name} {', '.join(unknown)}: of {', '.join(known)}")
    if os.environ.get("TRITON_INTERPRET") == "1":
        ap.error("unset TRITON_INTERPRET: the kernels must compile, not be interpreted")
    t0 = time.time()
    rec = Recorder(DEVICES[a.device])
    if a.tiles == "shipped" and rec.device != H200:
        ap.error("--tiles shipped is for the H200 only: the shipped cache holds its tiles")

    def log(r: dict) -> None:
        if not r["fits"]:
            print(f"DOES NOT FIT: {r['format']} {r['shape']} bucket {r['bucket']} {r['source']} tile {r['tile']}: "
                  f"{r['error'] or [(k['kernel'], k['shared']) for k in r['kernels']]}", flush=True)
    rows = drive(rec, a.formats.split(","), a.shapes.split(","), parse_buckets(a.buckets), log, a.tiles == "shipped",
                 a.glu)
    bad = [r for r in rows if not r["fits"]]
    most = max((k for k in rec.compiled.values() if k["shared"] is not None), key=lambda k: k["shared"], default=None)
    print(f"{len(rows) - len(bad)}/{len(rows)} {a.tiles}-tile launches fit the {rec.device.name}'s "
          f"{rec.device.shared} bytes "
          f"on Triton {triton.__version__} ({len(rec.compiled)} distinct kernels compiled, {time.time() - t0:.0f} s; "
          f"most: {most and (most['kernel'], most['shared'])})")
    serialized = [k for k in rec.compiled.values() if k.get("wgmma_serialized")]
    if serialized:
        print(f"{len(serialized)} kernels have their wgmma instructions serialized by ptxas: "
              + ", ".join(sorted({k['kernel'] for k in serialized})))
    spilled = [k for k in rec.compiled.values() if k.get("stack")]
    if spilled:
        print(f"{len(spilled)} kernels keep a stack (spills or calls), up to {max(k['stack'] for k in spilled)} bytes "
              f"a thread: " + ", ".join(sorted({k['kernel'] for k in spilled})))
    if a.out:
        Path(a.out).write_text(json.dumps(dict(benchmark="sm90-fit", device=rec.device.name, tiles=a.tiles, glu=a.glu,
                                               commit=code_commit(),
                                               triton=triton.__version__,
                                               torch=torch.__version__, rows=rows,
                                               kernels=list(rec.compiled.values())), indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
