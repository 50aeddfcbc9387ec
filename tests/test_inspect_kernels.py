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


@pytest.mark.skipif(not (BIN / "cuobjdump").exists(), reason="this Triton has no bundled CUDA binaries")
def test_reports_resources_of_a_compiled_int4_kernel(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "inspect.json"
    p = subprocess.run([sys.executable, str(BENCH / "inspect_kernels.py"), "--cases",
                        "int4-swap-16x128,int4-slices-ptx-16x128",
                        "--out", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
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
    assert sl["register_bytes_to_shared_per_step"] <= 128 * 16 * 2 < r["register_bytes_to_shared_per_step"]
    assert sl["main_loop_instructions"] < r["main_loop_instructions"]


@pytest.mark.skipif(not (BIN / "cuobjdump").exists(), reason="this Triton has no bundled CUDA binaries")
def test_int4_slices_and_join_compile_for_every_nvidia_architecture(tmp_path):
    # The slices and join kernels as the launcher configures them, for bf16 and fp16 x, on Ampere, Ada and
    # Hopper: sub.bf16x2 exists only from sm_90, and the first slices version failed to build on
    # sm_80-89 with bf16 (ptxas: "Feature 'sub.bf16x2' requires .target sm_90 or higher").
    script = tmp_path / "arch.py"
    script.write_text(f"""
import sys
sys.path.insert(0, {str(BENCH)!r})
import torch
import inspect_kernels as ik
from vsr.kernels import int4
for cap in ((8, 0), (8, 6), (8, 9), (9, 0)):
    for dt, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        types = dict(ik._INT4, x_ptr="*" + name, sc_ptr="*" + name, y_ptr="*" + name, bias_ptr="*" + name)
        consts = dict(GROUP=128, HAS_ZP=True, HAS_BIAS=True, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=2,
                      GROUP_M=8, PAIRS=int4.ptx_pairs(dt, cap), F16=dt == torch.float16, IEEE=False)
        ik.compile_cuda(int4._int4_slices_kernel, types, consts, 4, 3, arch=cap[0] * 10 + cap[1])
        consts.pop("IEEE")
        ik.compile_cuda(int4._int4_join_kernel, types, consts, 4, 3, arch=cap[0] * 10 + cap[1])
        print("ok", cap, name, consts["PAIRS"])
""")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.count("ok") == 8
    assert "ok (9, 0) bf16 True" in p.stdout and "ok (8, 9) bf16 False" in p.stdout
