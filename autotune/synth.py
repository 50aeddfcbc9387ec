"""Random weights and activations for tuning a key when no real weights are at hand.

A tile depends on the shape, the format and its parameters, never on the values, so
`vsr-tune 27b` and a resolver with policy "tune" time candidates on random data of the
key's exact layout (random, never zeros: BENCHMARKS.md method), built by the format's spec
(kernels/formats.py) from the Problem's format parameters.

Tuning weights carry a random bias (`bias=True`, as shapes.weight_for and for_problem ask): the
epilogue that adds one is the kernel's costliest, and on fp32's FMA products it is what makes a
tile spill (the H200's shipped fp32 TMA tiles at M = 256 and 512 ran 6-10x slower with the bias
of the router's layers than as tuned without one). A tile timed with a bias is no slower on a
product without one, whose kernel holds fewer registers.
"""
from __future__ import annotations

import torch

from vsr.kernels import formats


def weight_format(template_name: str) -> str:
    """The weight format a registered template computes (its spec's name)."""
    return formats.of_template(template_name).name


def template_format(template) -> str:
    """The weight format `template` computes: its registered format's, else its module's
    WEIGHT_FORMAT (a template no format registers, such as autotune.fake's)."""
    if template.name in formats.TEMPLATES:
        return weight_format(template.name)
    fmt = getattr(template.module, "WEIGHT_FORMAT", None)
    if fmt is None:
        raise ValueError(f"template {template.name!r} is no registered format's and its module names no WEIGHT_FORMAT")
    return fmt


def random_weight(fmt: str, N: int, K: int, params: dict, model_dtype: torch.dtype,
                  device: torch.device | str = "cpu", seed: int = 0, bias: bool = False):
    """A weight object of format `fmt` with shape [N, K] and the given format parameters, made on
    `device` directly (a 27B-class layer made on the CPU costs seconds per weight); with `bias`, a
    random bias [N] in model_dtype."""
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    w = formats.get(fmt).random_weight(N, K, params, model_dtype, g, device)
    if bias:
        w.bias = torch.randn(N, generator=g, device=device).to(model_dtype)
    return w


def random_activations(M: int, K: int, dtype: torch.dtype, device, seed: int = 1) -> torch.Tensor:
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(M, K, generator=g, device=device).to(dtype)


def for_problem(template, problem, device, seed: int = 0):
    """(weight, x) for tuning `problem`: x has `bucket` rows, the most the bucket serves."""
    w = random_weight(template_format(template), problem.N, problem.K, dict(problem.params),
                      problem.act_dtype, device, seed, bias=True)
    x = random_activations(problem.bucket, problem.K, problem.act_dtype, device, seed + 1)
    return w, x
