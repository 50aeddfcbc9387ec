"""Static resource report of kernels compiled for sm_90 (Hopper), no GPU needed.

    python benchmarks/inspect_kernels.py [--out FILE] [--cases int4-swap,...]

Triton compiles each case for GPUTarget("cuda", 90) with its bundled ptxas, exactly as it would
for the H200, and this reports, per case: registers, spill bytes and shared memory of the cubin
(`cuobjdump -res-usage`), the tensor-core instructions (HGMMA: wgmma), the bytes of register
tensors stored to shared memory inside a loop (TTGIR `ttg.local_alloc %value`: an operand taking
a round trip through shared memory on every step), and the SASS opcode histogram, whole and of the main loop (per thread and step). It answers "what does the
compiled kernel do" between device sessions; it times nothing (benchmarks/limits.py and
variants.py do that on the GPU). The Triton version here may differ from the device's: the
report records it.

Cases: the int4 template's shipped kernels on their H200-tuned tiles (caches/nvidia-h200.json,
qkv: M=1 GEMV, M=16 split-K, M=64 swap, as shipped before run 11), fp8's GEMV for comparison per
weight byte, and the slices path (run 11's winner, in both forms: PTX two-nibble conversion and
its portable fp32 twin) on the same tiles as the swap path, and with 2 warps (mma.sync); the
join path; fp8's activation prologue (run 16), and the stream-K product and its reduction.
Besides resources, each row counts the wgmma
completions waited for inside the loops (`wgmma_full_waits_in_loops`, from the TTGIR).
"""
from __future__ import annotations

import argparse
import collections
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common_bench import code_commit, result_path  # noqa: E402

from vsr.kernels import fp8, gemm, int4  # noqa: E402

BIN = Path(os.path.dirname(triton.backends.nvidia.__file__)) / "bin"

# Pointer and integer argument types of the int4 product kernels (bf16 activations and scales).
_INT4 = dict(x_ptr="*bf16", q_ptr="*i32", sc_ptr="*bf16", zp_ptr="*i32", y_ptr="*bf16", ws_ptr="*fp32",
             cnt_ptr="*i32", bias_ptr="*bf16", M="i32", N="i32", K="i32", K8="i32", KG="i32", stride_xm="i32", stride_ym="i32",
             KW_SPLIT="i32")
_GPTQ = dict(GROUP=128, HAS_ZP=False)
_SPLITS = dict(_GPTQ, FIXUP=False)   # the kernels that stash split-K partials take FIXUP; the GEMV does not


def cases() -> dict[str, tuple]:
    """name -> (kernel, argument types, constexprs, num_warps, num_stages, what it is)."""
    swap = dict(_SPLITS, HAS_BIAS=False, EVEN_K=True, BLOCK_K=128, SPLIT_K=8, GROUP_M=8, IEEE=False)
    out = {
        "int4-gemv": (int4._int4_gemv_kernel, _INT4, dict(_GPTQ, HAS_BIAS=False, BLOCK_N=8, W8=128, SPLIT_K=1), 2, 2,
                      "int4 M=1 GEMV, qkv's tuned tile (8 rows x 128 words per step)"),
        "fp8-gemv": (gemm.gemv_kernel, dict(x_ptr="*fp8e4nv", w_ptr="*fp8e4nv", y_ptr="*bf16", rs_ptr="*bf16",
                                              cs_ptr="*bf16", bias_ptr="*bf16", N="i32", K="i32", stride_wn="i32"),
                     dict(HAS_BIAS=False, HAS_RS=True, HAS_CS=True, EVEN_K=True, BLOCK_N=8, BLOCK_K=512, WAIT=False),
                     4, 3,
                     "fp8's CUDA-core GEMV (run 5's tile), for instructions per weight byte"),
        "int4-splitk-16": (int4._int4_kernel, _INT4, dict(swap, BLOCK_M=16, BLOCK_N=128, BLOCK_K=64), 4, 4,
                           "int4 M=16 split-K, qkv's tuned tile 16x128x64 split 8"),
    }
    for bm, bn in ((16, 128), (64, 128), (64, 64)):
        out[f"int4-swap-{bm}x{bn}"] = (int4._int4_swap_kernel, _INT4, dict(swap, BLOCK_M=bm, BLOCK_N=bn), 4, 3,
                                       f"int4 swap path {bm}x{bn}x128 (64x128: qkv M=64's tuned tile)")
        for pairs in (False, True):
            out[f"int4-slices{'-ptx' if pairs else ''}-{bm}x{bn}"] = (
                int4._int4_slices_kernel, _INT4, dict(_SPLITS, HAS_BIAS=False, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=128,
                                                      SPLIT_K=8, GROUP_M=8, PAIRS=pairs, F16=False, IEEE=False,
                                                      X_SPLIT=False, X_ROW=False),
                4, 3,
                f"int4 slices path{' (PTX two-nibble conversion, as on NVIDIA)' if pairs else ' (portable twin)'}"
                f" on the swap path's {bm}x{bn}x128 tile")
    out["int4-join-ptx-16x64"] = (
        int4._int4_join_kernel, _INT4, dict(_SPLITS, HAS_BIAS=False, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=4,
                                            GROUP_M=8, PAIRS=True, F16=False), 4, 3,
        "int4 join path (pairs joined into natural K order, one tl.dot per step), 16x64x128")
    out["int4-slices-ptx-16x64"] = (
        int4._int4_slices_kernel, _INT4, dict(_SPLITS, HAS_BIAS=False, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=4,
                                              GROUP_M=8, PAIRS=True, F16=False, IEEE=False, X_SPLIT=False, X_ROW=False),
        4, 3, "int4 slices path, 16x64x128 with 4 warps: the shipped M=1-16 default, beside the join kernel's tile")
    out["int4-slices-ptx-16x64-xsplit"] = (
        int4._int4_slices_kernel, _INT4, dict(out["int4-slices-ptx-16x64"][2], X_SPLIT=True), 4, 3,
        "the same with X_SPLIT: x as stored, each step's block split into its slices in registers")
    out["int4-slices-ptx-16x64-xrow"] = (
        int4._int4_slices_kernel, _INT4, dict(out["int4-slices-ptx-16x64"][2], X_SPLIT=True, X_ROW=True), 4, 3,
        "the same at M <= 2 (X_ROW): x's rows loaded once, slice j's operand that tile zeroed but columns 8m + j")
    out["int4-slices-ptx-32x64-xrow"] = (
        int4._int4_slices_kernel, _INT4, dict(out["int4-slices-ptx-16x64"][2], BLOCK_M=32, X_SPLIT=True, X_ROW=True),
        4, 3, "X_ROW on a 32-row tile: four rows of x in place (run 29, M=4: at best 1% less to 20% more "
              "time than the shipped tile; not offered)")
    out["int4-slices-ptx-16x64-2w"] = (
        int4._int4_slices_kernel, _INT4, dict(_SPLITS, HAS_BIAS=False, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=4,
                                              GROUP_M=8, PAIRS=True, F16=False, IEEE=False, X_SPLIT=False, X_ROW=False),
        2, 3,
        "int4 slices path, 16x64x128 with 2 warps: mma.sync (HMMA) instead of wgmma (run 12's candidate at M=1)")
    # fp8's activation prologue on qkv's and down's rows (bf16, the 1/s product), and the stream-K
    # kernels on the M = 512-2048 default (bf16) with their reduction.
    quant = dict(x_ptr="*bf16", xq_ptr="*fp8e4nv", s_ptr="*bf16", K="i32", stride_xm="i32", EPS="fp32")
    for k, a, b, w in ((5120, 4096, 1024, 8), (17408, 16384, 1024, 16)):
        out[f"fp8-prologue-{k}"] = (fp8._act_quant_kernel, quant,
                                    dict(BLOCK_A=a, BLOCK_B=b, CHUNKED=False, RECIPROCAL=True, HW_CVT=True,
                                         RELEASE=False, BF16_RCP=True), w, 1,
                                    f"fp8's activation prologue, K = {k} = {a} + {b} in registers, bf16 rows")
    flags = dict(HAS_BIAS=False, HAS_RS=False, HAS_CS=False, HAS_ALPHA=False, BLOCK_K=64, GROUP_M=8)
    scalars = dict(y_ptr="*bf16", ws_ptr="*fp32", cnt_ptr="*i32", bias_ptr="*bf16", rs_ptr="*bf16", cs_ptr="*bf16",
                   alpha_ptr="*bf16", M="i32", N="i32", K="i32", stride_ym="i32", NUM_PROGRAMS="i32")
    out["tma-sk-128x256"] = (gemm.tma_streamk_kernel,
                             dict(scalars, a_desc="tensordesc<bf16[128,64]>", b_desc="tensordesc<bf16[256,64]>"),
                             dict(flags, IEEE=False, BLOCK_M=128, BLOCK_N=256, WAIT=False, FIXUP=False,
                                  ROWS=16), 8, 4,
                             "stream-K TMA product, bf16 128x256x64 (the M = 1024-2048 default)")
    wide = {k: v for k, v in scalars.items() if k not in ("ws_ptr", "cnt_ptr")}   # tma_gemm_kernel has no workspace
    wide.update(a_desc="tensordesc<bf16[128,64]>", b_desc="tensordesc<bf16[128,64]>",
                b2_desc="tensordesc<bf16[32,64]>", b_ptr="*bf16", stride_bn="i32")
    out["tma-wide-128x160"] = (gemm.tma_gemm_kernel, wide,
                               dict(flags, IEEE=False, BLOCK_M=128, BLOCK_N=128, BLOCK_N2=32, PERSISTENT=False,
                                    WAIT=False, PREFETCH=0, LINE_COLS=64), 8, 4,
                               "wide TMA tile, bf16 128x(128+32)x64: one wave of 128 programs on qkv at M = 256")
    out["tma-sk-128x256-fixup"] = (
        gemm.tma_streamk_kernel, out["tma-sk-128x256"][1], dict(out["tma-sk-128x256"][2], FIXUP=True), 8, 4,
        "the same, each leftover tile's partials added by its last program to finish (FIXUP)")
    out["tma-swap-16x128-fixup"] = (
        gemm.tma_swap_kernel, dict(scalars, a_desc="tensordesc<fp8e4nv[16,256]>", b_desc="tensordesc<fp8e4nv[128,256]>",
                                     b_ptr="*fp8e4nv", stride_bn="i32", K_SPLIT="i32"),
        dict(HAS_BIAS=False, HAS_RS=True, HAS_CS=True, IEEE=False, BLOCK_M=16, BLOCK_N=128, BLOCK_K=256, SPLIT_K=2,
             GROUP_M=8, WAIT=True, PREFETCH=4, LINE_COLS=128, FIXUP=True), 4, 4,
        "fp8's transposed product for few rows, 16x128x256, two K splits added in the kernel (FIXUP)")
    out["streamk-reduce-64x128"] = (gemm.streamk_reduce_kernel, scalars,
                                    dict(flags, BLOCK_M=64, BLOCK_N=128, ROWS=16), 4, 1,
                                    "stream-K's reduction of the leftover tiles' partials, bf16 64x128")
    return out


def compile_cuda(fn, types: dict, consts: dict, warps: int, stages: int, arch: int = 90, divisible=()):
    """fn compiled for GPUTarget("cuda", arch) (90: the H200; the tests also compile other NVIDIA
    architectures the device table supports). `divisible`: the arguments specialised as divisible
    by 16, as a launch specialises aligned pointers and strides; a bare signature (none) gives
    unvectorised loads, and then Triton pipelines nothing (run 25 item 2)."""
    params = list(inspect.signature(fn.fn).parameters)
    unknown = set(consts) - set(params)   # (types is a pool shared by kernels: not checked)
    if unknown:   # a misspelt flag would otherwise compile the kernel's default silently
        raise ValueError(f"{fn.fn.__name__} has no parameter {', '.join(sorted(unknown))}")
    unknown = set(divisible) - set(types) - set(consts)
    if unknown:
        raise ValueError(f"{fn.fn.__name__}: no typed argument {', '.join(sorted(unknown))} to mark divisible")
    sig, cx, attrs = {}, {}, {}
    for i, p in enumerate(params):
        if p in divisible and p not in consts:
            attrs[(i,)] = [["tt.divisibility", 16]]
        if p in consts:
            sig[p], cx[(i,)] = "constexpr", consts[p]
        elif p in types:
            sig[p] = types[p]
        else:  # a constexpr with a default (e.g. IEEE=False) left out of the case
            default = inspect.signature(fn.fn).parameters[p].default
            if default is inspect.Parameter.empty:
                raise ValueError(f"the case gives {fn.fn.__name__}'s parameter {p} neither a type nor a value")
            sig[p], cx[(i,)] = "constexpr", default
    return triton.compile(ASTSource(fn, sig, cx, attrs), target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": warps, "num_stages": stages})


def _tool(name: str, *args: str) -> str:
    return subprocess.run([str(BIN / name), *args], capture_output=True, text=True, check=True).stdout


_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "i32": 4, "i8": 1, "f8E4M3FN": 1, "i16": 2}


def _stored_bytes(ttgir_loops: str) -> int:
    """Bytes of register tensors written to shared memory by `ttg.local_alloc %value` inside the
    loops (operands taking a round trip through shared memory on every step, e.g. an unpacked
    weight tile on its way to the MMA; asynchronous global->shared copies are not counted)."""
    total = 0
    for dims, dtype in re.findall(r"ttg\.local_alloc %\S+ : \(tensor<([0-9x]+)x(\w+),", ttgir_loops):
        n = 1
        for d in dims.split("x"):
            n *= int(d)
        total += n * _BYTES.get(dtype, 4)
    return total


def analyse(k) -> dict:
    """Resources, shared-memory round trips in loops and the SASS histogram of one compiled kernel."""
    ttgir = k.asm["ttgir"]
    in_loops = ttgir[ttgir.find("scf.for"):] if "scf.for" in ttgir else ""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        usage = _tool("cuobjdump", "-res-usage", f.name)
        sass = _tool("cuobjdump", "-sass", f.name)
    res = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", usage))
    ins = []   # (address, opcode, operands)
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(.*)", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2), m.group(3)))
    ops = collections.Counter(op for _, op, _ in ins)
    # The main loop: the longest span closed by a backward branch.
    spans = [(int(t.group(1), 16), a) for a, op, rest in ins if op == "BRA"
             for t in [re.search(r"0x([0-9a-f]+)", rest)] if t and int(t.group(1), 16) < a]
    lo, hi = max(spans, key=lambda p: p[1] - p[0]) if spans else (0, -1)
    loop = collections.Counter(op for a, op, _ in ins if lo <= a <= hi)
    return {"registers": int(res.get("REG", -1)), "stack_bytes": int(res.get("STACK", -1)),
            "local_bytes": int(res.get("LOCAL", -1)), "shared_bytes": k.metadata.shared,
            "hgmma": ops.get("HGMMA", 0), "sass_instructions": sum(ops.values()),
            "register_bytes_to_shared_per_step": _stored_bytes(in_loops),
            # wgmma completions waited for inside the loops (TTGIR): the slices kernel waits after
            # each of its eight products per step (operand A in registers), run 12's join form once.
            "wgmma_full_waits_in_loops": len(re.findall(r"ttng\.warp_group_dot_wait [^\n]*pendings = 0", in_loops)),
            "sass_top": dict(ops.most_common(14)),
            "main_loop_instructions": sum(loop.values()), "main_loop_ops": dict(loop.most_common())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=None, help="comma-separated names (default: all)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    all_cases = cases()
    names = a.cases.split(",") if a.cases else list(all_cases)
    rows = []
    for name in names:
        fn, types, consts, warps, stages, what = all_cases[name]
        row = {"case": name, "what": what, "tile": {k: v for k, v in consts.items() if k.isupper()},
               "num_warps": warps, "num_stages": stages}
        try:
            row.update(analyse(compile_cuda(fn, types, consts, warps, stages)))
        except Exception as e:  # a case that does not compile is a finding
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = Path(a.out) if a.out else result_path("inspect", "sm90")
    out.write_text(json.dumps({"benchmark": "inspect", "target": "cuda sm_90 (compiled, not run)",
                               "triton": triton.__version__, "commit": code_commit(), "rows": rows}, indent=1) + "\n")
    print(f"\n{'case':30s} {'regs':>5s} {'spill':>6s} {'smem':>7s} {'hgmma':>5s} {'reg->smem B/step':>16s} {'sass':>6s} {'loop':>5s} {'waits':>5s}")
    for r in rows:
        if "error" in r:
            print(f"{r['case']:30s} ERROR {r['error'][:80]}")
            continue
        print(f"{r['case']:30s} {r['registers']:5d} {r['local_bytes']:6d} {r['shared_bytes']:7d} {r['hgmma']:5d} "
              f"{r['register_bytes_to_shared_per_step']:16d} {r['sass_instructions']:6d} {r['main_loop_instructions']:5d} "
              f"{r['wgmma_full_waits_in_loops']:5d}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
