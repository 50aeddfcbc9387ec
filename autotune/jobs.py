"""What vsr-tune tunes: one job per (layer shape, format, row bucket).

A job is a dict {"label", "template", "weight", "problem"}: the template that runs the weight
(kernels.registry.template_for), the weight it is timed on, and the Problem of one row bucket.
shape_jobs builds them for a shape spec and record formats (autotune/shapes.py) on synthetic
weights; `vsr-tune PACKAGE` builds them from a package's own layers (cli/tune.py) with weight_jobs.
"""
from __future__ import annotations

import torch

from vsr.autotune import shapes
from vsr.kernels.registry import template_for


def choose_template(w, act_dtype: torch.dtype, emulate: bool, what: str, hint: str = ""):
    """The template of a weight; a format this device cannot run is a ValueError naming `what`."""
    try:
        return template_for(w, act_dtype, emulate=emulate)
    except RuntimeError as e:   # e.g. NVFP4 W4A4 without FP4 tensor cores
        raise ValueError(f"{what}: {e}{hint}") from None


def weight_jobs(label: str, template, w, buckets, act_dtype: torch.dtype) -> list[dict]:
    return [{"label": label, "template": template, "weight": w, "problem": template.problem(w, b, act_dtype)}
            for b in buckets]


def shape_jobs(spec: str, formats: str, device, buckets, act: str | None = None) -> list[dict]:
    """Jobs for every shape of `spec` ("27b", "minilm", "NxK[,NxK]") in every record format of
    `formats` ("bf16,fp8,int4-gptq", "fp8@fp32"), format-major, on synthetic weights made on `device`;
    `act`: the activation dtype of quantized formats (default bf16)."""
    jobs = []
    for fs in shapes.parse_formats(formats):
        act_dtype = shapes.act_dtype_for(fs, act)
        emulated = [n for n, r in shapes.FORMATS.items() if r.fmt == fs.fmt and r.emulate]
        hint = f" (vsr-tune: --formats {emulated[0]})" if emulated and not fs.emulate else ""
        for label, N, K in shapes.parse_shapes(spec):
            w = shapes.weight_for(fs, N, K, act_dtype, device)
            template = choose_template(w, act_dtype, fs.emulate, f"format {fs.name}", hint)
            jobs += weight_jobs(f"{label} {fs.name}", template, w, buckets, act_dtype)
    return jobs
