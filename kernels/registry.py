"""Every Triton template by name, and the choice of template for a weight (contract 5).

template_for never falls back silently: a weight whose format has no kernel on this
device raises, naming what is missing. The runtime's device check refuses such a
package earlier, with the seeds' sentence; this is the second line.
"""
from __future__ import annotations

import torch

from vsr.kernels import common, dense, fp8, int4, nvfp4
from vsr.kernels.template import Template

TEMPLATES: dict[str, Template] = {
    t.name: t for t in (dense.TEMPLATE, fp8.TEMPLATE, int4.TEMPLATE, nvfp4.TEMPLATE_W4A4, nvfp4.TEMPLATE_EMULATED)
}


def _fp4_tensor_cores(device: torch.device | None) -> bool:
    if device is None and not torch.cuda.is_available():
        return False
    return nvfp4.fp4_tensor_cores(torch.device("cuda") if device is None else device)


def template_for(weight, act_dtype: torch.dtype, emulate: bool = False) -> Template:
    """The template that runs `weight` with activations of `act_dtype`.

    NVFP4 runs "nvfp4_w4a4" on FP4 tensor cores (compute capability 10.x/12.x) and
    "nvfp4_emulated" only when emulate=True; anywhere else it raises. NVFP4A16
    weights (no input_global_scale) have no FP4-tensor-core form and run the
    emulation kernel, which is then their exact kernel, so they need no emulate flag."""
    fmt = getattr(weight, "format", None)
    if fmt == "dense":
        name = "dense"
        if weight.weight.dtype != act_dtype:
            raise ValueError(f"dense weight is {weight.weight.dtype}; activations are {act_dtype}: "
                             "cast the weight once at load, not per call")
    elif fmt == "fp8":
        name = "fp8_w8a8"
    elif fmt == "int4":
        name = "int4_w4a16"
    elif fmt == "nvfp4":
        if emulate or not weight.quantizes_activations:
            name = "nvfp4_emulated"
        else:
            dev = weight.packed.device if weight.packed.is_cuda else None
            if not _fp4_tensor_cores(dev):
                raise RuntimeError(
                    "NVFP4 W4A4 needs FP4 tensor cores (NVIDIA compute capability 10.x or 12.x) for its Triton "
                    "kernel; this device has none. Ask for the explicit emulation (emulate=True) to run the "
                    "reference numerics instead.")
            name = "nvfp4_w4a4"
    else:
        raise ValueError(f"no Triton template for weight format {fmt!r}; formats: dense, fp8, int4, nvfp4")
    if act_dtype not in common.ACT_DTYPES:   # every template takes the same ones
        raise ValueError(f"template {name} takes activations in {[str(d) for d in common.ACT_DTYPES]}, got {act_dtype}")
    return TEMPLATES[name]
