"""A fresh process for tests/test_bundle.py: compiles small Triton kernels for an sm_90 target on
the CPU (Triton's real compile and cache-lookup path: triton.compile with a GPUTarget writes and
reads Triton cache entries without a GPU) and builds a C module through Triton's launcher builder,
optionally with a kernel bundle activated first. Prints one JSON line.

    python tests/bundle_probe.py KERNELS [BUNDLE IDENTITY ROOT]
"""
import hashlib
import json
import sys
import warnings

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.build import compile_module_from_src


@triton.jit
def twice_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)


@triton.jit
def square_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + i, mask=i < n)
    tl.store(y_ptr + i, v * v, mask=i < n)


MODULE_SRC = """#include <Python.h>
static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "vsr_bundle_probe", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_vsr_bundle_probe(void) { return PyModule_Create(&m); }
"""


def main() -> None:
    kernels = sys.argv[1].split(",")
    out = {"refused": None, "warnings": [], "cubins": {}}
    if len(sys.argv) > 2:
        from pathlib import Path

        from vsr.autotune import bundle
        try:
            bundle.activate(sys.argv[2], sys.argv[3], Path(sys.argv[4]))
        except bundle.BundleError as e:
            out["refused"] = str(e)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name in kernels:
            fn = globals()[f"{name}_kernel"]
            k = triton.compile(ASTSource(fn, {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                                         {(3,): 64}), target=GPUTarget("cuda", 90, 32))
            out["cubins"][name] = hashlib.sha256(k.asm["cubin"]).hexdigest()
        compile_module_from_src(MODULE_SRC, "vsr_bundle_probe")
    out["warnings"] = [str(w.message) for w in caught if "bundle" in str(w.message)]
    from vsr.autotune import bundle
    out["stats"] = bundle.stats()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
