"""benchmarks/inspect_kernels.py compiles kernels for sm_90 without a GPU and reads their resources.

It runs in a subprocess: under the interpreter (the CPU test set-up) @triton.jit functions are
interpreted and cannot be compiled."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import triton

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
BIN = Path(os.path.dirname(triton.backends.nvidia.__file__)) / "bin"
NEEDS_CUDA_BINARIES = pytest.mark.skipif(not (BIN / "cuobjdump").exists(),
                                         reason="this Triton has no bundled CUDA binaries")
# Triton 3.8.0 sends int4 weight operands through shared memory where 3.6, 3.7 and 3.9 keep them in
# registers (run 33, compiled for sm_90 on the CPU): the PTX-pairs slices kernel stores four of its
# eight unpacked 128 x 16 bf16 weight slices a step (16 KB, beside x's 4 KB of slices, all the others
# store) and the SCALE_W join its 128 x 128 joined operand (32 KB a step; the others none). So on
# 3.8 the tests below leave out those shared-memory assertions and keep the rest. (On 3.8 the
# kernels compile for sm_90 and pass the interpreter's reference tests; none ran on a GPU, whose
# Triton is 3.6, so int4's speed on 3.8 is unknown.)
TRITON_38 = triton.__version__.startswith("3.8.")


def compile_outside_the_interpreter(*args: str) -> str:
    """Run python with args, TRITON_INTERPRET unset (so @triton.jit functions compile), asserting
    success; its stdout."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


def compile_script(tmp_path, body: str) -> str:
    """compile_outside_the_interpreter on a script: `body` after a header that imports
    benchmarks/inspect_kernels.py as `ik`; its stdout."""
    script = tmp_path / "compile.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(BENCH)!r})\nimport inspect_kernels as ik\n" + body)
    return compile_outside_the_interpreter(str(script))


@NEEDS_CUDA_BINARIES
def test_reports_resources_of_a_compiled_int4_kernel(tmp_path):
    out = tmp_path / "inspect.json"
    compile_outside_the_interpreter(str(BENCH / "inspect_kernels.py"), "--cases",
                                    "int4-swap-16x128,int4-slices-ptx-16x128", "--out", str(out))
    doc = json.loads(out.read_text())
    r, sl = doc["rows"]
    assert "error" not in r and "error" not in sl, (r.get("error"), sl.get("error"))
    assert 0 < r["registers"] <= 255 and r["shared_bytes"] > 0
    assert r["hgmma"] > 0, "a 128-row weight tile as the left operand runs on Hopper's wgmma"
    # The unpacked [128, 128] bf16 weight tile goes through shared memory on every step.
    assert r["register_bytes_to_shared_per_step"] >= 128 * 128 * 2
    # The main loop was found, and it holds the tensor-core instructions.
    assert 0 < r["main_loop_instructions"] < r["sass_instructions"] and r["main_loop_ops"].get("HGMMA", 0) > 0
    # The shipped slices path (each nibble slice its own wgmma operand) keeps the unpacked weights
    # in registers: only x's [128, 16] tile reaches shared memory, and its main loop is shorter.
    assert sl["hgmma"] > 0 and sl["main_loop_ops"].get("HGMMA", 0) > 0
    if not TRITON_38:
        assert sl["register_bytes_to_shared_per_step"] <= 128 * 16 * 2 < r["register_bytes_to_shared_per_step"]
    assert sl["main_loop_instructions"] < r["main_loop_instructions"]


@NEEDS_CUDA_BINARIES
def test_int4_join_scale_w_keeps_its_products_in_flight_on_sm90(tmp_path):
    # Why SCALE_W exists (run 25 item 2): compiled for sm_90 with its pointers and strides aligned
    # as launched, the join kernel that scales each step's fp32 product waits for every wgmma of
    # the step (0 pending) and stores its joined operand to shared memory each step; with the scale
    # on the weight tile its waits leave products pending and the operand stays in registers.
    stdout = compile_script(tmp_path, """
import re
from vsr.kernels import int4
consts = dict(GROUP=128, HAS_ZP=False, HAS_BIAS=False, BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, SPLIT_K=1,
              GROUP_M=8, PAIRS=True, F16=False, FIXUP=False)
aligned = ("x_ptr", "q_ptr", "sc_ptr", "zp_ptr", "y_ptr", "ws_ptr", "cnt_ptr", "bias_ptr", "K", "K8", "KG",
           "stride_xm", "stride_ym", "KW_SPLIT")
for scale_w in (False, True):
    k = ik.compile_cuda(int4._int4_join_kernel, ik._INT4, dict(consts, SCALE_W=scale_w), 8, 3, divisible=aligned)
    ttgir = k.asm["ttgir"]
    loop = ttgir[ttgir.find("scf.for"):]
    pending = sorted({int(n) for n in re.findall(r"warp_group_dot_wait [^\\n]*pendings = (\\d+)", loop)})
    print("case", scale_w, max(pending), ik._stored_bytes(loop), k.metadata.shared)
""")
    cases = {c[1]: list(map(int, c[2:])) for c in (line.split() for line in stdout.splitlines()) if c[0] == "case"}
    (fp32_pending, fp32_stored, fp32_smem), (sw_pending, sw_stored, sw_smem) = cases["False"], cases["True"]
    assert fp32_pending == 0 and fp32_stored > 0, "the fp32-scaled form: waits for each step, operand via shared memory"
    assert sw_pending > 0, "SCALE_W: products left in flight"
    if not TRITON_38:
        assert sw_stored == 0, "SCALE_W: no shared-memory trip"
        assert sw_smem < fp32_smem


@NEEDS_CUDA_BINARIES
def test_int4_slices_and_join_compile_for_every_nvidia_architecture(tmp_path):
    # The slices and join kernels as the launcher configures them, for bf16 and fp16 x, on Ampere, Ada and
    # Hopper: sub.bf16x2 exists only from sm_90, and the first slices version failed to build on
    # sm_80-89 with bf16 (ptxas: "Feature 'sub.bf16x2' requires .target sm_90 or higher").
    stdout = compile_script(tmp_path, """
import torch
from vsr.kernels import int4
for cap in ((8, 0), (8, 6), (8, 9), (9, 0)):
    for dt, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        types = dict(ik._INT4, x_ptr="*" + name, sc_ptr="*" + name, y_ptr="*" + name, bias_ptr="*" + name)
        consts = dict(GROUP=128, HAS_ZP=True, HAS_BIAS=True, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=2,
                      GROUP_M=8, PAIRS=int4.ptx_pairs(dt, cap), F16=dt == torch.float16, IEEE=False, FIXUP=True)
        for x_split, x_row, bm in ((False, False, 16), (True, False, 16), (True, True, 16), (True, True, 32)):
            ik.compile_cuda(int4._int4_slices_kernel, types, dict(consts, BLOCK_M=bm, X_SPLIT=x_split, X_ROW=x_row),
                            4, 3, arch=cap[0] * 10 + cap[1])
        consts.pop("IEEE")
        for scale_w in (False, True):   # SCALE_W: the half-precision multiply (scales in x's dtype)
            ik.compile_cuda(int4._int4_join_kernel, types, dict(consts, SCALE_W=scale_w), 4, 3,
                            arch=cap[0] * 10 + cap[1])
        print("ok", cap, name, consts["PAIRS"])
""")
    assert stdout.count("ok") == 8
    assert "ok (9, 0) bf16 True" in stdout and "ok (8, 9) bf16 False" in stdout


@NEEDS_CUDA_BINARIES
def test_fp8_programmatic_dependent_launch_compiles_for_sm90(tmp_path):
    # The interpreter cannot run griddepcontrol or inline PTX, so the CPU tests never build the
    # PDL forms: compiled here for sm_90, the prologue releases its dependents, and the products
    # prefetch their weight rows to L2 before waiting; without the flags neither instruction is there.
    stdout = compile_script(tmp_path, """
from vsr.kernels import gemm
scales = dict(y_ptr="*bf16", bias_ptr="*bf16", rs_ptr="*bf16", cs_ptr="*bf16", M="i32", N="i32", K="i32",
              stride_ym="i32", b_ptr="*fp8e4nv", stride_bn="i32")
flags = dict(HAS_BIAS=False, HAS_RS=True, HAS_CS=True, IEEE=False, BLOCK_N=128, GROUP_M=8, LINE_COLS=128)
for on in (True, False):
    swap = ik.compile_cuda(gemm.tma_swap_kernel, dict(scales, a_desc="tensordesc<fp8e4nv[16, 256]>",
                           b_desc="tensordesc<fp8e4nv[128, 256]>", ws_ptr="*fp32", cnt_ptr="*i32",
                           K_SPLIT="i32"),
                           dict(flags, BLOCK_M=16, BLOCK_K=256, SPLIT_K=1, WAIT=on, PREFETCH=4 if on else 0,
                                FIXUP=False), 4, 4)
    tile = ik.compile_cuda(gemm.tma_gemm_kernel, dict(scales, a_desc="tensordesc<fp8e4nv[64, 256]>",
                           b_desc="tensordesc<fp8e4nv[128, 256]>", b2_desc="tensordesc<fp8e4nv[128, 256]>",
                           alpha_ptr="*fp32", NUM_PROGRAMS="i32"),
                           dict(flags, HAS_ALPHA=False, BLOCK_M=64, BLOCK_K=256, BLOCK_N2=0, PERSISTENT=False,
                                WAIT=on, PREFETCH=4 if on else 0), 4, 4)
    wide = ik.compile_cuda(gemm.tma_gemm_kernel, dict(scales, a_desc="tensordesc<fp8e4nv[64, 256]>",
                           b_desc="tensordesc<fp8e4nv[128, 256]>", b2_desc="tensordesc<fp8e4nv[32, 256]>",
                           alpha_ptr="*fp32", NUM_PROGRAMS="i32"),
                           dict(flags, HAS_ALPHA=False, BLOCK_M=64, BLOCK_K=256, BLOCK_N2=32, PERSISTENT=False,
                                WAIT=on, PREFETCH=4 if on else 0), 4, 4)
    fn, types, consts, warps, stages, _ = ik.cases()["fp8-prologue-5120"]
    quant = ik.compile_cuda(fn, types, dict(consts, RELEASE=on), warps, stages)
    for name, k in (("swap", swap), ("tile", tile), ("wide", wide)):
        ptx = k.asm["ptx"]
        print(name, on, ptx.count("griddepcontrol.wait"), ptx.count("prefetch.global.L2"))
    print("quant", on, quant.asm["ptx"].count("griddepcontrol.launch_dependents"))
""")
    got = {tuple(line.split()[:2]): [int(n) for n in line.split()[2:]] for line in stdout.splitlines()}
    # 128 rows x 4 lines over 128 threads: 4 prefetches per thread.
    assert got[("swap", "True")] == [1, 4] and got[("tile", "True")] == [1, 4], got
    assert got[("swap", "False")] == [0, 0] and got[("tile", "False")] == [0, 0], got
    # A wide tile (128 + 32 rows) prefetches its second block's rows too: one more per thread.
    assert got[("wide", "True")] == [1, 5] and got[("wide", "False")] == [0, 0], got
    assert got[("quant", "True")] == [1] and got[("quant", "False")] == [0], got


@NEEDS_CUDA_BINARIES
def test_nvfp4_kernels_compile_for_hopper_and_blackwell(tmp_path):
    # The interpreter runs what the compiler refuses: nvfp4's prologue once read a plain Python
    # global (a NaN-keeping clamp's flag) that only a constexpr may be, and failed on the H200
    # alone. Compiled here: the prologue (both outputs) and the emulated product for sm_90; the
    # dot_scaled product, which no device here can run, for sm_100 and sm_120, where it must become
    # the NVFP4 block-scaled MMA (e2m1 operands, one e4m3 scale per 16 elements).
    stdout = compile_script(tmp_path, """
from vsr.kernels import nvfp4
for packed in (False, True):
    ik.compile_cuda(nvfp4._act_quant_kernel, dict(x_ptr="*bf16", gx_ptr="*fp32", val_ptr="*fp16", code_ptr="*u8",
                    sc_ptr="*u8", K="i32", stride_xm="i32"), dict(PACKED=packed, BLOCKS=64), 4, 1)
    print("quant", packed)
ints = dict(M="i32", N="i32", K="i32", K2="i32", K16="i32", stride_ym="i32", K_SPLIT="i32")
for a16 in (False, True):
    ik.compile_cuda(nvfp4._emulated_kernel, dict(ints, a_ptr="*bf16" if a16 else "*fp16", q_ptr="*u8",
                    bs_ptr="*u8", gw_ptr="*fp32", alpha_ptr="*fp32", y_ptr="*bf16", ws_ptr="*fp32",
                    bias_ptr="*bf16", stride_am="i32"), dict(A16=a16, HAS_BIAS=True, EVEN_K=True, BLOCK_M=16,
                    BLOCK_N=64, BLOCK_K=128, SPLIT_K=1, GROUP_M=8), 4, 3)
    print("emulated", a16)
for arch in (100, 120):
    k = ik.compile_cuda(nvfp4._w4a4_kernel, dict(ints, xc_ptr="*u8", xs_ptr="*fp8e4nv", q_ptr="*u8",
                        bs_ptr="*fp8e4nv", alpha_ptr="*fp32", y_ptr="*bf16", ws_ptr="*fp32", bias_ptr="*bf16"),
                        dict(HAS_BIAS=True, BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, SPLIT_K=1, GROUP_M=8), 4, 3,
                        arch=arch)
    mma = [word for line in k.asm["ptx"].splitlines() for word in line.split() if "kind::mxf4nvf4" in word]
    print("w4a4", arch, len(mma), sorted(set(mma)))
""").splitlines()
    assert stdout[:4] == ["quant False", "quant True", "emulated False", "emulated True"], stdout
    w100, w120 = stdout[4:]
    # sm_100: tcgen05's block-scaled MMA with 16-element scale blocks (PTX spells it block16 with
    # Triton 3.9, scale_vec::4X with 3.6: four scales per 64-element K step); sm_120: mma.sync's,
    # with scale_vec::4X and ue4m3 scales.
    assert w100.startswith("w4a4 100 ") and "tcgen05.mma" in w100, w100
    assert "block_scale.block16" in w100 or "block_scale.scale_vec::4X" in w100, w100
    assert w120.startswith("w4a4 120 ") and "scale_vec::4X" in w120 and "ue4m3" in w120, w120


@NEEDS_CUDA_BINARIES
def test_streamk_reduction_launches_as_usual_on_sm90(tmp_path):
    # The stream-K product does not release its reduction early and the reduction waits for
    # nothing (the programmatic-dependent form lost, H200 run 18, and is gone): no griddepcontrol.
    got = compile_script(tmp_path, """
cases = ik.cases()
for name in ("tma-sk-128x256", "streamk-reduce-64x128"):
    fn, types, consts, warps, stages, _ = cases[name]
    print(name, ik.compile_cuda(fn, types, consts, warps, stages).asm["ptx"].count("griddepcontrol"))
""").split()
    assert got == ["tma-sk-128x256", "0", "streamk-reduce-64x128", "0"], got


def test_in_kernel_fixup_compiles_to_one_acq_rel_ticket_on_sm90(tmp_path):
    # FIXUP: each tile's ticket is one acquire-release increment at GPU scope (and one reset),
    # the partials read back through L2 (ld.global.cg); without it, no atomic at all.
    got = compile_script(tmp_path, """
cases = ik.cases()
for name in ("tma-sk-128x256", "tma-sk-128x256-fixup", "tma-swap-16x128-fixup"):
    fn, types, consts, warps, stages, _ = cases[name]
    ptx = ik.compile_cuda(fn, types, consts, warps, stages).asm["ptx"]
    print(name, ptx.count("atom.global.gpu.acq_rel.add"), ptx.count("atom.global.gpu.relaxed.exch"),
          int("ld.global.cg" in ptx))
""").split()
    assert got == ["tma-sk-128x256", "0", "0", "0", "tma-sk-128x256-fixup", "1", "1", "1",
                   "tma-swap-16x128-fixup", "1", "1", "1"], got


@NEEDS_CUDA_BINARIES
def test_wide_tma_tile_compiles_to_two_wgmma_widths_on_sm90(tmp_path):
    # inspect_kernels.py's wide case (128 x (128 + 32) bf16, 8 warps): both products on wgmma
    # (n128 and n32, one accumulator each), no spills (no local memory, no stack).
    got = compile_script(tmp_path, """
import re
fn, types, consts, warps, stages, _ = ik.cases()["tma-wide-128x160"]
k = ik.compile_cuda(fn, types, consts, warps, stages)
a = ik.analyse(k)
print(" ".join(sorted(set(re.findall(r"wgmma.mma_async.sync.aligned.m64(n\\d+)k16", k.asm["ptx"])))),
      a["local_bytes"], a["stack_bytes"])
""").split()
    assert got == ["n128", "n32", "0", "0"], got


@NEEDS_CUDA_BINARIES
@pytest.mark.parametrize("stream_k", [False, True])
def test_gluon_ws_study_kernel_is_warp_specialised_on_sm90(tmp_path, stream_k):
    # benchmarks/gluon_ws.py (run 22's study), both forms: a loader partition and wgmma consumers,
    # with the registers moved between them (setmaxnreg), TMA loads and mbarrier waits: what plain
    # Triton's tl.range(warp_specialize=True) does not give on sm_90.
    pytest.importorskip("triton.experimental.gluon._runtime", reason="this Triton has no Gluon")
    got = compile_script(tmp_path, f"""
sys.path.insert(0, {str(BENCH)!r})
import re, gluon_ws
k = gluon_ws.compile_sm90(dict(BM=128, BN=128, BK=64, stages=6, warps=8), stream_k={stream_k})
ptx = k.asm["ptx"]
print(len(re.findall(r"setmaxnreg", ptx)), len(re.findall(r"wgmma.mma_async.sync.aligned.m64n128k16", ptx)),
      len(re.findall(r"cp.async.bulk.tensor", ptx)), len(re.findall(r"mbarrier.try_wait", ptx)))
""").split()
    assert [int(n) > 0 for n in got] == [True] * 4, got


@NEEDS_CUDA_BINARIES
def test_default_tiles_fit_the_h200s_shared_memory_on_this_triton(tmp_path):
    # benchmarks/sm90_fit.py: each default tile's launch, driven on the CPU as on the H200 and
    # compiled for sm_90 here, fits 227 KB of shared memory (the shipped cache is keyed by the
    # device's Triton, so on any other every key starts on its default tile); and a launch that
    # would not fit is caught: the limit set one byte below what a launch was measured to take.
    got = compile_script(tmp_path, """
import dataclasses
import sm90_fit
points = (["bf16", "fp8", "int4-gptq", "fp8@fp32"], ["o"], [1, 16, 256, 1024, 8192])
rows = sm90_fit.drive(sm90_fit.Recorder(), *points, lambda r: None)
print(sum(r["fits"] for r in rows), len(rows), all(r["kernels"] for r in rows))
most = max(k["shared"] for r in rows for k in r["kernels"])
smaller = dataclasses.replace(sm90_fit.H200, shared=most - 1)   # the same tiles, a smaller GPU
again = sm90_fit.drive(sm90_fit.Recorder(smaller), *points, lambda r: None)
print(sum(not r["fits"] for r in again), sum(any(k["shared"] == most for k in r["kernels"]) for r in rows))
""").split()
    assert got[:3] == ["20", "20", "True"], got
    assert got[3] == got[4] and int(got[3]) >= 1, got   # exactly the launches that took the most


AMD = (Path(os.path.dirname(triton.backends.__file__)) / "amd").exists()


@NEEDS_CUDA_BINARIES
@pytest.mark.skipif(not AMD, reason="this Triton has no AMD backend")
def test_every_default_launch_compiles_for_an_mi300x(tmp_path):
    # benchmarks/sm90_fit.py's recorder aimed at gfx942 (an AMD device of the seeds' table, 64 KB
    # of LDS a block): each default launch passes Triton's HIP argument packing, which refused
    # the `launch_pdl=False` the launchers used to name on every gemm.py launch (run 24), and
    # compiles; bf16's and int4's fit the LDS (dense fp32's TMA tiles do on Triton 3.9, not 3.6).
    # Between them they reach launch_tma's three paths, launch_tiled (split-K) and int4's own.
    got = compile_script(tmp_path, """
import sm90_fit
rows = sm90_fit.drive(sm90_fit.Recorder(sm90_fit.DEVICES["mi300x"]), ["bf16", "int4-gptq", "fp32"], ["o"],
                      [1, 16, 64, 256, 1024, 8192], lambda r: None)
print(len(rows), sum(r["error"] is None and bool(r["kernels"]) and all(k["shared"] is not None for k in r["kernels"])
                     for r in rows), sum(r["fits"] for r in rows if r["format"] != "fp32"),
      ",".join(sorted({r["tile"]["path"] for r in rows})))
""").split()
    assert got[:3] == ["18", "18", "12"], got
    assert got[3] == "dequant-sk,dequant-tma,slices,splitk,tma,tma-sk,tma-swap", got
