"""Every Triton template by name, and the choice of template for a weight (contract 5).

template_for never falls back silently: a weight whose format has no kernel on this device
raises, naming what is missing (the runtime's device check refuses such a package earlier, with
the seeds' sentence). Both read the format specs of kernels/formats.py.
"""
from __future__ import annotations

import torch

from vsr.kernels import common, formats
from vsr.kernels.template import Template

TEMPLATES: dict[str, Template] = formats.TEMPLATES


def template_for(weight, act_dtype: torch.dtype, emulate: bool = False) -> Template:
    """The template that runs `weight` with activations of `act_dtype` (its format's choose_template;
    `emulate` allows an emulating template, e.g. nvfp4_emulated)."""
    fmt = getattr(weight, "format", None)
    spec = formats.FORMATS.get(fmt)
    if spec is None:
        raise ValueError(f"no Triton template for weight format {fmt!r}; formats: {', '.join(formats.FORMATS)}")
    name = spec.choose_template(weight, act_dtype, emulate)
    if act_dtype not in common.ACT_DTYPES:   # every template takes the same ones
        raise ValueError(f"template {name} takes activations in {[str(d) for d in common.ACT_DTYPES]}, got {act_dtype}")
    return TEMPLATES[name]
